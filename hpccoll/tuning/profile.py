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

KIND = "hpccoll.tuning.profile"
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

    # -- HDF5 ---------------------------------------------------------------------------
    def save(self, path: str, env: Optional[dict] = None) -> None:
        from .store import write_attrs, h5open
        with h5open(path, "w") as f:
            f.attrs["kind"] = KIND
            f.attrs["format"] = 1
            write_attrs(f, env or {})
            write_attrs(f, {f"profile.{k}": v for k, v in self.attrs.items()})
            f.create_dataset("sizes", data=self.sizes).attrs["units"] = "bytes"
            d = f.create_dataset("blocks", data=self.blocks)
            d.attrs["doc"] = "block counts (CPU: reduction threads); 0 = library default"
            d = f.create_dataset("comm_time", data=self.comm_time)
            d.attrs.update(units="s", source=self.sources["comm_time"],
                           doc="allreduce time, sizes x blocks (median over repeats of the "
                               "slowest rank when measured)")
            d = f.create_dataset("slowdown", data=self.slowdown)
            d.attrs.update(source=self.sources["slowdown"],
                           doc="compute kernel time with an allreduce of each block count in "
                               "flight / alone (medians)")
            for name, arr in self.samples.items():
                f.create_dataset(f"samples/{name}", data=np.asarray(arr)).attrs["source"] = "measured"

    @classmethod
    def load(cls, path: str) -> "Profile":
        import h5py
        try:
            f = h5py.File(path, "r")
        except OSError as exc:
            raise ArgumentError(f"profile: cannot open {path!r} as HDF5 ({exc})") from None
        with f:
            if f.attrs.get("kind") != KIND:
                raise ArgumentError(f"profile: {path!r} is not an hpccoll profile "
                                    f"(kind={f.attrs.get('kind')!r})")
            from .store import read_attrs
            attrs = {k[len("profile."):]: v for k, v in read_attrs(f).items()
                     if k.startswith("profile.")}
            samples = {k: f["samples"][k][()] for k in f["samples"]} if "samples" in f else {}
            return cls(f["sizes"][()], f["blocks"][()], f["comm_time"][()], f["slowdown"][()],
                       {"comm_time": str(f["comm_time"].attrs["source"]),
                        "slowdown": str(f["slowdown"].attrs["source"])}, attrs, samples)
