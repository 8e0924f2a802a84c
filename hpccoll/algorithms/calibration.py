"""Algorithm choice by measurement: which candidate of each collective is fastest on this
machine, per message size, for a communicator of so many ranks with so many on one node,
on ordinary or registered buffers.

``hpccoll-tune calibrate`` measures it (hpccoll/core/calibrate.py) and appends it to a
calibration file as a run of kind ``tuning.calibration``; ``hpccoll.init`` loads the file
the ``calibration`` setting names.  Rank 0 reads it and every rank gets rank 0's table:
ranks must agree on the algorithm of every collective, and nodes may see different files.

A plan asks ``choose`` once per call signature.  Where the table has nothing for the
communicator's shape (ranks, most ranks on one node) the built-in table of
hpccoll/algorithms decides; so does it where the pick cannot run there (shared memory with
``shm`` off, MPI's own with ``mpi_coll_bytes`` 0, a dtype or op MPI lacks).  A message
takes the pick of the nearest measured size (on a log scale).
"""
from __future__ import annotations

import math
import os
from typing import Optional

import numpy as np

from ..base.units import human_bytes
from ..errors import ArgumentError
from .. import h5log

KIND = "tuning.calibration"
BUFFERS = ("host", "registered")


def cache_dir() -> str:
    """hpccoll's folder in this user's cache directory (XDG_CACHE_HOME, else ~/.cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "hpccoll")


def default_path() -> str:
    """Where ``calibration=auto`` looks and ``hpccoll-tune calibrate`` writes by default."""
    return os.path.join(cache_dir(), "calibration.h5")


class Calibration:
    """Picks per (ranks, per_node, collective, buffers): measured sizes and the fastest
    candidate at each.  ``times`` keeps every candidate's median, for the table."""

    def __init__(self, picks: Optional[dict] = None, times: Optional[dict] = None,
                 source: str = "", library: str = ""):
        self.picks: dict = {}
        for key, pairs in (picks or {}).items():
            pairs = sorted((int(n), str(a)) for n, a in pairs)
            self.picks[tuple(key)] = (tuple(math.log2(max(n, 1)) for n, _ in pairs),
                                      tuple(n for n, _ in pairs), tuple(a for _, a in pairs))
        self.times: dict = dict(times or {})   # (ranks, per_node, coll, buffers, nbytes, algo) -> s
        self.source, self.library = source, library

    def __bool__(self) -> bool:
        return bool(self.picks)

    def choose(self, coll: str, buffers: str, nbytes: int, ranks: int, per_node: int) -> str:
        """The measured pick for this message, or "" where nothing was measured."""
        entry = self.picks.get((ranks, per_node, coll, buffers))
        if entry is None:
            return ""
        logs, _, algos = entry
        x = math.log2(max(nbytes, 1))
        best = min(range(len(logs)), key=lambda i: abs(logs[i] - x))
        return algos[best]

    def shapes(self) -> list:
        return sorted({(r, p) for r, p, _, _ in self.picks})

    def state(self) -> dict:
        """Plain data (what rank 0 broadcasts)."""
        return {"picks": {k: list(zip(v[1], v[2])) for k, v in self.picks.items()},
                "times": self.times, "source": self.source, "library": self.library}

    @classmethod
    def from_state(cls, d: Optional[dict]) -> "Calibration":
        return cls(**d) if d else cls()

    def merged(self, other: "Calibration") -> "Calibration":
        """This table with ``other``'s picks on top (a newer run of the same shape wins)."""
        out = Calibration(source=other.source or self.source,
                          library=other.library or self.library)
        out.picks = {**self.picks, **other.picks}
        out.times = {**self.times, **other.times}
        return out

    def table(self) -> list:
        """Text lines: per shape, a row per collective and buffers with the pick at each
        measured size and how much faster it was than MPI's own (the median times of MPI's
        own over the pick's), where both were timed."""
        lines = []
        for ranks, per_node in self.shapes():
            keys = [k for k in sorted(self.picks) if k[:2] == (ranks, per_node)]
            sizes = sorted({n for k in keys for n in self.picks[k][1]})
            lines.append(f"{ranks} ranks, {per_node} per node: the pick at each size "
                         "(x: MPI's own time / the pick's)")
            lines.append(f"  {'collective':<15}{'buffers':<11}"
                         + "".join(f"{human_bytes(n):>15}" for n in sizes))
            for key in keys:
                _, measured, algos = self.picks[key]
                pick = dict(zip(measured, algos))
                cells = []
                for n in sizes:
                    a = pick.get(n, "")
                    mine, mpi = self.times.get(key + (n, a)), self.times.get(key + (n, "mpi"))
                    ratio = f" {mpi / mine:.2f}x" if a and a != "mpi" and mine and mpi else ""
                    cells.append(f"{a}{ratio}")
                lines.append(f"  {key[2]:<15}{key[3]:<11}" + "".join(f"{c:>15}" for c in cells))
        return lines

    def timings(self) -> list:
        """Text lines: every candidate's median time (us) per shape, collective, buffers
        and size, fastest first."""
        rows: dict = {}
        for (r, p, c, b, n, a), t in self.times.items():
            rows.setdefault((r, p, c, b, n), []).append((t, a))
        return [f"{r} ranks ({p} per node) {c:<15}{b:<11}{human_bytes(n):>9}: "
                + ", ".join(f"{a} {t * 1e6:.1f}" for t, a in sorted(v))
                for (r, p, c, b, n), v in sorted(rows.items())]

    # -- HDF5 -------------------------------------------------------------------------------
    def save(self, path: str, env: Optional[dict] = None) -> str:
        """Append this calibration to ``path`` as a run; returns where it landed."""
        keys = sorted(self.times)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        run = h5log.RunWriter(path, "calibration", dict(env or {}, mpi_library=self.library),
                              kind=KIND)
        with run:
            rows = [(r, p, c, b, n, a) for (r, p, c, b), (_, sizes, algos) in
                    sorted(self.picks.items()) for n, a in zip(sizes, algos)]
            _columns(run, "picks", rows, "the fastest candidate per shape, collective, "
                     "buffers and size (within 10%: the built-in choice)")
            _columns(run, "times", [k for k in keys], "every candidate measured")
            run.array("times/seconds", np.array([self.times[k] for k in keys], np.float64),
                      {"units": "s", "doc": "median over rounds of the slowest rank's time "
                                            "per call"})
        return str(run.final_path)

    @classmethod
    def load(cls, path: str, library: Optional[str] = None) -> "Calibration":
        """Every calibration run in ``path`` measured with MPI library ``library`` (any, when
        None), later runs over earlier ones."""
        try:
            runs = h5log.read(path)
        except (ValueError, OSError) as exc:
            raise ArgumentError(f"calibration: cannot read {path!r} as an hpccoll result "
                                f"file ({exc})") from None
        mine = [r for r in runs if r.kind == KIND]
        if not mine:
            raise ArgumentError(f"calibration: {path!r} holds no calibration (its runs: "
                                f"{', '.join(sorted({r.kind or 'untyped' for r in runs}))})")
        out = cls(source=path, library=library or "")
        for run in mine:
            if library is not None and str(run.attrs.get("mpi_library", "")) != library:
                continue
            out = out.merged(cls.from_run(run, path))
        out.source = str(path)
        return out

    @classmethod
    def from_run(cls, run, source: str = "") -> "Calibration":
        """One calibration run of a result file."""
        picks: dict = {}
        for r, p, c, b, n, a in _read_columns(run.arrays, "picks"):
            picks.setdefault((r, p, c, b), []).append((n, a))
        secs = run.arrays.get("times/seconds", np.zeros(0))
        times = {k: float(t) for k, t in zip(_read_columns(run.arrays, "times"), secs)}
        return cls(picks, times, source, str(run.attrs.get("mpi_library", "")))


_FIELDS = ("ranks", "per_node", "collective", "buffers", "bytes", "algo")


def _columns(run, group: str, rows: list, doc: str) -> None:
    cols = list(zip(*rows)) if rows else [()] * len(_FIELDS)
    for name, col in zip(_FIELDS, cols):
        text = name in ("collective", "buffers", "algo")
        arr = np.array(list(col), str) if text else np.array(list(col), np.int64)
        run.array(f"{group}/{name}", arr, {"doc": doc} if name == "algo" else None)


def _read_columns(arrays: dict, group: str) -> list:
    cols = []
    for name in _FIELDS:
        a = arrays.get(f"{group}/{name}")
        if a is None:
            return []
        cols.append([x.decode() if isinstance(x, bytes) else str(x) for x in a]
                    if name in ("collective", "buffers", "algo") else [int(x) for x in a])
    return list(zip(*cols))


def load_setting(value: str, library: str):
    """(Calibration, note) for the ``calibration`` setting's value: "off", "auto" (the
    default file, if there is one), "init" (measured by init: empty here) or a path."""
    if value in ("off", "init"):
        return Calibration(), value
    path = default_path() if value == "auto" else value
    if value == "auto" and not os.path.exists(path):
        return Calibration(), f"built-in (no {path})"
    try:
        cal = Calibration.load(path, library)
    except ArgumentError as exc:
        if value == "auto":
            return Calibration(), f"built-in ({exc})"
        raise
    if not cal:
        return cal, f"built-in ({path} holds no table measured with {library})"
    return cal, path
