"""Tree and chain algorithms rooted at one rank: broadcast, reduce, gather and scatter.

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


# -- gather and scatter: the same binomial tree, blocks instead of sums -------------------
# Relative rank v's subtree holds blocks v .. v+span-1 (relative order), span the lowest
# set bit of v (all n for the root): a rank gathers its subtree's blocks, in relative
# order, before it passes them up in one message, and a scatter hands each child its
# subtree's blocks in one message.  Relative block c is absolute block (c + root) mod n:
# a child's blocks lie in one piece of the root's buffer unless they wrap past its end.

def _subtree(spec: Spec, v: int):
    """(span of v's subtree, [(child v, its span), ...] largest first, parent or None)."""
    n = spec.size
    low = v & -v if v else 1 << n.bit_length()
    children, k = [], 1
    while k < low and v + k < n:
        children.append((v + k, min(k, n - v - k)))
        k <<= 1
    children.reverse()
    return min(low, n - v), children, (None if v == 0 else _abs(spec, v - low))


def _root_blocks(spec: Spec, c: int, k: int):
    """The root buffer's pieces ((element offset, elements), ...) of relative blocks
    c .. c+k-1, in relative order: one piece, or two where they wrap past the end."""
    n, m = spec.size, spec.count
    a = _abs(spec, c)
    if a + k <= n:
        return ((a * m, k * m),)
    return ((a * m, (n - a) * m), (0, (a + k - n) * m))


def gather(spec: Spec):
    """Binomial tree: log2(n) rounds, each rank sends its subtree's blocks once; for small
    messages (the root receives (n-1)*m elements either way)."""
    n, m, root = spec.size, spec.count, spec.root
    v = (spec.rank - root) % n
    if v == 0 and not spec.inplace and m:
        yield Copy(Region(RECV, root * m, m), Region(SEND, 0, m))
    if n == 1 or m == 0:
        return
    span, children, parent = _subtree(spec, v)
    if v == 0:
        recvs, after = [], []
        for c, k in children:
            pieces = _root_blocks(spec, c, k)
            if len(pieces) == 1:
                recvs.append((_abs(spec, c), Region(RECV, pieces[0][0], k * m)))
                continue
            recvs.append((_abs(spec, c), Region(SCRATCH, 0, k * m)))
            lo = 0
            for off, size in pieces:
                after.append(Copy(Region(RECV, off, size), Region(SCRATCH, lo, size)))
                lo += size
        yield Post(0, (), tuple(recvs))
        yield Wait(0)
        yield from after
        return
    if not children:      # a leaf: its own block straight from the input
        yield Post(1, ((parent, Region(SEND, 0, m)),), ())
        yield Wait(1)
        return
    yield Copy(Region(SCRATCH, 0, m), Region(SEND, 0, m))
    yield Post(0, (), tuple((_abs(spec, c), Region(SCRATCH, (c - v) * m, k * m))
                            for c, k in children))
    yield Wait(0)
    yield Post(1, ((parent, Region(SCRATCH, 0, span * m)),), ())
    yield Wait(1)


def scatter(spec: Spec):
    """Binomial tree: the gather's tree run backwards; for small messages."""
    n, m, root = spec.size, spec.count, spec.root
    v = (spec.rank - root) % n
    if v == 0 and not spec.inplace and m:
        yield Copy(Region(RECV, 0, m), Region(SEND, root * m, m))
    if n == 1 or m == 0:
        return
    span, children, parent = _subtree(spec, v)
    if v == 0:
        sends = []
        for c, k in children:
            pieces = _root_blocks(spec, c, k)
            if len(pieces) == 1:
                sends.append((_abs(spec, c), Region(SEND, pieces[0][0], k * m)))
                continue
            lo = 0      # the wrapping child's blocks, put in one piece first
            for off, size in pieces:
                yield Copy(Region(SCRATCH, lo, size), Region(SEND, off, size))
                lo += size
            sends.append((_abs(spec, c), Region(SCRATCH, 0, k * m)))
        yield Post(1, tuple(sends), ())
        yield Wait(1)
        return
    if not children:      # a leaf: its block straight into the output
        yield Post(0, (), ((parent, Region(RECV, 0, m)),))
        yield Wait(0)
        return
    yield Post(0, (), ((parent, Region(SCRATCH, 0, span * m)),))
    yield Wait(0)
    yield Copy(Region(RECV, 0, m), Region(SCRATCH, 0, m))
    yield Post(1, tuple((_abs(spec, c), Region(SCRATCH, (c - v) * m, k * m))
                        for c, k in children), ())
    yield Wait(1)
