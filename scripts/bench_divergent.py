#!/usr/bin/env python
"""hpccoll on divergent-order workloads against the MPI library's own nonblocking
collectives (the baseline that never deadlocks on host arrays: every collective of an
iteration posted with I<coll> on its own communicator, then one Waitall), in one run,
interleaved iteration by iteration, medians of the slowest rank, float32 sum:

    mpiexec -n 2 python scripts/bench_divergent.py [--sizes 8,64K,1M,16M] [--workloads latin,abba,mixed]

Workloads (the chaos module's, on buffers made once):
  latin: n communicators over the same n ranks; rank r issues its allreduces in the order
         of row r of a seeded Latin square (DFCCL's deadlock test);
  abba:  two communicators, opposite issue order on alternating ranks;
  mixed: alltoall on one communicator and allreduce on another, opposite order on
         alternating ranks (the production hang).
Every iteration issues the whole workload, then waits for all of it; the same pattern
repeats, so the ordered policy runs in its steady state.  Reported: microseconds per
iteration of each, and baseline time / hpccoll time (> 1: hpccoll faster).  The first
iteration's results are checked against the baseline's.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import hpccoll  # noqa: E402
from hpccoll.chaos import latin_square  # noqa: E402
from hpccoll.timing import handoff_note, human_bytes, parse_bytes  # noqa: E402


class Workload:
    """One workload's communicators (hpccoll's per policy, and the MPI baseline's) and
    buffers; ``ours(policy)`` and ``theirs()`` run one iteration."""

    def __init__(self, name, ctxs, world, nbytes):
        n, r = world.size, world.rank
        self.name, self.world = name, world
        count = max(1, nbytes // 4)
        if name == "latin":
            ncomm = n
            order = latin_square(n, 0)[r]
            kinds = ["allreduce"] * n
        elif name == "abba":
            ncomm, order, kinds = 2, [0, 1] if r % 2 == 0 else [1, 0], ["allreduce"] * 2
        else:
            ncomm, order, kinds = 2, [0, 1] if r % 2 == 0 else [1, 0], ["alltoall", "allreduce"]
        self.order, self.kinds = order, kinds
        count = -(-count // n) * n if "alltoall" in kinds else count
        self.send = [(np.arange(count) % 13 + r + c).astype(np.float32) for c in range(ncomm)]
        self.comms = {p: [ctx.world.dup(name=f"{name}{c}") for c in range(ncomm)]
                      for p, ctx in ctxs.items()}
        self.out = {p: [np.empty(count, np.float32) for _ in range(ncomm)] for p in ctxs}
        self.mpi = [world.Dup() for _ in range(ncomm)]
        self.ref = [np.empty(count, np.float32) for _ in range(ncomm)]

    def ours(self, policy, order=None, one_by_one=False):
        """One iteration: every collective issued in this rank's order (or ``order``: a
        subset of the communicators, as scripts/bench_mixed_floor.py times them), then
        waited for; ``one_by_one``: each waited for before the next is issued."""
        comms, out, send = self.comms[policy], self.out[policy], self.send
        works = []
        for c in self.order if order is None else order:
            w = getattr(comms[c], self.kinds[c])(send[c], out[c])
            if one_by_one:
                w.wait()
            else:
                works.append(w)
        for w in works:
            w.wait()

    def theirs(self, order=None, one_by_one=False):
        """The baseline's iteration, as ``ours``."""
        from mpi4py import MPI
        reqs = []
        for c in self.order if order is None else order:
            if self.kinds[c] == "alltoall":
                q = self.mpi[c].Ialltoall(self.send[c], self.ref[c])
            else:
                q = self.mpi[c].Iallreduce(self.send[c], self.ref[c], op=MPI.SUM)
            if one_by_one:
                q.Wait()
            else:
                reqs.append(q)
        MPI.Request.Waitall(reqs)

    def check(self, policy) -> bool:
        return all(np.array_equal(a, b) for a, b in zip(self.out[policy], self.ref))

    def free(self):
        for cs in self.comms.values():
            for c in cs:
                c.free()
        for c in self.mpi:
            c.Free()


def measure(wl, policies, iters, reps):
    """Median seconds per iteration of the baseline and of each policy; the order of the
    contenders rotates, so that none always follows another."""
    from mpi4py import MPI
    names = ["mpi"] + list(policies)
    run = {"mpi": wl.theirs, **{p: (lambda p=p: wl.ours(p)) for p in policies}}
    times = {k: [] for k in names}
    for it in range(iters + 1):
        for k in names[it % len(names):] + names[:it % len(names)]:
            wl.world.Barrier()
            t0 = time.perf_counter()
            for _ in range(reps):
                run[k]()
            dt = wl.world.allreduce((time.perf_counter() - t0) / reps, op=MPI.MAX)
            if it:            # the first round warms up (plans, token rounds, caches)
                times[k].append(dt)
    return {k: float(np.median(v)) for k, v in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="8,64K,1M,16M")
    ap.add_argument("--workloads", default="latin,abba,mixed")
    # one policy per job by default: an idle ordered context's daemon looks for the token
    # every millisecond, which would tax a busy context of another policy in the process
    ap.add_argument("--policies", default="preemptive",
                    help="comma-separated policies, each with its own context (default: "
                         "preemptive; measure ordered in a job of its own)")
    ap.add_argument("--iters", type=int, default=15, help="samples per size (median)")
    ap.add_argument("--max-active", type=int, default=None,
                    help="execution slot bound passed to hpccoll.init (default: the setting's)")
    args = ap.parse_args()
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    policies = [p for p in args.policies.split(",") if p]
    opts = {} if args.max_active is None else {"max_active": args.max_active}
    ctxs = {p: hpccoll.init(policy=p, timeout=120, **opts) for p in policies}
    if world.rank == 0:
        handoff = handoff_note(next(iter(ctxs.values())).handoff_ns) if ctxs else ""
        print(f"# {world.size} ranks{handoff}; baseline: I<coll> on every communicator + "
              f"Waitall; ratio = baseline time / hpccoll time (> 1: hpccoll faster)")
        head = f"{'workload':<8} {'size':>7} {'mpi us':>10}"
        for p in policies:
            head += f" {p + ' us':>15} {'ratio':>6}"
        print(head + "  check", flush=True)
    ok = True
    for name in [w for w in args.workloads.split(",") if w]:
        for nbytes in (parse_bytes(s) for s in args.sizes.split(",")):
            wl = Workload(name, ctxs, world, nbytes)
            wl.theirs()
            good = True
            for p in policies:
                wl.ours(p)
                good = good and wl.check(p)
            good = bool(world.allreduce(good, op=MPI.LAND))
            ok = ok and good
            # a sample of a few ms at least: the barrier and the timer vanish in it
            reps = max(1, min(200, (2 << 20) // max(1, nbytes)))
            iters = args.iters if nbytes <= (4 << 20) else max(5, args.iters // 2)
            med = measure(wl, policies, iters, reps)
            if world.rank == 0:
                row = f"{name:<8} {human_bytes(nbytes):>7} {med['mpi'] * 1e6:>10.1f}"
                for p in policies:
                    row += f" {med[p] * 1e6:>15.1f} {med['mpi'] / med[p]:>6.2f}"
                print(row + ("  ok" if good else "  WRONG"), flush=True)
            wl.free()
    for ctx in ctxs.values():
        ctx.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
