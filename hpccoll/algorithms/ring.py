"""Ring algorithms for large messages: reduce-scatter, allgather, and what they compose.

Bandwidth-optimal: every rank sends and receives (n-1)/n of the data per phase.
Each ring step is cut into chunks, and every chunk is a ``Wait`` (a point where
the collective can be suspended and resumed).  Blocks may be uneven (counts not
divisible by the number of ranks); a rank skips a chunk exactly when its peer
does, because both compute the same block sizes.
"""
from __future__ import annotations

from .primitives import (RECV, SCRATCH, SEND, Copy, Reduce, Region, Unit, chunk_ranges, partition,
                         pipeline)
from .spec import Spec


def _reduce_scatter_units(spec: Spec, blocks, shift, send_from, reduce_to):
    """At step s, send block (r-s-shift) to the next rank, receive block (r-s-shift-1) from
    the previous one into a scratch slot, and reduce it with this rank's own input."""
    r, n, chunk = spec.rank, spec.size, spec.chunk
    nxt, prv = (r + 1) % n, (r - 1) % n
    units, k = [], 0
    for s in range(n - 1):
        bs, br = (r - s - shift) % n, (r - s - shift - 1) % n
        (_, ss), (ro, rs) = blocks[bs], blocks[br]
        for lo in range(0, max(ss, rs), chunk):
            sn, rn = max(0, min(chunk, ss - lo)), max(0, min(chunk, rs - lo))
            slot = Region(SCRATCH, (k % spec.depth) * chunk, rn)
            k += 1
            units.append(Unit(
                sends=((nxt, send_from(s, bs, lo, sn)),) if sn else (),
                recvs=((prv, slot),) if rn else (),
                after=(Reduce(reduce_to(s, br, lo, rn), Region(SEND, ro + lo, rn), slot),)
                if rn else ()))
    return units


def _allgather_units(spec: Spec, blocks, shift):
    """At step s, forward block (r-s+shift) to the next rank and receive block (r-s-1+shift)."""
    r, n = spec.rank, spec.size
    nxt, prv = (r + 1) % n, (r - 1) % n
    units = []
    for s in range(n - 1):
        (so, ss), (ro, rs) = blocks[(r - s + shift) % n], blocks[(r - s - 1 + shift) % n]
        for lo in range(0, max(ss, rs), spec.chunk):
            sn, rn = max(0, min(spec.chunk, ss - lo)), max(0, min(spec.chunk, rs - lo))
            units.append(Unit(
                sends=((nxt, Region(RECV, so + lo, sn)),) if sn else (),
                recvs=((prv, Region(RECV, ro + lo, rn)),) if rn else ()))
    return units


def allreduce(spec: Spec):
    r, n, count = spec.rank, spec.size, spec.count
    if n == 1:
        if not spec.inplace and count:
            yield Copy(Region(RECV, 0, count), Region(SEND, 0, count))
        return
    blocks = partition(count, n)
    # reduce-scatter: the first step sends raw input, later steps forward what was reduced
    yield from pipeline(_reduce_scatter_units(
        spec, blocks, 0,
        send_from=lambda s, b, lo, k: Region(SEND if s == 0 else RECV, blocks[b][0] + lo, k),
        reduce_to=lambda s, b, lo, k: Region(RECV, blocks[b][0] + lo, k)), spec.depth)
    # allgather: rank r owns block r+1 after the reduce-scatter
    yield from pipeline(_allgather_units(spec, blocks, 1), spec.depth)


def reduce_scatter(spec: Spec):
    n, m = spec.size, spec.count
    if n == 1:
        if not spec.inplace and m:
            yield Copy(Region(RECV, 0, m), Region(SEND, 0, m))
        return
    blocks = [(b * m, m) for b in range(n)]
    acc = spec.depth * spec.chunk  # two block-sized accumulators follow the receive slots

    def send_from(s, b, lo, k):
        return Region(SEND, b * m + lo, k) if s == 0 else Region(SCRATCH, acc + ((s - 1) % 2) * m + lo, k)

    def reduce_to(s, b, lo, k):
        return Region(RECV, lo, k) if s == n - 2 else Region(SCRATCH, acc + (s % 2) * m + lo, k)

    # shift 1: the last step receives block r, so rank r ends with block r
    yield from pipeline(_reduce_scatter_units(spec, blocks, 1, send_from, reduce_to), spec.depth)


def allgather(spec: Spec):
    r, n, m = spec.rank, spec.size, spec.count
    if not spec.inplace and m:
        yield Copy(Region(RECV, r * m, m), Region(SEND, 0, m))
    if n > 1:
        yield from pipeline(_allgather_units(spec, [(b * m, m) for b in range(n)], 0), spec.depth)


def reduce(spec: Spec):
    """Ring reduce-scatter into every rank's recvbuf, then each block goes to the root."""
    r, n, count, root = spec.rank, spec.size, spec.count, spec.root
    if n == 1:
        yield from allreduce(spec)
        return
    blocks = partition(count, n)
    yield from pipeline(_reduce_scatter_units(
        spec, blocks, 0,
        send_from=lambda s, b, lo, k: Region(SEND if s == 0 else RECV, blocks[b][0] + lo, k),
        reduce_to=lambda s, b, lo, k: Region(RECV, blocks[b][0] + lo, k)), spec.depth)
    own_off, own_n = blocks[(r + 1) % n]
    units = []
    if r == root:
        for q in range(n):
            if q != root:
                off, size = blocks[(q + 1) % n]
                units += [Unit((), ((q, Region(RECV, off + lo, k)),)) for lo, k in chunk_ranges(size, spec.chunk)]
    else:
        units = [Unit(((root, Region(RECV, own_off + lo, k)),), ())
                 for lo, k in chunk_ranges(own_n, spec.chunk)]
    yield from pipeline(units, max(spec.depth, n - 1))


# -- variable counts (MPI's Allgatherv and Reduce_scatter) ----------------------------

def allgatherv(spec: Spec):
    """Allgather of per-rank blocks: rank i contributes counts[i] elements, which land at
    displs[i] of every rank's output.  The same ring as allgather, on uneven blocks."""
    r, n = spec.rank, spec.size
    blocks = list(zip(spec.displs, spec.counts))
    own_off, own_n = blocks[r]
    if not spec.inplace and own_n:
        yield Copy(Region(RECV, own_off, own_n), Region(SEND, 0, own_n))
    if n > 1:
        yield from pipeline(_allgather_units(spec, blocks, 0), spec.depth)


def reduce_scatterv(spec: Spec):
    """Reduce-scatter of uneven blocks: the input holds counts[i] elements for rank i, back to
    back; rank r ends with the reduced block r at the start of its output.

    In place (MPI_IN_PLACE) the output is the start of the input buffer.  That is safe:
    units retire in order, so when the last step writes output chunk [lo, lo+k) every
    earlier step has finished, the input it reduces lies at offset(r) + lo >= lo, and the
    only transfers still in flight (n = 2: later chunks of the first step's raw sends) read
    at offsets >= lo + chunk."""
    n, counts = spec.size, spec.counts
    offs = [sum(counts[:b]) for b in range(n)]
    if n == 1:
        if not spec.inplace and counts[0]:
            yield Copy(Region(RECV, 0, counts[0]), Region(SEND, 0, counts[0]))
        return
    big = max(counts)
    acc = spec.depth * spec.chunk  # two accumulators of the largest block follow the receive slots

    def send_from(s, b, lo, k):
        return Region(SEND, offs[b] + lo, k) if s == 0 else \
            Region(SCRATCH, acc + ((s - 1) % 2) * big + lo, k)

    def reduce_to(s, b, lo, k):
        return Region(RECV, lo, k) if s == n - 2 else Region(SCRATCH, acc + (s % 2) * big + lo, k)

    # shift 1: the last step receives block r, so rank r ends with block r
    yield from pipeline(_reduce_scatter_units(spec, list(zip(offs, counts)), 1, send_from,
                                              reduce_to), spec.depth)
