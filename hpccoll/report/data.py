"""Benchmark runs as series: one series per (run, library, policy), each a set of points
keyed by (collective, type, op, root, placement, size), and the rule that picks each
series' baseline.  Runs of other kinds are summarized by kinds.py."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from .. import h5log

STATS = {"mean": "time_us", "median": "median_us", "min": "min_us", "max": "max_us",
         "p10": "p10_us", "p90": "p90_us"}
GROUP = ("coll", "type", "op", "root", "placement")
_PERCENTILE = {"p10_us": 10, "p90_us": 90}


def stat_value(row: dict, stat: str) -> float:
    """A row's time under ``stat``; percentiles of files written before the benchmark
    stored them come from the iterations (``times_us``), as the benchmark computes them."""
    col = STATS[stat]
    if col in row:
        return row[col]
    import numpy as np
    return float(np.percentile(np.asarray(row["times_us"], dtype=np.float64), _PERCENTILE[col]))


def group_key(row: dict) -> tuple:
    return tuple(row[k] for k in GROUP)


@dataclass
class Series:
    run: h5log.Run
    run_label: str
    library: str
    policy: str
    rows: list = field(default_factory=list)
    prefix: bool = False      # show the run label (more than one run loaded)

    @property
    def lib_name(self) -> str:
        return f"{self.library}/{self.policy}" if self.library == "hpccoll" and self.policy else self.library

    @property
    def name(self) -> str:
        return f"{self.run_label}: {self.lib_name}" if self.prefix else self.lib_name

    def matches(self, libspec: str) -> bool:
        lib, _, pol = libspec.partition("/")
        return self.library == lib and (not pol or self.policy == pol)

    def points(self, stat: str = "mean") -> dict:
        """(group key, size) -> (time_us, busbw) under the chosen statistic."""
        out = {}
        for r in self.rows:
            t = stat_value(r, stat)
            busbw = r["busbw"] * r["time_us"] / t if t > 0 else 0.0
            out[(group_key(r), r["size"])] = (t, busbw)
        return out


class ReportError(Exception):
    """A bad input file or argument; the message says which and why."""


def read_runs(path: str) -> list:
    if not os.path.exists(path):
        raise ReportError(f"{path}: no such file")
    try:
        return h5log.read(path)
    except (OSError, ValueError) as exc:
        raise ReportError(f"{path}: not a readable hpccoll result file ({exc})") from None


def load(paths: list, loaded: Optional[list] = None) -> list[Series]:
    """Every series of every benchmark run in ``paths``, in file, run, then table order
    (``loaded``: [(path, runs)] already read)."""
    series: list[Series] = []
    nruns = 0
    for path, runs in loaded if loaded is not None else [(p, read_runs(p)) for p in paths]:
        runs = [r for r in runs if r.kind == "bench"]
        stem = Path(path).stem
        for run in runs:
            nruns += 1
            label = stem if len(runs) == 1 else f"{stem}/{run.name}"
            by_lib: dict = {}
            for name, rows in run.tables.items():
                if name == "floor":       # the MPI's own from C (hpccoll-bench --floor)
                    continue
                for r in rows:
                    key = (r["library"], r.get("policy", ""))
                    if key not in by_lib:
                        by_lib[key] = Series(run, label, key[0], key[1])
                        series.append(by_lib[key])
                    by_lib[key].rows.append(r)
    for s in series:
        s.prefix = nruns > 1
    return series


def _split_file_spec(spec: str):
    """'FILE[:LIB[/POLICY]]' -> (file, libspec) if FILE exists, else None."""
    if os.path.exists(spec):
        return spec, ""
    head, sep, tail = spec.rpartition(":")
    if sep and os.path.exists(head):
        return head, tail
    return None


def baselines(series: list[Series], spec: Optional[str], paths: list) -> tuple[list, Callable]:
    """(series, baseline_of): series now includes any baseline file's series;
    baseline_of(s) is the series s is compared with, or None.

    spec None: each run's mpi series where there is one (else the first mpi series
    loaded); without any mpi series, the first series loaded.  spec LIB[/POLICY]: the
    same with that library.  spec FILE[:LIB[/POLICY]]: that file's series (the one of
    the same library and policy, else its first)."""
    if spec is None:
        spec = "mpi" if any(s.library == "mpi" for s in series) else None
        if spec is None:
            first = series[0] if series else None
            return series, lambda s: None if s is first else first
    filespec = _split_file_spec(spec)
    if filespec is None:
        lib, _, _ = spec.partition("/")
        if lib not in ("hpccoll", "mpi"):
            raise ReportError(f"--baseline: expected a result file or a library (mpi, hpccoll, "
                              f"hpccoll/POLICY), got {spec!r}")
        if not any(s.matches(spec) for s in series):
            raise ReportError(f"--baseline: no {spec} results in {', '.join(paths)}")

        def of(s):
            if s.matches(spec):
                return None
            same_run = [b for b in series if b.run is s.run and b.matches(spec)]
            return same_run[0] if same_run else next(b for b in series if b.matches(spec))
        return series, of
    path, libspec = filespec
    mine = [s for s in series if os.path.samefile(s.run.file, path)]
    if not mine:
        extra = load([path])
        for s in series + extra:
            s.prefix = True
        series, mine = series + extra, extra
    if libspec:
        mine = [s for s in mine if s.matches(libspec)]
        if not mine:
            raise ReportError(f"--baseline: no {libspec} results in {path}")
    base = set(map(id, mine))

    def of(s):
        # like with like: the same library and policy, else the same library, else the
        # file's only series
        if id(s) in base:
            return None
        for same in ([b for b in mine if (b.library, b.policy) == (s.library, s.policy)],
                     [b for b in mine if b.library == s.library], mine if len(mine) == 1 else []):
            if same:
                return same[0]
        return None
    return series, of
