"""A structural call one rank never makes: init (argv[1] == "init"), dup or split of the
world.  With a timeout, the rank that waits raises CollectiveTimeout instead of hanging
in MPI's Comm_dup / Comm_split.
Prints one line per rank: RESULT <rank> <outcome> <seconds>."""
import sys
import time

from mpi4py import MPI

import hpccoll

what, timeout = sys.argv[1], float(sys.argv[2])
rank = MPI.COMM_WORLD.rank
t0 = time.monotonic()
ctx = None
outcome = "absent"
if what == "init":
    if rank == 0:
        try:
            ctx = hpccoll.init(timeout=timeout)
            outcome = "completed"
        except hpccoll.CollectiveTimeout as exc:
            outcome = "timeout"
            print(exc, file=sys.stderr, flush=True)
    else:
        time.sleep(timeout + 2)
else:
    ctx = hpccoll.init(timeout=timeout)
    t0 = time.monotonic()
    if rank == 0:
        try:
            ctx.world.dup() if what == "dup" else ctx.world.split(0)
            outcome = "completed"
        except hpccoll.CollectiveTimeout as exc:
            outcome = "timeout"
            print(exc, file=sys.stderr, flush=True)
    else:
        time.sleep(timeout + 2)     # never calls it; its engine still answers the report
sys.stdout.write(f"RESULT {rank} {outcome} {time.monotonic() - t0:.2f}\n")
sys.stdout.flush()
if what == "init" and rank != 0:
    # rank 0's barrier is still posted: complete it, so that both finalize cleanly
    MPI.COMM_WORLD.Ibarrier().Wait()
if ctx is not None:
    ctx.close()
