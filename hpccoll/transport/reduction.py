"""Where a lane's local primitives (Reduce, ReduceN, Copy, Scale) run: one backend per
kind of buffer and block allocation, every one computing the same bits as the NumPy
reference of hpccoll/core/ops.py (``tests/unit/test_ops.py`` checks it).

- ``HostOps``: NumPy, one thread (host arrays by default);
- ``CpuKernelOps(blocks)``: numba_kernels' CPU kernels on ``blocks`` threads (host arrays
  with a block count: the contention-aware allocation decides how many threads);
- ``CudaOps(blocks, threads_per_block, device)``: numba_kernels' CUDA kernels on hpccoll's
  stream of that GPU.
"""
from __future__ import annotations

import numpy as np

from ..base import ops as table
from . import staging


class HostOps:
    name = "numpy"

    @staticmethod
    def reduce(op, dst, a, b):
        table.reduce2(op, dst, a, b)

    @staticmethod
    def reduce_n(op, dst, srcs, divisor=0):
        table.reduce_n(op, dst, srcs, divisor)

    @staticmethod
    def copy(dst, src):
        np.copyto(dst, src)

    @staticmethod
    def scale(dst, src, divisor):
        table.scale(dst, src, divisor)


class CpuKernelOps:
    name = "numba-cpu"

    def __init__(self, blocks: int):
        from numba_kernels import cpu
        self.k, self.blocks = cpu, blocks

    def reduce(self, op, dst, a, b):
        self.k.reduce(op, dst, (a, b), self.blocks)

    def reduce_n(self, op, dst, srcs, divisor=0):
        self.k.reduce(op, dst, srcs, self.blocks, divisor=divisor)

    def copy(self, dst, src):
        self.k.copy(dst, src, self.blocks)

    def scale(self, dst, src, divisor):
        self.k.scale(dst, src, divisor, self.blocks)


class CudaOps:
    name = "numba-cuda"

    def __init__(self, blocks: int, threads_per_block: int, device=None):
        from numba_kernels import cuda as k
        self.k, self.blocks, self.tpb = k, blocks, threads_per_block
        self.device = device          # the GPU of the collective's arrays (None: current)
        self.stream = staging.engine_stream(device)

    def reduce(self, op, dst, a, b):
        self.k.reduce(op, dst, (a, b), self.blocks, self.tpb, self.stream)

    def reduce_n(self, op, dst, srcs, divisor=0):
        self.k.reduce(op, dst, srcs, self.blocks, self.tpb, self.stream, divisor=divisor)

    def copy(self, dst, src):
        self.k.copy(dst, src, self.blocks, self.tpb, self.stream)

    def scale(self, dst, src, divisor):
        self.k.scale(dst, src, divisor, self.blocks, self.tpb, self.stream)

    def sync(self):
        self.stream.synchronize()
