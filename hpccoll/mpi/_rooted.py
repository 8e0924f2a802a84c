"""The adapter's rooted and prefix collectives: Gather(v), Scatter(v), Scan, Exscan and
their nonblocking forms, as methods ``Comm`` inherits (``_comm.py``).  Until they run on
hpccoll they are forwarded to the wrapped communicator like any other attribute."""
from __future__ import annotations


class RootedCalls:
    """Mixed into ``hpccoll.mpi.Comm``: uses its ``_hc``, ``_st``, ``_mpi``, ``_stats``,
    ``_blocking`` and ``_nonblocking``."""
