"""Prefix reductions: scan (rank r gets x0 op x1 op ... op xr) and exscan (x0 op ... op
x(r-1); rank 0's output is not written).  Every reduction keeps rank order, lower ranks'
data on the left, so the result is the one MPI defines whatever the op.

- ``doubling``: recursive doubling, log2(n) rounds of whole-message exchanges; for small
  messages (MPICH's algorithm).
- ``chain``: rank r receives the prefix of ranks below it from r-1, chunk by chunk,
  combines it with its own and passes it on to r+1 at once: a pipeline along the ranks,
  each element crossing n-1 links once; for large messages.
"""
from __future__ import annotations

from .primitives import RECV, SCRATCH, SEND, Copy, Post, Reduce, Region, Unit, Wait, \
    chunk_ranges, pipeline
from .spec import Spec


def _doubling(spec: Spec, exclusive: bool):
    r, n, count = spec.rank, spec.size, spec.count
    out = Region(RECV, 0, count)
    if not exclusive and not spec.inplace and count:
        yield Copy(out, Region(SEND, 0, count))
    if n == 1 or count == 0:
        return
    # partial: the reduction of every block this rank has seen, which its partners get
    partial, tmp = Region(SCRATCH, 0, count), Region(SCRATCH, count, count)
    yield Copy(partial, Region(SEND, 0, count))
    written = not exclusive       # whether the output holds anything yet (exscan)
    mask = 1
    while mask < n:
        partner = r ^ mask
        if partner < n:
            yield Post(0, ((partner, partial),), ((partner, tmp),))
            yield Wait(0)
            if partner < r:       # tmp covers lower ranks: it goes on the left
                yield Reduce(partial, tmp, partial)
                if written:
                    yield Reduce(out, tmp, out)
                else:
                    yield Copy(out, tmp)
                    written = True
            else:
                yield Reduce(partial, partial, tmp)
        mask <<= 1


def scan_doubling(spec: Spec):
    yield from _doubling(spec, False)


def exscan_doubling(spec: Spec):
    yield from _doubling(spec, True)


def _chain(spec: Spec, exclusive: bool):
    r, n, count, chunk, depth = spec.rank, spec.size, spec.count, spec.chunk, spec.depth
    if not exclusive and not spec.inplace and count and r == 0:
        yield Copy(Region(RECV, 0, count), Region(SEND, 0, count))
    if n == 1 or count == 0:
        return
    prv, nxt = r - 1, (r + 1 if r + 1 < n else None)
    units = []
    for i, (lo, k) in enumerate(chunk_ranges(count, chunk)):
        own, out = Region(SEND, lo, k), Region(RECV, lo, k)
        # what goes on to r+1: rank 0's own input; else the prefix up to r, for scan the
        # output itself, for exscan a scratch slot (the output stops at r-1)
        fwd = own if r == 0 else (out if not exclusive else
                                  Region(SCRATCH, depth * chunk + (i % depth) * chunk, k))
        if r > 0:
            slot = Region(SCRATCH, (i % depth) * chunk, k)
            if not exclusive:
                after = (Reduce(out, slot, own),)
            elif spec.inplace:        # the output is the input: combine, then overwrite
                after = ((Reduce(fwd, slot, own),) if nxt is not None else ()) + \
                    (Copy(out, slot),)
            else:
                slot = out            # received straight into the output
                after = (Reduce(fwd, out, own),) if nxt is not None else ()
            units.append(Unit((), ((prv, slot),), after))
        if nxt is not None:
            units.append(Unit(((nxt, fwd),), ()))
    yield from pipeline(units, 2 * depth)


def scan_chain(spec: Spec):
    yield from _chain(spec, False)


def exscan_chain(spec: Spec):
    yield from _chain(spec, True)
