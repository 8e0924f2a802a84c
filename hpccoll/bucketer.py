"""Data-parallel gradient buckets on a plan: fuse, allreduce as soon as a bucket is
complete, scatter the averages back.

    bucketer = GradientBucketer(ctx.world, grads, plan)   # grads in backward order
    for each step:
        ... backward: after writing grads[i]:  bucketer.ready(i)
        bucketer.finish()                                   # grads now hold the averages

Each bucket's allreduce is keyed by the bucket's name, so ranks may mark gradients
ready in different orders (and so complete buckets in different orders).  A bucket's
block count goes to the allreduce's ``blocks=`` keyword where this build has it; where
it does not, the allreduce runs with the library's own choice and ``blocks_applied``
is False (say so when reporting timings).
"""
from __future__ import annotations

import inspect
import threading
import time
from typing import Optional, Sequence

import numpy as np

from .errors import ArgumentError, HpcCollError


class GradientBucketer:
    def __init__(self, comm, grads: Sequence, plan, name: str = "grads", op: str = "avg"):
        from .tuning.model import Plan
        if not isinstance(plan, Plan):
            raise ArgumentError(f"plan: expected a hpccoll.tuning.Plan, got {type(plan).__name__}")
        grads = list(grads)
        if plan.ends[-1] != len(grads):
            raise ArgumentError(f"plan: covers {plan.ends[-1]} tensors but grads has {len(grads)}")
        if not isinstance(name, str) or not name:
            raise ArgumentError(f"name: expected a non-empty str, got {name!r}")
        self.comm, self.grads, self.plan, self.name, self.op = comm, grads, plan, name, op
        self.blocks_applied = "blocks" in inspect.signature(comm.allreduce).parameters
        self._bucket_of = np.empty(len(grads), dtype=np.int64)
        self._slices = []               # per tensor: slice of its bucket's flat buffer
        self.buffers = []
        for m, (a, e) in enumerate(plan.buckets):
            members = grads[a:e]
            dt = members[0].dtype
            for i, g in enumerate(members, start=a):
                if g.dtype != dt:
                    raise ArgumentError(f"grads[{i}]: dtype {g.dtype} differs from {dt} of the "
                                        f"other tensors in bucket {m}; a bucket fuses one dtype")
                if not g.flags.c_contiguous:
                    raise ArgumentError(f"grads[{i}]: expected a C-contiguous array")
            xp = _array_module(members[0])
            off = 0
            for i, g in enumerate(members, start=a):
                self._bucket_of[i] = m
                self._slices.append(slice(off, off + g.size))
                off += g.size
            self.buffers.append(xp.empty(off, dtype=dt))
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._missing = [e - a for a, e in self.plan.buckets]
        self._marked = np.zeros(len(self.grads), dtype=bool)
        self._works: list = [None] * len(self.buffers)
        self.issued_at = [None] * len(self.buffers)     # perf_counter() of each issue
        self.done_at = [None] * len(self.buffers)       # ... and completion

    def ready(self, i: int) -> None:
        """grads[i] holds this step's gradient: copy it into its bucket, and issue the
        bucket's allreduce if it was the bucket's last missing tensor."""
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < len(self.grads):
            raise ArgumentError(f"i: expected a tensor index in [0, {len(self.grads)}), got {i!r}")
        with self._lock:
            if self._marked[i]:
                raise ArgumentError(f"i: gradient {i} was already marked ready this step")
            self._marked[i] = True
            m = int(self._bucket_of[i])
            self.buffers[m][self._slices[i]] = self.grads[i].reshape(-1)
            self._missing[m] -= 1
            if self._missing[m] == 0:
                self._issue(m)

    def _issue(self, m: int) -> None:
        buf = self.buffers[m]
        kw = {"key": f"{self.name}/{m}"}
        b = self.plan.blocks[m]
        if self.blocks_applied and b > 0:
            kw["blocks"] = b
        self.issued_at[m] = time.perf_counter()
        w = self.comm.allreduce(buf, buf, op=self.op, **kw)
        w.add_done_callback(lambda _w, m=m: self.done_at.__setitem__(m, time.perf_counter()))
        self._works[m] = w

    def finish(self, timeout: Optional[float] = None) -> dict:
        """Wait for every bucket, write the results into the gradient arrays, and get
        ready for the next step.  Returns this step's timings (perf_counter seconds)."""
        missing = [i for i in range(len(self.grads)) if not self._marked[i]]
        if missing:
            raise HpcCollError(f"finish: gradient(s) {missing[:10]} were never marked ready this "
                               "step; call ready(i) for every gradient before finish()")
        for m, w in enumerate(self._works):
            w.wait(timeout)
            if self.done_at[m] is None:     # wait() can return before the callback has run
                self.done_at[m] = time.perf_counter()
        for i, g in enumerate(self.grads):
            g.reshape(-1)[...] = self.buffers[int(self._bucket_of[i])][self._slices[i]]
        stats = {"issued": list(self.issued_at), "done": list(self.done_at),
                 "finished": time.perf_counter()}
        self._reset()
        return stats


def _array_module(a):
    if isinstance(a, np.ndarray):
        return np
    try:
        import cupy
        return cupy.get_array_module(a)
    except ImportError:
        raise ArgumentError(f"grads: expected NumPy (or CuPy) arrays, got {type(a).__name__}") \
            from None
