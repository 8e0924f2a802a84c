#!/usr/bin/env python
"""The floor under the divergent 8 B target: what a latin iteration costs (every rank
issues one tiny allreduce per communicator, in the order of its row of a Latin square,
then waits for each), with less and less of hpccoll around MPI, in one run:

    mpiexec -n 2 python scripts/floor_small.py [iterations] [bytes]

- "MPI Iallreduce + Waitall": the baseline users have (scripts/bench_divergent.py's);
- "MPI persistent Start + Test": MPI alone on hpccoll's path for tiny messages (one
  persistent request per communicator, staging copies left out);
- "stripped hpccoll": only what a collective cannot do without -- the argument check,
  the plan lookup, the sequence number and the mismatch ledger under the communicator's
  lock, the persistent request's copy in, ``Start``, a ``Test`` loop, the copy out; no
  task object, flight record, engine hand-over or thread safety for the waiter.  Python's
  floor for an issue-and-complete path (a prototype, not an API: it bypasses the engine);
- "hpccoll": the real thing.

Medians over rounds of 2000 iterations, rank 0's clock; ratio = baseline / row.  Run it
with a core per rank: the MPI-only rows spin without yielding, which starves peers that
share a core."""
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import hpccoll  # noqa: E402
from hpccoll.chaos import latin_square  # noqa: E402
from hpccoll.core import validate  # noqa: E402
from hpccoll.core.plan import PERSISTENT_SLOTS  # noqa: E402  (initialises MPI)
from hpccoll.engine.task import started  # noqa: E402
from hpccoll.transport.mpi import finish_slot, start_slot  # noqa: E402


class Stripped:
    """The prototype's handle: the request, its persistent slot and where the result
    goes."""
    __slots__ = ("req", "slot", "recipe", "recv", "result")

    def wait(self):
        test = self.req.Test
        while not test():
            pass
        finish_slot(self.recipe, self.slot, self.recv)
        return self.result


def stripped(st, sendbuf, recvbuf):
    """An allreduce with nothing but its essentials (None where it cannot take this path:
    the caller then uses hpccoll's)."""
    call = validate.allreduce(st, sendbuf, recvbuf, "sum")
    plan = st._plan(call, False, None)
    recipe = plan.recipe
    if recipe is None or recipe.persist is None:
        return None
    with st.lock:
        seq, ledger = st.seq, st.ledger
        pset = st.persist.get(recipe.persist)
        if pset is None:       # (made by hpccoll's own first call)
            return None
        slot = pset.slots[pset.uses % PERSISTENT_SLOTS]
        if not started(st._last()) or (ledger is not None and ledger.due(seq)) or slot.busy:
            return None
        st.seq = seq + 1
        pset.uses += 1
        if ledger is not None:
            ledger.record(seq, plan.fp, plan.fp_hash)
        st.last = None
        h = Stripped()
        h.req = start_slot(recipe, slot, call.send)
        h.slot, h.recipe, h.recv, h.result = slot, recipe, call.recv, call.result
        return h


def main() -> int:
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    nbytes = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    n, r = world.size, world.rank
    order = latin_square(n, 0)[r]
    count = max(1, nbytes // 4)
    x = [np.full(count, r + c, np.float32) for c in range(n)]
    out = [np.empty(count, np.float32) for _ in range(n)]
    expect = [np.full(count, sum(range(n)) + n * c, np.float32) for c in range(n)]
    mpi = [world.Dup() for _ in range(n)]
    pers = [mpi[c].Allreduce_init(x[c], out[c], MPI.SUM) for c in range(n)]
    with hpccoll.init(policy="preemptive", calibration="off") as ctx:
        comms = [ctx.world.dup(name=f"floor{c}") for c in range(n)]
        states = [c._state for c in comms]

        def baseline():
            MPI.Request.Waitall([mpi[c].Iallreduce(x[c], out[c], MPI.SUM) for c in order])

        def persistent():
            for c in order:
                pers[c].Start()
            for c in order:
                while not pers[c].Test():
                    pass

        def proto():
            hs = [stripped(states[c], x[c], out[c]) or comms[c].allreduce(x[c], out[c])
                  for c in order]
            for h in hs:
                h.wait()

        def ours():
            ws = [comms[c].allreduce(x[c], out[c]) for c in order]
            for w in ws:
                w.wait()

        rows = [("MPI Iallreduce + Waitall", baseline), ("MPI persistent Start + Test", persistent),
                ("stripped hpccoll", proto), ("hpccoll", ours)]
        times = {name: [] for name, _ in rows}
        rounds = max(1, iters // 2000)
        for k in range(rounds + 1):
            for name, fn in rows[k % len(rows):] + rows[:k % len(rows)]:
                for o in out:
                    o[:] = -1
                world.Barrier()
                t0 = time.perf_counter()
                for _ in range(min(iters, 2000)):
                    fn()
                dt = (time.perf_counter() - t0) / min(iters, 2000)
                if not all(np.array_equal(o, e) for o, e in zip(out, expect)):
                    print(f"rank {r}: {name}: wrong result", file=sys.stderr, flush=True)
                    world.Abort(1)
                if k:
                    times[name].append(dt)
        for c in comms:
            c.free()
    for p in pers:
        p.Free()
    for m in mpi:
        m.Free()
    if r == 0:
        base = float(np.median(times[rows[0][0]]))
        print(f"latin, {n} ranks, {nbytes} B float32 allreduce per communicator, medians of "
              f"{rounds} round(s) (us per iteration)")
        print(f"{'':30s} {'us':>8s} {'ratio':>7s}")
        for name, _ in rows:
            t = float(np.median(times[name]))
            print(f"{name:30s} {t * 1e6:8.1f} {base / t:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
