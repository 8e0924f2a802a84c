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

Instructions are tuples ``(opcode, ...)``, one per step, so the lane's program counter
and its diagnosis (``waiting`` is the step it waits on) are those of the program.  An
operand is an array (shared memory: fixed) or ``(buf, lo, hi)``: a slice of the call's
send, receive or scratch array.  Only host programs of shared-memory primitives are
compiled (no MPI transfer, no kernel backend); the others are interpreted as before.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..algorithms.primitives import (PRECV, PSEND, SLOT, Copy, Reduce, ReduceN, Scale, Signal,
                                     WaitFlags)
from ..core import ops as table
from ..transport.shm import FLAG_STRIDE

WAIT, SIGNAL, COPY, UFUNC, REDUCE_N, REDUCE2, SCALE = range(7)


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

    ufunc = table.OPS[op].ufunc if op is not None else None
    plain = op is not None and table.accumulator(dtype) == dtype
    code = []
    for p in program.steps:
        kind = type(p)
        if kind is WaitFlags:
            code.append((WAIT, tuple(_flag(area, q, p.flag) for q in p.peers), p.epoch, p))
        elif kind is Signal:
            code.append((SIGNAL, _flag(area, area.rank, p.flag), p.epoch))
        elif kind is Copy:
            code.append((COPY, operand(p.dst), operand(p.src)))
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


def run(lane) -> bool:
    """ProgramLane.run for compiled code: execute until a flag wait that does not hold yet,
    or the end.  True if anything moved."""
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
