"""A profile: allreduce time T(bytes, blocks) and compute slowdown s(blocks).

Every profile says where its numbers come from: ``sources["comm_time"]`` and
``sources["slowdown"]`` are "measured" (by ``hpccoll-tune profile`` on a machine) or
"model" (an analytic model, with its parameters in ``attrs``).  Block count 0 stands
for the library's own choice (the collective called without ``blocks=``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..errors import ArgumentError

KIND = "tuning.profile"
SOURCES = ("measured", "model")


@dataclass
class Profile:
    sizes: np.ndarray          # bytes, strictly increasing
    blocks: np.ndarray         # block counts, strictly increasing (0 = library default)
    comm_time: np.ndarray      # seconds, shape (len(sizes), len(blocks))
    slowdown: np.ndarray       # compute time with the allreduce in flight / alone, per block count
    sources: dict = field(default_factory=lambda: {"comm_time": "model", "slowdown": "model"})
    attrs: dict = field(default_factory=dict)
    samples: dict = field(default_factory=dict)   # raw measurements, name -> array

    def __post_init__(self):
        self.sizes = np.asarray(self.sizes, dtype=np.int64)
        self.blocks = np.asarray(self.blocks, dtype=np.int64)
        self.comm_time = np.asarray(self.comm_time, dtype=np.float64)
        self.slowdown = np.asarray(self.slowdown, dtype=np.float64)
        if self.sizes.ndim != 1 or self.sizes.size == 0 or np.any(np.diff(self.sizes) <= 0) \
                or self.sizes[0] < 0:
            raise ArgumentError("sizes: expected strictly increasing byte counts >= 0")
        if self.blocks.ndim != 1 or self.blocks.size == 0 or np.any(np.diff(self.blocks) <= 0) \
                or self.blocks[0] < 0:
            raise ArgumentError("blocks: expected strictly increasing block counts >= 0")
        if self.comm_time.shape != (self.sizes.size, self.blocks.size):
            raise ArgumentError(f"comm_time: expected shape {(self.sizes.size, self.blocks.size)} "
                                f"(sizes x blocks), got {self.comm_time.shape}")
        if not np.all(np.isfinite(self.comm_time)) or np.any(self.comm_time <= 0):
            raise ArgumentError("comm_time: expected finite times > 0 (seconds)")
        if self.slowdown.shape != self.blocks.shape or not np.all(np.isfinite(self.slowdown)) \
                or np.any(self.slowdown <= 0):
            raise ArgumentError(f"slowdown: expected {self.blocks.size} finite factors > 0")
        for k in ("comm_time", "slowdown"):
            if self.sources.get(k) not in SOURCES:
                raise ArgumentError(f"sources[{k!r}]: expected one of {SOURCES}, "
                                    f"got {self.sources.get(k)!r}")
        self._index = {int(b): i for i, b in enumerate(self.blocks)}

    @property
    def block_list(self) -> tuple:
        return tuple(int(b) for b in self.blocks)

    def _col(self, b: int) -> int:
        try:
            return self._index[int(b)]
        except (KeyError, TypeError, ValueError):
            raise ArgumentError(f"blocks: {b!r} is not in the profile's block counts "
                                f"{list(self.block_list)}") from None

    def time(self, nbytes, b: int):
        """T(nbytes, b): piecewise linear in bytes between the measured sizes (exact for
        latency + bytes / bandwidth), flat below the smallest size (latency floor), and
        extended beyond the largest with the slope of the last segment (bandwidth)."""
        col = self.comm_time[:, self._col(b)]
        x = np.asarray(nbytes, dtype=np.float64)
        t = np.interp(x, self.sizes, col)
        if self.sizes.size >= 2:
            slope = max(0.0, (col[-1] - col[-2]) / float(self.sizes[-1] - self.sizes[-2]))
            t = np.where(x > self.sizes[-1], col[-1] + (x - self.sizes[-1]) * slope, t)
        return t

    def slowdown_of(self, b: int) -> float:
        """The slowdown factor the model uses: an allreduce in flight cannot speed compute
        up, so measured factors below 1 (noise) count as 1."""
        return max(1.0, float(self.slowdown[self._col(b)]))

    # -- HDF5: a run of kind tuning.profile (docs/results.md, docs/tuning.md) -------------
    def save(self, path: str, env: Optional[dict] = None):
        """Append this profile to the result file ``path`` as a run; returns the file it
        landed in (``path``, unless it could not be locked: see hpccoll.h5log)."""
        from .. import h5log
        attrs = dict(env or {}, sources=dict(self.sources),
                     **{f"profile.{k}": v for k, v in self.attrs.items()})
        run = h5log.RunWriter(path, "profile", attrs, kind=KIND)
        with run:
            run.array("sizes", self.sizes, {"units": "bytes"})
            run.array("blocks", self.blocks, {"doc": "block counts (CPU: reduction threads); "
                                                     "0 = library default"})
            run.array("comm_time", self.comm_time, {
                "units": "s", "source": self.sources["comm_time"],
                "doc": "allreduce time, sizes x blocks (median over repeats of the slowest "
                       "rank when measured)"})
            run.array("slowdown", self.slowdown, {
                "source": self.sources["slowdown"],
                "doc": "compute kernel time with an allreduce of each block count in flight "
                       "/ alone (flight over work, the largest over ranks)"})
            for name, arr in self.samples.items():
                run.array(f"samples/{name}", np.asarray(arr), {"source": "measured"})
        return run.final_path

    @classmethod
    def load(cls, path: str) -> "Profile":
        """The newest profile in the result file ``path`` (a profile file of an earlier
        hpccoll too)."""
        from .. import h5log
        try:
            runs = h5log.read(path)
        except ValueError as exc:
            raise ArgumentError(f"profile: {path!r} is not an hpccoll profile ({exc})") from None
        except OSError as exc:
            raise ArgumentError(f"profile: cannot open {path!r} as HDF5 ({exc})") from None
        mine = [r for r in runs if r.kind == KIND]
        if not mine:
            kinds = sorted({r.kind or "untyped" for r in runs})
            raise ArgumentError(f"profile: {path!r} is not an hpccoll profile (its runs: "
                                f"{', '.join(kinds) or 'none'})")
        return cls.from_run(mine[-1])

    @classmethod
    def from_run(cls, run) -> "Profile":
        a = run.arrays
        sources = run.attrs.get("sources") or {    # files of earlier versions: per dataset
            k: str(run.array_attrs[k].get("source")) for k in ("comm_time", "slowdown")}
        attrs = {k[len("profile."):]: v for k, v in run.attrs.items() if k.startswith("profile.")}
        samples = {k[len("samples/"):]: v for k, v in a.items() if k.startswith("samples/")}
        return cls(a["sizes"], a["blocks"], a["comm_time"], a["slowdown"], sources, attrs, samples)

    def table(self) -> list:
        """The profile as text lines: T in us by size and block count, and the slowdown."""
        from ..timing import human_bytes
        names = ["default" if b == 0 else str(b) for b in self.block_list]
        lines = [f"allreduce time in us ({self.sources['comm_time']}), by block count:",
                 f"{'size':>10}" + "".join(f"{n:>10}" for n in names)]
        for i, s in enumerate(self.sizes):
            lines.append(f"{human_bytes(int(s)):>10}"
                         + "".join(f"{t * 1e6:>10.1f}" for t in self.comm_time[i]))
        lines.append(f"compute slowdown ({self.sources['slowdown']}, {self.attrs.get('kernel', '')}): "
                     + ", ".join(f"{n}: {s:.3f}" for n, s in zip(names, self.slowdown)))
        return lines
