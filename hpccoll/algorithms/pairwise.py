"""Pairwise exchange alltoall: in step s rank r sends block r+s and receives block r-s.
Steps are independent, so chunks of several steps are in flight at once."""
from __future__ import annotations

from .primitives import RECV, SCRATCH, SEND, Copy, Region, Unit, chunk_ranges, pipeline
from .spec import Spec


def alltoall(spec: Spec):
    r, n, m = spec.rank, spec.size, spec.count
    if m == 0:
        return
    src = SEND
    if spec.inplace:
        # blocks are overwritten while later steps still have to send them: work from a copy
        yield Copy(Region(SCRATCH, 0, n * m), Region(SEND, 0, n * m))
        src = SCRATCH
    else:
        yield Copy(Region(RECV, r * m, m), Region(SEND, r * m, m))
    units = []
    for s in range(1, n):
        to, fr = (r + s) % n, (r - s) % n
        for lo, k in chunk_ranges(m, spec.chunk):
            units.append(Unit(((to, Region(src, to * m + lo, k)),), ((fr, Region(RECV, fr * m + lo, k)),)))
    yield from pipeline(units, max(spec.depth, 2))
