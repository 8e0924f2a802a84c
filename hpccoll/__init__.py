"""hpccoll: fast, deadlock-free nonblocking collectives over MPI.

    import hpccoll
    with hpccoll.init() as ctx:
        total = ctx.world.allreduce(x).wait()

MPI is imported (and initialised with MPI_THREAD_MULTIPLE) by ``init``, not by
``import hpccoll``.
"""
from ._version import __version__
from .api import Communicator, Context, init
from .errors import (ArgumentError, ArgumentTypeError, CollectiveMismatch, CollectiveTimeout,
                     ContextClosed, HpcCollError, WaitTimeout)
from .work import Work

__all__ = [
    "__version__", "init", "Context", "Communicator", "Work",
    "HpcCollError", "CollectiveTimeout", "CollectiveMismatch", "ContextClosed", "WaitTimeout",
    "ArgumentError", "ArgumentTypeError",
]
