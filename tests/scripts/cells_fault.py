"""A rank that stops or dies in the middle of cell collectives (tests/unit/test_cells_fault.py):

    python cells_fault.py stop|kill [ref]

stop: rank 1 completes a collective, then stops (SIGSTOP) before its part of the next;
the others' next collective raises CollectiveTimeout (timeout 3 s), each prints it, rank 0
lets rank 1 go on (SIGCONT) and every rank leaves.  kill: rank 1 publishes its part of a
collective and dies (SIGKILL); the launcher ends the job.  (Ranks leave by os._exit:
the launcher may report a bad termination, which the test does not look at.)  ref: the
collectives are gathers to rank 1 larger than a cell (cells by reference): the others
publish where their input is and wait for rank 1 to have read it."""
import os
import signal
import sys
import time

import numpy as np

import hpccoll

mode = sys.argv[1]
ctx = hpccoll.init(timeout=3)
w = ctx.world
if sys.argv[2:] == ["ref"]:
    big = np.ones(ctx.settings.cell_bytes // 8 + 1, np.int64)

    def coll():
        return w.gather(big, root=1)
else:
    def coll():
        return w.allreduce(np.ones(2, np.int64))
pids = ctx._ctl.allgather(os.getpid())
first = coll()
first.wait()
print(f"rank {w.rank}: algo {first.counters['algo']}", flush=True)
if w.rank == 1:
    if mode == "stop":
        coll().wait()
        os.kill(os.getpid(), signal.SIGSTOP)
        os._exit(0)
    coll()
    os.kill(os.getpid(), signal.SIGKILL)
t0 = time.monotonic()
code = 1
try:
    coll().wait()
    coll().wait()
    print(f"rank {w.rank}: no error", flush=True)
except hpccoll.CollectiveTimeout as exc:
    named = "waiting on rank(s) 1" in str(exc)
    print(f"rank {w.rank}: CollectiveTimeout after {time.monotonic() - t0:.1f} s, "
          f"{'naming' if named else 'NOT naming'} rank 1", flush=True)
    code = 0
# every other rank has printed before anybody leaves (a rank that leaves first may make
# the launcher end the job), then rank 1 goes on
from mpi4py import MPI  # noqa: E402
others = [r for r in range(w.size) if r != 1]
if w.rank == 0:
    for r in others[1:]:
        MPI.COMM_WORLD.recv(source=r, tag=77)
    os.kill(pids[1], signal.SIGCONT)
    for r in others[1:]:
        MPI.COMM_WORLD.send(None, dest=r, tag=78)
else:
    MPI.COMM_WORLD.send(None, dest=0, tag=77)
    MPI.COMM_WORLD.recv(source=0, tag=78)
os._exit(code)
