#!/usr/bin/env python
"""Two application threads, each looping blocking 1-element allreduces on a communicator
of its own, native and through the mpi4py adapter; every result checked.  Exit status 1
on a wrong result, a lost completion (CollectiveTimeout) or a thread that never finishes:

    mpiexec -n 2 python scripts/threads.py [--iters 3000] [--runs 50]

Each run is its own hpccoll context (and adapter), one after the other in this job."""
from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import hpccoll  # noqa: E402
import hpccoll.mpi  # noqa: E402


def run(bodies) -> list:
    errors = []

    def guarded(body):
        try:
            body()
        except BaseException as exc:
            errors.append(repr(exc)[:300])
    threads = [threading.Thread(target=guarded, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    if any(t.is_alive() for t in threads):
        errors.append("a thread never finished")
    return errors


def native(iters: int) -> list:
    with hpccoll.init(timeout=30) as ctx:
        comms = [ctx.world.dup(name=f"t{i}") for i in range(2)]

        def body(i):
            def loop():
                x, out = np.full(1, i + 1, np.int64), np.empty(1, np.int64)
                for k in range(iters):
                    comms[i].allreduce(x, out).wait()
                    if out[0] != (i + 1) * ctx.size:
                        raise AssertionError(f"thread {i} iteration {k}: {out}")
            return loop
        errors = run([body(0), body(1)])
        for c in comms:
            c.free()
    return errors


def adapter(iters: int) -> list:
    from mpi4py import MPI
    comm = hpccoll.mpi.Comm(MPI.COMM_WORLD, timeout=30)
    try:
        dups = [comm.Dup() for _ in range(2)]

        def body(i):
            def loop():
                x, out = np.full(1, i + 1, np.int64), np.empty(1, np.int64)
                for k in range(iters):
                    dups[i].Allreduce(x, out, op=MPI.SUM)
                    if out[0] != (i + 1) * comm.size:
                        raise AssertionError(f"thread {i} iteration {k}: {out}")
            return loop
        errors = run([body(0), body(1)])
        for d in dups:
            d.Free()
    finally:
        comm.context.close()
    return errors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=3000)
    ap.add_argument("--runs", type=int, default=50)
    args = ap.parse_args()
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    failed = {"native": 0, "adapter": 0}
    t0 = time.perf_counter()
    for r in range(args.runs):
        for name, fn in (("native", native), ("adapter", adapter)):
            errors = fn(args.iters)
            if errors:
                failed[name] += 1
                print(f"rank {world.rank}: run {r} {name}: {errors}", flush=True)
    bad = world.allreduce(sum(failed.values()))
    if world.rank == 0:
        print(f"{args.runs} runs x {args.iters} iterations x 2 threads, {world.size} ranks: "
              f"native {failed['native']} failed, adapter {failed['adapter']} failed "
              f"({time.perf_counter() - t0:.0f} s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
