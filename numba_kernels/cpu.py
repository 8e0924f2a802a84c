"""CPU kernels (Numba njit, parallel over a configurable number of threads) with the same
signatures as the CUDA ones: ``blocks`` is the thread count, ``threads_per_block`` and
``stream`` are accepted and ignored.  Used for host arrays when a collective asks for
``blocks`` (the contention-aware allocation chooses a thread count); NumPy's ufuncs
(one thread) remain the default.  Each element is computed exactly as the NumPy
reference (hpccoll/core/ops.py) computes it, so the bits agree.  Numba has no float16
or bfloat16 on the CPU: those run the NumPy reference itself."""
from __future__ import annotations

import numpy as np

from hpccoll.base import ops as table

from . import ops, registry


def _numba():
    import numba
    return numba


def _build_reduce(op: str, dtype: np.dtype):
    numba = _numba()
    combine = numba.njit(ops.COMBINE[op])

    @numba.njit(parallel=True)
    def reduce2(dst, a, b):
        for i in numba.prange(dst.size):
            dst[i] = combine(a[i], b[i])

    x = np.ones(2, dtype)
    reduce2(x, x, x)          # compile now (warm-up), not on the hot path
    return reduce2


def _build_scale(dtype: np.dtype):
    numba = _numba()

    @numba.njit(parallel=True)
    def scale(dst, src, divisor):
        for i in numba.prange(dst.size):
            dst[i] = src[i] / divisor

    x = np.ones(2, dtype)
    scale(x, x, dtype.type(1))
    return scale


def _build_add_scaled(dtype: np.dtype):
    """dst += src / divisor: one more contribution of an average."""
    numba = _numba()

    @numba.njit(parallel=True)
    def add_scaled(dst, src, divisor):
        for i in numba.prange(dst.size):
            dst[i] = dst[i] + src[i] / divisor

    x = np.ones(2, dtype)
    add_scaled(x, x, dtype.type(1))
    return add_scaled


def _build_copy(dtype: np.dtype):
    numba = _numba()

    @numba.njit(parallel=True)
    def copy(dst, src):
        for i in numba.prange(dst.size):
            dst[i] = src[i]

    x = np.ones(2, dtype)
    copy(x, x)
    return copy


def max_threads() -> int:
    return _numba().config.NUMBA_NUM_THREADS


def _threads(blocks: int) -> None:
    _numba().set_num_threads(max(1, min(int(blocks), max_threads())))


def supported(dtype) -> bool:
    return np.dtype(dtype) not in ops.LOW_PRECISION


def _kernel(kind: str, op: str, dt: np.dtype):
    builders = {"reduce": lambda: _build_reduce(op, dt), "scale": lambda: _build_scale(dt),
                "add_scaled": lambda: _build_add_scaled(dt), "copy": lambda: _build_copy(dt)}
    return registry.get(("cpu", kind, op, dt.str, 2), builders[kind])


def reduce(op: str, dst: np.ndarray, srcs, blocks: int, threads_per_block: int = 0, stream=None,
           divisor: int = 0):
    """dst = srcs[0] (op) srcs[1] (op) ..., folded in order into dst (dst may alias
    srcs[0] only); with a divisor (avg) every source is divided by it first.  Per
    element this is the NumPy reference's sequence of operations, so the bits agree."""
    if dst.size == 0:
        return
    op = "sum" if op == "avg" else op     # avg sums contributions divided first
    dt = dst.dtype
    if not supported(dt) or op not in ops.COMBINE:
        table.reduce_n(op, dst, srcs, divisor)
        return
    _threads(blocks)
    if divisor:
        d = dt.type(divisor)
        _kernel("scale", "", dt)(dst, srcs[0], d)
        add = _kernel("add_scaled", "", dt) if len(srcs) > 1 else None
        for s in srcs[1:]:
            add(dst, s, d)
        return
    if len(srcs) == 1:
        _kernel("copy", "", dt)(dst, srcs[0])
        return
    kernel = _kernel("reduce", op, dt)
    kernel(dst, srcs[0], srcs[1])
    for s in srcs[2:]:
        kernel(dst, dst, s)


def scale(dst: np.ndarray, src: np.ndarray, divisor: int, blocks: int, threads_per_block: int = 0,
          stream=None):
    """dst = src / divisor (dst may be src)."""
    if dst.size == 0:
        return
    if not supported(dst.dtype):
        table.scale(dst, src, divisor)
        return
    _threads(blocks)
    _kernel("scale", "", dst.dtype)(dst, src, dst.dtype.type(divisor))


def copy(dst: np.ndarray, src: np.ndarray, blocks: int, threads_per_block: int = 0, stream=None):
    if dst.size == 0:
        return
    if not supported(dst.dtype):
        np.copyto(dst, src)
        return
    _threads(blocks)
    _kernel("copy", "", dst.dtype)(dst, src)


def prepare(op, dtype) -> None:
    """Compile what a collective with this op and dtype will launch, on the calling
    thread, never inside the engine: copy always, reduce for reductions, the average's
    two kernels for avg."""
    dt = np.dtype(dtype)
    avg = op == "avg"
    if not supported(dt):
        return
    _kernel("copy", "", dt)
    if op in ops.COMBINE:
        op = "sum" if op == "avg" else op
        _kernel("reduce", op, dt)
        if avg:
            _kernel("scale", "", dt)
            _kernel("add_scaled", "", dt)


def warmup(op_names=table.KERNEL_OPS, dtypes=ops.DTYPES) -> dict:
    """Compile every (op, dtype) now; returns the compile seconds per kernel."""
    for dt in map(np.dtype, dtypes):
        if supported(dt):
            for op in op_names:
                _kernel("reduce", op, dt)
    return registry.compiled()
