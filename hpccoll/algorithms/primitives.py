"""The primitives step machines yield, and the pipelining helper they share.

A step machine is a generator over these primitives; it makes no MPI call and
touches no data.  The engine carries each primitive out:

- ``Post(h, sends, recvs)``: start the transfers (nonblocking) and name them ``h``.
- ``Wait(h)``: resume once every transfer of ``h`` completed.  The only point where
  a collective can be suspended; its context is the program counter plus the
  transfers still in flight, so nothing done before is redone.
- ``Reduce(dst, a, b)``: dst = a (op) b.   ``Copy(dst, src)``.
- ``Scale(dst, src, k)``: dst = src / k (dst may be src).  An ``avg`` divides every
  contribution by the number of ranks before it is summed (``prescaled`` below), so that
  no partial sum leaves the range of the average (see hpccoll/core/ops.py).

Regions name one of three buffers: ``SEND`` (the input, never written), ``RECV``
(the output) and ``SCRATCH`` (engine-provided; its size is the largest extent any
region of the program reaches).

Shared-memory step machines (algorithms/shm.py) add three primitives and regions in
other ranks' memory:

- ``Signal(flag, e)``: publish "my counter ``flag`` reached epoch e" (memory barrier first);
- ``WaitFlags(flag, e, peers)``: resume once every peer's counter ``flag`` >= e (a
  suspension point, like Wait);
- ``ReduceN(dst, srcs, k)``: dst = srcs[0] (op) srcs[1] (op) ..., in the accumulator type,
  rounded once; k (avg): every source divided by k first; dst may alias srcs[0] only;
- regions ``(SLOT, q, e)``: rank q's staging slot for epoch e; ``(PSEND, q)`` /
  ``(PRECV, q)``: rank q's registered send/receive buffer;
- ``Publish(buf)``: make this call's buffer ``buf`` (SEND, RECV or SCRATCH) readable by
  the peers until the program ends (its address goes into this rank's segment, one word
  per buffer; the next Signal publishes it), and region ``(PEER, q, buf)``: that buffer
  of rank q, in q's own process, read (a Copy from it) or written (a Copy into it) by a
  single copy through the kernel (single-copy programs, algorithms/cma.py: Linux Cross
  Memory Attach, ``process_vm_readv`` and ``process_vm_writev``).

Epochs are relative to the collective; the engine adds the communicator's running
epoch, so programs stay cacheable and data-independent.
"""
from __future__ import annotations

from collections import deque
from typing import Iterable, Iterator, NamedTuple

SEND, RECV, SCRATCH = 0, 1, 2
BUF_NAMES = ("send", "recv", "scratch")


class Region(NamedTuple):
    buf: int
    off: int
    n: int


class Post(NamedTuple):
    h: int
    sends: tuple  # ((peer, Region), ...)
    recvs: tuple  # ((peer, Region), ...)


class Wait(NamedTuple):
    h: int


class Reduce(NamedTuple):
    dst: Region
    a: Region
    b: Region


class Copy(NamedTuple):
    dst: Region
    src: Region


class Scale(NamedTuple):
    dst: Region
    src: Region
    divisor: int


# shared-memory regions and flags (algorithms/shm.py)
SLOT, PSEND, PRECV, PEER = "slot", "psend", "precv", "peer"
READY, REDUCED, CONSUMED = 0, 1, 2
FLAG_NAMES = ("ready", "reduced", "consumed")


class Signal(NamedTuple):
    flag: int
    epoch: int


class WaitFlags(NamedTuple):
    flag: int
    epoch: int
    peers: tuple


class Publish(NamedTuple):
    buf: int


class ReduceN(NamedTuple):
    dst: Region
    srcs: tuple
    divisor: int = 0


class Unit(NamedTuple):
    """One pipelined transfer: post sends/recvs, then run ``after`` once they completed."""
    sends: tuple
    recvs: tuple
    after: tuple = ()


def partition(count: int, parts: int) -> list[tuple[int, int]]:
    """(offset, size) of ``parts`` contiguous blocks covering ``count``; sizes differ by <= 1."""
    base, extra = divmod(count, parts)
    return [(i * base + min(i, extra), base + (1 if i < extra else 0)) for i in range(parts)]


def chunk_ranges(size: int, chunk: int) -> list[tuple[int, int]]:
    """(offset, n) pieces of at most ``chunk`` elements covering ``size``."""
    return [(lo, min(chunk, size - lo)) for lo in range(0, size, chunk)]


def _overlaps(x: Region, y: Region) -> bool:
    return (x.buf == y.buf and x.n > 0 and y.n > 0
            and x.off < y.off + y.n and y.off < x.off + x.n)


def _reads(u: Unit) -> list[Region]:
    out = [reg for _, reg in u.sends]
    for p in u.after:
        if isinstance(p, Reduce):
            out += [p.a, p.b]
        elif isinstance(p, Copy):
            out.append(p.src)
        elif isinstance(p, Scale):
            out.append(p.src)
    return out


def _writes(u: Unit) -> list[Region]:
    return [reg for _, reg in u.recvs] + [p.dst for p in u.after]


def _conflict(posted: Unit, new: Unit) -> bool:
    """True when ``new`` may not be posted while ``posted`` is in flight (or its after pending)."""
    pw, pr = _writes(posted), _reads(posted)
    nw, nr = _writes(new), _reads(new)
    return any(_overlaps(a, b) for a in pw for b in nr + nw) or \
        any(_overlaps(a, b) for a in pr for b in nw)


def pipeline(units: Iterable[Unit], depth: int) -> Iterator:
    """Keep up to ``depth`` units in flight, in order, never two that touch the same data.

    Handles are the units' indices; they are unique while in flight, which is all
    the engine needs (a handle is forgotten once waited).
    """
    inflight: deque = deque()

    def retire():
        h, u = inflight.popleft()
        yield Wait(h)
        yield from u.after

    for h, u in enumerate(units):
        if not u.sends and not u.recvs:
            # nothing to transfer: run the local part in order
            while inflight:
                yield from retire()
            yield from u.after
            continue
        while inflight and (len(inflight) >= depth or any(_conflict(p, u) for _, p in inflight)):
            yield from retire()
        yield Post(h, u.sends, u.recvs)
        inflight.append((h, u))
    while inflight:
        yield from retire()


def scratch_extent(program: Iterable) -> int:
    """Elements of scratch a program touches (regions are data-independent, so this is exact)."""
    top = 0

    def see(reg: Region):
        nonlocal top
        if reg.buf == SCRATCH:
            top = max(top, reg.off + reg.n)

    for p in program:
        if isinstance(p, Post):
            for _, reg in p.sends + p.recvs:
                see(reg)
        elif isinstance(p, Reduce):
            see(p.dst), see(p.a), see(p.b)
        elif isinstance(p, Copy):
            see(p.dst), see(p.src)
        elif isinstance(p, Scale):
            see(p.dst), see(p.src)
    return top


def prescaled(steps, divisor: int, extent: int, inplace: bool, base: int):
    """An ``avg`` program from a sum program: every contribution divided by ``divisor``
    before anything reads it.  In place the input is the user's output buffer, divided
    where it lies; otherwise the input (``extent`` elements of SEND) is divided into
    SCRATCH from element ``base`` on and every read of SEND reads that copy."""
    if inplace:
        if extent:
            whole = Region(SEND, 0, extent)
            yield Scale(whole, whole, divisor)
        yield from steps
        return
    if extent:
        yield Scale(Region(SCRATCH, base, extent), Region(SEND, 0, extent), divisor)

    def moved(reg):
        return Region(SCRATCH, base + reg.off, reg.n) if reg.buf == SEND else reg

    for p in steps:
        kind = type(p)
        if kind is Post:
            yield Post(p.h, tuple((q, moved(g)) for q, g in p.sends), p.recvs)
        elif kind is Reduce:
            yield Reduce(p.dst, moved(p.a), moved(p.b))
        elif kind is Copy:
            yield Copy(p.dst, moved(p.src))
        elif kind is ReduceN:
            yield ReduceN(p.dst, tuple(moved(g) for g in p.srcs), p.divisor)
        else:
            yield p
