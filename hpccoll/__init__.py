"""hpccoll: fast, deadlock-free nonblocking collectives over MPI.

    import hpccoll
    with hpccoll.init() as ctx:
        total = ctx.world.allreduce(x).wait()

MPI is imported (and initialised with MPI_THREAD_MULTIPLE) by ``init``, not by
``import hpccoll``.
"""
from ._version import __version__
from .core.communicator import Communicator
from .core.context import Context, init
from .core.work import Work
from .errors import (ArgumentError, ArgumentTypeError, CollectiveMismatch, CollectiveTimeout,
                     ContextClosed, HpcCollError, ResourcesExhausted, WaitTimeout)

__all__ = [
    "__version__", "init", "Context", "Communicator", "Work",
    "HpcCollError", "CollectiveTimeout", "CollectiveMismatch", "ContextClosed", "WaitTimeout",
    "ArgumentError", "ArgumentTypeError", "ResourcesExhausted",
]
