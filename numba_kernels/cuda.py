"""CUDA kernels (numba.cuda): k-source reductions, copy and scale, each a grid-stride
loop launched with an explicit ``blocks`` x ``threads_per_block`` on a given stream, so
they are correct for any size (including 0 and sizes not divisible by the grid) and the
caller decides how many SMs communication may occupy.

This module is imported only when a device collective needs it (``import hpccoll`` and
``import numba_kernels`` never touch CUDA).  Under NUMBA_ENABLE_CUDASIM=1 the same kernels
run in Numba's simulator, which needs ``cuda`` to be a module global of the kernels.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda

from . import ops, registry

ELEMS_PER_THREAD = 8    # grid-stride iterations a thread does before more blocks pay off


def _device_fns(op: str, dtype: np.dtype):
    """(combine, widen, narrow) device functions for op on dtype."""
    combine = cuda.jit(device=True)(ops.COMBINE[op])
    if dtype == np.float16:
        # NumPy scalar constructors: valid Python (simulator) and typed casts for Numba
        widen = cuda.jit(device=True)(lambda x: np.float32(x))
        narrow = cuda.jit(device=True)(lambda x: np.float16(x))
    else:
        widen = narrow = cuda.jit(device=True)(lambda x: x)
    return combine, widen, narrow


def _build_reduce(op: str, dtype: np.dtype, k: int):
    combine, widen, narrow = _device_fns(op, dtype)
    if k == 2:
        @cuda.jit
        def kernel(dst, a, b):
            i = cuda.grid(1)
            stride = cuda.gridsize(1)
            while i < dst.size:
                dst[i] = narrow(combine(widen(a[i]), widen(b[i])))
                i += stride
    elif k == 3:
        @cuda.jit
        def kernel(dst, a, b, c):
            i = cuda.grid(1)
            stride = cuda.gridsize(1)
            while i < dst.size:
                dst[i] = narrow(combine(combine(widen(a[i]), widen(b[i])), widen(c[i])))
                i += stride
    else:
        @cuda.jit
        def kernel(dst, a, b, c, d):
            i = cuda.grid(1)
            stride = cuda.gridsize(1)
            while i < dst.size:
                acc = combine(combine(widen(a[i]), widen(b[i])), widen(c[i]))
                dst[i] = narrow(combine(acc, widen(d[i])))
                i += stride
    x = cuda.device_array(2, dtype)
    kernel[1, 2](x, *([x] * k))   # compile now (warm-up), not inside a collective
    cuda.synchronize()
    return kernel


def _build_scale(dtype: np.dtype):
    _, widen, narrow = _device_fns("sum", dtype)

    @cuda.jit
    def kernel(dst, divisor):
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < dst.size:
            dst[i] = narrow(widen(dst[i]) / divisor)
            i += stride

    x = cuda.device_array(2, dtype)
    kernel[1, 2](x, 1)
    cuda.synchronize()
    return kernel


def _build_copy(dtype: np.dtype):

    @cuda.jit
    def kernel(dst, src):
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < dst.size:
            dst[i] = src[i]
            i += stride

    x = cuda.device_array(2, dtype)
    kernel[1, 2](x, x)
    cuda.synchronize()
    return kernel


def _launch(kernel, blocks: int, threads_per_block: int, stream, *args):
    if stream is None:
        kernel[int(blocks), int(threads_per_block)](*args)
    else:
        kernel[int(blocks), int(threads_per_block), stream](*args)


def reduce(op: str, dst, srcs, blocks: int, threads_per_block: int = 256, stream=None):
    """dst = srcs[0] (op) srcs[1] (op) ... on the device; dst may alias a source.
    Up to four sources per launch; more are folded in by further launches."""
    if len(srcs) < 2:
        raise ValueError("reduce needs at least two sources")
    if dst.size == 0:
        return
    dt = np.dtype(dst.dtype)
    first = srcs[:4]
    k = len(first)
    kernel = registry.get(("cuda", "reduce", op, dt.str, k), lambda: _build_reduce(op, dt, k))
    _launch(kernel, blocks, threads_per_block, stream, dst, *first)
    rest = srcs[4:]
    while rest:
        more = rest[:3]
        rest = rest[3:]
        k = len(more) + 1
        kernel = registry.get(("cuda", "reduce", op, dt.str, k), lambda: _build_reduce(op, dt, k))
        _launch(kernel, blocks, threads_per_block, stream, dst, dst, *more)


def scale(dst, divisor: int, blocks: int, threads_per_block: int = 256, stream=None):
    if dst.size == 0:
        return
    dt = np.dtype(dst.dtype)
    kernel = registry.get(("cuda", "scale", "", dt.str, 1), lambda: _build_scale(dt))
    _launch(kernel, blocks, threads_per_block, stream, dst, divisor)


def copy(dst, src, blocks: int, threads_per_block: int = 256, stream=None):
    if dst.size == 0:
        return
    dt = np.dtype(dst.dtype)
    kernel = registry.get(("cuda", "copy", "", dt.str, 1), lambda: _build_copy(dt))
    _launch(kernel, blocks, threads_per_block, stream, dst, src)


def multiprocessors() -> int:
    try:
        return int(cuda.get_current_device().MULTIPROCESSOR_COUNT)
    except Exception:   # the simulator has no such attribute
        return 1


def default_blocks(nelems: int, threads_per_block: int, max_blocks: int) -> int:
    """Enough blocks that each thread does about ELEMS_PER_THREAD elements, at most
    max_blocks (NCCL likewise grows channels with the message size)."""
    need = math.ceil(max(1, nelems) / (threads_per_block * ELEMS_PER_THREAD))
    return max(1, min(int(max_blocks), need))


def prepare(op, dtype) -> None:
    """Compile what a collective with this op and dtype will launch, on the calling thread:
    copy always; reduce for reductions; scale for avg."""
    dt = np.dtype(dtype)
    registry.get(("cuda", "copy", "", dt.str, 1), lambda: _build_copy(dt))
    if op in ops.COMBINE:
        registry.get(("cuda", "reduce", op, dt.str, 2), lambda: _build_reduce(op, dt, 2))
        if op == "avg":
            registry.get(("cuda", "scale", "", dt.str, 1), lambda: _build_scale(dt))


def warmup(op_names=ops.OPS, dtypes=ops.DTYPES, sources=(2,)) -> dict:
    for dt in map(np.dtype, dtypes):
        for op in op_names:
            for k in sources:
                registry.get(("cuda", "reduce", op, dt.str, k), lambda: _build_reduce(op, dt, k))
    return registry.compiled()
