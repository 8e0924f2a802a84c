"""Programs compiled into instructions, and the executor that runs them in Python.

A step machine's program (hpccoll/algorithms) is a tuple of primitives.  ``build`` turns
it into straight-line instructions once per plan: every region becomes either a fixed
array (a slot of the node-shared area, a peer's registered buffer) or ``(buf, lo, hi)``,
a slice of the call's send, receive or scratch array; an op becomes its NumPy ufunc
where NumPy runs it.  What is left per call is slicing the caller's arrays and adding
the collective's epoch base.  ``run`` executes them in Python: MPI point-to-point
programs, shared memory, device kernels alike; ``ProgramLane.run`` (engine/program.py)
hands a program the C executor has to ``_native.run`` instead.

``native`` encodes a program's instructions once more for the C executor
(``_native.c``), which runs them in one call per poll instead of a Python dispatch and a
NumPy call each (a 64 KiB allreduce at 2 ranks spent about a third of its time in that
Python).  The C side has the node-shared instructions only, on host buffers, with the
reductions it has (``c_reduces``); any other program runs here.  So there are two
executors of one instruction set: ``run`` below and ``_native.run``.  The C module's
opcodes, dtypes and ops are checked against this module's tables at import.

Instructions are tuples ``(opcode, ...)``, one per step, so a lane's program counter and
its diagnosis (``waiting``: the step or the transfers it waits on) are those of the
program.  An unknown step is an error at build time, never skipped.
"""
from __future__ import annotations

import importlib
import os
from functools import lru_cache
from typing import Optional

import numpy as np

from ..algorithms.primitives import (PEER, PRECV, PSEND, SLOT, Copy, Post, Publish, Reduce,
                                     ReduceN, Scale, Signal, Wait, WaitFlags)
from ..base import ops as table
from ..transport import cma, shm
from ..transport.shm import ADDR, CELL_RING, FLAG_STRIDE

# the instruction set (both executors; _native has the node-shared ones: NATIVE_OPCODES)
(WAIT, SIGNAL, COPY, UFUNC, REDUCE_N, REDUCE2, SCALE, PUBLISH, READ, POST, WAITREQ,
 OCOPY, OREDUCE2, OREDUCE_N, OSCALE, WRITE) = range(16)

# the C executor's tables: its opcodes, and its reductions in FNS order (dtype-major,
# then these ops)
NATIVE_OPCODES = {"WAIT": 0, "SIGNAL": 1, "COPY": 2, "REDUCE": 3, "PUBLISH": 4, "READ": 5,
                  "WRITE": 6}
NATIVE_DTYPES = tuple(np.dtype(t) for t in ("i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8",
                                            "f4", "f8"))
NATIVE_OPS = ("sum", "prod", "max", "min")


# the cells' collectives and the words of their layout (_native.c: cell_post, cell_done),
# in the C module's order
CELL_KINDS = ("allreduce", "reduce", "broadcast", "allgather", "reduce_scatter", "alltoall",
              "barrier", "gather", "scatter")
CELL_FIELDS = ("magic", "kind", "rank", "n", "root", "ring", "stride", "write", "block", "fn",
               "count", "result", "ref", "pid")
# larger than a cell, these cells hold the address of the writer's buffer, which the
# readers read in place (single copy: where the node's ranks may read each other's memory)
REF_KINDS = ("broadcast", "gather", "scatter")


def _checked(mod):
    """The C executor, once its tables are this module's (a build out of step with the
    source it came from must not run: it would reduce with the wrong function)."""
    got = (dict(mod.OPCODES), tuple(np.dtype(t) for t in mod.DTYPES), tuple(mod.OPS),
           mod.NFNS, tuple(mod.CELL_KINDS), tuple(mod.CELL_FIELDS))
    want = (NATIVE_OPCODES, NATIVE_DTYPES, NATIVE_OPS, len(NATIVE_DTYPES) * len(NATIVE_OPS),
            CELL_KINDS, CELL_FIELDS)
    if got != want:
        raise ImportError(f"hpccoll/engine/_native.c's tables {got} differ from "
                          f"engine/code.py's {want}: rebuild it (pip install -e .)")
    return mod


try:                        # built at install where a C compiler is present (setup.py)
    # (the extension module itself, not the package: engine/engine.py imports the lanes,
    # which import this module, and "from . import" would name the package)
    _built = importlib.import_module("._native", __package__)
except ImportError:         # pragma: no cover - depends on the install
    _native = None
else:
    _native = _checked(_built)

# a reduction's sources and a wait's peers are the ranks of a node: what one row holds
C_MAX_RANKS = (_native.NROW - 6) // 2 if _native is not None else 0


# Which copies into node-shared memory stream (_native.c: slot_stream_bytes,
# slot_stream_limit), by how long a cache line takes from one of the node's cores to
# another (handoff_ns): the first row whose bound (ns) holds gives the copy sizes that
# stream, from and below (-1: no bound).  Where a line hands off fast (the cores share
# their caches) a peer reads a cached copy from those caches, a streamed one from memory:
# 2 ranks, 60 ns handoffs, mpi4py's collectives in the same jobs, four jobs, medians
# (us), streamed from 32 KiB against streamed below 128 KiB: allreduce 64 KiB 17.3 /
# 12.8, 256 KiB 52.3 / 35.9, 1 MiB 157 / 130; reduce 1 MiB 100 / 70; reduce_scatter
# 1 MiB 86 / 44; allgather, broadcast no slower (all cached: allreduce 64 KiB 14.3;
# scatter 16 KiB cached 1.28-1.42x MPI, streamed 1.16-1.18x).  Where it hands off slowly
# (250 ns: the host placed the cores apart) every streamed size was ahead (1 MiB
# allreduce 1.63x MPI against 1.18x cached, gather 1.33x against 0.25x), from 16 KiB
# too: mpi4py interleaved, three jobs, from 16 KiB against from 32 KiB: Bcast 16 KiB
# 1.47-1.49x against 0.70-1.37x, Scatter 16 KiB 1.49-1.56 against 1.19-1.55, Allreduce
# 32 KiB 2.09-2.19 against 1.46-1.48, Allgather 32 KiB 2.37-2.73 against 1.27-1.33,
# Alltoall 32 KiB 1.98-2.23 against 1.07-1.09, Reduce 16-24 KiB even, Gather 16 KiB
# 1.45-1.51 against 1.47-1.66 (from 8 KiB: no better, Gather 16 KiB 1.22-1.25).
# Where it hands off fast, copies of 128-255 KiB stream too (50 ns, mpi4py interleaved,
# 2-3 jobs each, hpccoll's us, streamed below 256 KiB against below 128 KiB): Scatter
# 256 KiB 13 against 23 (1.25-1.35x against 0.73-0.77x MPI), Gather 256 KiB 17-18 against
# 19-20, Allgather 256 KiB 20-23 against 27, 384 KiB 30 against 39, Bcast 128 KiB 12
# against 20, Allreduce 256 KiB 39 against 42, Reduce and Reduce_scatter_block 256 and
# 384 KiB 3-7 us ahead, Alltoall 256 KiB and Bcast 192 KiB even; copies of 256-511 KiB
# stay cached (streamed: Allreduce 768 KiB 1.65-1.69x against 1.78-1.84x, Reduce_scatter
# 768 KiB 1.29-1.35 against 1.55-1.58, Gather 768 KiB 1.04-1.08 against 1.09-1.16).
# Not measured (one rank on the node, more ranks than cores): NOT_MEASURED.
SLOT_STREAMING = ((120.0, 32 << 10, 256 << 10), (float("inf"), 16 << 10, -1))
NOT_MEASURED = (32 << 10, -1)


def handoff_ns(node, rounds: int = 1000, runs: int = 3, limit_ns: int = 20_000_000) -> float:
    """The median one-way time (ns) a cache line takes between the node's local ranks 0
    and 1 (half a flag round trip; ``runs`` runs of ``rounds``, each given up after
    ``limit_ns``), rank 0's figure on every rank of ``node``; nan with fewer than two
    ranks or no C executor.  Collective over ``node``; the two ranks spin."""
    got = []
    if node.size > 1 and _native is not None:
        with shm.flag_lines(node) as lines:
            stopped = False
            for _ in range(runs):
                node.Barrier()
                if lines is not None and not stopped:
                    ns, done = _native.handoff(lines[0], lines[1], rounds, node.rank == 0,
                                               limit_ns)
                    stopped = done < rounds
                    if done:
                        got.append(ns / done / 2)
    return node.bcast(float(np.median(got)) if got else float("nan"), root=0)


def stream_slots(handoff: float) -> tuple:
    """Set which of the C executor's copies into node-shared memory stream, for a node
    whose cache lines hand off in ``handoff`` ns (SLOT_STREAMING; nan: NOT_MEASURED);
    returns (from, below) in bytes (-1: no bound)."""
    sizes = next(row[1:] for row in SLOT_STREAMING if handoff <= row[0]) \
        if handoff == handoff else NOT_MEASURED
    if _native is not None:
        _native.set_slot_stream_bytes(sizes[0])
        _native.set_slot_stream_limit(sizes[1])
    return sizes


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


def build(program, shm, dtype: np.dtype, op: Optional[str], host: bool = True) -> tuple:
    """The instructions of ``program`` for data of ``dtype`` reduced with ``op``.  ``shm``:
    the shared-memory runtime (engine/program.py: Shm) where the program uses the
    node-shared area, else None.  ``host``: NumPy runs the local steps (HostOps); False:
    the lane's reduction backend does (kernels with a block count, device arrays)."""
    area = shm.area if shm is not None else None

    def operand(reg):
        b = reg.buf
        if type(b) is not tuple:
            return (b, reg.off, reg.off + reg.n)
        if area is None:
            raise ValueError(f"region {b!r} of a program without node-shared memory")
        if b[0] == SLOT:
            # the collective's epoch base is a multiple of the slot count: relative epoch e
            # always uses slot e mod slots
            whole = area.slot(b[1], b[2] % area.slots).view(dtype)
        elif b[0] == PSEND:
            whole = shm.peer_send[b[1]]
        elif b[0] == PRECV:
            whole = shm.peer_recv[b[1]]
        else:
            raise ValueError(f"unknown region {b!r}")
        return whole[reg.off:reg.off + reg.n]

    def peer(reg):
        """A region of what rank q published: (its address word, its pid, byte offset,
        bytes), read or written by a single copy (transport/cma.py)."""
        _, q, buf = reg.buf
        return (_flag(area, q, ADDR + buf), area.pids[q], reg.off * dtype.itemsize,
                reg.n * dtype.itemsize)

    ufunc = table.OPS[op].ufunc if op is not None else None
    plain = op is not None and table.accumulator(dtype) == dtype
    code = []
    for p in program.steps:
        kind = type(p)
        if kind is Post:
            code.append((POST, p, tuple((q, operand(r)) for q, r in p.sends),
                         tuple((q, operand(r)) for q, r in p.recvs)))
        elif kind is Wait:
            code.append((WAITREQ, p.h))
        elif kind is WaitFlags:
            code.append((WAIT, tuple(_flag(area, q, p.flag) for q in p.peers), p.epoch, p))
        elif kind is Signal:
            code.append((SIGNAL, _flag(area, area.rank, p.flag), p.epoch))
        elif kind is Copy and type(p.src.buf) is tuple and p.src.buf[0] == PEER:
            code.append((READ, operand(p.dst), peer(p.src)))
        elif kind is Copy and type(p.dst.buf) is tuple and p.dst.buf[0] == PEER:
            code.append((WRITE, operand(p.src), peer(p.dst)))
        elif kind is Copy:
            code.append((COPY if host else OCOPY, operand(p.dst), operand(p.src)))
        elif kind is Publish:
            code.append((PUBLISH, p.buf, _flag(area, area.rank, ADDR + p.buf)))
        elif kind is ReduceN:
            srcs = tuple(operand(r) for r in p.srcs)
            if not host:
                code.append((OREDUCE_N, operand(p.dst), srcs, (op, p.divisor)))
            elif plain and not p.divisor and len(srcs) >= 2:
                code.append((UFUNC, operand(p.dst), srcs, ufunc))
            else:
                code.append((REDUCE_N, operand(p.dst), srcs, (op, p.divisor)))
        elif kind is Reduce and op is not None:
            code.append((REDUCE2 if host else OREDUCE2, operand(p.dst),
                         (operand(p.a), operand(p.b)), op))
        elif kind is Scale:
            code.append((SCALE if host else OSCALE, operand(p.dst), operand(p.src), p.divisor))
        else:
            raise ValueError(f"step {p!r} of program {getattr(program, 'algo', '?')!r} has "
                             f"no instruction (op {op!r})")
    return tuple(code)


@lru_cache(maxsize=1024)
def built(program, dtype: np.dtype, op: Optional[str], host: bool = True) -> tuple:
    """``build`` of a program without node-shared memory (its instructions depend on
    nothing else: made once per program, dtype, op and backend)."""
    return build(program, None, dtype, op, host)


def _address(a) -> int:
    return a.__array_interface__["data"][0]


def native(code: Optional[tuple], dtype: np.dtype, op: Optional[str]):
    """``code`` (build's instructions) encoded for _native.run: int64 rows (as bytes: a
    buffer C takes without an array's export, which cost a third of a waiter's poll), the
    first a header (the bytes each of the call's send, recv and scratch buffers must hold),
    or None where the C executor lacks something (not built, an instruction or reduction
    it does not have: those programs run in Python)."""
    if _native is None or code is None:
        return None
    row, itemsize = _native.NROW, dtype.itemsize
    ops = NATIVE_OPCODES
    fn = None
    if op is not None and c_reduces(dtype, op):
        fn = _fn(dtype, op)
    rows = np.zeros((len(code) + 1, row), np.int64)
    need = [0, 0, 0]
    writes = [False, False, False]     # (destinations: what must be writable)

    def dest(x):
        if type(x) is tuple:
            writes[x[0]] = True

    def operand(x, out, at) -> int:
        """Write operand x (its kind and offset) at rows[out, at:at + 2]; its bytes."""
        if type(x) is tuple:
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
            rows[i, :3] = ops["WAIT"], ins[2], len(flags)
            for j, f in enumerate(flags):
                rows[i, 3 + j] = _address(np.frombuffer(f, np.int64))
        elif k == SIGNAL:
            rows[i, :3] = ops["SIGNAL"], ins[2], _address(np.frombuffer(ins[1], np.int64))
        elif k == COPY:
            rows[i, 0] = ops["COPY"]
            dest(ins[1])
            n = operand(ins[1], i, 1)
            if operand(ins[2], i, 3) != n:
                return None
            rows[i, 5] = n
        elif k == PUBLISH:
            rows[i, :3] = ops["PUBLISH"], ins[1], _address(np.frombuffer(ins[2], np.int64))
        elif k == READ or k == WRITE:
            if k == READ:
                rows[i, 0] = ops["READ"]
                dest(ins[1])
            else:
                rows[i, 0] = ops["WRITE"]
            operand(ins[1], i, 1)
            word, pid, off, n = ins[2]
            rows[i, 3:7] = _address(np.frombuffer(word, np.int64)), pid, off, n
        elif k == UFUNC and fn is not None and 6 + 2 * len(ins[2]) <= row:
            rows[i, 0] = ops["REDUCE"]
            dest(ins[1])
            n = operand(ins[1], i, 1)
            rows[i, 3:6] = n // itemsize, fn, len(ins[2])
            for j, s in enumerate(ins[2]):
                if operand(s, i, 6 + 2 * j) != n:
                    return None
        else:
            return None
    rows[0, :5] = _native.MAGIC, *need, writes[1]
    return rows.tobytes()


def _fn(dtype: np.dtype, op: str) -> int:
    """The C reduction's index in FNS (dtype-major, then NATIVE_OPS)."""
    return NATIVE_DTYPES.index(dtype) * len(NATIVE_OPS) + NATIVE_OPS.index(op)


def cells_layout(area, coll: str, root: int, count: int, dtype: np.dtype,
                 op: Optional[str]) -> Optional[bytes]:
    """The layout of a cell collective for _native.cell_post and cell_done (CELL_FIELDS,
    then every rank's ring of cells and DONE word, then this rank's SEEN word), or None
    where cells cannot run it: no C module, a reduction it lacks, or more input than a
    cell holds (except a broadcast, gather or scatter where the node's ranks may read each
    other's memory: its cells then hold where the input is, ``ref``).  ``count``: elements
    per rank's block (the collective's count)."""
    if _native is None or coll not in CELL_KINDS or area is None or not area.cell_bytes:
        return None
    if op is not None and not c_reduces(dtype, op):
        return None
    n, p = area.size, area.rank
    root = root if root is not None and root >= 0 else 0
    block = count * dtype.itemsize
    whole = {"allreduce": block, "reduce": block, "broadcast": block,
             "allgather": block, "reduce_scatter": n * block, "alltoall": n * block,
             "barrier": 0, "gather": block, "scatter": n * block}[coll]
    ref = whole > area.cell_bytes
    if ref and not (area.cma and coll in REF_KINDS):
        return None
    result = {"allreduce": block, "reduce": block if p == root else 0,
              "broadcast": block if p != root else 0, "allgather": n * block,
              "reduce_scatter": block, "alltoall": n * block, "barrier": 0,
              "gather": n * block if p == root else 0, "scatter": block}[coll]
    fn = _fn(dtype, op) if op is not None else -1
    head = dict(magic=_native.CELL_MAGIC, kind=CELL_KINDS.index(coll), rank=p, n=n,
                root=root, ring=CELL_RING, stride=area.cell_stride, write=whole,
                block=block, fn=fn, count=count, result=result, ref=int(ref),
                pid=os.getpid())
    words = [head[f] for f in CELL_FIELDS]
    words += [area.cells(q) for q in range(n)] + [area.done_word(q) for q in range(n)]
    words.append(area.seen_word())
    return np.array(words, np.int64).tobytes()


def run(lane) -> bool:
    """Execute ``lane``'s instructions from its program counter until a wait that does not
    hold yet, or the end.  True if anything moved."""
    code = lane.code
    bufs = lane.bufs
    base = lane.base
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
            lane.shm.area.fence()      # counter before data (transport/shm.py)
            lane.waits_done += 1
        elif k == WAITREQ:
            h = ins[1]
            reqs, descr, finish = lane.inflight[h]
            if not lane._test(reqs):
                lane.pc = pc
                lane.waiting = h
                return pc != start
            del lane.inflight[h]
            if finish is not None:
                finish()
            lane.waits_done += 1
            for d in descr:
                lane.bytes_moved += d[2]
        elif k == POST:
            lane.inflight[ins[1].h] = lane._post(ins[1], ins[2], ins[3])
        elif k == SIGNAL:
            lane.shm.area.fence()      # data before counter
            ins[1][0] = base + ins[2]
        elif k == COPY:
            d, s = ins[1], ins[2]
            if type(d) is tuple:
                d = bufs[d[0]][d[1]:d[2]]
            if type(s) is tuple:
                s = bufs[s[0]][s[1]:s[2]]
            d[...] = s         # (one dtype: np.copyto's dispatch adds a Python call)
        elif k == PUBLISH:
            ins[2][0] = _address(bufs[ins[1]])
        elif k == READ or k == WRITE:
            d = ins[1]
            if type(d) is tuple:
                d = bufs[d[0]][d[1]:d[2]]
            word, pid, off, n = ins[2]
            if n and k == READ:
                cma.read(pid, _address(d), word[0] + off, n)
            elif n:
                cma.write(pid, word[0] + off, _address(d), n)
        else:
            d = ins[1]
            if type(d) is tuple:
                d = bufs[d[0]][d[1]:d[2]]
            if k == SCALE or k == OSCALE or k == OCOPY:
                s = ins[2]
                if type(s) is tuple:
                    s = bufs[s[0]][s[1]:s[2]]
                if k == SCALE:
                    table.scale(d, s, ins[3])
                elif k == OSCALE:
                    lane.ops.scale(d, s, ins[3])
                else:
                    lane.ops.copy(d, s)
            else:
                srcs = []      # (a loop: a comprehension is a call of its own)
                for s in ins[2]:
                    srcs.append(s if type(s) is not tuple else bufs[s[0]][s[1]:s[2]])
                if k == UFUNC:
                    u = ins[3]
                    u(srcs[0], srcs[1], out=d)
                    for s in srcs[2:]:
                        u(d, s, out=d)
                elif k == REDUCE_N:
                    table.reduce_n(ins[3][0], d, srcs, ins[3][1])
                elif k == REDUCE2:
                    table.reduce2(ins[3], d, srcs[0], srcs[1])
                elif k == OREDUCE_N:
                    lane.ops.reduce_n(ins[3][0], d, srcs, ins[3][1])
                elif k == OREDUCE2:
                    lane.ops.reduce(ins[3], d, srcs[0], srcs[1])
                else:
                    raise ValueError(f"unknown instruction {k} at {pc}")
        pc += 1
    lane.pc = pc
    lane.waiting = None
    lane.done = True
    lane._end()
    return True
