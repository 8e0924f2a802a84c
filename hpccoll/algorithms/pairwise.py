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


def alltoallv(spec: Spec):
    """Alltoall with per-peer counts and offsets (MPI's Alltoallv): in step s rank r sends
    scounts[r+s] elements from sdispls[r+s] and receives counts[r-s] at displs[r-s].

    One message per peer, posted even when empty: ranks that disagree about a count then
    get a truncation error (a longer message) or a short block (a shorter one), as with
    MPI, never a stray message or a hang.  So blocks are not cut into chunks; the peers'
    messages are the pipeline's units."""
    r, n = spec.rank, spec.size
    sc, sd, rc, rd = spec.scounts, spec.sdispls, spec.counts, spec.displs
    src = SEND
    if spec.inplace:
        # blocks are overwritten while later steps still have to send them: work from a copy
        top = max((d + c for d, c in zip(sd, sc) if c), default=0)
        if top:
            yield Copy(Region(SCRATCH, 0, top), Region(SEND, 0, top))
        src = SCRATCH
    elif sc[r]:
        yield Copy(Region(RECV, rd[r], sc[r]), Region(SEND, sd[r], sc[r]))
    units = []
    for s in range(1, n):
        to, fr = (r + s) % n, (r - s) % n
        units.append(Unit(((to, Region(src, sd[to], sc[to])),), ((fr, Region(RECV, rd[fr], rc[fr])),)))
    yield from pipeline(units, max(spec.depth, 2))
