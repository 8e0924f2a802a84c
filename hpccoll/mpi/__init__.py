"""A drop-in mpi4py communicator: adopt hpccoll by changing one line.

    from mpi4py import MPI
    import hpccoll.mpi
    comm = hpccoll.mpi.Comm(MPI.COMM_WORLD)   # was: comm = MPI.COMM_WORLD

``Comm`` is an ``MPI.Intracomm`` (``Cartcomm``, ``Graphcomm``, ``Distgraphcomm``: the
topology communicators) whose collectives run on hpccoll where hpccoll has them; the
rest is mpi4py's own, inherited.  ``python -m hpccoll.mpi --coverage`` prints what is
native.  Importing this module initialises MPI (with MPI_THREAD_MULTIPLE), as
``from mpi4py import MPI`` does.  See docs/mpi4py.md.
"""
from ._comm import Cartcomm, Comm, Distgraphcomm, Graphcomm
from ._request import Request

__all__ = ["Comm", "Cartcomm", "Graphcomm", "Distgraphcomm", "Request"]
