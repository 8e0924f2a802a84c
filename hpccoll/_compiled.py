"""The modules of the per-call path that the install compiles from their Python source
(Cython), and the switch that runs them interpreted.

Every call of every collective passes through these modules; where a C compiler is
present, ``pip install`` compiles each one, from the same ``.py`` file (with a ``.pxd``
beside it typing its hot classes, where it has one), into an extension module that
Python imports instead of the source.  Nothing is written twice: where no compiler
exists, or with ``HPCCOLL_COMPILED=0`` in the environment before hpccoll is imported,
the very same modules run interpreted (``python -m hpccoll config`` says which).
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

MODULES = (
    "hpccoll.base.work",
    "hpccoll.base.mismatch",
    "hpccoll.transport.mpi",
    "hpccoll.engine.task",
    "hpccoll.engine.lane",
    "hpccoll.engine.program",
    "hpccoll.engine.code",
    "hpccoll.engine.flight",
    "hpccoll.engine.policies.preemptive",
    "hpccoll.engine.engine",
    "hpccoll.core.validate",
    "hpccoll.core.plan",
    "hpccoll.core.state",
    "hpccoll.core.communicator",
    "hpccoll.mpi._message",
    "hpccoll.mpi._calls",
    "hpccoll.mpi._buffers",
    "hpccoll.mpi._comm",
    "hpccoll.mpi._codec",
    "hpccoll.mpi._objects",
    "hpccoll.mpi._rooted",
)

ENV = "HPCCOLL_COMPILED"


def wanted() -> bool:
    """Whether the compiled forms may be used (HPCCOLL_COMPILED, default 1)."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def compiled(name: str) -> bool:
    """Whether module ``name`` runs compiled in this process."""
    mod = sys.modules.get(name)
    return mod is not None and not str(getattr(mod, "__file__", "")).endswith(".py")


class _SourceFirst:
    """A meta-path finder that loads the listed modules from their ``.py`` source even
    where the compiled extension sits beside it (HPCCOLL_COMPILED=0)."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name not in MODULES or not path:
            return None
        leaf = name.rpartition(".")[2]
        for folder in path:
            source = os.path.join(folder, leaf + ".py")
            if os.path.exists(source):
                loader = importlib.machinery.SourceFileLoader(name, source)
                return importlib.util.spec_from_file_location(name, source, loader=loader)
        return None


def install() -> None:
    """Called by hpccoll/__init__.py before anything else of hpccoll is imported."""
    if not wanted() and not any(isinstance(f, _SourceFirst) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceFirst())
