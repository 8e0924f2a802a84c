#!/usr/bin/env python
"""The ordered policy's negotiation in a real run: every collective takes a place in the
order (hpccoll's own algorithms, one execution slot), and each is timed from its
admission by the policy to its global sequence number, with the protocol's messages
counted:

    mpiexec -n 2 python scripts/bench_ordering.py [--iters 200] [--workload abba|latin|groups]

Workloads, repeated every iteration (the steady state after the first ones):
  abba:   two communicators over every rank, opposite issue order on alternating ranks;
  latin:  n communicators over every rank, rank r issuing them in row r of a Latin square;
  groups: each rank's group of 4 consecutive ranks and the world, alternating order.
Reported, past the first fifth of the iterations: the median time from admission to gseq
on the slowest rank and on the fastest, the iteration's time (slowest rank), and the
protocol's messages per collective (all ranks' sends).  Times on an oversubscribed
machine measure its scheduler as much as the protocol.
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


def communicators(ctx, workload):
    r, n = ctx.rank, ctx.size
    if workload == "abba":
        comms = [ctx.world.dup(name="A"), ctx.world.dup(name="B")]
        return comms if r % 2 == 0 else comms[::-1]
    if workload == "latin":
        comms = [ctx.world.dup(name=f"L{i}") for i in range(n)]
        return [comms[c] for c in latin_square(n, 0)[r]]
    group = ctx.world.split(r // 4, name=f"group{r // 4}")
    both = [group, ctx.world.dup(name="all")]
    return both if r % 2 == 0 else both[::-1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--workload", choices=("abba", "latin", "groups"), default="abba")
    args = ap.parse_args()
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    with hpccoll.init(policy="ordered", max_active=1, mpi_coll_bytes=0, cell_bytes=0,
                      timeout=120) as ctx:
        policy = ctx._engine.policy
        admitted, waits, sent, share = {}, [], [0], [0.0]
        admit, run_admit, send = policy.admit, policy.run.admit, policy._send

        def timed_admit(task):
            admitted[id(task)] = time.perf_counter()
            admit(task)

        def timed_run_admit(task):          # the policy hands a task its gseq
            t0 = admitted.pop(id(task), None)
            if t0 is not None:
                waits.append(time.perf_counter() - t0)
                share[0] += 1 / task.comm.size    # summed over its members: one
            run_admit(task)

        def counted_send(msgs):
            sent[0] += len(msgs)
            send(msgs)
        policy.admit, policy.run.admit, policy._send = timed_admit, timed_run_admit, counted_send
        order = communicators(ctx, args.workload)
        x = np.ones(2, np.float32)
        skip = args.iters // 5
        wrong = 0
        for it in range(args.iters):
            if it == skip:
                ctx.world.barrier().wait()
                del waits[:]
                sent[0], share[0] = 0, 0.0
                t0 = time.perf_counter()
            works = [(c, c.allreduce(x)) for c in order]
            for c, w in works:
                wrong += not np.array_equal(w.wait(), np.full(2, c.size, np.float32))
        per_iter = (time.perf_counter() - t0) / (args.iters - skip)
    med = world.gather(float(np.median(waits)) if waits else float("nan"), root=0)
    iters = world.gather(per_iter, root=0)
    totals = world.reduce(np.array([sent[0], share[0]]), root=0)
    wrong = world.allreduce(wrong)
    if world.rank == 0:
        messages, collectives = totals
        print(f"{world.size} ranks, {args.workload}: admission to gseq {max(med) * 1e6:.0f} us "
              f"(slowest rank's median; fastest {min(med) * 1e6:.0f}), iteration "
              f"{max(iters) * 1e6:.0f} us, {messages / max(collectives, 1):.2f} messages per "
              f"collective, {'every result right' if not wrong else f'{wrong} WRONG results'}",
              flush=True)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
