"""Shared-memory algorithms for ranks on one node: every rank reads its peers' data in
place instead of receiving it.  Pure step machines, like the others.

Each rank owns a segment of a node-shared window (transport/shm.py) with ``slots``
staging slots and three monotonic counters: READY (my input for epoch e is in place),
REDUCED (my part of epoch e is reduced), CONSUMED (I have finished reading everybody's
epoch-e data).  A message is processed in chunks of one slot; every chunk is an epoch,
and every flag wait is a point where the collective can be suspended and resumed.

Registered buffers (ctx.empty): peers read the user's arrays directly, so the copy into
the slot disappears; those collectives end by waiting until every peer CONSUMED the last
epoch, so the user may reuse the buffers as soon as wait() returns.

Reduction order: every part of the result is reduced by exactly one rank (its owner,
sources in rank order starting with its own) and copied by the others, so all ranks hold
the same bits.
"""
from __future__ import annotations

from . import doubling
from .primitives import (CONSUMED, PRECV, PSEND, READY, RECV, REDUCED, SEND, SLOT, Copy, Post,
                         Reduce, ReduceN, Region, Scale, Signal, WaitFlags, chunk_ranges,
                         partition)
from .spec import Spec


def _others(spec: Spec) -> tuple:
    return tuple(q for q in range(spec.size) if q != spec.rank)


def _order(spec: Spec) -> list:
    """Source order of a reduction: this rank first (dst may alias only srcs[0])."""
    r = spec.rank
    return [r] + [q for q in range(spec.size) if q != r]


def _stage(spec: Spec, e: int, peers: tuple):
    """Wait until the slot epoch e reuses is free (every peer consumed epoch e - slots)."""
    yield WaitFlags(CONSUMED, e - spec.slots, peers)


def _stage_parts(spec: Spec, e: int, lo: int, parts, peers: tuple):
    """Stage the parts of the chunk at ``lo`` that the peers reduce (this rank reduces its
    own part straight from its private input), once the slot is free."""
    yield from _stage(spec, e, peers)
    for q in peers:
        qo, ql = parts[q]
        if ql:
            yield Copy(Region((SLOT, spec.rank, e), qo, ql), Region(SEND, lo + qo, ql))


def allreduce(spec: Spec):
    r, n, count = spec.rank, spec.size, spec.count
    peers = _others(spec)
    reg = spec.registered
    last = 0
    for c, (lo, length) in enumerate(chunk_ranges(count, spec.chunk)):
        e = last = c + 1
        parts = partition(length, n)
        if reg:
            def src(q, o, k):
                return Region(SEND if q == r else (PSEND, q), lo + o, k)

            def out(q, o, k):
                return Region(RECV if q == r else (PRECV, q), lo + o, k)
        else:
            yield from _stage_parts(spec, e, lo, parts, peers)

            def src(q, o, k, e=e, lo=lo):
                return Region(SEND, lo + o, k) if q == r else Region((SLOT, q, e), o, k)

            def out(q, o, k, e=e):
                return Region((SLOT, q, e), o, k)
        yield Signal(READY, e)
        yield WaitFlags(READY, e, peers)
        po, pl = parts[r]
        if pl:
            dst = out(r, po, pl)
            yield ReduceN(dst, tuple(src(q, po, pl) for q in _order(spec)), n if spec.avg else 0)
        yield Signal(REDUCED, e)
        yield WaitFlags(REDUCED, e, peers)
        for q in range(n):
            qo, ql = parts[q]
            if ql and not (reg and q == r):
                yield Copy(Region(RECV, lo + qo, ql), out(q, qo, ql))
        yield Signal(CONSUMED, e)
    if reg and last:
        yield WaitFlags(CONSUMED, last, peers)   # nobody reads my buffers after wait()


def broadcast(spec: Spec):
    """The root copies each chunk into its slot; the others copy it out.  Staged whatever
    the buffers are (as reduce)."""
    r, root = spec.rank, spec.root
    others = tuple(q for q in range(spec.size) if q != root)
    for c, (lo, length) in enumerate(chunk_ranges(spec.count, spec.chunk)):
        e = c + 1
        staged = Region((SLOT, root, e), 0, length)
        if r == root:
            yield from _stage(spec, e, others)
            yield Copy(staged, Region(RECV, lo, length))
            yield Signal(READY, e)
        else:
            yield WaitFlags(READY, e, (root,))
            yield Copy(Region(RECV, lo, length), staged)
        yield Signal(CONSUMED, e)


def reduce(spec: Spec):
    """allreduce's first half, then the root gathers: each rank reduces one part of every
    chunk reading its peers' slots in place, into the root's receive buffer (the root's
    part) or its own slot (the others'), and the root copies those parts out.  Always
    staged: a reduce's receive buffer is the root's alone, so registered buffers would not
    let every rank read every other's in place."""
    r, n, root = spec.rank, spec.size, spec.root
    peers = _others(spec)
    for c, (lo, length) in enumerate(chunk_ranges(spec.count, spec.chunk)):
        e = c + 1
        parts = partition(length, n)
        yield from _stage_parts(spec, e, lo, parts, peers)
        yield Signal(READY, e)
        yield WaitFlags(READY, e, peers)
        po, pl = parts[r]
        if pl:
            dst = Region(RECV, lo + po, pl) if r == root else Region((SLOT, r, e), po, pl)
            yield ReduceN(dst, tuple(Region(SEND, lo + po, pl) if q == r
                                     else Region((SLOT, q, e), po, pl) for q in _order(spec)),
                          n if spec.avg else 0)
        yield Signal(REDUCED, e)
        if r == root:
            # (in place, RECV is SEND: the parts it overwrites were staged above)
            yield WaitFlags(REDUCED, e, peers)
            for q in peers:
                qo, ql = parts[q]
                if ql:
                    yield Copy(Region(RECV, lo + qo, ql), Region((SLOT, q, e), qo, ql))
        yield Signal(CONSUMED, e)


def reduce_scatter(spec: Spec):
    """Input n blocks of m; rank r reduces block r reading every peer's block r in place."""
    r, n, m = spec.rank, spec.size, spec.count
    peers = _others(spec)
    reg = spec.registered
    per = spec.chunk if reg else max(1, spec.chunk // n)   # a slot holds n block-chunks
    last = 0
    for c, (lo, length) in enumerate(chunk_ranges(m, per)):
        e = last = c + 1
        if reg:
            def src(q, lo=lo, length=length):
                return Region(SEND if q == r else (PSEND, q), r * m + lo, length)
        else:
            yield from _stage(spec, e, peers)
            for b in peers:     # my own block is read by me only: straight from my input
                yield Copy(Region((SLOT, r, e), b * length, length), Region(SEND, b * m + lo, length))

            def src(q, e=e, lo=lo, length=length):
                if q == r:
                    return Region(SEND, r * m + lo, length)
                return Region((SLOT, q, e), r * length, length)
        yield Signal(READY, e)
        yield WaitFlags(READY, e, peers)
        dst = Region(RECV, lo, length)
        yield ReduceN(dst, tuple(src(q) for q in _order(spec)), n if spec.avg else 0)
        yield Signal(CONSUMED, e)
    if reg and last:
        yield WaitFlags(CONSUMED, last, peers)


def allgather(spec: Spec):
    """Every block is copied once: from its owner's slot (or registered buffer) to RECV."""
    r, n, m = spec.rank, spec.size, spec.count
    peers = _others(spec)
    reg = spec.registered
    last = 0
    for c, (lo, length) in enumerate(chunk_ranges(m, spec.chunk)):
        e = last = c + 1
        if reg and spec.inplace:
            # every rank's block q sits in its own receive buffer, at block q
            def src(q, lo=lo, length=length):
                return Region((PRECV, q), q * m + lo, length)
        elif reg:
            def src(q, lo=lo, length=length):
                return Region(SEND if q == r else (PSEND, q), lo, length)
        else:
            yield from _stage(spec, e, peers)
            yield Copy(Region((SLOT, r, e), 0, length), Region(SEND, lo, length))

            def src(q, e=e, lo=lo, length=length):
                return Region(SEND, lo, length) if q == r else Region((SLOT, q, e), 0, length)
        yield Signal(READY, e)
        yield WaitFlags(READY, e, peers)
        for q in range(n):
            if q == r and spec.inplace:
                continue
            yield Copy(Region(RECV, q * m + lo, length), src(q))
        yield Signal(CONSUMED, e)
    if reg and last:
        yield WaitFlags(CONSUMED, last, peers)


def alltoall(spec: Spec):
    """Input n blocks of m; block q goes to rank q.  Per chunk, every rank stages the
    block-chunks its peers take (a slot holds n of them: slot position q for rank q) and
    copies its own straight across; each then copies its block-chunk out of every peer's
    slot.  Always staged (a rank's input may be its output, in place), so each block is
    copied twice, as MPI's own does through its cells; what is left out is MPI's
    per-message protocol."""
    r, n, m = spec.rank, spec.size, spec.count
    peers = _others(spec)
    for c, (lo, length) in enumerate(chunk_ranges(m, max(1, spec.chunk // n))):
        e = c + 1
        yield from _stage(spec, e, peers)
        for q in peers:
            yield Copy(Region((SLOT, r, e), q * length, length), Region(SEND, q * m + lo, length))
        yield Signal(READY, e)
        if not spec.inplace:
            yield Copy(Region(RECV, r * m + lo, length), Region(SEND, r * m + lo, length))
        yield WaitFlags(READY, e, peers)
        for q in peers:
            yield Copy(Region(RECV, q * m + lo, length), Region((SLOT, q, e), r * length, length))
        yield Signal(CONSUMED, e)


def gather(spec: Spec):
    """Every rank but the root copies each chunk of its input into its slot; the root
    copies it out of every slot into its block.  Staged whatever the buffers are."""
    r, root, m = spec.rank, spec.root, spec.count
    peers = _others(spec)
    if r == root and not spec.inplace and m:
        yield Copy(Region(RECV, r * m, m), Region(SEND, 0, m))
    for c, (lo, length) in enumerate(chunk_ranges(m, spec.chunk)):
        e = c + 1
        if r == root:
            yield WaitFlags(READY, e, peers)
            for q in peers:
                yield Copy(Region(RECV, q * m + lo, length), Region((SLOT, q, e), 0, length))
        else:
            # (every peer: a previous collective's reader of this slot may be any rank)
            yield from _stage(spec, e, peers)
            yield Copy(Region((SLOT, r, e), 0, length), Region(SEND, lo, length))
            yield Signal(READY, e)
        yield Signal(CONSUMED, e)


def scatter(spec: Spec):
    """The root stages, per chunk, every peer's block-chunk in its slot (slot position q
    for rank q); each peer copies its own out."""
    r, n, root, m = spec.rank, spec.size, spec.root, spec.count
    peers = _others(spec)
    if r == root and not spec.inplace and m:
        yield Copy(Region(RECV, 0, m), Region(SEND, r * m, m))
    for c, (lo, length) in enumerate(chunk_ranges(m, max(1, spec.chunk // n))):
        e = c + 1
        if r == root:
            yield from _stage(spec, e, peers)
            for q in peers:
                yield Copy(Region((SLOT, r, e), q * length, length),
                           Region(SEND, q * m + lo, length))
            yield Signal(READY, e)
        else:
            yield WaitFlags(READY, e, (root,))
            yield Copy(Region(RECV, lo, length), Region((SLOT, root, e), r * length, length))
        yield Signal(CONSUMED, e)


def _embed(steps, ranks: tuple, target: Region):
    """A sub-collective's program run on ``target`` among ``ranks``: its RECV becomes the
    target region, its peers (0..len(ranks)-1) become communicator ranks."""
    def region(reg):
        if reg.buf == RECV:
            return Region(target.buf, target.off + reg.off, reg.n)
        return reg

    for p in steps:
        kind = type(p)
        if kind is Post:
            yield Post(p.h, tuple((ranks[q], region(g)) for q, g in p.sends),
                       tuple((ranks[q], region(g)) for q, g in p.recvs))
        elif kind is Reduce:
            yield Reduce(region(p.dst), region(p.a), region(p.b))
        elif kind is Copy:
            yield Copy(region(p.dst), region(p.src))
        elif kind is Scale:
            yield Scale(region(p.dst), region(p.src), p.divisor)
        else:
            yield p


def allreduce_hier(spec: Spec):
    """Ranks on several nodes: per chunk, the node's ranks reduce one part each through
    shared memory, allreduce that part with the same part on the other nodes over MPI
    (recursive doubling among the ranks with the same local index), and gather the parts
    through shared memory again."""
    me = spec.local.index(spec.rank)
    nloc, nodes = len(spec.local), len(spec.cross)
    node = spec.cross.index(spec.rank)
    peers = tuple(q for q in range(nloc) if q != me)
    order = [me] + list(peers)
    for c, (lo, length) in enumerate(chunk_ranges(spec.count, spec.chunk)):
        e = c + 1
        parts = partition(length, nloc)
        yield from _stage(spec, e, peers)
        yield Copy(Region((SLOT, me, e), 0, length), Region(SEND, lo, length))
        yield Signal(READY, e)
        yield WaitFlags(READY, e, peers)
        po, pl = parts[me]
        if pl:
            mine = Region((SLOT, me, e), po, pl)
            # avg: every contribution divided by the whole communicator's size here, the
            # cross-node sum then adds the nodes' averaged parts
            yield ReduceN(mine, tuple(Region((SLOT, q, e), po, pl) for q in order),
                          spec.size if spec.avg else 0)
            if nodes > 1:
                sub = Spec("allreduce", node, nodes, pl, inplace=True)
                yield from _embed(doubling.allreduce(sub), spec.cross, mine)
        yield Signal(REDUCED, e)
        yield WaitFlags(REDUCED, e, peers)
        for q in range(nloc):
            qo, ql = parts[q]
            if ql:
                yield Copy(Region(RECV, lo + qo, ql), Region((SLOT, q, e), qo, ql))
        yield Signal(CONSUMED, e)
