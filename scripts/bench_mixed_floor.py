#!/usr/bin/env python
"""Where the mixed workload's time goes (bench_divergent.py's alltoall on one communicator
and allreduce on another): hpccoll's and the MPI baseline's pair in opposite orders on
alternate ranks, in the same order (either first), one after the other, and each piece
alone; interleaved, medians of the slowest rank, microseconds per iteration, float32:

    mpiexec -n 2 python scripts/bench_mixed_floor.py [--size 16M] [--iters 15]

If hpccoll's pair costs the sum of its pieces, the pair cannot beat the baseline by more
than (baseline pair) / (hpccoll's alltoall + hpccoll's allreduce).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import hpccoll  # noqa: E402
from bench_divergent import Workload  # noqa: E402  (the mixed workload's buffers and comms)
from hpccoll.timing import parse_bytes  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="16M", help="bytes per collective (default 16M)")
    ap.add_argument("--iters", type=int, default=15, help="samples per case (median)")
    args = ap.parse_args()
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    r, n = world.rank, world.size
    ctx = hpccoll.init(timeout=120)
    nbytes = parse_bytes(args.size)
    wl = Workload("mixed", {"preemptive": ctx}, world, nbytes)
    out, ref, opposite = wl.out["preemptive"], wl.ref, wl.order

    def ours(order, one_by_one=False):
        wl.ours("preemptive", order, one_by_one)

    theirs = wl.theirs

    cases = {
        "pair, opposite orders": (lambda: theirs(opposite), lambda: ours(opposite)),
        "pair, alltoall first": (lambda: theirs([0, 1]), lambda: ours([0, 1])),
        "pair, allreduce first": (lambda: theirs([1, 0]), lambda: ours([1, 0])),
        "one after the other": (lambda: theirs([0, 1], True), lambda: ours([0, 1], True)),
        "alltoall alone": (lambda: theirs([0]), lambda: ours([0])),
        "allreduce alone": (lambda: theirs([1]), lambda: ours([1])),
    }
    runs = {(k, who): fn for k, fns in cases.items() for who, fn in zip(("mpi", "hpccoll"), fns)}
    for fn in runs.values():
        fn()
    good = all(np.array_equal(a, b) for a, b in zip(out, ref))
    reps = max(1, min(200, (2 << 20) // max(1, nbytes)))
    names = list(runs)
    times = {k: [] for k in names}
    for it in range(args.iters + 1):
        for k in names[it % len(names):] + names[:it % len(names)]:
            world.Barrier()
            t0 = time.perf_counter()
            for _ in range(reps):
                runs[k]()
            dt = world.allreduce((time.perf_counter() - t0) / reps, op=MPI.MAX)
            if it:
                times[k].append(dt)
    good = bool(world.allreduce(good, op=MPI.LAND))
    if r == 0:
        print(f"# {n} ranks, {args.size} per collective; us per iteration (medians)")
        print(f"{'case':<24} {'mpi us':>10} {'hpccoll us':>11} {'ratio':>6}")
        for k in cases:
            m, h = (float(np.median(times[(k, w)])) * 1e6 for w in ("mpi", "hpccoll"))
            print(f"{k:<24} {m:>10.1f} {h:>11.1f} {m / h:>6.2f}")
        parts = sum(float(np.median(times[(k, "hpccoll")])) for k in
                    ("alltoall alone", "allreduce alone"))
        pair = float(np.median(times[("pair, opposite orders", "mpi")]))
        print(f"bound on the pair's ratio if hpccoll's pair costs the sum of its pieces: "
              f"{pair / parts:.2f}" + ("" if good else "  (results WRONG)"))
    wl.free()
    ctx.close()
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
