"""Helpers for the adapter tests: the same call through mpi4py and through hpccoll.mpi.Comm
on equal inputs, compared (exact for integers and bools, a tolerance derived from the
number of ranks for floating point, whose reduction order MPI leaves open).

Expected values always come from mpi4py's own call in the same run.  Every comparison
also checks the adapter's ``stats``: a natively meant call that was forwarded would
compare mpi4py with itself, so it fails.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

# every predefined numeric type mpi4py maps to NumPy, with the ops MPI defines on it
INTS = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
FLOATS = ["float32", "float64"]
COMPLEX = ["complex64", "complex128"]
ALL_DTYPES = INTS + FLOATS + COMPLEX + ["bool"]
ARITH = [MPI.SUM, MPI.PROD]
ORDER = [MPI.MIN, MPI.MAX]
LOGICAL = [MPI.LAND, MPI.LOR, MPI.LXOR]
BITWISE = [MPI.BAND, MPI.BOR, MPI.BXOR]
OP_NAMES = {MPI.SUM.py2f(): "SUM", MPI.PROD.py2f(): "PROD", MPI.MIN.py2f(): "MIN",
            MPI.MAX.py2f(): "MAX", MPI.LAND.py2f(): "LAND", MPI.LOR.py2f(): "LOR",
            MPI.LXOR.py2f(): "LXOR", MPI.BAND.py2f(): "BAND", MPI.BOR.py2f(): "BOR",
            MPI.BXOR.py2f(): "BXOR"}


def ops_for(dtype) -> list:
    kind = np.dtype(dtype).kind
    if kind in "iu":
        return ARITH + ORDER + LOGICAL + BITWISE
    if kind == "f":
        return ARITH + ORDER
    if kind == "c":
        return ARITH
    return LOGICAL   # bool


# fixed-width names (dtlib.from_numpy_dtype makes derived types, which are forwarded)
MPI_TYPES = {"int8": MPI.INT8_T, "uint8": MPI.UINT8_T, "int16": MPI.INT16_T,
             "uint16": MPI.UINT16_T, "int32": MPI.INT32_T, "uint32": MPI.UINT32_T,
             "int64": MPI.INT64_T, "uint64": MPI.UINT64_T, "float32": MPI.FLOAT,
             "float64": MPI.DOUBLE, "complex64": MPI.C_FLOAT_COMPLEX,
             "complex128": MPI.C_DOUBLE_COMPLEX, "bool": MPI.C_BOOL}


def mpi_type(dtype):
    return MPI_TYPES[np.dtype(dtype).name]


def data(dtype, count, rank, salt=0) -> np.ndarray:
    """Deterministic per (rank, salt): small integers, floats near 1, random bools."""
    dt = np.dtype(dtype)
    rng = np.random.default_rng(7919 * rank + 31 * count + salt)
    if dt.kind == "b":
        return rng.integers(0, 2, size=count).astype(bool)
    if dt.kind == "u":
        return rng.integers(0, 5, size=count).astype(dt)
    if dt.kind == "i":
        return rng.integers(-4, 5, size=count).astype(dt)
    if dt.kind == "c":
        return (rng.uniform(0.5, 1.5, count) + 1j * rng.uniform(-0.5, 0.5, count)).astype(dt)
    return rng.uniform(0.5, 1.5, size=count).astype(dt)


def assert_same(got, want, n: int, what: str = "") -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, what
    if got.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        eps = np.finfo(got.dtype).eps
        np.testing.assert_allclose(got, want, rtol=8 * n * eps, atol=0, err_msg=what)


def native_calls(adapter, method: str) -> int:
    return adapter.stats.get(method, {}).get("native", 0)


def forwarded_calls(adapter, method: str) -> int:
    return adapter.stats.get(method, {}).get("forwarded", 0)


def twin(mpi_comm, adapter, method: str, build, native: bool = True, compare=None) -> None:
    """``build()`` -> (args, outputs): fresh buffers each time.  Runs ``method`` through
    mpi4py and through the adapter (nonblocking methods: then Wait) and compares every
    output with ``compare(got, want)`` (default: assert_same over whole buffers)."""
    args_m, outs_m = build()
    args_a, outs_a = build()
    req = getattr(mpi_comm, method)(*args_m)
    if method.startswith("I"):
        req.Wait()
    before_n, before_f = native_calls(adapter, method), forwarded_calls(adapter, method)
    req = getattr(adapter, method)(*args_a)
    if method.startswith("I"):
        assert req.Wait() is True
    assert native_calls(adapter, method) == before_n + native, f"{method}: not run natively"
    assert forwarded_calls(adapter, method) == before_f + (not native)
    n = mpi_comm.Get_size()
    for i, (got, want) in enumerate(zip(outs_a, outs_m)):
        what = f"{method} output {i} on rank {mpi_comm.Get_rank()}"
        if compare is not None:
            compare(got, want, what)
        else:
            assert_same(got, want, n, what)


def spec(buf, dtype, form: str, count: int = 0, displ: int = 0):
    """One of mpi4py's argument forms for ``buf`` (count/displ in entries)."""
    t = mpi_type(dtype)
    return {
        "plain": lambda: buf,
        "type": lambda: [buf, t],
        "typecode": lambda: [buf, np.dtype(dtype).char],
        "count": lambda: [buf, count, t],
        "pair": lambda: [buf, (count, displ), t],
        "four": lambda: [buf, count, displ, t],
    }[form]()


# forms that name a count and displacement read a window of a larger buffer
WINDOWED = ("count", "pair", "four")
DISPL = {"count": 0, "pair": 2, "four": 3}
FORMS = ["plain", "type", "typecode", "count", "pair", "four"]


def padded(x: np.ndarray, form: str, fill=None) -> np.ndarray:
    """x inside a larger buffer for the windowed forms (leading displacement, a tail)."""
    if form not in WINDOWED:
        return x.copy()
    d = DISPL[form]
    out = np.empty(d + x.size + 2, x.dtype)
    out[:] = fill if fill is not None else np.zeros(1, x.dtype)[0]
    out[d:d + x.size] = x
    return out
