"""Event simulation of a plan under the model's rules (model.py), written independently
of the closed form the planner uses: it walks layer completions and allreduce ends in
time order, changing the compute rate whenever an allreduce starts or ends."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .model import Plan, Workload


@dataclass
class Timeline:
    time: float                  # backward completion: the last allreduce's end
    compute_end: float           # when the last gradient existed
    ready: list = field(default_factory=list)     # time each tensor existed
    starts: list = field(default_factory=list)    # allreduce start per bucket
    ends: list = field(default_factory=list)      # allreduce end per bucket

    @property
    def exposed_comm(self) -> float:
        """Communication time not hidden behind compute."""
        return self.time - self.compute_end


def simulate(work: Workload, plan: Plan, profile) -> Timeline:
    plan.check(work, profile.block_list)
    n = work.n
    bucket_of_end = {e - 1: m for m, e in enumerate(plan.ends)}
    durations, factors = [], []
    for (a, e), b in zip(plan.buckets, plan.blocks):
        durations.append(float(profile.time(int(work.nbytes[a:e].sum()), b)))
        factors.append(profile.slowdown_of(b))
    out = Timeline(0.0, 0.0, [0.0] * n, [0.0] * len(plan.ends), [0.0] * len(plan.ends))
    queue: deque = deque()           # buckets whose tensors all exist, waiting for the link
    t = 0.0
    layer, left = 0, float(work.compute[0])
    running, run_end = None, np.inf  # the bucket whose allreduce is in flight
    while True:
        # tensors that are done (zero-work layers finish at once)
        while layer < n and left <= 0.0:
            out.ready[layer] = t
            if layer in bucket_of_end:
                queue.append(bucket_of_end[layer])
            layer += 1
            left = float(work.compute[layer]) if layer < n else 0.0
        if running is None and queue:
            running = queue.popleft()
            out.starts[running] = t
            run_end = t + durations[running]
        if layer == n and running is None:
            break
        rate = 1.0 / factors[running] if running is not None else 1.0
        layer_end = t + left / rate if layer < n else np.inf
        if layer_end <= run_end:
            t, left = layer_end, 0.0
        else:
            left -= (run_end - t) * rate
            left = max(left, 0.0) if left > 1e-15 * max(1.0, t) else 0.0
            t = run_end
            out.ends[running] = t
            running, run_end = None, np.inf
    out.compute_end = out.ready[-1]
    out.time = max(out.ends[-1], out.compute_end)
    return out
