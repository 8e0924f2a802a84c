"""A drop-in mpi4py communicator: adopt hpccoll by changing one line.

    from mpi4py import MPI
    import hpccoll.mpi
    comm = hpccoll.mpi.Comm(MPI.COMM_WORLD)   # was: comm = MPI.COMM_WORLD

Buffer collectives (Allreduce, Reduce, Bcast, Allgather(v), Alltoall(v),
Reduce_scatter(_block), Barrier and their nonblocking forms) run on hpccoll; everything
else is forwarded to the wrapped communicator.  Importing this module initialises MPI
(with MPI_THREAD_MULTIPLE), as ``from mpi4py import MPI`` does.  See docs/mpi4py.md.
"""
from ._comm import Comm
from ._request import Request

__all__ = ["Comm", "Request"]
