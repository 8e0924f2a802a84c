"""Reduction and copy kernels for hpccoll, with explicit block counts.

Two targets with one signature each::

    from numba_kernels import cuda, cpu
    cuda.reduce(op, dst, srcs, blocks, threads_per_block=256, stream=None)
    cpu.reduce(op, dst, srcs, blocks)          # blocks = CPU threads
    cuda.copy(dst, src, blocks, ...), cuda.scale(dst, divisor, blocks, ...)

- ops: sum, prod, min, max, avg (avg = sum, then ``scale`` by the number of ranks);
  dtypes: int8, uint8, int32, int64, float16, float32, float64 (see ``ops``);
- ``srcs``: two or more source arrays; ``dst`` may alias one of them;
- float16 accumulates in float32 and is rounded once (``ops`` explains why);
- each (target, op, dtype, sources) is compiled once, on first use or by ``warmup()``,
  and its compile time is kept in ``registry.COMPILE_SECONDS``.

Submodules import Numba lazily: importing this package costs nothing.
"""
from . import ops, registry

__all__ = ["ops", "registry"]
