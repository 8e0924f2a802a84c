"""Buffers, dtypes and reduction ops.

Everything here runs before a collective is queued: a bad argument raises an
error that names the argument and says what was expected.  Buffers are handled
as flat 1-D views; the engine only ever touches ``Buffer.flat``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from .errors import ArgumentError, ArgumentTypeError

try:  # bfloat16 where ml_dtypes is installed (the contract says "where ml_dtypes exists")
    import ml_dtypes as _ml_dtypes
    _BFLOAT16 = np.dtype(_ml_dtypes.bfloat16)
except Exception:  # pragma: no cover - optional dependency
    _BFLOAT16 = None

# The contract's dtypes first; the others exist for the mpi4py adapter.
_DTYPE_NAMES = ["int8", "uint8", "int32", "int64", "float16", "float32", "float64",
                "int16", "uint16", "uint32", "uint64", "complex64", "complex128", "bool"]
DTYPES: dict[str, np.dtype] = {n: np.dtype(n) for n in _DTYPE_NAMES}
if _BFLOAT16 is not None:
    DTYPES["bfloat16"] = _BFLOAT16
CONTRACT_DTYPES = ("int8", "uint8", "int32", "int64", "float16", "float32", "float64")
_DTYPE_CODE = {dt: i + 1 for i, dt in enumerate(DTYPES.values())}

# op name -> (binary ufunc, kinds it accepts: i=signed u=unsigned f=float c=complex b=bool)
OPS: dict[str, tuple[Any, str]] = {
    "sum": (np.add, "iufc"),
    "prod": (np.multiply, "iufc"),
    "min": (np.minimum, "iuf"),
    "max": (np.maximum, "iuf"),
    "avg": (np.add, "fc"),   # sum, then divided by the number of ranks
    "land": (np.logical_and, "iub"),
    "lor": (np.logical_or, "iub"),
    "lxor": (np.logical_xor, "iub"),
    "band": (np.bitwise_and, "iub"),
    "bor": (np.bitwise_or, "iub"),
    "bxor": (np.bitwise_xor, "iub"),
}
CONTRACT_OPS = ("sum", "prod", "min", "max", "avg")
_OP_CODE = {name: i + 1 for i, name in enumerate(OPS)}


def _is_bfloat16(dt) -> bool:
    # not `dt == _BFLOAT16`: without ml_dtypes that is `dt == None`, which NumPy reads as
    # "dt is the default dtype", float64
    return _BFLOAT16 is not None and dt == _BFLOAT16


def dtype_kind(dt: np.dtype) -> str:
    if _is_bfloat16(dt):
        return "f"
    return dt.kind


def dtype_name(dt: np.dtype) -> str:
    return "bfloat16" if _is_bfloat16(dt) else dt.name


def dtype_code(dt: np.dtype) -> int:
    return _DTYPE_CODE.get(dt, 0)


def op_code(op: Optional[str]) -> int:
    return _OP_CODE.get(op, 0) if op else 0


def check_op(op: Any, dt: np.dtype) -> str:
    if not isinstance(op, str) or op.lower() not in OPS:
        raise ArgumentError(f"op: expected one of {', '.join(CONTRACT_OPS)}, got {op!r}")
    op = op.lower()
    kinds = OPS[op][1]
    if dtype_kind(dt) not in kinds:
        if op == "avg":
            raise ArgumentError(f"op: 'avg' needs a floating dtype, got {dtype_name(dt)} "
                                "(use 'sum' and divide, or convert to float first)")
        raise ArgumentError(f"op: {op!r} is not defined for dtype {dtype_name(dt)}")
    return op


def reduce_into(op: str, dst: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """dst = a (op) b, elementwise; dst may alias a or b.

    Integer arithmetic wraps like MPI's; float16 is combined pairwise in float16,
    each step rounded once, like MPI_SUM on MPI_FLOAT16 implementations.
    """
    OPS[op][0](a, b, out=dst)


def scale_into(dst: np.ndarray, divisor: int) -> None:
    """The second half of 'avg': every rank divides the same sum by the same number."""
    np.divide(dst, divisor, out=dst, casting="unsafe")


@dataclass
class Buffer:
    """A validated array and its flat 1-D view (what the engine reads and writes): a NumPy
    array, or for device arrays a Numba device-array view (``device``, ``ptr``, and the
    CUDA stream named by the array's interface)."""
    array: Any
    flat: Any
    device: bool = False
    ptr: int = 0
    stream: Any = None

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.flat.dtype)

    @property
    def size(self) -> int:
        return self.flat.size

    @property
    def address(self) -> int:
        if self.device:
            return self.ptr
        return self.flat.__array_interface__["data"][0] if self.flat.size else 0

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def same_memory(self, other: "Buffer") -> bool:
        if self.array is other.array:
            return True
        if self.device != other.device:
            return False
        if self.device:
            return self.ptr == other.ptr and self.nbytes == other.nbytes
        return (np.may_share_memory(self.flat, other.flat) and self.address == other.address
                and self.nbytes == other.nbytes)


def as_buffer(obj: Any, name: str, *, writable: bool = False) -> Buffer:
    """Validate an array argument: a C-contiguous NumPy array of a supported dtype, or a
    device array (CuPy, Numba, __cuda_array_interface__, DLPack on CUDA)."""
    if not isinstance(obj, np.ndarray):
        if not isinstance(obj, (list, tuple, str, bytes, int, float)) and obj is not None:
            from . import device   # CUDA support is imported only when it is needed
            if device.is_device_array(obj):
                return device.as_device_buffer(obj, name, writable=writable)
        raise ArgumentTypeError(f"{name}: expected a numpy.ndarray or a device array (CuPy, "
                                f"__cuda_array_interface__), got {type(obj).__name__}")
    if obj.dtype not in _DTYPE_CODE:
        raise ArgumentTypeError(
            f"{name}: dtype {obj.dtype} is not supported; expected one of {', '.join(DTYPES)}")
    if not obj.flags.c_contiguous:
        raise ArgumentError(f"{name}: expected a C-contiguous array (use numpy.ascontiguousarray)")
    if writable and not obj.flags.writeable:
        raise ArgumentError(f"{name}: expected a writable array, got a read-only one")
    return Buffer(obj, obj if obj.ndim == 1 else obj.ravel())


def new_buffer(n: int, like: Buffer) -> Buffer:
    """recvbuf=None: a new 1-D array of ``like``'s dtype, on ``like``'s device."""
    if like.device:
        from . import device
        return device.new_device_buffer(like, n)
    arr = np.empty(n, dtype=like.dtype)
    return Buffer(arr, arr)


def check_recvbuf(recvbuf: Any, expected: int, dt: np.dtype, what: str,
                  device: bool = False) -> Buffer:
    rb = as_buffer(recvbuf, "recvbuf", writable=True)
    if rb.device != device:
        where = ("a device array", "on the host") if device else ("on the host", "a device array")
        raise ArgumentTypeError(f"recvbuf: sendbuf is {where[0]} but recvbuf is {where[1]}; "
                                "both must be on the same device")
    if rb.dtype != dt:
        raise ArgumentTypeError(
            f"recvbuf: dtype {dtype_name(rb.dtype)} differs from sendbuf's {dtype_name(dt)}")
    if rb.size != expected:
        raise ArgumentError(f"recvbuf: expected {expected} elements ({what}), got {rb.size}")
    return rb


def overlap(a: Buffer, b: Buffer) -> bool:
    if a.size == 0 or b.size == 0 or a.device != b.device:
        return False
    if a.device:
        return a.ptr < b.ptr + b.nbytes and b.ptr < a.ptr + a.nbytes
    return np.may_share_memory(a.flat, b.flat)
