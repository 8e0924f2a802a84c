"""The backward-pass model that the planner optimizes and the simulator replays.

A backward pass is an ordered list of gradient tensors (``Workload``): tensor i is
produced when the compute stream has done ``compute[0] + ... + compute[i]`` seconds of
work.  A ``Plan`` cuts the list into contiguous buckets and gives each a block count.

The rules (docs/tuning.md states them with their limits):

1. compute runs without pause from time 0; while an allreduce with b blocks is in
   flight it advances at rate 1 / slowdown(b), otherwise at rate 1;
2. a bucket's allreduce starts when its last tensor exists and the previous bucket's
   allreduce has finished (one allreduce in flight at a time, in bucket order);
3. it lasts comm_time(bucket bytes, b), whatever the compute does;
4. the backward pass ends when the last allreduce ends.

``advance`` is the closed form of one bucket under these rules; the planner's DP and
``evaluate`` use it.  The event simulator (simulate.py) replays the same rules
independently, event by event, and the tests hold the two against each other.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import ArgumentError


@dataclass(frozen=True)
class Workload:
    """Gradient tensors in the order the backward pass produces them."""
    nbytes: np.ndarray           # int64, bytes of each gradient
    compute: np.ndarray          # float64 seconds of backward compute ending with this gradient
    names: tuple = ()

    @classmethod
    def of(cls, nbytes: Sequence[int], compute: Sequence[float], names: Sequence[str] = ()):
        b = np.asarray(nbytes)
        c = np.asarray(compute, dtype=np.float64)
        if b.ndim != 1 or b.size == 0:
            raise ArgumentError(f"nbytes: expected a non-empty list of byte counts, got shape {b.shape}")
        if not np.issubdtype(b.dtype, np.integer) and not np.all(np.equal(np.mod(b, 1), 0)):
            raise ArgumentError("nbytes: expected whole byte counts")
        b = b.astype(np.int64)
        if np.any(b < 0):
            raise ArgumentError(f"nbytes: expected byte counts >= 0, got {int(b.min())}")
        if c.shape != b.shape:
            raise ArgumentError(f"compute: expected {b.size} times (one per tensor), got {c.size}")
        if not np.all(np.isfinite(c)) or np.any(c < 0):
            raise ArgumentError("compute: expected finite times >= 0 (seconds)")
        names = tuple(names) or tuple(f"t{i}" for i in range(b.size))
        if len(names) != b.size:
            raise ArgumentError(f"names: expected {b.size} names, got {len(names)}")
        return cls(b, c, names)

    @property
    def n(self) -> int:
        return int(self.nbytes.size)

    @property
    def ready(self) -> np.ndarray:
        """Compute work done when tensor i exists (the prefix sums P_i)."""
        return np.cumsum(self.compute)


@dataclass(frozen=True)
class Plan:
    """Contiguous buckets, given by their exclusive end indices, and a block count each."""
    ends: tuple
    blocks: tuple

    def __post_init__(self):
        if len(self.ends) != len(self.blocks) or not self.ends:
            raise ArgumentError("plan: expected one block count per bucket and at least one bucket")
        if any(b <= a for a, b in zip((0,) + tuple(self.ends[:-1]), self.ends)):
            raise ArgumentError(f"plan: bucket ends must be strictly increasing, got {self.ends}")

    @property
    def buckets(self) -> list:
        """(start, end) index pairs, end exclusive."""
        starts = (0,) + tuple(self.ends[:-1])
        return list(zip(starts, self.ends))

    def check(self, work: Workload, allowed: Sequence[int]) -> None:
        if self.ends[-1] != work.n:
            raise ArgumentError(f"plan: the last bucket must end at tensor {work.n}, "
                                f"got {self.ends[-1]}")
        bad = [b for b in self.blocks if b not in allowed]
        if bad:
            raise ArgumentError(f"plan: block count(s) {bad} are not in the profile's "
                                f"{list(allowed)}")

    def describe(self, work: Workload) -> str:
        parts = []
        for (a, e), b in zip(self.buckets, self.blocks):
            parts.append(f"[{a}:{e}) {int(work.nbytes[a:e].sum())} B x{b}")
        return ", ".join(parts)


def advance(E, pi, ready_k, total, T, s):
    """One bucket under the model's rules, vectorized over states.

    State: E = when the previous allreduce ended, pi = compute work done at time E.
    The bucket's last tensor exists once the work reaches ``ready_k``; its allreduce
    lasts T and slows compute by ``s``; ``total`` is all the work.  Returns (E', pi').

    Between E and the start no allreduce is in flight, so compute runs at rate 1 and
    the start is E + max(0, ready_k - pi).  During the allreduce compute does T / s of
    work, capped at what is left.
    """
    E2 = E + np.maximum(0.0, ready_k - pi) + T
    pi2 = np.minimum(total, np.maximum(pi, ready_k) + T / s)
    return E2, pi2


def evaluate(work: Workload, plan: Plan, profile) -> float:
    """Backward completion time of ``plan`` by the closed form (see ``advance``)."""
    plan.check(work, profile.block_list)
    P = work.ready
    total = float(P[-1])
    cum = np.concatenate(([0], np.cumsum(work.nbytes)))
    E, pi = 0.0, 0.0
    for (a, e), b in zip(plan.buckets, plan.blocks):
        T = float(profile.time(cum[e] - cum[a], b))
        E, pi = advance(E, pi, float(P[e - 1]), total, T, profile.slowdown_of(b))
    return float(E)
