"""The one table of dtypes and reduction ops, for every backend.

Every path that reduces reads this table: the NumPy backend (below), the Numba CPU and
CUDA kernels (``numba_kernels``), the MPI library's own ops (the ``mpi`` algorithm row)
and the mpi4py adapter's ``MPI.Op`` map.  The rules, identical on every backend:

- float16 and bfloat16 accumulate in float32: sources are widened, combined in float32
  and the result is rounded once (``accumulator``).  A reduction of k sources in one
  step (shared memory's ``ReduceN``) rounds once for all k.
- ``avg`` is a sum of contributions each divided by the number of ranks first, in the
  accumulator type: every partial sum then stays within the range of the result, so an
  average that fits never overflows (a sum first would: float16 40000 + 40000 is inf).
- min and max propagate NaN, and of two equal values (0.0 and -0.0) give the later
  source, like NumPy's float32 and float64 ``minimum`` / ``maximum`` (its float16 loops
  give the earlier one: the float32 rule above covers float16 too).
- integers wrap like MPI's.

The NumPy functions here are the reference: ``tests/unit/test_ops.py`` checks that every
backend gives the same bits on the same inputs.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from ..errors import ArgumentError

try:  # bfloat16 where ml_dtypes is installed (the contract says "where ml_dtypes exists")
    import ml_dtypes as _ml_dtypes
    BFLOAT16: Optional[np.dtype] = np.dtype(_ml_dtypes.bfloat16)
except Exception:  # pragma: no cover - optional dependency
    BFLOAT16 = None

# Every collective hpccoll runs, in the order the fingerprint numbers them (ranks that
# disagree are told by name: base/mismatch.py).
COLLECTIVES = ("allreduce", "reduce", "broadcast", "allgather", "reduce_scatter", "alltoall",
               "barrier", "allgatherv", "reduce_scatterv", "alltoallv", "gather", "scatter",
               "scan", "exscan", "gatherv", "scatterv")

# The contract's dtypes first; the others exist for the mpi4py adapter.
_DTYPE_NAMES = ["int8", "uint8", "int32", "int64", "float16", "float32", "float64",
                "int16", "uint16", "uint32", "uint64", "complex64", "complex128", "bool"]
DTYPES: dict = {n: np.dtype(n) for n in _DTYPE_NAMES}
if BFLOAT16 is not None:
    DTYPES["bfloat16"] = BFLOAT16
CONTRACT_DTYPES = ("int8", "uint8", "int32", "int64", "float16", "float32", "float64")
DTYPE_CODE = {dt: i + 1 for i, dt in enumerate(DTYPES.values())}
_NAME_OF = {dt: name for name, dt in DTYPES.items()}
LOW_PRECISION = frozenset(dt for dt in (np.dtype(np.float16), BFLOAT16) if dt is not None)
# the dtypes MPI has a predefined datatype for (float16 and bfloat16: none)
MPI_DTYPES = frozenset(np.dtype(n) for n in (
    "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float32",
    "float64"))
_F32 = np.dtype(np.float32)


# Scalar combine functions: plain Python that Numba compiles for both targets.
def _sum(a, b):
    return a + b


def _prod(a, b):
    return a * b


def _min(a, b):
    # NaN propagates and a tie (0.0, -0.0) gives b: numpy.minimum's float32/float64 rule
    return a if (a < b or a != a) else b


def _max(a, b):
    return a if (a > b or a != a) else b


class Op(NamedTuple):
    name: str
    ufunc: Any                   # the NumPy reference
    kinds: str                   # dtype kinds it accepts: i u f c b
    combine: Optional[Callable]  # for the kernels; None: NumPy only (logical, bitwise)
    mpi: str                     # the mpi4py.MPI attribute of MPI's own op


OPS: dict = {op.name: op for op in (
    Op("sum", np.add, "iufc", _sum, "SUM"),
    Op("prod", np.multiply, "iufc", _prod, "PROD"),
    Op("min", np.minimum, "iuf", _min, "MIN"),
    Op("max", np.maximum, "iuf", _max, "MAX"),
    Op("avg", np.add, "fc", _sum, "SUM"),       # contributions divided by n, then summed
    Op("land", np.logical_and, "iub", None, "LAND"),
    Op("lor", np.logical_or, "iub", None, "LOR"),
    Op("lxor", np.logical_xor, "iub", None, "LXOR"),
    Op("band", np.bitwise_and, "iub", None, "BAND"),
    Op("bor", np.bitwise_or, "iub", None, "BOR"),
    Op("bxor", np.bitwise_xor, "iub", None, "BXOR"),
)}
CONTRACT_OPS = ("sum", "prod", "min", "max", "avg")
KERNEL_OPS = tuple(name for name, op in OPS.items() if op.combine is not None)
OP_CODE = {name: i + 1 for i, name in enumerate(OPS)}


def is_bfloat16(dt) -> bool:
    # not `dt == BFLOAT16`: without ml_dtypes that is `dt == None`, which NumPy reads as
    # "dt is the default dtype", float64
    return BFLOAT16 is not None and dt == BFLOAT16


def dtype_kind(dt: np.dtype) -> str:
    return "f" if is_bfloat16(dt) else dt.kind


def dtype_name(dt: np.dtype) -> str:
    return _NAME_OF.get(dt) or dt.name


def dtype_code(dt: np.dtype) -> int:
    return DTYPE_CODE.get(dt, 0)


def op_code(op: Optional[str]) -> int:
    return OP_CODE.get(op, 0) if op else 0


_VALID: dict = {}     # (op, dtype) pairs already checked -> canonical name


def check_op(op: Any, dt: np.dtype) -> str:
    """The op's canonical name, or an ArgumentError naming ``op``."""
    try:
        return _VALID[op, dt]
    except (KeyError, TypeError):
        pass
    if op.__class__ is str and op in OPS:
        name = op
    elif isinstance(op, str) and op.lower() in OPS:
        name = op.lower()
    else:
        raise ArgumentError(f"op: expected one of {', '.join(CONTRACT_OPS)}, got {op!r}")
    if dtype_kind(dt) not in OPS[name].kinds:
        if name == "avg":
            raise ArgumentError(f"op: 'avg' needs a floating dtype, got {dtype_name(dt)} "
                                "(use 'sum' and divide, or convert to float first)")
        raise ArgumentError(f"op: {name!r} is not defined for dtype {dtype_name(dt)}")
    if op.__class__ is str and dt in DTYPE_CODE:
        _VALID[op, dt] = name
    return name


def accumulator(dt: np.dtype) -> np.dtype:
    """The type sources are combined in: float32 for float16 and bfloat16."""
    return _F32 if dt in LOW_PRECISION else dt


def mpi_native(op: Optional[str], dt: np.dtype) -> bool:
    """The MPI library can run this reduction (or, op None, move this dtype) itself."""
    return dt in MPI_DTYPES and (op is None or op in CONTRACT_OPS)


# -- the NumPy reference backend -----------------------------------------------------------
_TEMP = threading.local()


def _temp(n: int, dt: np.dtype, which: int = 0) -> np.ndarray:
    """Scratch array ``which`` of n elements, reused per thread (no allocation per chunk)."""
    cache = _TEMP.__dict__.setdefault("arrays", {})
    buf = cache.get((dt, which))
    if buf is None or buf.size < n:
        buf = cache[(dt, which)] = np.empty(max(n, 4096), dt)
    return buf[:n]


def reduce2(op: str, dst, a, b) -> None:
    """dst = a (op) b; dst may alias a or b."""
    if dst.dtype in LOW_PRECISION:
        OPS[op].ufunc(a, b, out=dst, dtype=_F32, casting="unsafe")
    else:
        OPS[op].ufunc(a, b, out=dst)


def reduce_n(op: str, dst, srcs, divisor: int = 0) -> None:
    """dst = srcs[0] (op) srcs[1] (op) ... in order, in the accumulator type, rounded once;
    ``divisor`` (avg): every source is divided by it first.  dst may alias srcs[0] only."""
    ufunc = OPS[op].ufunc
    dt = dst.dtype
    acc_dt = accumulator(dt)
    if divisor:
        d = acc_dt.type(divisor)
        acc = dst if acc_dt == dt else _temp(dst.size, acc_dt)
        np.divide(srcs[0], d, out=acc, dtype=acc_dt, casting="unsafe")
        if len(srcs) > 1:
            tmp = _temp(dst.size, acc_dt, 1)
            for s in srcs[1:]:
                np.divide(s, d, out=tmp, dtype=acc_dt, casting="unsafe")
                ufunc(acc, tmp, out=acc)
    elif len(srcs) == 1:
        np.copyto(dst, srcs[0])
        return
    elif acc_dt == dt:
        ufunc(srcs[0], srcs[1], out=dst)
        for s in srcs[2:]:
            ufunc(dst, s, out=dst)
        return
    else:
        acc = _temp(dst.size, acc_dt)
        np.copyto(acc, srcs[0])
        for s in srcs[1:]:
            ufunc(acc, s, out=acc, dtype=acc_dt, casting="unsafe")
    if acc is not dst:
        np.copyto(dst, acc, casting="unsafe")


def scale(dst, src, divisor: int) -> None:
    """dst = src / divisor in the accumulator type, rounded once (dst may be src)."""
    acc_dt = accumulator(dst.dtype)
    np.divide(src, acc_dt.type(divisor), out=dst, dtype=acc_dt, casting="unsafe")
