#!/usr/bin/env python
"""Where an 8 B allreduce spends its time on this machine (run under mpiexec -n 2):
each stage timed with perf_counter around the real calls, medians over many operations,
next to the MPI library's own Allreduce and Iallreduce.  The stage timers themselves
cost about a microsecond each.

Two paths: the general one (``express=False``: validation, planning, a queued task, the
engine's pass) stage by stage, then the express path (hpccoll/express.py, the default
under the preemptive policy) as call and wait, with the mismatch check on and off."""
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import hpccoll  # noqa: E402
from hpccoll import collectives  # noqa: E402


def express(world, n, check: bool) -> tuple:
    """(call, wait, total) medians of the express path, seconds."""
    ctx = hpccoll.init(policy="preemptive", express=True, check_mismatch=check)
    x = np.ones(2, np.float32)
    out = np.empty_like(x)
    call, wait, total = [], [], []
    for i in range(n + 100):
        world.Barrier()
        t0 = time.perf_counter()
        w = ctx.world.allreduce(x, out)
        t1 = time.perf_counter()
        w.wait()
        t2 = time.perf_counter()
        if i >= 100:
            call.append(t1 - t0)
            wait.append(t2 - t1)
            total.append(t2 - t0)
    ctx.close()
    return tuple(float(np.median(v)) for v in (call, wait, total))


def main(n=2000) -> int:
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    ctx = hpccoll.init(policy="preemptive", express=False)
    comm, eng = ctx.world, ctx._engine
    x = np.ones(2, np.float32)
    out = np.empty_like(x)
    stages = {k: [] for k in ("argument checks", "planning + task creation", "first pass (start, post)",
                              "polls until complete", "completion (retire, wake)", "total")}
    orig_pass, orig_alone, orig_complete = eng._pass, eng._poll_alone, eng._complete
    mark = {}

    def timed_pass():
        t = time.perf_counter()
        r = orig_pass()
        mark.setdefault("first", time.perf_counter() - t)
        return r

    def timed_alone(task, idle):
        t = time.perf_counter()
        r = orig_alone(task, idle)
        mark["polls"] = mark.get("polls", 0.0) + time.perf_counter() - t
        return r

    def timed_complete(task, admitted=True):
        t = time.perf_counter()
        orig_complete(task, admitted)
        mark["complete"] = time.perf_counter() - t

    eng._pass, eng._poll_alone, eng._complete = timed_pass, timed_alone, timed_complete
    for i in range(n + 100):
        mark.clear()
        world.Barrier()
        t0 = time.perf_counter()
        collectives.allreduce(comm, x, out, "sum")          # what submit validates first
        t1 = time.perf_counter()
        w = comm.allreduce(x, out)
        t2 = time.perf_counter()
        w.wait()
        t3 = time.perf_counter()
        if i >= 100:
            stages["argument checks"].append(t1 - t0)
            stages["planning + task creation"].append((t2 - t1) - (t1 - t0))
            stages["first pass (start, post)"].append(mark.get("first", 0.0))
            stages["polls until complete"].append(mark.get("polls", 0.0))
            stages["completion (retire, wake)"].append(mark.get("complete", 0.0))
            stages["total"].append(t3 - t1)
    mpi_comm = world.Dup()

    def mpi_time(fn):
        ts = []
        for _ in range(n):
            world.Barrier()
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return float(np.median(ts))

    def iall():
        r = mpi_comm.Iallreduce(x, out)
        while not r.Test():
            pass

    pair = np.zeros(2, np.int64)

    def checked():
        # the least a checked collective costs: the check's allreduce and the data's,
        # posted back to back and tested, with no bookkeeping at all
        r1 = mpi_comm.Iallreduce(MPI.IN_PLACE, pair, op=MPI.MIN)
        r2 = mpi_comm.Iallreduce(x, out)
        while not r1.Test():
            pass
        while not r2.Test():
            pass
    t_all = mpi_time(lambda: mpi_comm.Allreduce(x, out))
    t_iall = mpi_time(iall)
    t_checked = mpi_time(checked)
    ctx.close()
    fast = {check: express(world, n, check) for check in (True, False)}
    if world.rank == 0:
        print(f"8 B float32 allreduce, {world.size} ranks, medians of {n} on rank 0 (us)")
        print("general path (express=False):")
        for k, v in stages.items():
            print(f"  {k:<28}{np.median(v) * 1e6:>8.1f}")
        for check, (call, wait, total) in fast.items():
            print(f"express path, check_mismatch={check}:")
            print(f"  {'call (accept, task, post)':<28}{call * 1e6:>8.1f}")
            print(f"  {'wait (polls, completion)':<28}{wait * 1e6:>8.1f}")
            print(f"  {'total':<28}{total * 1e6:>8.1f}")
        print(f"  {'MPI Allreduce':<28}{t_all * 1e6:>8.1f}")
        print(f"  {'MPI Iallreduce + Test':<28}{t_iall * 1e6:>8.1f}")
        print(f"  {'MPI 2 Iallreduce (floor)':<28}{t_checked * 1e6:>8.1f}"
              "   what a checked collective costs with no bookkeeping")
        print(f"  ratio general / MPI Allreduce{np.median(stages['total']) / t_all:>7.1f}")
        for check, (_, _, total) in fast.items():
            print(f"  ratio express (check {'on' if check else 'off'}) / MPI{total / t_all:>6.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000))
