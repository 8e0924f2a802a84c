"""Measure a profile on the machine at hand (collective over the world; run under mpiexec).

(a) allreduce time T(bytes, blocks): for each size, every block count is timed in turn
    within each repeat (so that a noisy moment hits all of them alike), each call after
    a barrier, the slowest rank's time kept; the profile holds medians over repeats;
(b) a compute kernel (a float32 matrix multiply: NumPy/BLAS on CPU, CuPy on GPU) timed
    alone, and run back to back while an allreduce with each block count is in flight:
    slowdown(b) = flight time / kernel work done during it (``slowdowns``), the largest
    over ranks (the slowest rank gates data parallelism).

Every decision that shapes the sequence of collectives (more rounds, giving up) is taken
together, so no rank raises alone and leaves the others waiting in a collective.

Block count 0 means the library's own choice (allreduce called without ``blocks=``).
"""
from __future__ import annotations

import inspect
import time
from typing import Optional, Sequence

import numpy as np

from ..errors import ArgumentError, HpcCollError
from ..timing import time_interleaved
from .profile import Profile


def blocks_supported(comm) -> bool:
    """Whether this build's collectives take ``blocks=`` (builds before numba_kernels don't)."""
    return "blocks" in inspect.signature(comm.allreduce).parameters


def require_blocks(comm, blocks: Sequence[int]) -> None:
    if any(b > 0 for b in blocks) and not blocks_supported(comm):
        raise HpcCollError(
            "blocks: this hpccoll build's allreduce has no blocks= keyword (builds before "
            "numba_kernels), so block counts cannot be profiled. Profile the library's own "
            "allocation instead with --blocks default (block count 0).")


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


def _flight(comm, mpi_comm, x, out, b: int, kernel: Kernel):
    """One allreduce with ``b`` blocks in flight, the kernel run back to back until it
    ended: (issue time, end time, [(start, end) of every kernel run])."""
    mpi_comm.Barrier()                         # no rank is still busy with a collective
    ended: list = []
    runs = []
    t_issue = time.perf_counter()
    w = allreduce(comm, x, out, b)
    w.add_done_callback(lambda _w: ended.append(time.perf_counter()))
    while True:
        t0 = time.perf_counter()
        kernel()
        runs.append((t0, time.perf_counter()))
        if w.test():
            break
    w.wait()
    return t_issue, ended[0] if ended else runs[-1][1], runs


def work_done(t_end: float, runs, t_alone: float) -> float:
    """Kernel work done before ``t_end``, in alone-seconds: every run that ended before,
    and for the run ``t_end`` falls in, the middle of what it can have done before: at
    least its alone time less the time it ran after ``t_end``, at most the time it ran
    before (and its alone time).  The run's own timing cannot tell where in it the work
    happened: a kernel whose thread got the CPU (or the GIL) back only after the
    allreduce ended computed early, one slowed evenly computed late."""
    whole = sum(1 for t0, t1 in runs if t1 <= t_end)
    last = next(((t0, t1) for t0, t1 in runs if t1 > t_end), None)
    if last is None:
        return whole * t_alone
    most = min(t_alone, max(0.0, t_end - last[0]))
    least = min(most, max(0.0, t_alone - (last[1] - t_end)))
    return whole * t_alone + (least + most) / 2


def _sums(flights, alone, nblocks: int) -> np.ndarray:
    """[flight seconds, work done (alone-seconds)] summed per block count."""
    t_alone = float(np.median(alone))
    sums = np.zeros((nblocks, 2))
    for j, t_issue, t_end, runs in flights:
        sums[j] += (t_end - t_issue, work_done(t_end, runs, t_alone))
    return sums


def _lacking(mpi_comm, sums) -> list:
    """Block counts (indices) whose flights hold no work on some rank (collective: the
    same list on every rank)."""
    from mpi4py import MPI
    have = (sums[:, 1] > 0).astype(np.int32)
    every = np.empty_like(have)
    mpi_comm.Allreduce(have, every, op=MPI.MIN)
    return [j for j in range(len(have)) if not every[j]]


def slowdowns(comm, mpi_comm, blocks, kernel: Kernel, contend_bytes: int, rounds: int,
              alone_per_round: int = 5, extra_rounds: Optional[int] = None):
    """Compute slowdown per block count, as the model defines it: a rate.

    Each round times the kernel alone, then for each block count issues one allreduce and
    runs kernels back to back until it has ended.  slowdown = flight time (issue to
    completion callback) / kernel work done in it (``work_done``, in alone-seconds),
    summed over rounds; the largest over ranks.  Every rank issues the same allreduces, so
    they match whatever the local timing.  On a loaded machine a short allreduce can end
    before any kernel run began; block counts whose flights hold no work on some rank get
    more rounds, decided together (up to ``extra_rounds``, default max(10, 2 x rounds)),
    and if one still has none, every rank raises the same HpcCollError.

    Returns (slowdown, per-rank alone median, per-rank [flight, work] sums per block,
    rounds measured per block)."""
    from mpi4py import MPI
    x = np.ones(max(1, contend_bytes // 4), dtype=np.float32)
    out = np.empty_like(x)
    kernel()                                   # first call: allocation, BLAS threads
    alone: list = []
    flights: list = []                         # (block index, issue, end, kernel runs)
    done = np.zeros(len(blocks), dtype=np.int64)
    extra = max(10, 2 * rounds) if extra_rounds is None else extra_rounds
    todo = list(range(len(blocks)))
    for r in range(rounds + extra):
        if r >= rounds:
            todo = _lacking(mpi_comm, _sums(flights, alone, len(blocks)))
            if not todo:
                break
        mpi_comm.Barrier()
        alone.extend(kernel() for _ in range(alone_per_round))
        for j in todo:
            flights.append((j, *_flight(comm, mpi_comm, x, out, blocks[j], kernel)))
            done[j] += 1
    sums = _sums(flights, alone, len(blocks))
    short = _lacking(mpi_comm, sums)
    if short:
        idle = np.array(mpi_comm.allgather(sums[:, 1] <= 0))
        ranks = sorted({int(r) for r in np.nonzero(idle[:, short].any(axis=1))[0]})
        raise HpcCollError(
            f"contend_bytes: in {int(done.max())} rounds, {kernel.describe()} made no "
            f"measurable progress while allreduces of {contend_bytes} bytes with block "
            f"count(s) {[blocks[j] for j in short]} were in flight, on rank(s) {ranks} (each "
            f"allreduce ended before a kernel run began): this machine is too busy to "
            f"measure, or the allreduce is too short for the kernel; raise --contend-bytes "
            f"or lower --kernel-size")
    ratio = sums[:, 0] / sums[:, 1]
    worst = np.empty_like(ratio)
    mpi_comm.Allreduce(ratio, worst, op=MPI.MAX)
    return (worst, np.array(mpi_comm.allgather(float(np.median(alone)))),
            np.array(mpi_comm.allgather(sums)), done)


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
        slow, alone, flight_work, done = slowdowns(comm, mpi_comm, blocks, kernel,
                                                   contend_bytes, rounds)
    finally:
        mpi_comm.Free()
    attrs = {"device": device, "kernel": kernel.describe(), "repeats": repeats, "rounds": rounds,
             "slowdown_rounds": [int(n) for n in done],
             "contend_bytes": contend_bytes, "blocks_api": blocks_supported(comm),
             "statistic": "median over repeats of the slowest rank's time",
             "blocks_meaning": "CPU: reduction threads; GPU: CUDA blocks; 0: library default"}
    return Profile(np.array(sizes), np.array(blocks), med, slow,
                   {"comm_time": "measured", "slowdown": "measured"}, attrs,
                   {"comm_time": samples, "compute_alone_median_per_rank": alone,
                    "flight_and_work_per_rank": flight_work})
