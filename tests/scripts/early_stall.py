"""A tiny allreduce, started on the calling thread (MPI's own collective, no slot), that
one rank never joins: with a timeout, the waiting rank raises CollectiveTimeout naming
the absent rank, instead of hanging.
Prints one line per rank: RESULT <rank> <outcome> <seconds>."""
import sys
import time

import numpy as np

import hpccoll

timeout = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
ctx = hpccoll.init(policy="preemptive", timeout=timeout)
t0 = time.monotonic()
if ctx.rank == 0:
    w = ctx.world.allreduce(np.ones(2, np.float32))
    assert w.counters["t_start"] is not None      # started at issue, before any wait
    try:
        w.wait()
        outcome = "completed"
    except hpccoll.CollectiveTimeout as exc:
        outcome = "timeout"
        print(exc.report, file=sys.stderr, flush=True)
else:
    time.sleep(timeout + 2)     # never joins; its engine still answers the report request
    outcome = "absent"
# one write: with PYTHONUNBUFFERED, print() writes the newline separately, and mpiexec
# may put another rank's line in between
sys.stdout.write(f"RESULT {ctx.rank} {outcome} {time.monotonic() - t0:.2f}\n")
sys.stdout.flush()
ctx.close()
