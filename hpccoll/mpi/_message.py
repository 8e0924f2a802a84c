"""mpi4py's buffer arguments, read with mpi4py's meaning and raising mpi4py's errors.

The forms (mpi4py's "message" specifications):

    buf                               count inferred, datatype from the buffer's format
    [buf, datatype]                   datatype: an MPI.Datatype or a typecode string
    [buf, count]  [buf, (count, displ)]  [buf, count, datatype]  [buf, (count, displ), datatype]
    [buf, count, displ, datatype]
    v-forms: counts/displs are a sequence (one per rank), an integer (same count, or
    stride), or None (the buffer split evenly / blocks back to back).

``None`` and MPI.BOTTOM as ``buf`` stand for an empty buffer and need a datatype.  A
derived datatype that is k entries of one predefined type back to back (``_types.unroll``)
is read as those entries: counts and displacements times k, the caller's datatype kept
as ``declared`` for mpi4py's checks.
Parsing follows mpi4py's order of checks, so a malformed argument raises the exception
type mpi4py raises.  Where mpi4py would hand MPI a count that runs past the end of the
buffer, the views made here raise ValueError instead of touching foreign memory.
"""
from __future__ import annotations

import operator
import sys
from typing import Any, NamedTuple, Optional

import mpi4py
import numpy as np

from . import _dlpack
from ._types import MPI, unroll

# mpi4py 4 takes None for MPI.IN_PLACE (and for MPI.BOTTOM)
_NONE_IS_SPECIAL = int(mpi4py.__version__.split(".")[0]) >= 4
# objects whose buffer mpi4py itself exports as MPI.BYTE
_BYTE_OBJECTS = tuple(t for t in (getattr(MPI, "buffer", None), type(MPI.IN_PLACE),
                                  type(MPI.BOTTOM)) if t is not None)
_LITTLE = sys.byteorder == "little"


class Message(NamedTuple):
    obj: Any                      # the buffer object (None: no buffer)
    base: Optional[np.ndarray]    # its bytes, flat uint8 (None: no buffer or a device buffer)
    datatype: Any                 # MPI.Datatype: predefined, where the caller's unrolls
    count: int                    # entries of it (per block when parsed with blocks > 1)
    offset: int                   # bytes from the buffer's start (the displacement)
    device: bool = False          # DLPack / CUDA array interface only: not parsed, forwarded
    declared: Any = None          # the caller's datatype, where it was unrolled (_types.unroll)
    scale: int = 1                # entries of ``datatype`` per entry of ``declared``


class VMessage(NamedTuple):
    obj: Any
    base: Optional[np.ndarray]
    datatype: Any
    counts: tuple                 # entries per rank
    displs: tuple                 # entries from the buffer's start, per rank
    device: bool = False
    offset: int = 0               # v-forms have no message displacement
    declared: Any = None
    scale: int = 1


def is_in_place(obj) -> bool:
    return obj is MPI.IN_PLACE or (_NONE_IS_SPECIAL and obj is None)


def _is_bottom(obj) -> bool:
    return obj is MPI.BOTTOM or (_NONE_IS_SPECIAL and obj is None)


def _is_buffer(obj) -> bool:
    if isinstance(obj, np.ndarray):
        return True
    try:
        memoryview(obj)
    except TypeError:
        return False
    return True


def _is_device(obj) -> bool:
    # mpi4py asks hasattr(obj, ...).  Asked of the type, so that a property that raises
    # (torch, for tensors that require grad) is not read; and of the instance's own
    # attributes, because an object may carry the interface itself (mpi4py's GPU-like test
    # arrays set __cuda_array_interface__ in __init__), and mpi4py takes those too.
    cls = type(obj)
    if hasattr(cls, "__dlpack__") or hasattr(cls, "__cuda_array_interface__"):
        return True
    try:   # not getattr: that would reach a class's __getattr__
        own = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        return False
    return isinstance(own, dict) and ("__cuda_array_interface__" in own or "__dlpack__" in own)


def _on_device(buf) -> bool:
    """A device array (CuPy, PyTorch, ...): mpi4py handles it, the adapter forwards."""
    return not _is_bottom(buf) and not _is_buffer(buf) and _is_device(buf)


def _host(buf):
    """A DLPack producer in host memory without the buffer protocol (mpi4py asks the buffer
    protocol first) as a NumPy view of its memory; anything else as it is."""
    if isinstance(buf, np.ndarray) or not _dlpack.is_host(buf) or _is_buffer(buf):
        return buf
    arr = _dlpack.host_array(buf)
    return buf if arr is None else arr


def _split(msg, vector: bool):
    """(buf, count(s), displ(s), datatype) of one message argument."""
    if _is_buffer(msg):
        return msg, None, None, None
    if isinstance(msg, (list, tuple)):
        pair = tuple if vector else (tuple, list)   # v-forms: only a tuple is (counts, displs)
        count = displ = typ = None
        if len(msg) == 2:
            buf, count = msg
            if isinstance(count, (MPI.Datatype, str)):
                count, typ = None, count
            elif isinstance(count, pair):
                count, displ = count
        elif len(msg) == 3:
            buf, count, typ = msg
            if isinstance(count, pair):
                count, displ = count
        elif len(msg) == 4:
            buf, count, displ, typ = msg
        else:
            raise ValueError("message: expecting 2 to 4 items")
        return buf, count, displ, typ
    if _is_device(msg):
        return msg, None, None, None
    raise TypeError("message: expecting buffer or list/tuple")


def as_datatype(typ):
    if isinstance(typ, MPI.Datatype):
        return typ
    try:
        return MPI._typedict[typ]
    except KeyError:
        raise KeyError(f"cannot map {typ!r} to MPI datatype") from None


def _format_type(fmt: str):
    if fmt[:1] == "@":
        fmt = fmt[1:]
    elif fmt[:1] in "<>":
        if (fmt[0] == "<") != _LITTLE:
            raise BufferError(f"format string {fmt!r} with non-native byte order")
        fmt = fmt[1:]
    return as_datatype(fmt)


_ARRAY_TYPES: dict = {}   # NumPy dtype -> MPI datatype of its buffer format


def array_type(dt: np.dtype):
    t = _ARRAY_TYPES.get(dt)
    if t is None:
        t = _ARRAY_TYPES[dt] = _format_type(memoryview(np.empty(0, dt)).format)
    return t


def _acquire(obj, readonly: bool):
    """(flat uint8 view of obj's memory, obj's buffer format, or its dtype for arrays)."""
    if isinstance(obj, np.ndarray):
        if obj.__class__ is not np.ndarray:
            # mpi4py takes a subclass's buffer, its data alone: a masked array's data
            # without the mask (whose own view would not reshape to bytes), an np.matrix's
            # elements (whose reshape(-1) stays 2-D, so slicing it picks rows, not bytes)
            obj = np.ndarray.view(obj, np.ndarray)
        flags = obj.flags
        if not (flags.c_contiguous or flags.f_contiguous):
            raise BufferError("buffer is not contiguous")
        if not readonly and not flags.writeable:
            raise BufferError("buffer is not writable")
        # memory order: a view, C or Fortran contiguous
        flat = obj if obj.ndim == 1 else obj.reshape(-1, order="A")
        return flat.view(np.uint8), obj.dtype
    mv = memoryview(obj)
    if not mv.contiguous:
        raise BufferError("buffer is not contiguous")
    if not readonly and mv.readonly:
        raise BufferError("Object is not writable.")
    if mv.c_contiguous:
        return np.frombuffer(mv, np.uint8) if mv.nbytes else np.empty(0, np.uint8), mv.format
    flat = np.asarray(mv).reshape(-1, order="F")
    return flat.view(np.uint8), mv.format


def _buffer(buf, typ, readonly: bool):
    """(base, datatype) of the buffer part of a message."""
    if _is_bottom(buf):
        return None, as_datatype(typ)
    base, fmt = _acquire(buf, readonly)
    if typ is not None:
        return base, as_datatype(typ)
    if isinstance(fmt, np.dtype):
        return base, array_type(fmt)
    if isinstance(buf, _BYTE_OBJECTS):
        return base, MPI.BYTE
    return base, _format_type(fmt)


def _extent(datatype, what: str) -> tuple:
    if datatype == MPI.DATATYPE_NULL:
        raise ValueError(f"message: cannot {what}, datatype is null")
    lb, extent = datatype.Get_extent()
    if extent <= 0:
        raise ValueError(f"message: cannot {what}, datatype extent {extent} (lb:{lb}, ub:{lb + extent})")
    return lb, extent


def simple(msg, readonly: bool, blocks: int = 0) -> Message:
    """One buffer with one count; ``blocks`` > 1: the inferred count is per block."""
    buf, count, displ, typ = _split(msg, vector=False)
    buf = _host(buf)
    if _on_device(buf):
        return Message(buf, None, None, 0, 0, device=True)
    base, datatype = _buffer(buf, typ, readonly)
    length = 0 if base is None else base.size
    offset, extent, lb = 0, None, 0
    if displ is not None:
        displ = operator.index(displ)
        if displ < 0:
            raise ValueError(f"message: negative displacement {displ}")
        if displ > 0:
            lb, extent = _extent(datatype, "handle displacement")
            if displ * extent > length:
                raise ValueError(f"message: displacement {displ} out of bounds, "
                                 f"number of datatype entries {length // extent}")
            offset = displ * extent
            length -= offset
    if count is not None:
        count = operator.index(count)
        if count < 0:
            raise ValueError(f"message: negative count {count}")
        if count > 0 and buf is None:
            raise ValueError(f"message: buffer is None but count is {count}")
    elif length > 0:
        if extent is None:
            lb, extent = _extent(datatype, "infer count")
        if length % extent:
            raise ValueError(f"message: cannot infer count, buffer length {length} is not a "
                             f"multiple of datatype extent {extent} (lb:{lb}, ub:{lb + extent})")
        count = length // extent
        if blocks > 1:
            if count % blocks:
                raise ValueError(f"message: cannot infer count, number of entries {count} is "
                                 f"not a multiple of required number of blocks {blocks}")
            count //= blocks
    else:
        count = 0
    if not datatype.is_predefined and (u := unroll(datatype)) is not None:
        return Message(buf, base, u[0], count * u[1], offset, False, datatype, u[1])
    return Message(buf, base, datatype, count, offset)


def _is_integral(obj) -> bool:
    """mpi4py's test of a count or stride argument: an index that is not a sized sequence
    (a NumPy array of counts has __index__ too; a 0-d one is an integer)."""
    if not hasattr(type(obj), "__index__"):
        return False
    try:
        len(obj)
    except TypeError:
        pass
    else:
        return False
    try:
        operator.index(obj)
    except TypeError:
        return False
    return True


def index_array(obj, n: int) -> tuple:
    """A sequence of exactly n integers (mpi4py's check of counts and displacements)."""
    if len(obj) != n:
        raise ValueError(f"expecting {n} items, got {len(obj)}")
    return tuple(operator.index(v) for v in obj)


def vector(msg, readonly: bool, blocks: int) -> VMessage:
    """One buffer with a count and displacement per rank (the v-forms)."""
    buf, counts, displs, typ = _split(msg, vector=True)
    buf = _host(buf)
    if _on_device(buf):
        return VMessage(buf, None, None, (), (), device=True)
    base, datatype = _buffer(buf, typ, readonly)
    if counts is None:
        total = 0
        if base is not None and base.size:
            lb, extent = _extent(datatype, "infer count")
            if base.size % extent:
                raise ValueError(f"message: cannot infer count, buffer length {base.size} is not "
                                 f"a multiple of datatype extent {extent} (lb:{lb}, ub:{lb + extent})")
            total = base.size // extent
        counts = tuple(total // blocks + (total % blocks > i) for i in range(blocks))
    elif _is_integral(counts):
        counts = (operator.index(counts),) * blocks
    else:
        counts = index_array(counts, blocks)
    if displs is None:
        displs = tuple(sum(counts[:i]) for i in range(blocks))
    elif _is_integral(displs):
        stride = operator.index(displs)
        displs = tuple(stride * i for i in range(blocks))
    else:
        displs = index_array(displs, blocks)
    if not datatype.is_predefined and (u := unroll(datatype)) is not None:
        k = u[1]
        return VMessage(buf, base, u[0], tuple(c * k for c in counts),
                        tuple(d * k for d in displs), False, 0, datatype, k)
    return VMessage(buf, base, datatype, counts, displs)


def view(m, dt: np.dtype, count: int, start: int = 0) -> np.ndarray:
    """``count`` entries of ``dt`` from entry ``start`` (after the message's displacement):
    the caller's memory, never a copy."""
    offset = m.offset
    avail = 0 if m.base is None else (m.base.size - offset) // dt.itemsize
    if start + count > avail:
        raise ValueError(f"message: {start + count} entries of {dt.name} needed, but the buffer "
                         f"holds {avail} (after the displacement)")
    if not count:
        return np.empty(0, dt)
    lo = offset + start * dt.itemsize
    return m.base[lo:lo + count * dt.itemsize].view(dt)


def overlap(a: np.ndarray, b: np.ndarray) -> bool:
    return a.size > 0 and b.size > 0 and np.may_share_memory(a, b)
