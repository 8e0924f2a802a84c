"""Single-copy algorithms for ranks on one node: every rank reads its peers' ordinary
buffers where they lie, in the peers' own processes, through the kernel (Linux Cross
Memory Attach: ``process_vm_readv``, as MPICH and Open MPI move large messages between
processes), or writes into theirs (``process_vm_writev``: gather and scatter split each
block between its peer and the root).  Pure step machines, like the others.

The staged programs of algorithms/shm.py copy each block twice (into the owner's slot,
out of it); these copy it once, with a fixed number of flag rounds however large the
message: each rank publishes its buffers' addresses (``Publish``) with READY, reads what
it needs from its peers', then signals CONSUMED and waits until every peer consumed
too, so that no peer still reads a buffer the caller gets back.  One epoch, no slot:
nothing is chunked.

Reductions read each peer's contribution to this rank's part into scratch and reduce
it there with their own (each part of the result reduced by exactly one rank, sources in
rank order from its own, as in algorithms/shm.py: every rank holds the same bits);
allreduce then reads the other parts, reduced, from their owners' receive buffers.

Every rank signals READY and CONSUMED at the epoch whatever its role: the staged programs
after this one wait on both counters of every peer.
"""
from __future__ import annotations

from .primitives import (CONSUMED, PEER, READY, RECV, REDUCED, SCRATCH, SEND, Copy, Publish,
                         ReduceN, Region, Signal, WaitFlags, chunk_ranges, partition)
from .spec import Spec

E = 1   # the only epoch


def _others(spec: Spec) -> tuple:
    return tuple(q for q in range(spec.size) if q != spec.rank)


def _peer(q: int, buf: int, off: int, n: int) -> Region:
    return Region((PEER, q, buf), off, n)


def _finish(peers: tuple):
    yield Signal(CONSUMED, E)
    yield WaitFlags(CONSUMED, E, peers)     # nobody reads my buffers after I return


def allgather(spec: Spec):
    """Block q of the result is read from rank q's input (in place: from block q of its
    receive buffer, which nobody writes meanwhile)."""
    r, m = spec.rank, spec.count
    peers = _others(spec)
    mine = RECV if spec.inplace else SEND
    yield Publish(mine)
    yield Signal(READY, E)
    if not spec.inplace:
        yield Copy(Region(RECV, r * m, m), Region(SEND, 0, m))
    yield WaitFlags(READY, E, peers)
    for q in peers:
        yield Copy(Region(RECV, q * m, m), _peer(q, mine, q * m if spec.inplace else 0, m))
    yield from _finish(peers)


def alltoall(spec: Spec):
    """Block r of rank q's input is read straight into block q of rank r's output.  In
    place, the input is copied aside first (locally) and published from there: each
    rank overwrites the blocks its peers are reading."""
    r, n, m = spec.rank, spec.size, spec.count
    peers = _others(spec)
    src = SCRATCH if spec.inplace else SEND
    if spec.inplace:
        yield Copy(Region(SCRATCH, 0, n * m), Region(SEND, 0, n * m))
    yield Publish(src)
    yield Signal(READY, E)
    if not spec.inplace:
        yield Copy(Region(RECV, r * m, m), Region(SEND, r * m, m))
    yield WaitFlags(READY, E, peers)
    for q in peers:
        yield Copy(Region(RECV, q * m, m), _peer(q, src, r * m, m))
    yield from _finish(peers)


def broadcast(spec: Spec):
    """Every rank but the root reads the root's buffer (the root's data is in its RECV)."""
    r, root = spec.rank, spec.root
    if r == root:
        yield Publish(RECV)
    yield Signal(READY, E)
    if r == root:
        yield Signal(CONSUMED, E)
        yield WaitFlags(CONSUMED, E, _others(spec))
    else:
        yield WaitFlags(READY, E, (root,))
        yield Copy(Region(RECV, 0, spec.count), _peer(root, RECV, 0, spec.count))
        yield Signal(CONSUMED, E)


def _reduce_mine(spec: Spec, lo: int, length: int, dst: Region):
    """dst = this rank's input at ``lo`` (op) every peer's, in rank order from its own:
    chunk by chunk (``spec.chunk``: a staging slot's size), the peers' chunks read into
    scratch, one region each, and reduced while they are still in the cache (16 MiB at
    2 ranks, alternating jobs: 4.8-5.5 ms against 7.0-8.2 reading the whole half first)."""
    peers = _others(spec)
    for c, (o, k) in enumerate(chunk_ranges(length, spec.chunk)):
        srcs = [Region(SEND, lo + o, k)]
        for i, q in enumerate(peers):
            yield Copy(Region(SCRATCH, i * k, k), _peer(q, SEND, lo + o, k))
            srcs.append(Region(SCRATCH, i * k, k))
        yield ReduceN(Region(dst.buf, dst.off + o, k), tuple(srcs), spec.size if spec.avg else 0)


def allreduce(spec: Spec):
    """Each rank reduces its part (peers' contributions read from their inputs), then
    reads the other parts from their owners' results.  In place too: a peer's part of my
    buffer is read (as input) before my REDUCED, and overwritten (with its result) only
    after it."""
    r, n, count = spec.rank, spec.size, spec.count
    peers = _others(spec)
    parts = partition(count, n)
    po, pl = parts[r]
    yield Publish(SEND)
    yield Publish(RECV)
    yield Signal(READY, E)
    yield WaitFlags(READY, E, peers)
    if pl:
        yield from _reduce_mine(spec, po, pl, Region(RECV, po, pl))
    yield Signal(REDUCED, E)
    yield WaitFlags(REDUCED, E, peers)
    for q in peers:
        qo, ql = parts[q]
        if ql:
            yield Copy(Region(RECV, qo, ql), _peer(q, RECV, qo, ql))
    yield from _finish(peers)


def reduce_scatter(spec: Spec):
    """Block r of the result: this rank's block r (op) every peer's, read from their
    inputs; one flag round to read, one to release."""
    r, m = spec.rank, spec.count
    peers = _others(spec)
    yield Publish(SEND)
    yield Signal(READY, E)
    yield WaitFlags(READY, E, peers)
    if m:
        yield from _reduce_mine(spec, r * m, m, Region(RECV, 0, m))
    yield from _finish(peers)


# What the root's copy of its own block costs against a kernel copy of the same bytes
# (np.copyto of 128 KiB 2.7 us, process_vm_readv or _writev 11.6; 2 MiB 45 against 160 in
# the cache), by the block's size in staging slots (``spec.chunk`` elements, 512 KiB by
# default): (up to this many slots, the cost).  Beyond two slots the root's buffers leave
# the caches its copy runs in (2 ranks, 1,000-call loops, hpccoll's us, 0.3 against 0.5:
# Scatter 4 MiB 119-141 against 106-121 in five jobs of six, Gather 4 MiB 124-142
# against 105-118 in three of four, Gather 16 MiB 465-593 against 394-512; 1 MiB blocks
# ahead at 0.3: Scatter 2 MiB 67-77 against 74-77).
OWN_COPY = ((2, 0.3), (float("inf"), 0.5))


def _split(spec: Spec) -> tuple:
    """(head, tail) of each peer's block in a gather or scatter: the peer moves the head,
    the root the tail of every peer's block (one after another) besides copying its own
    block (OWN_COPY of a kernel copy; nothing in place): both sides' kernel copies at
    once, sized so that they end together."""
    m = spec.count
    slots = m / max(1, spec.chunk)
    own = 0.0 if spec.inplace else next(c for most, c in OWN_COPY if slots <= most)
    tail = int(m * (1 - own) / spec.size)
    return m - tail, tail


def gather(spec: Spec):
    """Every rank but the root writes the head of its block straight into the root's
    output (``process_vm_writev``) while the root copies its own block and reads the tails
    from the peers' inputs (``_split``): the root reading every block whole did the
    copies one after another on its own core (2 ranks, 4 MiB: 240-272 us)."""
    r, root, m = spec.rank, spec.root, spec.count
    head, tail = _split(spec)
    if r != root:
        yield Publish(SEND)
        yield Signal(READY, E)
        yield WaitFlags(READY, E, (root,))
        if head:
            yield Copy(_peer(root, RECV, r * m, head), Region(SEND, 0, head))
        yield from _finish((root,))     # (and the root has read my tail)
        return
    peers = _others(spec)
    yield Publish(RECV)
    yield Signal(READY, E)
    if not spec.inplace and m:
        yield Copy(Region(RECV, r * m, m), Region(SEND, 0, m))
    yield WaitFlags(READY, E, peers)
    if tail:
        for q in peers:
            yield Copy(Region(RECV, q * m + head, tail), _peer(q, SEND, head, tail))
    yield from _finish(peers)           # (every peer's head is in)


def scatter(spec: Spec):
    """Every rank but the root reads the head of its block straight from the root's input
    while the root copies its own block and writes the tails into the readers' outputs
    (``_split``)."""
    r, root, m = spec.rank, spec.root, spec.count
    head, tail = _split(spec)
    if r == root:
        peers = _others(spec)
        yield Publish(SEND)
        yield Signal(READY, E)
        if not spec.inplace and m:
            yield Copy(Region(RECV, 0, m), Region(SEND, r * m, m))
        yield WaitFlags(READY, E, peers)
        if tail:
            for q in peers:
                yield Copy(_peer(q, RECV, head, tail), Region(SEND, q * m + head, tail))
        yield from _finish(peers)
        return
    yield Publish(RECV)
    yield Signal(READY, E)
    yield WaitFlags(READY, E, (root,))
    if head:
        yield Copy(Region(RECV, 0, head), _peer(root, SEND, r * m, head))
    yield from _finish((root,))        # (and the root's writes into my output are done)
