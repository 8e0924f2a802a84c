"""The measurement loop: for every (type, op, root, size), out of place then in place,
each library timed on the same buffers with the libraries interleaved iteration by
iteration (so drift and noise hit them alike), then checked.

Timing: every timed call starts right after an MPI barrier and ends when the collective
completed on this rank (GPU: the stream synchronized).  Per iteration the ranks' times
are combined as nccl-tests' -a says (0 rank 0, 1 mean, 2 min, 3 max); the table shows
the mean over iterations, the result file keeps every iteration.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from . import cases
from .load import spread
from .table import PLACEMENTS

AVERAGE = {0: "rank0", 1: "mean", 2: "min", 3: "max"}


@dataclass
class Plan:
    coll: str
    sizes: list
    types: list          # nccl-tests type names
    ops: list            # op names, or [None] for collectives without one
    roots: list          # roots, or [-1] for collectives without one
    iters: int
    warmup: int
    check: int
    average: int
    libraries: tuple     # the library under test first, then the baseline if any
    policy: str


@dataclass
class Line:
    """One printed line: both placements of every library at one size."""
    index: int
    type_name: str
    dtype: np.dtype
    op: Optional[str]
    root: int
    shape: cases.Shape
    rows: list           # table rows, placement-major then library (rank 0 only)
    traces: list         # per placement: engine trace records of every rank (rank 0 only)
    algos: tuple = ()    # per placement: the algorithm hpccoll's plan chose ("" if none)


def combine(times: np.ndarray, average: int) -> np.ndarray:
    """(ranks, iters) seconds -> (iters,) per nccl-tests' -a."""
    if average == 0:
        return times[0]
    return {1: np.mean, 2: np.min, 3: np.max}[average](times, axis=0)


class Progress:
    """A status line that rewrites itself, on rank 0 when stdout is a terminal only."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._last = 0.0
        self._shown = False

    def update(self, text: str) -> None:
        now = time.monotonic()
        if not self.enabled or now - self._last < 0.1:
            return
        self._last = now
        sys.stdout.write("\r\033[K" + text)
        sys.stdout.flush()
        self._shown = True

    def clear(self) -> None:
        if self._shown:
            sys.stdout.write("\r\033[K")
            self._shown = False


class Sweep:
    def __init__(self, plan: Plan, mpi, comm, ctx=None, xp=np, sync: Callable = lambda: None,
                 progress: Optional[Progress] = None):
        self.plan, self.mpi, self.comm, self.ctx = plan, mpi, comm, ctx
        self.xp, self.sync = xp, sync
        self.progress = progress or Progress(False)
        self.rank, self.nranks = mpi.Get_rank(), mpi.Get_size()
        self.tracing = ctx is not None and ctx.settings.trace

    def lines(self):
        """Measure every line; yields a Line per size as soon as it is measured."""
        p = self.plan
        index = 0
        for type_name in p.types:
            dtype = cases.numpy_dtype(type_name)
            for op in p.ops:
                if op == "avg" and not _floating(dtype):
                    continue          # -o all with an integer type: avg is undefined
                for root in p.roots:
                    for nbytes in p.sizes:
                        sh = cases.shape(p.coll, nbytes, dtype.itemsize, self.nranks)
                        yield self._line(index, type_name, dtype, op, root, sh)
                        index += 1

    def _line(self, index, type_name, dtype, op, root, sh) -> Line:
        p = self.plan
        L = len(p.libraries)
        local = np.zeros((2, L, p.iters))
        wrong = np.zeros((2, L), dtype=np.int64)
        traces, algos = [], []
        for k, inplace in enumerate((False, True)):
            case = cases.Case(p.coll, sh, dtype, op, max(root, 0), inplace, self.rank,
                              self.nranks, self.xp)
            what = f"{p.coll} {sh.nbytes} B {type_name} {PLACEMENTS[k]}"
            plans = self.ctx.world._state.plans if self.ctx is not None else {}
            seen = {id(plan) for plan in plans.values()}
            local[k], wrong[k], recs = self._measure(case, what)
            # the plans this placement made: which algorithm hpccoll chose for it
            algos.append("/".join(sorted({plan.algo for plan in list(plans.values())
                                          if id(plan) not in seen})))
            traces.append(recs)
            del case
        gathered = self.mpi.gather((local, wrong, traces), root=0)
        rows, all_traces = [], []
        if self.rank == 0:
            times = np.stack([g[0] for g in gathered])          # (ranks, 2, L, iters)
            wrong_sum = sum(g[1] for g in gathered)
            for k in range(2):
                for j, lib in enumerate(p.libraries):
                    rows.append(self._row(sh, type_name, dtype, op, root, k, lib,
                                          times[:, k, j, :], int(wrong_sum[k, j])))
                all_traces.append([r for g in gathered for r in g[2][k]])
        return Line(index, type_name, dtype, op, root, sh, rows, all_traces, tuple(algos))

    def _measure(self, case: cases.Case, what: str):
        p = self.plan
        calls = [case.call(lib, self.ctx.world if lib == "hpccoll" else self.mpi)
                 for lib in p.libraries]
        sync, barrier = self.sync, self.mpi.Barrier
        out = np.zeros((len(calls), p.iters))
        if self.tracing:
            self.ctx.trace(clear=True)
        case.reset()
        sync()
        total = p.warmup + p.iters
        for it in range(total):
            if self.rank == 0:
                self.progress.update(f"{what}: iteration {it + 1}/{total}")
            for j, call in enumerate(calls):
                barrier()
                t0 = time.perf_counter()
                call()
                sync()
                dt = time.perf_counter() - t0
                if it >= p.warmup:
                    out[j, it - p.warmup] = dt
        wrong = np.zeros(len(calls), dtype=np.int64)
        for j, lib in enumerate(p.libraries):
            for _ in range(p.check):
                case.reset()
                sync()
                barrier()
                calls[j]()
                sync()
                wrong[j] += case.wrong(lib)
        recs = self.ctx.trace(clear=True) if self.tracing else []
        return out, wrong, recs

    def _row(self, sh, type_name, dtype, op, root, k, lib, times, wrong) -> dict:
        p = self.plan
        it = combine(times, p.average) * 1e6
        mean = float(np.mean(it))
        p10, _, p90 = spread(it)
        algbw = sh.nbytes / 1e3 / mean if mean > 0 else 0.0    # bytes/us/1e3 = GB/s
        return {
            "coll": p.coll, "library": lib, "policy": p.policy if lib == "hpccoll" else "",
            "placement": PLACEMENTS[k], "inplace": bool(k), "size": int(sh.nbytes),
            "count": int(sh.count), "dtype": dtype.name, "type": type_name,
            "op": op or "none", "root": int(root), "nranks": int(self.nranks),
            "iters": int(p.iters), "warmup": int(p.warmup), "average": AVERAGE[p.average],
            "time_us": mean, "min_us": float(np.min(it)), "median_us": float(np.median(it)),
            "max_us": float(np.max(it)), "stdev_us": float(np.std(it)),
            "p10_us": p10, "p90_us": p90,
            "algbw": algbw, "busbw": algbw * cases.busbw_factor(p.coll, self.nranks),
            "wrong": int(wrong) if p.check else -1,
            "times_us": it.astype(np.float64),
            "rank_mean_us": (np.mean(times, axis=1) * 1e6).astype(np.float64),
        }


def _floating(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or dtype.name == "bfloat16"


def trace_rows(records: list, row: int, warmup: int, iters: int) -> list[dict]:
    """Engine trace records of one measurement as table rows, labelled with the table row
    they belong to and the phase (warmup, timed, check) they ran in.  A rank's records
    come in issue order, because the benchmark runs one collective at a time."""
    out, seen = [], {}
    for r in records:
        k = seen[r["rank"]] = seen.get(r["rank"], -1) + 1
        phase = "warmup" if k < warmup else "timed" if k < warmup + iters else "check"
        out.append({
            "rank": int(r["rank"]), "row": int(row), "phase": phase, "comm": str(r["comm"]),
            "ident": str(r["ident"]), "coll": str(r["coll"]), "dtype": str(r["dtype"]),
            "count": int(r["count"]), "bytes": int(r["bytes"]), "algo": str(r["algo"]),
            "state": str(r["state"]), "t_issue": _time(r["t_issue"]),
            "t_start": _time(r["t_start"]), "t_end": _time(r["t_end"]),
            "tries": int(r["tries"]), "yields": int(r["yields"]),
            "yields_progress": int(r["yields_progress"]), "polls": int(r["polls"]),
            "gseq": -1 if r.get("gseq") is None else int(r["gseq"]),
            "yield_times": [float(t) for t in r.get("yield_times", ())],
        })
    return out


def _time(t) -> float:
    return math.nan if t is None else float(t)
