"""hpccoll: fast, deadlock-free nonblocking collectives over MPI.

    import hpccoll
    with hpccoll.init() as ctx:
        total = ctx.world.allreduce(x).wait()

MPI is imported (and initialised with MPI_THREAD_MULTIPLE) by the first use of ``init``,
``Context``, ``Communicator`` or ``Work``, not by ``import hpccoll``: the tools that need
no MPI (hpccoll-report, hpccoll-tune simulate) run without it.
"""
from . import _compiled
from ._version import __version__

_compiled.install()       # HPCCOLL_COMPILED=0: the per-call path interpreted (_compiled.py)

from .errors import (ArgumentError, ArgumentTypeError, CollectiveMismatch,  # noqa: E402
                     CollectiveTimeout, ContextClosed, HpcCollError, ResourcesExhausted,
                     WaitTimeout)

__all__ = [
    "__version__", "init", "Context", "Communicator", "Work",
    "HpcCollError", "CollectiveTimeout", "CollectiveMismatch", "ContextClosed", "WaitTimeout",
    "ArgumentError", "ArgumentTypeError", "ResourcesExhausted",
]

# where each name that needs MPI lives (PEP 562: loaded at first use)
_LAZY = {"init": "core.context", "Context": "core.context",
         "Communicator": "core.communicator", "Work": "base.work"}


def __getattr__(name: str):
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'hpccoll' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(f".{where}", __name__), name)
    globals()[name] = value
    return value
