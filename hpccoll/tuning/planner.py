"""Dynamic programming over bucket boundaries: the plan with the smallest backward
time under the model of model.py.  docs/tuning.md has the derivation; in short:

Stage k = the first k tensors are in buckets whose allreduces are issued.  A state is
(E, pi): when the last issued allreduce ends, and the compute work done at that moment.
The future depends on the past only through (E, pi) (model.advance), and the final time
is nondecreasing in E and nonincreasing in pi for every choice of the future, so a state
that another state of the same stage dominates (E' <= E and pi' >= pi) can be dropped.
Each stage keeps its Pareto front; the transition k -> k' (k' > k) adds the bucket
[k, k') with each block count.  The answer is the smallest E at stage n.

A single number (E alone, or E - pi) is not enough: a later allreduce ending at the
same time may leave the compute further behind, which delays every later bucket.

``grid > 0`` rounds E up and pi down to multiples of ``grid`` seconds: the front then
holds at most total_compute / grid + 1 states, and by the same monotonicity the DP's
value is an upper bound on its plan's true time (which ``PlanResult.time`` reports).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ..errors import ArgumentError
from .model import Plan, Workload, advance, evaluate
from .profile import Profile

REL_TIE = 1e-12   # relative slack under which two modelled times count as equal


@dataclass
class PlanResult:
    plan: Plan
    time: float          # the plan's backward time under the model (closed form)
    dp_time: float       # what the DP computed: == time when grid == 0, >= time otherwise
    max_front: int       # largest Pareto front over the stages
    states: int          # states generated in total


def _pareto(E, pi, b):
    """Indices of the states no other state dominates (smaller-or-equal E and
    smaller-or-equal E - pi), sorted by E; of exact duplicates the one with more
    blocks stays."""
    D = E - pi
    order = np.lexsort((-b, D, E))
    d = D[order]
    best_before = np.minimum.accumulate(np.concatenate(([np.inf], d[:-1])))
    return order[d < best_before]


def plan(work: Workload, profile: Profile, *, blocks: Optional[Sequence[int]] = None,
         fusion: bool = True, grid: float = 0.0, polish: bool = True) -> PlanResult:
    """The plan that minimizes backward completion time.

    blocks: the block counts to choose from (default: all of the profile's).
    fusion: False keeps one tensor per bucket (only the block counts are chosen).
    grid: 0 for the exact DP; > 0 seconds for the discretized one (see module doc).
    polish: among plans of equal modelled time, raise block counts where that costs
    nothing, so that without contention every bucket gets the most blocks.
    """
    if not isinstance(work, Workload):
        raise ArgumentError(f"work: expected a Workload, got {type(work).__name__}")
    allowed = profile.block_list if blocks is None else tuple(sorted(set(int(b) for b in blocks)))
    if not allowed:
        raise ArgumentError("blocks: expected at least one block count")
    for b in allowed:
        profile.slowdown_of(b)           # raises, naming the block count, if unknown
    if not (grid >= 0 and np.isfinite(grid)):
        raise ArgumentError(f"grid: expected seconds >= 0, got {grid!r}")
    n = work.n
    P = work.ready
    total = float(P[-1])
    cum = np.concatenate(([0], np.cumsum(work.nbytes)))
    slow = [profile.slowdown_of(b) for b in allowed]

    # fronts of all earlier stages, concatenated: each state knows its stage and parent
    E_all, pi_all = np.zeros(1), np.zeros(1)
    stage_all = np.zeros(1, dtype=np.int64)
    parent, bucket_b = [-1], [0]
    states, max_front = 1, 1
    best = None
    for k in range(1, n + 1):
        src = np.arange(E_all.size) if fusion else np.flatnonzero(stage_all == k - 1)
        nbytes = cum[k] - cum[stage_all[src]]
        cand_E, cand_pi, cand_src, cand_b = [], [], [], []
        for b, s in zip(allowed, slow):
            T = profile.time(nbytes, b)
            E2, pi2 = advance(E_all[src], pi_all[src], float(P[k - 1]), total, T, s)
            if grid > 0:
                E2 = np.ceil(E2 / grid) * grid
                pi2 = np.floor(pi2 / grid) * grid
            cand_E.append(E2)
            cand_pi.append(pi2)
            cand_src.append(src)
            cand_b.append(np.full(src.size, b))
        E2, pi2 = np.concatenate(cand_E), np.concatenate(cand_pi)
        srcs, bs = np.concatenate(cand_src), np.concatenate(cand_b)
        states += E2.size
        keep = _pareto(E2, pi2, bs)
        max_front = max(max_front, keep.size)
        if k == n:
            best = keep[0]       # smallest E (the front is sorted by E)
            final_E, final_src, final_b = float(E2[best]), int(srcs[best]), int(bs[best])
            break
        E_all = np.concatenate((E_all, E2[keep]))
        pi_all = np.concatenate((pi_all, pi2[keep]))
        stage_all = np.concatenate((stage_all, np.full(keep.size, k)))
        parent.extend(int(x) for x in srcs[keep])
        bucket_b.extend(int(x) for x in bs[keep])

    ends, blks = [n], [final_b]
    node = final_src
    while parent[node] >= 0:
        ends.append(int(stage_all[node]))
        blks.append(bucket_b[node])
        node = parent[node]
    result = Plan(tuple(reversed(ends)), tuple(reversed(blks)))
    t = evaluate(work, result, profile)
    if polish:
        result, t = _raise_blocks(work, result, t, profile, allowed)
    return PlanResult(result, t, final_E, max_front, states)


def _raise_blocks(work, result: Plan, t: float, profile, allowed):
    """Give each bucket the most blocks that do not make the plan slower."""
    blks = list(result.blocks)
    for m in range(len(blks)):
        for b in sorted((x for x in allowed if x > blks[m]), reverse=True):
            trial = Plan(result.ends, tuple(blks[:m] + [b] + blks[m + 1:]))
            t2 = evaluate(work, trial, profile)
            if t2 <= t * (1 + REL_TIE):
                blks[m], t = b, min(t, t2)
                break
    return Plan(result.ends, tuple(blks)), t
