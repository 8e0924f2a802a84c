"""A mixed sequence of collectives, recorded: run under mpiexec, once with the per-call
path compiled and once interpreted (HPCCOLL_COMPILED=0), by tests/unit/test_compiled.py,
which compares what each rank wrote to ``OUT.rank<N>.json``.

Recorded per collective: how it ran (algorithm, started at issue or queued, admitted,
state, sequence number or key, waits passed, polls of a lone task), its result (exact:
integers), the communicator's ledger (digest, fingerprints), the flight rows (times
aside) and, with trace=True, the trace's rows; and which modules ran compiled."""
import json
import sys

import numpy as np

import hpccoll
from hpccoll import _compiled


def record(ctx, out_path):
    world = ctx.world
    other = world.dup(name="other")
    r, n = ctx.rank, ctx.size
    rows = []
    pending = []

    def keep(comm, what, work):
        pending.append((comm, what, work))

    def settle():
        for comm, what, work in pending:
            record_one(comm, what, work)
        pending.clear()

    def record_one(comm, what, work):
        result = work.wait()
        if what.startswith("reduce ") and r != n - 1:
            result = None          # (a reduce's result means something at its root only)
        rows.append({"what": what, "comm": comm.name, "seq": work.seq, "key": work.key,
                     "algo": work.plan.algo, "state": work.state,
                     "at_issue": work.t_start == work.t_issue,
                     "admitted": work.admitted,
                     "waits": int(work.lane.waits_done),
                     "result": None if result is None else np.asarray(result).tolist()})

    for size in (1, 7, 1024, 20000):
        x = (np.arange(size) % 11 + r).astype(np.int64)
        for comm in ((world, other) if r % 2 == 0 else (other, world)):
            keep(comm, f"allreduce {size}", comm.allreduce(x))
            keep(comm, f"allreduce max {size}", comm.allreduce(x, op="max"))
            keep(comm, f"reduce {size}", comm.reduce(x, root=n - 1))
            y = x.copy()
            keep(comm, f"broadcast {size}", comm.broadcast(y, root=0))
            keep(comm, f"allgather {size}", comm.allgather(x))
            keep(comm, f"reduce_scatter {size}", comm.reduce_scatter(np.tile(x, n)))
            keep(comm, f"alltoall {size}", comm.alltoall(np.tile(x, n)))
            keep(comm, f"keyed {size}", comm.allreduce(x, key=f"k{size}"))
            keep(comm, f"gather {size}", comm.gather(x, root=n - 1))
            keep(comm, f"scatter {size}", comm.scatter(np.tile(x, n), root=0))
            keep(comm, f"scan {size}", comm.scan(x))
            keep(comm, f"exscan {size}", comm.exscan(x, op="max"))
            keep(comm, f"keyed gather {size}", comm.gather(x, key=f"g{size}"))
            keep(comm, "barrier", comm.barrier())
        settle()       # (issued in opposite orders on alternate ranks: waited afterwards)
    ledgers = {}
    for comm in (world, other):
        led = comm._state.ledger
        ledgers[comm.name] = None if led is None else {
            "seq": led.seq, "digest": int(led.digest), "rows": [list(map(int, row))
                                                                for row in led.rows()]}
    flight = [{k: v for k, v in row.items() if not k.startswith("t_")}
              for row in ctx._engine.flight.rows(0.0)]
    trace = None
    if ctx._engine.trace is not None:
        trace = [{k: v for k, v in row.items()
                  # (polls and tries: how often and by whom it was polled, a matter of timing)
                  if not k.startswith("t_") and k not in ("yield_times", "polls", "tries")}
                 for row in ctx.trace()]
    compiled = sorted(m for m in _compiled.MODULES if _compiled.compiled(m))
    other.free()
    with open(f"{out_path}.rank{r}.json", "w") as f:
        json.dump({"rows": rows, "ledgers": ledgers, "flight": flight, "trace": trace,
                   "compiled": compiled}, f)


def main() -> int:
    options = dict(arg.split("=", 1) for arg in sys.argv[2:])
    options = {k: (v == "1") if k == "trace" else v for k, v in options.items()}
    # every row kept: the ring's newest 64 depend on the order collectives completed in
    with hpccoll.init(timeout=60, flight_entries=10_000, **options) as ctx:
        record(ctx, sys.argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
