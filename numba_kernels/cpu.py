"""CPU kernels (Numba njit, parallel over a configurable number of threads) with the same
signature as the CUDA ones: ``blocks`` is the thread count, ``threads_per_block`` and
``stream`` are accepted and ignored.  Used for host arrays when a collective asks for
``blocks`` (the contention-aware allocation chooses a thread count); NumPy's ufuncs
(single-threaded) remain the default.  float16 is not supported by Numba on the CPU:
those calls fall back to NumPy (float32 accumulation, one rounding)."""
from __future__ import annotations

import numpy as np

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
    def scale(dst, divisor):
        for i in numba.prange(dst.size):
            dst[i] = dst[i] / divisor

    scale(np.ones(2, dtype), 1)
    return scale


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
    return np.dtype(dtype) != np.float16


def reduce(op: str, dst: np.ndarray, srcs, blocks: int, threads_per_block: int = 0, stream=None):
    """dst = srcs[0] (op) srcs[1] (op) ...; dst may alias a source."""
    if len(srcs) < 2:
        raise ValueError("reduce needs at least two sources")
    if dst.size == 0:
        return
    dt = dst.dtype
    if not supported(dt):
        acc = srcs[0].astype(np.float32)
        fn = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum,
              "max": np.maximum}[op]
        for s in srcs[1:]:
            fn(acc, s, out=acc)
        np.copyto(dst, acc, casting="unsafe")
        return
    kernel = registry.get(("cpu", "reduce", op, dt.str, 2), lambda: _build_reduce(op, dt))
    _threads(blocks)
    kernel(dst, srcs[0], srcs[1])
    for s in srcs[2:]:
        kernel(dst, dst, s)


def scale(dst: np.ndarray, divisor: int, blocks: int, threads_per_block: int = 0, stream=None):
    if dst.size == 0:
        return
    if not supported(dst.dtype):
        np.copyto(dst, dst.astype(np.float32) / divisor, casting="unsafe")
        return
    kernel = registry.get(("cpu", "scale", "", dst.dtype.str, 1), lambda: _build_scale(dst.dtype))
    _threads(blocks)
    kernel(dst, divisor)


def copy(dst: np.ndarray, src: np.ndarray, blocks: int, threads_per_block: int = 0, stream=None):
    if dst.size == 0:
        return
    if not supported(dst.dtype):
        np.copyto(dst, src)
        return
    kernel = registry.get(("cpu", "copy", "", dst.dtype.str, 1), lambda: _build_copy(dst.dtype))
    _threads(blocks)
    kernel(dst, src)


def prepare(op: str, dtype) -> None:
    """Compile what a collective with this op and dtype will launch (reduce; scale for avg)."""
    dt = np.dtype(dtype)
    if supported(dt) and op in ops.COMBINE:
        registry.get(("cpu", "reduce", op, dt.str, 2), lambda: _build_reduce(op, dt))
        registry.get(("cpu", "copy", "", dt.str, 1), lambda: _build_copy(dt))
        if op == "avg":
            registry.get(("cpu", "scale", "", dt.str, 1), lambda: _build_scale(dt))


def warmup(op_names=ops.OPS, dtypes=ops.DTYPES) -> dict:
    """Compile every (op, dtype) now; returns the compile seconds per kernel."""
    for dt in map(np.dtype, dtypes):
        if not supported(dt):
            continue
        for op in op_names:
            registry.get(("cpu", "reduce", op, dt.str, 2), lambda: _build_reduce(op, dt))
    return registry.compiled()
