"""What one benchmark measurement runs: buffer shapes and bandwidth factors (as
nccl-tests defines them), inputs and their independently computed expectation, and
the call each library makes on the same buffers.

Inputs are small integers from a hash of (rank, element index), so every rank can
compute any other rank's input, and therefore every expected result, without
communicating; and sums of them are exact in every floating type, so a correct result
equals the expectation bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

COLLECTIVES = ("allreduce", "reduce", "broadcast", "allgather", "reducescatter", "alltoall")
_ALIASES = {"bcast": "broadcast", "reduce_scatter": "reducescatter", "all_reduce": "allreduce",
            "all_gather": "allgather", "all_to_all": "alltoall"}
REDUCING = ("allreduce", "reduce", "reducescatter")
ROOTED = ("reduce", "broadcast")
PER_RANK = ("allgather", "reducescatter", "alltoall")   # count is per rank (per peer)
LIBRARIES = ("hpccoll", "mpi")

# nccl-tests' names (what the table prints) -> numpy dtype names (what files store)
TYPES = {"int8": "int8", "uint8": "uint8", "int32": "int32", "uint32": "uint32",
         "int64": "int64", "uint64": "uint64", "half": "float16", "float": "float32",
         "double": "float64", "bfloat16": "bfloat16"}
_TYPE_ALIASES = {"char": "int8", "int": "int32", "float16": "half", "fp16": "half",
                 "float32": "float", "fp32": "float", "float64": "double", "fp64": "double",
                 "bf16": "bfloat16"}
OPS = ("sum", "prod", "max", "min", "avg")     # nccl-tests' order
# largest integer each floating type holds exactly: inputs shrink so sums stay below it
_EXACT = {"float16": 2048, "bfloat16": 256, "float32": 1 << 24, "float64": 1 << 53}


def canonical_collective(name: str) -> Optional[str]:
    key = name.strip().lower().replace("-", "_")
    key = _ALIASES.get(key, key).replace("_", "")
    return key if key in COLLECTIVES else None


def canonical_type(name: str) -> Optional[str]:
    key = name.strip().lower()
    key = _TYPE_ALIASES.get(key, key)
    return key if key in TYPES else None


def numpy_dtype(type_name: str) -> np.dtype:
    from ..base.ops import DTYPES
    name = TYPES[type_name]
    if name not in DTYPES:
        raise ValueError(f"{type_name} needs the ml_dtypes package (pip install ml_dtypes)")
    return DTYPES[name]


def busbw_factor(coll: str, nranks: int) -> float:
    """nccl-tests' bus bandwidth factors: busbw = algbw * factor."""
    if coll == "allreduce":
        return 2.0 * (nranks - 1) / nranks
    if coll in ("reducescatter", "allgather", "alltoall"):
        return (nranks - 1) / nranks
    return 1.0


@dataclass(frozen=True)
class Shape:
    """Element counts of one size: ``count`` is nccl-tests' count column (per rank for
    allgather and reducescatter, per peer for alltoall), ``send``/``recv`` the buffers."""
    coll: str
    count: int
    send: int
    recv: int
    itemsize: int

    @property
    def nbytes(self) -> int:
        """The size column, and the numerator of algbw: the larger buffer, in bytes."""
        return max(self.send, self.recv) * self.itemsize


def shape(coll: str, nbytes: int, itemsize: int, nranks: int) -> Shape:
    total = nbytes // itemsize
    if coll not in PER_RANK:
        return Shape(coll, total, total, total, itemsize)
    m = total // nranks
    send = m if coll == "allgather" else m * nranks
    recv = m if coll == "reducescatter" else m * nranks
    return Shape(coll, m, send, recv, itemsize)


def sizes(minbytes: int, maxbytes: int, stepbytes: int, stepfactor: int):
    """The sweep nccl-tests makes: multiply by stepfactor when it is > 1, else add
    stepbytes (a lazy range then: -i 8 up to 1G is a long sweep, not a huge list)."""
    if stepfactor <= 1:
        return range(minbytes, maxbytes + 1, stepbytes)
    out, size = [], minbytes
    while size <= maxbytes:
        out.append(size)
        size *= stepfactor
    return out


# -- inputs and expectations --------------------------------------------------------------
def _hash(rank: int, start: int, n: int, seed: int) -> np.ndarray:
    i = np.arange(start, start + n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        h = i * np.uint64(0x9E3779B97F4A7C15) + np.uint64((rank * 0xBF58476D1CE4E5B9 + seed) % (1 << 64))
        h ^= h >> np.uint64(31)
        h *= np.uint64(0x94D049BB133111EB)
        h ^= h >> np.uint64(29)
    return h


def fill(rank: int, n: int, dtype: np.dtype, op: Optional[str], nranks: int,
         start: int = 0) -> np.ndarray:
    """Rank ``rank``'s input, elements [start, start+n): small integers in the dtype.
    prod gets mostly ones and a few twos so products stay exact."""
    h = _hash(rank, start, n, 0)
    if op == "prod":
        v = 1 + (h % np.uint64(9) == 0).astype(np.int64)
    else:
        limit = _EXACT.get(np.dtype(dtype).name)   # None: integers, which wrap alike everywhere
        k = 4 if limit is None else max(1, min(4, limit // max(1, nranks)))
        v = (h % np.uint64(2 * k + 1)).astype(np.int64)
        if np.dtype(dtype).kind != "u":
            v -= k
    return v.astype(dtype)


def garbage(n: int, dtype: np.dtype) -> np.ndarray:
    """What output buffers hold before a checked collective: NaN for floating types,
    the most negative (unsigned: largest) value otherwise, so an element the collective
    never wrote cannot pass as correct."""
    if dtype.kind == "f" or dtype.name == "bfloat16":
        return np.full(n, np.nan, dtype=np.float32).astype(dtype)
    info = np.iinfo(dtype)
    return np.full(n, info.max if dtype.kind == "u" else info.min, dtype=dtype)


_UFUNCS = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


def _reduced(op: str, dtype: np.dtype, nranks: int, n: int, start: int) -> np.ndarray:
    acc = fill(0, n, dtype, op, nranks, start).copy()
    for k in range(1, nranks):
        _UFUNCS[op](acc, fill(k, n, dtype, op, nranks, start), out=acc)
    if op == "avg":
        np.divide(acc, nranks, out=acc, casting="unsafe")
    return acc


def expected(coll: str, sh: Shape, dtype: np.dtype, op: Optional[str], root: int, rank: int,
             nranks: int) -> Optional[np.ndarray]:
    """This rank's correct output, or None where the result is unspecified (reduce off root)."""
    m = sh.count
    if coll == "allreduce":
        return _reduced(op, dtype, nranks, m, 0)
    if coll == "reduce":
        return _reduced(op, dtype, nranks, m, 0) if rank == root else None
    if coll == "broadcast":
        return fill(root, m, dtype, None, nranks)
    if coll == "allgather":
        return np.concatenate([fill(k, m, dtype, None, nranks) for k in range(nranks)])
    if coll == "reducescatter":
        return _reduced(op, dtype, nranks, m, rank * m)
    if coll == "alltoall":
        return np.concatenate([fill(k, m, dtype, None, nranks, rank * m) for k in range(nranks)])
    raise ValueError(coll)


# -- buffers and calls --------------------------------------------------------------------
class Case:
    """The buffers of one measurement (collective, size, dtype, op, root, placement), shared
    by every library, and how each library runs on them.  ``xp`` is numpy or cupy."""

    def __init__(self, coll: str, sh: Shape, dtype: np.dtype, op: Optional[str], root: int,
                 inplace: bool, rank: int, nranks: int, xp=np):
        self.coll, self.sh, self.dtype, self.op, self.root = coll, sh, dtype, op, root
        self.inplace, self.rank, self.nranks, self.xp = inplace, rank, nranks, xp
        if inplace:
            self.buf = xp.empty(max(sh.send, sh.recv), dtype=dtype)
        else:
            self.send = xp.empty(sh.send, dtype=dtype)
            self.recv = xp.empty(sh.recv, dtype=dtype)
        self._expected = None

    def _put(self, dst, host: np.ndarray) -> None:
        dst[...] = host if self.xp is np else self.xp.asarray(host)

    def reset(self) -> None:
        """Inputs where the collective reads them, garbage everywhere it writes."""
        coll, sh, dt, r, n = self.coll, self.sh, self.dtype, self.rank, self.nranks
        mine = fill(r, sh.send, dt, self.op, n)
        if coll == "broadcast" and r != self.root:
            mine = garbage(sh.send, dt)
        if self.inplace:
            if coll == "allgather":
                self._put(self.buf, garbage(sh.recv, dt))
                self._put(self.buf[r * sh.count:(r + 1) * sh.count], mine)
            else:
                self._put(self.buf, mine)
        else:
            self._put(self.send, mine)
            self._put(self.recv, garbage(sh.recv, dt))

    def output(self, library: str):
        """Where this rank's result is, or None if it is unspecified."""
        if self.coll == "reduce" and self.rank != self.root:
            return None
        if not self.inplace:
            return self.recv
        if self.coll == "reducescatter":
            m = self.sh.count
            # MPI_IN_PLACE puts the block at the start; NCCL/hpccoll leave it at block rank
            return self.buf[:m] if library == "mpi" else self.buf[self.rank * m:(self.rank + 1) * m]
        return self.buf

    def wrong(self, library: str) -> int:
        """Elements of this rank's output that differ from the expectation."""
        out = self.output(library)
        if out is None:
            return 0
        if self._expected is None:
            self._expected = expected(self.coll, self.sh, self.dtype, self.op, self.root,
                                      self.rank, self.nranks)
        host = out if self.xp is np else self.xp.asnumpy(out)
        # expectations hold no NaN, so the NaN garbage of an unwritten element counts too
        return int(np.count_nonzero(host != self._expected))

    # -- the calls -----------------------------------------------------------------------
    def call(self, library: str, comm) -> Callable[[], None]:
        """A function that runs the collective once and returns when it completed."""
        return (self._hpccoll if library == "hpccoll" else self._mpi)(comm)

    def _hpccoll(self, comm) -> Callable[[], None]:
        coll, op, root = self.coll, self.op, self.root
        s, r = (self.buf, self.buf) if self.inplace else (self.send, self.recv)
        if coll == "allreduce":
            return lambda: comm.allreduce(s, r, op).wait()
        if coll == "reduce":
            return lambda: comm.reduce(s, r, op, root).wait()
        if coll == "allgather":
            return lambda: comm.allgather(s, r).wait()
        if coll == "reducescatter":
            return lambda: comm.reduce_scatter(s, r, op).wait()
        if coll == "alltoall":
            return lambda: comm.alltoall(s, r).wait()
        # broadcast: in place by contract; out of place = the root's copy + in place
        if self.inplace:
            return lambda: comm.broadcast(s, root).wait()
        copy = self._root_copy()
        return lambda: (copy(), comm.broadcast(r, root).wait())

    def _root_copy(self):
        if self.rank != self.root:
            return lambda: None
        return lambda: self.xp.copyto(self.recv, self.send)

    def _mpi(self, mpi) -> Callable[[], None]:
        from mpi4py import MPI
        coll, root, n = self.coll, self.root, self.nranks
        xp = self.xp
        mop = {"sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN,
               "max": MPI.MAX}.get(self.op)
        ip = self.inplace
        s, r = (MPI.IN_PLACE, self.buf) if ip else (self.send, self.recv)
        out = self.output("mpi")

        def avg(fn):
            # MPI has no average: sum, then divide, as NCCL's avg does
            if self.op != "avg" or out is None:
                return fn
            return lambda: (fn(), xp.divide(out, n, out=out, casting="unsafe"))

        if coll == "allreduce":
            return avg(lambda: mpi.Allreduce(s, r, mop))
        if coll == "reduce":
            if ip and self.rank != root:
                s, r = self.buf, None
            return avg(lambda: mpi.Reduce(s, r, mop, root))
        if coll == "allgather":
            return lambda: mpi.Allgather(s, r)
        if coll == "reducescatter":
            return avg(lambda: mpi.Reduce_scatter_block(s, r, mop))
        if coll == "alltoall":
            return lambda: mpi.Alltoall(s, r)
        if ip:
            return lambda: mpi.Bcast(r, root)
        copy = self._root_copy()
        return lambda: (copy(), mpi.Bcast(r, root))

