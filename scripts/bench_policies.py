#!/usr/bin/env python
"""Overhead of the deadlock-free policies on consistent-order workloads, against fifo,
measured in one run with the policies interleaved iteration by iteration (medians).

    mpiexec -n 2 python scripts/bench_policies.py [--sizes 8,64K,1M,16M] [--iters 30]

Workloads (every rank issues the same collectives in the same order):
  single: allreduce, then wait, one at a time;
  burst:  a repeated pattern of 8 allreduces alternating over two communicators, issued
          back to back, then all waited (a training step's gradient buckets).
Reported: time per collective (us) per policy, and fifo_time / policy_time (throughput
relative to fifo; >= 0.95 is the preemptive target at >= 64 KiB, >= 0.91, i.e. <= 10%
overhead, the ordered target on the repeated pattern).  Then the wake-up latency of a
parked daemon, and iterations per second of the latin deadlock scenario per policy.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import hpccoll  # noqa: E402
from hpccoll import chaos  # noqa: E402
from hpccoll.timing import human_bytes, parse_bytes  # noqa: E402
from hpccoll.transport.mpi import library_name  # noqa: E402

POLICIES = ("fifo", "preemptive", "ordered")
BURST = 8


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="8,64K,1M,16M")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--latin-iters", type=int, default=20)
    args = ap.parse_args()
    sizes = [parse_bytes(s) for s in args.sizes.split(",")]
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    ctxs = {p: hpccoll.init(policy=p, timeout=120) for p in POLICIES}
    pairs = {p: (c.world.dup(name="x"), c.world.dup(name="y")) for p, c in ctxs.items()}
    rows = []
    for nbytes in sizes:
        count = max(1, nbytes // 4)
        x = np.ones(count, np.float32)
        outs = [np.empty_like(x) for _ in range(BURST)]
        iters = max(5, args.iters if nbytes <= (1 << 20) else args.iters // 3)

        def single(p):
            pairs[p][0].allreduce(x, outs[0]).wait()

        def burst(p):
            a, b = pairs[p]
            works = [(a if i % 2 == 0 else b).allreduce(x, outs[i]) for i in range(BURST)]
            for w in works:
                w.wait()

        for name, fn, per in (("single", single, 1), ("burst", burst, BURST)):
            times = {p: [] for p in POLICIES}
            for it in range(iters + 2):
                # rotate which policy goes first, so that no policy always follows another
                for p in POLICIES[it % 3:] + POLICIES[:it % 3]:
                    world.Barrier()
                    t0 = time.perf_counter()
                    fn(p)
                    dt = world.allreduce(time.perf_counter() - t0, op=MPI.MAX) / per
                    if it >= 2:
                        times[p].append(dt)
            med = {p: float(np.median(v)) for p, v in times.items()}
            rows.append((name, nbytes, med))
    # wake-up latency of a parked daemon (submission to start, the caller not driving)
    wake = []
    ctx = hpccoll.init(policy="preemptive", inline_bytes=0, timeout=60)
    for _ in range(20):
        time.sleep(0.03)   # the daemon parks
        w = ctx.world.allreduce(np.ones(1, np.float32))
        w.add_done_callback(lambda _: None)
        while not w._done:
            time.sleep(0.0005)
        k = w.counters
        wake.append(k["t_start"] - k["t_issue"])
    parks = ctx.stats()["parks"]
    ctx.close()
    wake_med = world.allreduce(float(np.median(wake)), op=MPI.MAX)
    for c in ctxs.values():
        c.close()
    # latin scenario, iterations per second
    latin = {}
    largs = argparse.Namespace(bytes=4096, seed=0, timeout=10.0, iters=args.latin_iters,
                               max_active=1, verbose=False)
    for p in ("preemptive", "ordered"):
        res = chaos.run_policy("latin", p, largs)
        secs = world.allreduce(res.seconds, op=MPI.MAX)
        latin[p] = (res.outcome, res.iters / secs if secs else 0.0)
    if world.rank == 0:
        print(f"policy overhead, {world.size} ranks, {library_name()}, "
              f"float32 sum allreduce, medians of the slowest rank")
        print(f"{'workload':<8}{'size':>9}" + "".join(f"{p + ' us':>15}" for p in POLICIES)
              + f"{'preempt/fifo':>14}{'ordered/fifo':>14}")
        for name, nbytes, med in rows:
            print(f"{name:<8}{human_bytes(nbytes):>9}" + "".join(f"{med[p] * 1e6:>15.1f}" for p in POLICIES)
                  + f"{med['fifo'] / med['preemptive']:>14.2f}{med['fifo'] / med['ordered']:>14.2f}")
        print("(columns x/fifo: fifo time / policy time = throughput relative to fifo)")
        print(f"wake-up latency of a parked daemon (submit -> start): {wake_med * 1e6:.0f} us "
              f"median ({parks} parks on rank 0)")
        print("latin scenario (divergent orders, 4 KiB, 1 slot): " + ", ".join(
            f"{p} {o} {r:.1f} it/s" for p, (o, r) in latin.items()) + ", fifo deadlocks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
