"""Rank 1 fails after MPI_Init and the job is aborted through jobs.abort_job; every
rank first prints the MPICH shared-memory segments it has mapped (MAPPED <path>)."""
import sys

import numpy as np
from mpi4py import MPI

from hpccoll.jobs import abort_job

world = MPI.COMM_WORLD
world.Allreduce(np.ones(4), np.empty(4))
with open("/proc/self/maps") as f:
    mapped = sorted({p[5].strip() for p in (line.split(None, 5) for line in f)
                     if len(p) == 6 and p[5].startswith("/dev/shm/mpich_")})
sys.stdout.write("".join(f"MAPPED {p}\n" for p in mapped))
sys.stdout.flush()
world.Barrier()
if world.rank == 1:
    sys.exit(abort_job(RuntimeError("rank 1 gives up"), "abort_rank"))
world.Barrier()     # the others wait here until the abort ends them
