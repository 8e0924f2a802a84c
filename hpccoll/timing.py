"""Timing collectives the way benchmarks should: interleaved with the baseline in
one run, synchronized starts, the slowest rank's time per iteration, medians."""
from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np

from .base.units import human_bytes, parse_size  # noqa: F401  (the tools' formatting)


def time_interleaved(mpi_comm, fns: Sequence[Callable[[], None]], iters: int, warmup: int = 2):
    """Run each fn ``warmup`` + ``iters`` times, alternating between them every iteration.
    Each timed call starts after a barrier; its time is the maximum over ranks.
    Returns one array of ``iters`` seconds per fn (identical on every rank)."""
    from mpi4py import MPI
    k = len(fns)
    local = np.zeros((k, iters))
    for it in range(warmup + iters):
        for j, fn in enumerate(fns):
            mpi_comm.Barrier()
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            if it >= warmup:
                local[j, it - warmup] = dt
    worst = np.empty_like(local)
    mpi_comm.Allreduce(local, worst, op=MPI.MAX)
    return [worst[j] for j in range(k)]


def handoff_note(ns: float) -> str:
    """", a cache-line handoff N ns" for a benchmark's header (``ctx.handoff_ns``), "" where
    it was not measured: where the ranks' cores lie moves every shared-memory figure
    (docs/performance.md, "The floor")."""
    return f", a cache-line handoff {ns:.0f} ns" if ns == ns else ""


def parse_bytes(text: str) -> int:
    return parse_size(text)
