"""Tree and chain algorithms rooted at one rank: broadcast and reduce.

Ranks are renumbered relative to the root (v = (rank - root) mod n) so that the
root is 0; ``_abs`` maps back.
"""
from __future__ import annotations

from .primitives import RECV, SCRATCH, SEND, Copy, Post, Reduce, Region, Unit, Wait, \
    chunk_ranges, pipeline
from .spec import Spec


def _abs(spec: Spec, v: int) -> int:
    return (v + spec.root) % spec.size


def broadcast(spec: Spec):
    """Binomial tree: log2(n) rounds of whole-message sends; for small messages."""
    n, count = spec.size, spec.count
    if n == 1 or count == 0:
        return
    v = (spec.rank - spec.root) % n
    whole = Region(RECV, 0, count)
    mask = 1
    while mask < n:
        if v & mask:  # receive from the parent, the rank that differs in this bit
            yield Post(0, (), ((_abs(spec, v - mask), whole),))
            yield Wait(0)
            break
        mask <<= 1
    children = []
    mask >>= 1
    while mask > 0:
        if v + mask < n:
            children.append((_abs(spec, v + mask), whole))
        mask >>= 1
    if children:
        yield Post(1, tuple(children), ())
        yield Wait(1)


def broadcast_chain(spec: Spec):
    """Pipelined chain root -> root+1 -> ...: each chunk is forwarded as soon as it arrived."""
    n, count = spec.size, spec.count
    if n == 1 or count == 0:
        return
    v = (spec.rank - spec.root) % n
    units = []
    for lo, k in chunk_ranges(count, spec.chunk):
        reg = Region(RECV, lo, k)
        if v > 0:
            units.append(Unit((), ((_abs(spec, v - 1), reg),)))
        if v < n - 1:
            units.append(Unit(((_abs(spec, v + 1), reg),), ()))
    yield from pipeline(units, 2 * spec.depth)


def reduce(spec: Spec):
    """Binomial tree: receive every child's partial sum at once, reduce in a fixed order,
    pass the result to the parent.  For small messages."""
    n, count = spec.size, spec.count
    whole = Region(RECV, 0, count)
    if not spec.inplace and count:
        yield Copy(whole, Region(SEND, 0, count))
    if n == 1 or count == 0:
        return
    v = (spec.rank - spec.root) % n
    children, mask = [], 1
    while mask < n and not v & mask:
        if v + mask < n:
            children.append(_abs(spec, v + mask))
        mask <<= 1
    slots = [Region(SCRATCH, i * count, count) for i in range(len(children))]
    if children:
        yield Post(0, (), tuple(zip(children, slots)))
        yield Wait(0)
        for slot in slots:
            yield Reduce(whole, whole, slot)
    if v != 0:
        yield Post(1, ((_abs(spec, v - mask), whole),), ())
        yield Wait(1)
