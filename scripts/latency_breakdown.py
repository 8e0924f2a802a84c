#!/usr/bin/env python
"""Where an 8 B allreduce spends its time on this machine (run under mpiexec -n 2), next to
what the MPI library itself costs, medians over many calls, one run:

    mpiexec -n 2 python scripts/latency_breakdown.py [calls]

For each configuration of the one pipeline (the default; the per-call mismatch check;
no check; no persistent requests; the engine's queue instead of the calling thread):

- "before MPI": from calling ``allreduce`` to the moment its lane starts MPI's collective
  (validation, the cached plan, naming, the ledger, the task): the time before the first
  MPI call (a wrapper around transport/mpi.py's start marks the moment; it costs ~0.1 us;
  "-" where no call reached MPI: the collective ran in node-shared cells);
- "call": until ``allreduce`` returns; "wait": ``wait()``; "total": both.

Then the floors: MPI's blocking Allreduce, Iallreduce + a Test loop, a persistent request
(Allreduce_init once, Start + Test loop), and two Iallreduce (what a per-call check
costs with no bookkeeping at all)."""
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import hpccoll  # noqa: E402
from hpccoll.transport import mpi as transport  # noqa: E402  (initialises MPI)

CONFIGS = [
    ("default (deferred check)", {}),
    ("check_mismatch=every", {"check_mismatch": "every"}),
    ("check_mismatch=off", {"check_mismatch": "off"}),
    ("persistent_bytes=0", {"persistent_bytes": 0}),
    ("express=False (queued)", {"express": False}),
    ("trace=True", {"trace": True}),
]


def ours(world, n, options) -> dict:
    """Medians (seconds) of each stage for one configuration."""
    marks = []
    real = {name: getattr(transport, name) for name in ("start", "start_slot")}

    def marker(fn):
        def marked(*args):
            marks.append(time.perf_counter())
            return fn(*args)
        return marked
    for name, fn in real.items():
        setattr(transport, name, marker(fn))
    try:
        with hpccoll.init(policy="preemptive", **options) as ctx:
            comm = ctx.world
            x = np.ones(2, np.float32)
            out = np.empty_like(x)
            stages = {"before MPI": [], "call": [], "wait": [], "total": []}
            for i in range(n + 100):
                world.Barrier()
                marks.clear()
                t0 = time.perf_counter()
                w = comm.allreduce(x, out)
                t1 = time.perf_counter()
                w.wait()
                t2 = time.perf_counter()
                if i >= 100:
                    if marks:  # none where the collective ran in node-shared cells, not MPI
                        stages["before MPI"].append(marks[0] - t0)
                    stages["call"].append(t1 - t0)
                    stages["wait"].append(t2 - t1)
                    stages["total"].append(t2 - t0)
            assert (out == ctx.size).all()
    finally:
        for name, fn in real.items():
            setattr(transport, name, fn)
    return {k: float(np.median(v)) if v else np.nan for k, v in stages.items()}


def floors(world, n) -> dict:
    from mpi4py import MPI
    comm = world.Dup()
    x = np.ones(2, np.float32)
    out = np.empty_like(x)
    pair = np.zeros(2, np.int64)
    persistent = comm.Allreduce_init(x, out, MPI.SUM) if hasattr(comm, "Allreduce_init") else None

    def timed(fn):
        ts = []
        for i in range(n + 100):
            world.Barrier()
            t = time.perf_counter()
            fn()
            if i >= 100:
                ts.append(time.perf_counter() - t)
        return float(np.median(ts))

    def test_loop(req):
        while not req.Test():
            pass

    def start():
        persistent.Start()
        test_loop(persistent)

    def two():
        r1 = comm.Iallreduce(MPI.IN_PLACE, pair, op=MPI.MIN)
        r2 = comm.Iallreduce(x, out)
        test_loop(r1)
        test_loop(r2)

    got = {"MPI Allreduce": timed(lambda: comm.Allreduce(x, out)),
           "MPI Iallreduce + Test": timed(lambda: test_loop(comm.Iallreduce(x, out)))}
    if persistent is not None:
        got["MPI persistent Start + Test"] = timed(start)
        persistent.Free()
    got["MPI 2 x Iallreduce"] = timed(two)
    comm.Free()
    return got


def main(n=2000) -> int:
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    results = {name: ours(world, n, options) for name, options in CONFIGS}
    base = floors(world, n)
    if world.rank == 0:
        ref = base["MPI Allreduce"]
        print(f"8 B float32 allreduce, {world.size} ranks, medians of {n} on rank 0 (us)")
        print(f"{'configuration':<28}{'before MPI':>11}{'call':>8}{'wait':>8}{'total':>8}"
              f"{'/ MPI':>7}")
        for name, r in results.items():
            before = "-" if np.isnan(r["before MPI"]) else f"{r['before MPI'] * 1e6:.1f}"
            print(f"{name:<28}{before:>11}{r['call'] * 1e6:>8.1f}"
                  f"{r['wait'] * 1e6:>8.1f}{r['total'] * 1e6:>8.1f}{r['total'] / ref:>7.2f}")
        for name, t in base.items():
            print(f"{name:<28}{'':>11}{'':>8}{'':>8}{t * 1e6:>8.1f}{t / ref:>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000))
