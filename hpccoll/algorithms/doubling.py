"""Logarithmic algorithms for small messages: recursive doubling allreduce, Bruck
allgather, dissemination barrier.  Any number of ranks."""
from __future__ import annotations

from .primitives import RECV, SCRATCH, SEND, Copy, Post, Reduce, Region, Wait
from .spec import Spec


def allreduce(spec: Spec):
    """Recursive doubling over the largest power of two p2 <= n; the n - p2 extra ranks first
    hand their data to a partner and get the result back at the end.  Partners compute
    a (op) b and b (op) a, which are bitwise equal for every op, so all ranks agree."""
    r, n, count = spec.rank, spec.size, spec.count
    whole, tmp = Region(RECV, 0, count), Region(SCRATCH, 0, count)
    if not spec.inplace and count:
        yield Copy(whole, Region(SEND, 0, count))
    if n == 1 or count == 0:
        return
    p2 = 1 << (n.bit_length() - 1)
    extra = n - p2
    if r >= p2:
        yield Post(0, ((r - p2, whole),), ())
        yield Wait(0)
        yield Post(1, (), ((r - p2, whole),))
        yield Wait(1)
        return
    if r < extra:
        yield Post(0, (), ((r + p2, tmp),))
        yield Wait(0)
        yield Reduce(whole, whole, tmp)
    mask = 1
    while mask < p2:
        partner = r ^ mask
        yield Post(0, ((partner, whole),), ((partner, tmp),))
        yield Wait(0)
        yield Reduce(whole, whole, tmp)
        mask <<= 1
    if r < extra:
        yield Post(1, ((r + p2, whole),), ())
        yield Wait(1)


def allgather(spec: Spec):
    """Bruck: after the round with distance d, scratch holds the blocks of ranks r .. r+2d-1;
    a final rotation puts them in rank order."""
    r, n, m = spec.rank, spec.size, spec.count
    if m == 0:
        return
    yield Copy(Region(SCRATCH, 0, m), Region(SEND, 0, m))
    dist = 1
    while dist < n:
        cnt = min(dist, n - dist)
        yield Post(0, (((r - dist) % n, Region(SCRATCH, 0, cnt * m)),),
                   (((r + dist) % n, Region(SCRATCH, dist * m, cnt * m)),))
        yield Wait(0)
        dist <<= 1
    # scratch block i belongs to rank (r + i) % n
    yield Copy(Region(RECV, r * m, (n - r) * m), Region(SCRATCH, 0, (n - r) * m))
    if r:
        yield Copy(Region(RECV, 0, r * m), Region(SCRATCH, (n - r) * m, r * m))


def allgather_direct(spec: Spec):
    """Everyone sends its block to everyone in one round: n-1 messages each way, one Wait.
    For tiny blocks on few ranks (the fingerprint check), where rounds cost more than
    messages."""
    r, n, m = spec.rank, spec.size, spec.count
    if not spec.inplace:
        yield Copy(Region(RECV, r * m, m), Region(SEND, 0, m))
    if n == 1 or m == 0:
        return
    peers = [q for q in range(n) if q != r]
    yield Post(0, tuple((q, Region(RECV, r * m, m)) for q in peers),
               tuple((q, Region(RECV, q * m, m)) for q in peers))
    yield Wait(0)


def barrier(spec: Spec):
    """Dissemination: in round k every rank signals r + 2^k and hears from r - 2^k."""
    r, n = spec.rank, spec.size
    empty = Region(RECV, 0, 0)
    dist = 1
    while dist < n:
        yield Post(0, (((r + dist) % n, empty),), (((r - dist) % n, empty),))
        yield Wait(0)
        dist <<= 1
