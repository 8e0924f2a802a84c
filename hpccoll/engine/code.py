"""Shared-memory programs turned into straight-line code, once per plan.

A ProgramLane interprets its program's steps: for each one it looks at the step's type,
turns every region into a view (a slot of the area, a peer's registered buffer, a slice of
the caller's arrays) and calls the reduction backend.  For the programs of node-shared
memory (algorithms/shm.py) most of that is the same at every call: the slot a relative
epoch uses is fixed (every such collective starts on a multiple of ``shm_slots``:
core/plan.py), so are peers' registered buffers, the op's ufunc and the flags' memory.
``build`` works all of it out once, per plan; what is left per call is slicing the
caller's arrays and adding the collective's epoch base.  Measured on a 64 KiB float32
allreduce at 2 ranks, the interpretation cost more than the data movement itself.

``native`` encodes the instructions once more for the C executor (``_native.c``), which
runs them in one call per poll instead of a Python dispatch and NumPy call each: a 64 KiB
allreduce at 2 ranks spent about a third of its time there.

Instructions are tuples ``(opcode, ...)``, one per step, so the lane's program counter
and its diagnosis (``waiting`` is the step it waits on) are those of the program.  An
operand is an array (shared memory: fixed) or ``(buf, lo, hi)``: a slice of the call's
send, receive or scratch array.  Only host programs of shared-memory primitives are
compiled (no MPI transfer, no kernel backend); the others are interpreted as before.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..algorithms.primitives import (PEER, PRECV, PSEND, SLOT, Copy, Publish, Reduce, ReduceN,
                                     Scale, Signal, WaitFlags)
from ..core import ops as table
from ..transport import cma
from ..transport.shm import ADDR, FLAG_STRIDE

WAIT, SIGNAL, COPY, UFUNC, REDUCE_N, REDUCE2, SCALE, PUBLISH, READ = range(9)

try:                        # built at install where a C compiler is present (setup.py)
    from . import _native
except ImportError:         # pragma: no cover - depends on the install
    _native = None

# the reductions _native.c has, in its FNS order: dtype-major, then these ops
NATIVE_DTYPES = tuple(np.dtype(t) for t in ("i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8",
                                            "f4", "f8"))
NATIVE_OPS = ("sum", "prod", "max", "min")
# a reduction's sources and a wait's peers are the ranks of a node: what one row holds
C_MAX_RANKS = (_native.NROW - 6) // 2 if _native is not None else 0


def c_reduces(dtype: np.dtype, op: Optional[str]) -> bool:
    """Whether the C executor has this reduction (op None: nothing to reduce).  Float max
    and min stay NumPy's (its NaN and signed-zero rules)."""
    if op is None:
        return True
    return (op in NATIVE_OPS and dtype in NATIVE_DTYPES
            and not (dtype.kind == "f" and op in ("max", "min")))


def _flag(area, q: int, flag: int) -> memoryview:
    """Rank q's counter ``flag`` as a one-element memoryview: reading it gives a Python int
    (an aligned 8-byte load), without a NumPy scalar."""
    i = flag * FLAG_STRIDE
    return memoryview(area.flags[q][i:i + 1])


def build(program, shm, dtype: np.dtype, op: Optional[str]) -> Optional[tuple]:
    """The instructions of ``program`` with the shared-memory runtime ``shm`` (engine/lane.py:
    Shm) for data of ``dtype`` reduced with ``op``, or None where it cannot be compiled."""
    area = shm.area
    slots = area.slots

    def operand(reg):
        b = reg.buf
        if b.__class__ is not tuple:
            return (b, reg.off, reg.off + reg.n)
        if b[0] == SLOT:
            # the collective's epoch base is a multiple of the slot count: relative epoch e
            # always uses slot e mod slots
            whole = area.slot(b[1], b[2] % slots).view(dtype)
        elif b[0] == PSEND:
            whole = shm.peer_send[b[1]]
        elif b[0] == PRECV:
            whole = shm.peer_recv[b[1]]
        else:
            raise ValueError(f"unknown region {b!r}")
        return whole[reg.off:reg.off + reg.n]

    def peer(reg):
        """A region of what rank q published: (its address word, its pid, byte offset,
        bytes), read by a single copy (transport/cma.py)."""
        _, q, buf = reg.buf
        return (_flag(area, q, ADDR + buf), area.pids[q], reg.off * dtype.itemsize,
                reg.n * dtype.itemsize)

    ufunc = table.OPS[op].ufunc if op is not None else None
    plain = op is not None and table.accumulator(dtype) == dtype
    code = []
    for p in program.steps:
        kind = type(p)
        if kind is WaitFlags:
            code.append((WAIT, tuple(_flag(area, q, p.flag) for q in p.peers), p.epoch, p))
        elif kind is Signal:
            code.append((SIGNAL, _flag(area, area.rank, p.flag), p.epoch))
        elif kind is Copy and p.src.buf.__class__ is tuple and p.src.buf[0] == PEER:
            code.append((READ, operand(p.dst), peer(p.src)))
        elif kind is Copy:
            code.append((COPY, operand(p.dst), operand(p.src)))
        elif kind is Publish:
            code.append((PUBLISH, p.buf, _flag(area, area.rank, ADDR + p.buf)))
        elif kind is ReduceN:
            srcs = tuple(operand(r) for r in p.srcs)
            if plain and not p.divisor and len(srcs) >= 2:
                code.append((UFUNC, operand(p.dst), srcs, ufunc))
            else:
                code.append((REDUCE_N, operand(p.dst), srcs, (op, p.divisor)))
        elif kind is Reduce and op is not None:
            code.append((REDUCE2, operand(p.dst), (operand(p.a), operand(p.b)), op))
        elif kind is Scale:
            code.append((SCALE, operand(p.dst), operand(p.src), p.divisor))
        else:           # MPI transfers (hierarchical programs): interpreted
            return None
    return tuple(code)


def _address(a) -> int:
    return a.__array_interface__["data"][0]


def native(code: Optional[tuple], dtype: np.dtype, op: Optional[str]):
    """``code`` (build's instructions) encoded for _native.run: an int64 array of rows, the
    first a header (the bytes each of the call's send, recv and scratch buffers must hold),
    or None where the C executor lacks something (not built, an instruction or reduction
    it does not have: those programs stay in Python)."""
    if _native is None or code is None:
        return None
    row, itemsize = _native.NROW, dtype.itemsize
    fn = None
    if op is not None and c_reduces(dtype, op):
        fn = NATIVE_DTYPES.index(dtype) * len(NATIVE_OPS) + NATIVE_OPS.index(op)
    rows = np.zeros((len(code) + 1, row), np.int64)
    need = [0, 0, 0]

    def operand(x, out, at) -> int:
        """Write operand x (its kind and offset) at rows[out, at:at + 2]; its bytes."""
        if x.__class__ is tuple:
            b, lo, hi = x
            need[b] = max(need[b], hi * itemsize)
            rows[out, at:at + 2] = b, lo * itemsize
            return (hi - lo) * itemsize
        rows[out, at:at + 2] = 3, _address(x)
        return x.nbytes

    for i, ins in enumerate(code, 1):
        k = ins[0]
        if k == WAIT:
            flags = ins[1]
            if 3 + len(flags) > row:
                return None
            rows[i, :3] = 0, ins[2], len(flags)
            for j, f in enumerate(flags):
                rows[i, 3 + j] = _address(np.frombuffer(f, np.int64))
        elif k == SIGNAL:
            rows[i, :3] = 1, ins[2], _address(np.frombuffer(ins[1], np.int64))
        elif k == COPY:
            rows[i, 0] = 2
            n = operand(ins[1], i, 1)
            if operand(ins[2], i, 3) != n:
                return None
            rows[i, 5] = n
        elif k == PUBLISH:
            rows[i, :3] = 4, ins[1], _address(np.frombuffer(ins[2], np.int64))
        elif k == READ:
            rows[i, 0] = 5
            operand(ins[1], i, 1)
            word, pid, off, n = ins[2]
            rows[i, 3:7] = _address(np.frombuffer(word, np.int64)), pid, off, n
        elif k == UFUNC and fn is not None and 6 + 2 * len(ins[2]) <= row:
            rows[i, 0] = 3
            n = operand(ins[1], i, 1)
            rows[i, 3:6] = n // itemsize, fn, len(ins[2])
            for j, s in enumerate(ins[2]):
                if operand(s, i, 6 + 2 * j) != n:
                    return None
        else:
            return None
    rows[0, :4] = _native.MAGIC, *need
    return rows


def run(lane) -> bool:
    """ProgramLane.run for compiled code: execute until a flag wait that does not hold yet,
    or the end.  True if anything moved."""
    native = lane.shm.native
    if native is not None:
        start = lane.pc
        b = lane.bufs
        pc, waits = _native.run(native, start, lane.base, b[0], b[1], b[2])
        lane.pc = pc
        lane.waits_done += waits
        code = lane.code
        if pc < len(code):
            lane.waiting = code[pc][3]
            return pc != start
        lane.waiting = None
        return True
    code = lane.code
    bufs = lane.bufs
    base = lane.base
    fence = lane.shm.area.fence
    pc = start = lane.pc
    end = len(code)
    while pc < end:
        ins = code[pc]
        k = ins[0]
        if k == WAIT:
            v = base + ins[2]
            for f in ins[1]:
                if f[0] < v:
                    lane.pc = pc
                    lane.waiting = ins[3]
                    return pc != start
            fence()            # counter before data (transport/shm.py)
            lane.waits_done += 1
        elif k == SIGNAL:
            fence()            # data before counter
            ins[1][0] = base + ins[2]
        elif k == COPY:
            d, s = ins[1], ins[2]
            if d.__class__ is tuple:
                d = bufs[d[0]][d[1]:d[2]]
            if s.__class__ is tuple:
                s = bufs[s[0]][s[1]:s[2]]
            d[...] = s         # (one dtype: np.copyto's dispatch adds a Python call)
        elif k == PUBLISH:
            ins[2][0] = _address(bufs[ins[1]])
        elif k == READ:
            d = ins[1]
            if d.__class__ is tuple:
                d = bufs[d[0]][d[1]:d[2]]
            word, pid, off, n = ins[2]
            if n:
                cma.read(pid, _address(d), word[0] + off, n)
        else:
            d = ins[1]
            if d.__class__ is tuple:
                d = bufs[d[0]][d[1]:d[2]]
            if k == SCALE:
                s = ins[2]
                if s.__class__ is tuple:
                    s = bufs[s[0]][s[1]:s[2]]
                table.scale(d, s, ins[3])
            else:
                srcs = []      # (a loop: a comprehension is a call of its own)
                for s in ins[2]:
                    srcs.append(s if s.__class__ is not tuple else bufs[s[0]][s[1]:s[2]])
                if k == UFUNC:
                    u = ins[3]
                    u(srcs[0], srcs[1], out=d)
                    for s in srcs[2:]:
                        u(d, s, out=d)
                elif k == REDUCE_N:
                    table.reduce_n(ins[3][0], d, srcs, ins[3][1])
                else:
                    table.reduce2(ins[3], d, srcs[0], srcs[1])
        pc += 1
    lane.pc = pc
    lane.waiting = None
    return True
