"""Which MPI datatypes and reduction ops run on hpccoll, and as what.

A datatype runs natively when it is predefined, NumPy has it (``mpi4py.util.dtlib``)
and hpccoll supports that dtype.  A (op, datatype) pair runs natively only when the
MPI library itself accepts it: ``Op.Reduce_local`` on one element is asked once per
pair.  Anything else is forwarded, so that the MPI library computes it, or raises
exactly the error it raises for mpi4py.  The decision depends only on the collective,
the op and the datatypes, which are the same on every rank: all ranks take the same
path.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..core.context import mpi as _mpi
from ..base.ops import DTYPES, OPS, dtype_kind
from ..transport.mpi import op_of_mpi

MPI = _mpi()

_HPCCOLL_DTYPES = set(DTYPES.values())

# Fortran LOGICAL's "true" is the compiler's bit pattern, not NumPy's 1: forwarded.
# PACKED, CHAR and WCHAR are not numbers.
_NOT_NATIVE = {t.py2f() for t in (MPI.DATATYPE_NULL, MPI.PACKED, MPI.CHAR, MPI.WCHAR, MPI.LOGICAL)}

_dtypes: dict = {}    # datatype handle -> np.dtype or None
_accepts: dict = {}   # (op handle, datatype handle) -> bool
_arrays: dict = {}    # NumPy dtype of an array argument -> its MPI datatype, or None
_ops: dict = {}       # (id of an MPI.Op, dtype) -> hpccoll op name or None
_C_ALIGNED = 0x1 | 0x100     # NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED


def fast_dtype(arr: np.ndarray) -> Optional[np.dtype]:
    """The dtype of a NumPy array argument that mpi4py would send as a datatype hpccoll
    runs natively, when the array is C-contiguous and aligned; None: read the argument
    the long way (mpi4py's message forms, its checks and errors)."""
    if arr.flags.num & _C_ALIGNED != _C_ALIGNED:
        return None
    dt = arr.dtype
    try:
        datatype = _arrays[dt]
    except KeyError:
        from ._message import array_type
        try:
            datatype = array_type(dt)
        except Exception:
            datatype = None
        _arrays[dt] = datatype if datatype is not None and native_dtype(datatype) == dt else None
        datatype = _arrays[dt]
    return None if datatype is None else dt


_ARRAYS = _arrays     # for the adapter's inline checks (_calls.bcast)


def native_dtype(datatype) -> Optional[np.dtype]:
    """The NumPy dtype hpccoll runs ``datatype`` as, or None to forward."""
    key = datatype.py2f()
    if key not in _dtypes:
        _dtypes[key] = _lookup(datatype)
    return _dtypes[key]


def _lookup(datatype) -> Optional[np.dtype]:
    if not datatype.is_predefined or datatype.py2f() in _NOT_NATIVE:
        return None
    from mpi4py.util import dtlib
    try:
        dt = np.dtype(dtlib.to_numpy_dtype(datatype))
    except Exception:   # pair types, LB/UB, types NumPy lacks
        return None
    lb, extent = datatype.Get_extent()
    if dt not in _HPCCOLL_DTYPES or lb != 0 or extent != dt.itemsize or \
            datatype.Get_size() != dt.itemsize:
        return None
    return dt


def unroll(datatype):
    """(predefined datatype, k) when ``datatype`` is k entries of one predefined type back to
    back, as MPI moves it: a chain of ``Dup``, ``Create_contiguous`` and vectors whose stride
    is their block (what ``mpi4py.util.dtlib.from_numpy_dtype`` makes of NumPy's types and
    subarrays); None for a truly derived type (gaps, resized, several types).  Not cached:
    MPI may give a freed derived type's handle to the next one."""
    k, t = 1, datatype
    while not t.is_predefined:
        try:
            old, combiner, p = t.decode()
        except MPI.Exception:
            return None
        if combiner == "CONTIGUOUS":
            k *= p["count"]
        elif combiner in ("VECTOR", "HVECTOR"):
            step = p["blocklength"] * (1 if combiner == "VECTOR" else old.Get_extent()[1])
            if p["count"] > 1 and p["stride"] != step:
                return None
            k *= p["count"] * p["blocklength"]
        elif combiner != "DUP":
            return None
        t = old
    lb, extent = t.Get_extent()
    if k == 0 or datatype.Get_extent() != (lb, k * extent) or \
            datatype.Get_size() != k * t.Get_size():
        return None
    return t, k


def op_name(op) -> Optional[str]:
    """hpccoll's name for a predefined MPI op, or None (user-defined, MAXLOC, REPLACE, ...)."""
    return op_of_mpi(op)


def native_op(op, datatype, dt: np.dtype) -> Optional[str]:
    """hpccoll's op for reducing ``datatype`` (as ``dt``; None: the datatype of a ``dt``
    array) with ``op``, or None to forward."""
    if datatype is None:
        key = (id(op), dt)
        name = _ops.get(key, 0)
        if name == 0:
            datatype = _arrays.get(dt)
            name = None if datatype is None else native_op(op, datatype, dt)
            if key[0] in _PREDEFINED:   # they live as long as the module: ids stay theirs
                _ops[key] = name
        return name
    name = op_name(op)
    if name is None or dtype_kind(dt) not in OPS[name].kinds:
        return None
    key = (op.py2f(), datatype.py2f())
    if key not in _accepts:
        _accepts[key] = _mpi_accepts(op, datatype, dt)
    return name if _accepts[key] else None


def _mpi_accepts(op, datatype, dt: np.dtype, k: int = 1) -> bool:
    """Whether this MPI defines ``op`` on ``datatype`` (MPI_SUM on MPI_BYTE, MPI_MAX on a
    complex type, MPI_LAND on a float are errors; a predefined op on a derived type is an
    extension of some MPIs), ``datatype`` being k entries of ``dt``: one local reduction,
    no communication."""
    a, b = np.zeros(k, dt), np.zeros(k, dt)
    try:
        op.Reduce_local([a, 1, datatype], [b, 1, datatype])
    except MPI.Exception:
        return False
    return True


def derived_accepts(op, datatype, dt: np.dtype, k: int) -> bool:
    """``_mpi_accepts`` for a derived datatype of k entries of ``dt`` (asked every time: a
    derived type's handle may be reused)."""
    return _mpi_accepts(op, datatype, dt, k)


_PREDEFINED = {id(op) for op in (MPI.SUM, MPI.PROD, MPI.MIN, MPI.MAX, MPI.LAND, MPI.LOR,
                                 MPI.LXOR, MPI.BAND, MPI.BOR, MPI.BXOR)}
