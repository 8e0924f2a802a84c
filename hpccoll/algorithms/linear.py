"""Linear gather and scatter: the root exchanges with every other rank directly.

Each block crosses once, straight between its owner and the root (no forwarding through
a tree), so this is the choice for large blocks; blocks are cut into chunks, each a
suspension point, and the root keeps chunks of every peer in flight at once.  The
variable-count forms (MPI's Gatherv and Scatterv) move one message per peer, posted even
when empty, as alltoallv does: ranks that disagree about a count then get a truncation
error or a short block, as with MPI, never a stray message or a hang.  Only the root
knows every count, so nothing else could be done with them anyway.
"""
from __future__ import annotations

from .primitives import RECV, SEND, Copy, Post, Region, Unit, Wait, chunk_ranges, pipeline
from .spec import Spec


def _peers(spec: Spec):
    """Every rank but the root, starting after it (the order the root serves them)."""
    return [(spec.root + i) % spec.size for i in range(1, spec.size)]


def gather(spec: Spec):
    r, n, m, root = spec.rank, spec.size, spec.count, spec.root
    if r == root:
        if not spec.inplace and m:
            yield Copy(Region(RECV, root * m, m), Region(SEND, 0, m))
        units = [Unit((), ((q, Region(RECV, q * m + lo, k)),))
                 for lo, k in chunk_ranges(m, spec.chunk) for q in _peers(spec)]
        yield from pipeline(units, max(spec.depth, n - 1))
    else:
        yield from pipeline([Unit(((root, Region(SEND, lo, k)),), ())
                             for lo, k in chunk_ranges(m, spec.chunk)], spec.depth)


def scatter(spec: Spec):
    r, n, m, root = spec.rank, spec.size, spec.count, spec.root
    if r == root:
        if not spec.inplace and m:
            yield Copy(Region(RECV, 0, m), Region(SEND, root * m, m))
        units = [Unit(((q, Region(SEND, q * m + lo, k)),), ())
                 for lo, k in chunk_ranges(m, spec.chunk) for q in _peers(spec)]
        yield from pipeline(units, max(spec.depth, n - 1))
    else:
        yield from pipeline([Unit((), ((root, Region(RECV, lo, k)),))
                             for lo, k in chunk_ranges(m, spec.chunk)], spec.depth)


def gatherv(spec: Spec):
    """The root receives counts[q] elements from rank q at displs[q] of its output; every
    other rank sends its ``count`` elements."""
    r, root = spec.rank, spec.root
    if r != root:
        yield Post(0, ((root, Region(SEND, 0, spec.count)),), ())
        yield Wait(0)
        return
    counts, displs = spec.counts, spec.displs
    if not spec.inplace and counts[root]:
        yield Copy(Region(RECV, displs[root], counts[root]), Region(SEND, 0, counts[root]))
    peers = _peers(spec)
    if peers:
        yield Post(0, (), tuple((q, Region(RECV, displs[q], counts[q])) for q in peers))
        yield Wait(0)


def scatterv(spec: Spec):
    """The root sends scounts[q] elements from sdispls[q] of its input to rank q; every
    other rank receives its ``count`` elements."""
    r, root = spec.rank, spec.root
    if r != root:
        yield Post(0, (), ((root, Region(RECV, 0, spec.count)),))
        yield Wait(0)
        return
    counts, displs = spec.scounts, spec.sdispls
    if not spec.inplace and counts[root]:
        yield Copy(Region(RECV, 0, counts[root]), Region(SEND, displs[root], counts[root]))
    peers = _peers(spec)
    if peers:
        yield Post(0, tuple((q, Region(SEND, displs[q], counts[q])) for q in peers), ())
        yield Wait(0)
