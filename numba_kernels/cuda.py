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
    """(combine, widen, narrow) device functions for op on dtype (the accumulation rule of
    hpccoll/core/ops.py: float16 combines in float32)."""
    combine = cuda.jit(device=True)(ops.COMBINE[op])
    if dtype in ops.LOW_PRECISION:
        # NumPy scalar constructors: valid Python (simulator) and typed casts for Numba
        widen = cuda.jit(device=True)(lambda x: np.float32(x))
        narrow = cuda.jit(device=True)(lambda x: np.float16(x))
    else:
        widen = narrow = cuda.jit(device=True)(lambda x: x)
    return combine, widen, narrow


def _build_reduce2(op: str, dtype: np.dtype):
    combine, widen, narrow = _device_fns(op, dtype)

    @cuda.jit
    def kernel(dst, a, b):
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < dst.size:
            dst[i] = narrow(combine(widen(a[i]), widen(b[i])))
            i += stride

    x = cuda.to_device(np.zeros(2, dtype))  # zeros: no garbage to add
    kernel[1, 2](x, x, x)     # compile now (warm-up), not inside a collective
    cuda.synchronize()
    return kernel


def _build_fold(op: str, dtype: np.dtype, avg: bool):
    """The k-source reduction as three grid-stride kernels over an accumulator array (the
    destination itself unless the dtype accumulates wider): start (acc = widen(src)),
    fold (acc = acc (op) widen(src)), finish (dst = narrow(acc)); ``avg``: every source
    divided by the divisor first.  (Two builds, not a runtime branch: integers must never
    pass through a float expression.)"""
    combine, widen, narrow = _device_fns(op, dtype)
    if avg:
        term = cuda.jit(device=True)(lambda x, d: x / d)
    else:
        term = cuda.jit(device=True)(lambda x, d: x)

    @cuda.jit
    def start(acc, src, divisor):
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < acc.size:
            acc[i] = term(widen(src[i]), divisor)
            i += stride

    @cuda.jit
    def fold(acc, src, divisor):
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < acc.size:
            acc[i] = combine(acc[i], term(widen(src[i]), divisor))
            i += stride

    @cuda.jit
    def finish(dst, acc):
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < dst.size:
            dst[i] = narrow(acc[i])
            i += stride

    x = cuda.to_device(np.zeros(2, dtype))
    a = cuda.to_device(np.zeros(2, ops.accumulator(dtype)))
    one = ops.accumulator(dtype).type(1)
    start[1, 2](a, x, one)
    fold[1, 2](a, x, one)
    finish[1, 2](x, a)
    cuda.synchronize()
    return start, fold, finish


def _build_copy(dtype: np.dtype):

    @cuda.jit
    def kernel(dst, src):
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < dst.size:
            dst[i] = src[i]
            i += stride

    x = cuda.to_device(np.zeros(2, dtype))
    kernel[1, 2](x, x)
    cuda.synchronize()
    return kernel


def _launch(kernel, blocks: int, threads_per_block: int, stream, *args):
    if stream is None:
        kernel[int(blocks), int(threads_per_block)](*args)
    else:
        kernel[int(blocks), int(threads_per_block), stream](*args)


def _get(kind: str, op: str, dt: np.dtype):
    builders = {"reduce": lambda: _build_reduce2(op, dt),
                "fold": lambda: _build_fold(op, dt, False), "avg": lambda: _build_fold(op, dt, True),
                "copy": lambda: _build_copy(dt)}
    return registry.get(("cuda", kind, op, dt.str, 2), builders[kind])


def reduce(op: str, dst, srcs, blocks: int, threads_per_block: int = 256, stream=None,
           divisor: int = 0):
    """dst = srcs[0] (op) srcs[1] (op) ... on the device, in order, in the accumulator
    type, rounded once; with a divisor (avg) every source is divided by it first.  dst
    may alias srcs[0] only."""
    if dst.size == 0:
        return
    op = "sum" if op == "avg" else op     # avg sums contributions divided first
    dt = np.dtype(dst.dtype)
    shape = (blocks, threads_per_block, stream)
    if len(srcs) == 2 and not divisor:
        _launch(_get("reduce", op, dt), *shape, dst, srcs[0], srcs[1])
        return
    start, fold, finish = _get("avg" if divisor else "fold", op, dt)
    acc_dt = ops.accumulator(dt)
    acc = dst if acc_dt == dt else cuda.device_array(dst.size, acc_dt, stream=stream or 0)
    d = acc_dt.type(divisor)
    _launch(start, *shape, acc, srcs[0], d)
    for s in srcs[1:]:
        _launch(fold, *shape, acc, s, d)
    if acc is not dst:
        _launch(finish, *shape, dst, acc)


def scale(dst, src, divisor: int, blocks: int, threads_per_block: int = 256, stream=None):
    """dst = src / divisor in the accumulator type, rounded once (dst may be src)."""
    if dst.size == 0:
        return
    dt = np.dtype(dst.dtype)
    start, _, finish = _get("avg", "sum", dt)
    acc_dt = ops.accumulator(dt)
    if acc_dt == dt:
        _launch(start, blocks, threads_per_block, stream, dst, src, acc_dt.type(divisor))
        return
    acc = cuda.device_array(dst.size, acc_dt, stream=stream or 0)
    _launch(start, blocks, threads_per_block, stream, acc, src, acc_dt.type(divisor))
    _launch(finish, blocks, threads_per_block, stream, dst, acc)


def copy(dst, src, blocks: int, threads_per_block: int = 256, stream=None):
    if dst.size == 0:
        return
    _launch(_get("copy", "", np.dtype(dst.dtype)), blocks, threads_per_block, stream, dst, src)


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
    copy always; reduce for reductions; the fold kernels for avg (its division)."""
    dt = np.dtype(dtype)
    avg = op == "avg"
    _get("copy", "", dt)
    if op in ops.COMBINE:
        op = "sum" if op == "avg" else op
        _get("reduce", op, dt)
        if avg:
            _get("avg", "sum", dt)


def warmup(op_names=ops.KERNEL_OPS, dtypes=ops.DTYPES) -> dict:
    for dt in map(np.dtype, dtypes):
        for op in op_names:
            _get("reduce", op, dt)
    return registry.compiled()
