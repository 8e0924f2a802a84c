"""DLPack producers in host memory, read as mpi4py reads them: a NumPy view of the memory.

mpi4py takes an object without the buffer protocol through ``__dlpack__`` (asdlpack.pxi):
versioned capsule first (``max_version=(1, 0)``, ``copy=False``), the legacy one where the
producer refuses those arguments; C or Fortran contiguous; read-only only when a versioned
capsule says so.  ``numpy.from_dlpack`` is not that: it marks every legacy capsule's array
read-only, so a receive buffer mpi4py writes would be refused.  Hence this reader, of the
DLPack structs themselves (dlpack.h).  Device memory (CUDA, ROCm, ...) is not read here:
the adapter forwards it to mpi4py.
"""
from __future__ import annotations

import ctypes
from typing import Optional

import numpy as np

HOST_DEVICES = (1, 3)          # kDLCPU, kDLCUDAHost (pinned host memory)
_READ_ONLY = 1                 # DLPACK_FLAG_BITMASK_READ_ONLY
_KINDS = {0: "i", 1: "u", 2: "f", 5: "c", 6: "b"}   # kDLInt, kDLUInt, kDLFloat, kDLComplex, kDLBool


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):            # DLManagedTensor (legacy)
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class _Versioned(ctypes.Structure):          # DLManagedTensorVersioned (DLPack 1.x)
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", _Tensor)]


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype, _get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_is_valid.restype, _is_valid.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]


class _Memory:
    """The array interface of the tensor's memory; keeps the capsule (and so the producer's
    memory: its destructor calls the deleter) alive as long as an array refers to it."""

    def __init__(self, capsule, ptr: int, count: int, dtype: np.dtype, readonly: bool):
        self.capsule = capsule
        self.__array_interface__ = {"data": (ptr, readonly), "shape": (count,),
                                    "typestr": dtype.str, "version": 3}


def is_host(obj) -> bool:
    """Whether obj is a DLPack producer whose memory the host can read."""
    cls = type(obj)
    if not (hasattr(cls, "__dlpack__") and hasattr(cls, "__dlpack_device__")):
        return False
    try:
        return int(obj.__dlpack_device__()[0]) in HOST_DEVICES
    except Exception:
        return False     # mpi4py judges it


def host_array(obj) -> Optional[np.ndarray]:
    """A flat view of a host DLPack producer's memory, in memory order, of its element
    type; None when the element type has no NumPy equivalent (forwarded)."""
    try:
        capsule = obj.__dlpack__(max_version=(1, 0), copy=False)
    except TypeError:
        capsule = obj.__dlpack__()
    if _is_valid(capsule, b"dltensor_versioned"):
        managed = _Versioned.from_address(_get_pointer(capsule, b"dltensor_versioned"))
        if managed.major != 1:
            raise BufferError(f"dlpack: unexpected version {managed.major}.{managed.minor}")
        readonly = bool(managed.flags & _READ_ONLY)
    elif _is_valid(capsule, b"dltensor"):
        managed = _Managed.from_address(_get_pointer(capsule, b"dltensor"))
        readonly = False
    else:
        raise BufferError("dlpack: invalid capsule object")
    t = managed.dl_tensor
    kind = _KINDS.get(t.code)
    if kind is None or t.lanes != 1 or t.bits % 8:
        return None
    dtype = np.dtype(f"{kind}{t.bits // 8}") if kind != "b" else np.dtype(bool)
    shape = [t.shape[i] for i in range(t.ndim)]
    if t.strides and not _contiguous(shape, [t.strides[i] for i in range(t.ndim)]):
        raise BufferError("dlpack: buffer is not contiguous")
    count = int(np.prod(shape, dtype=np.int64))
    if count == 0:
        return np.empty(0, dtype)
    ptr = (t.data or 0) + t.byte_offset
    return np.asarray(_Memory(capsule, ptr, count, dtype, readonly))


def _contiguous(shape, strides) -> bool:
    """C or Fortran order, strides in elements (dimensions of 1 take any stride)."""
    def packed(dims):
        expected = 1
        for size, stride in dims:
            if size > 1 and stride != expected:
                return False
            expected *= size
        return True
    pairs = list(zip(shape, strides))
    return packed(reversed(pairs)) or packed(pairs)
