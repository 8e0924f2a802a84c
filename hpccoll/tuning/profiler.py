"""Measure a profile on the machine at hand (collective over the world; run under mpiexec).

(a) allreduce time T(bytes, blocks): for each size, every block count is timed in turn
    within each repeat (so that a noisy moment hits all of them alike), each call after
    a barrier, the slowest rank's time kept; the profile holds medians over repeats;
(b) a compute kernel (a float32 matrix multiply: NumPy/BLAS on CPU, CuPy on GPU) timed
    alone and while an allreduce with each block count is in flight; only kernel runs
    that ended before the allreduce did count.  slowdown(b) = median contended / median
    alone on each rank, the largest over ranks (the slowest rank gates data parallelism).

Block count 0 means the library's own choice (allreduce called without ``blocks=``).
"""
from __future__ import annotations

import inspect
import time
from typing import Sequence

import numpy as np

from ..errors import ArgumentError, HpcCollError
from ..timing import time_interleaved
from .profile import Profile


def blocks_supported(comm) -> bool:
    """Whether this build's collectives take ``blocks=`` (the numba_kernels issue)."""
    return "blocks" in inspect.signature(comm.allreduce).parameters


def require_blocks(comm, blocks: Sequence[int]) -> None:
    if any(b > 0 for b in blocks) and not blocks_supported(comm):
        raise HpcCollError(
            "blocks: this hpccoll build's allreduce has no blocks= keyword yet (it comes with "
            "the numba_kernels issue), so block counts cannot be profiled. Profile the "
            "library's own allocation instead with --blocks default (block count 0).")


def allreduce(comm, x, out, b: int):
    if b > 0:
        return comm.allreduce(x, out, op="sum", blocks=b)
    return comm.allreduce(x, out, op="sum")


class Kernel:
    """An n x n float32 matmul on the host (NumPy) or the GPU (CuPy, synchronized)."""

    def __init__(self, n: int, device: str = "cpu"):
        if device not in ("cpu", "gpu"):
            raise ArgumentError(f"device: expected 'cpu' or 'gpu', got {device!r}")
        if device == "gpu":
            import cupy as xp
        else:
            xp = np
        rng = np.random.default_rng(0)
        self.xp, self.device, self.n = xp, device, n
        self.a = xp.asarray(rng.standard_normal((n, n), dtype=np.float32))
        self.b = xp.asarray(rng.standard_normal((n, n), dtype=np.float32))
        self.c = xp.empty((n, n), dtype=np.float32)

    def __call__(self) -> float:
        t0 = time.perf_counter()
        self.xp.matmul(self.a, self.b, out=self.c)
        if self.device == "gpu":
            self.xp.cuda.get_current_stream().synchronize()
        return time.perf_counter() - t0

    def describe(self) -> str:
        lib = "CuPy" if self.device == "gpu" else "NumPy/BLAS"
        return f"{self.n}x{self.n} float32 matmul ({lib})"


def comm_times(comm, mpi_comm, sizes, blocks, repeats: int, warmup: int = 2):
    """(medians[size, block], samples[size, block, repeat]) in seconds."""
    samples = np.zeros((len(sizes), len(blocks), repeats))
    for i, nbytes in enumerate(sizes):
        n = max(1, int(nbytes) // 4)
        x = np.ones(n, dtype=np.float32)
        out = np.empty_like(x)
        fns = [(lambda b=b: allreduce(comm, x, out, b).wait()) for b in blocks]
        for j, t in enumerate(time_interleaved(mpi_comm, fns, repeats, warmup)):
            samples[i, j] = t
    return np.median(samples, axis=2), samples


def slowdowns(comm, mpi_comm, blocks, kernel: Kernel, contend_bytes: int, rounds: int,
              alone_per_round: int = 5):
    """(slowdown per block count, per-rank alone median, per-rank contended medians,
    contended sample counts).  Every rank issues the same collectives (rounds x blocks),
    so they match whatever the local timing."""
    from mpi4py import MPI
    x = np.ones(max(1, contend_bytes // 4), dtype=np.float32)
    out = np.empty_like(x)
    kernel()                                   # first call: allocation, BLAS threads
    alone: list = []
    contended: list = [[] for _ in blocks]
    for _ in range(rounds):
        mpi_comm.Barrier()                     # no rank is still busy with a collective
        alone.extend(kernel() for _ in range(alone_per_round))
        for j, b in enumerate(blocks):
            mpi_comm.Barrier()
            w = allreduce(comm, x, out, b)
            while True:
                dt = kernel()
                if w.test():
                    break                      # it ended during this run: not contended
                contended[j].append(dt)
            w.wait()
    counts = np.array([len(c) for c in contended], dtype=np.int64)
    counts_min = np.empty_like(counts)
    mpi_comm.Allreduce(counts, counts_min, op=MPI.MIN)
    if np.any(counts_min == 0):
        short = [b for b, c in zip(blocks, counts_min) if c == 0]
        raise HpcCollError(
            f"contend_bytes: an allreduce of {contend_bytes} bytes with block count(s) {short} "
            f"ended before one {kernel.describe()} did on some rank; raise --contend-bytes or "
            "lower --kernel-size so that kernels run while the allreduce is in flight")
    med_alone = float(np.median(alone))
    med_cont = np.array([np.median(c) for c in contended])
    ratio = med_cont / med_alone
    worst = np.empty_like(ratio)
    mpi_comm.Allreduce(ratio, worst, op=MPI.MAX)
    all_alone = np.array(mpi_comm.allgather(med_alone))
    all_cont = np.array(mpi_comm.allgather(med_cont))
    all_counts = np.array(mpi_comm.allgather(counts))
    return worst, all_alone, all_cont, all_counts


def measure(ctx, sizes: Sequence[int], blocks: Sequence[int], *, repeats: int = 10,
            kernel_size: int = 256, contend_bytes: int = 16 << 20, rounds: int = 5,
            device: str = "cpu") -> Profile:
    """A measured profile (collective over ctx.world)."""
    from mpi4py import MPI
    sizes = sorted(set(int(s) for s in sizes))
    blocks = sorted(set(int(b) for b in blocks))
    if not sizes or sizes[0] <= 0:
        raise ArgumentError(f"sizes: expected byte counts > 0, got {sizes}")
    if not blocks or blocks[0] < 0:
        raise ArgumentError(f"blocks: expected block counts >= 0, got {blocks}")
    if repeats < 1 or rounds < 1 or kernel_size < 1:
        raise ArgumentError("repeats, rounds, kernel_size: expected integers >= 1")
    comm = ctx.world
    require_blocks(comm, blocks)
    mpi_comm = MPI.COMM_WORLD.Dup()
    try:
        kernel = Kernel(kernel_size, device)
        med, samples = comm_times(comm, mpi_comm, sizes, blocks, repeats)
        slow, alone, cont, counts = slowdowns(comm, mpi_comm, blocks, kernel, contend_bytes,
                                              rounds)
    finally:
        mpi_comm.Free()
    attrs = {"device": device, "kernel": kernel.describe(), "repeats": repeats, "rounds": rounds,
             "contend_bytes": contend_bytes, "blocks_api": blocks_supported(comm),
             "statistic": "median over repeats of the slowest rank's time",
             "blocks_meaning": "CPU: reduction threads; GPU: CUDA blocks; 0: library default"}
    return Profile(np.array(sizes), np.array(blocks), med, slow,
                   {"comm_time": "measured", "slowdown": "measured"}, attrs,
                   {"comm_time": samples, "compute_alone_median_per_rank": alone,
                    "compute_contended_median_per_rank": cont,
                    "contended_samples_per_rank": counts})
