"""A program whose last collective is mismatched (rank 0 passes int32, the others
float32: same bytes, MPI would complete it), and which then ends without closing
anything, in one of several ways (argv[1]):

- ``adapter``: on hpccoll.mpi.Comm, falling off the end of the script;
- ``native``: on the native API, falling off the end;
- ``finalize``: on the native API, calling MPI.Finalize() itself;
- ``raises``: no mismatch; rank 1 raises (unhandled) while the others fall off the end.

Each rank prints ``rank R done`` before it ends."""
import sys

import numpy as np
from mpi4py import MPI

how = sys.argv[1]
r = MPI.COMM_WORLD.Get_rank()
x = np.ones(4, np.int32 if r == 0 and how != "raises" else np.float32)
if how == "adapter":
    import hpccoll.mpi
    comm = hpccoll.mpi.Comm(MPI.COMM_WORLD)
    comm.Allreduce(x, np.empty_like(x))
    comm.Allreduce(MPI.IN_PLACE, x)
else:
    import hpccoll
    ctx = hpccoll.init()
    ctx.world.allreduce(np.ones(2)).wait()
    ctx.world.allreduce(x, np.empty_like(x)).wait()
print(f"rank {r} done", flush=True)
if how == "finalize":
    MPI.Finalize()
elif how == "raises" and r == 1:
    raise RuntimeError("rank 1 gives up")
