"""The adapter's lowercase object methods (allreduce, bcast, allgather, ... of Python
objects), as methods ``Comm`` inherits (``_comm.py``).  Until they run on hpccoll they
are forwarded to the wrapped communicator like any other attribute."""
from __future__ import annotations


class ObjectCalls:
    """Mixed into ``hpccoll.mpi.Comm``: uses its ``_hc``, ``_st``, ``_mpi``, ``_stats``,
    ``_blocking`` and ``_nonblocking``."""
