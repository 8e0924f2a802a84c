"""The adapter's rooted and prefix collectives: Gather(v), Scatter(v), Scan, Exscan and
their nonblocking forms, as methods ``Comm`` inherits (``_comm.py``).  Each reads its
arguments as mpi4py does (``_calls.py``) and runs on hpccoll, or forwards the very same
call to the wrapped communicator where hpccoll cannot run it (derived datatypes, ops it
lacks, device buffers)."""
from __future__ import annotations

from . import _calls as calls
from ._types import MPI


class RootedCalls:
    """Mixed into ``hpccoll.mpi.Comm``: uses its ``_run`` (calls.Runner) and
    ``_nonblocking``."""

    # -- blocking ----------------------------------------------------------------------
    def Gather(self, sendbuf, recvbuf, root: int = 0) -> None:
        self._run.blocking("Gather", calls.gather, (sendbuf, recvbuf, root))

    def Gatherv(self, sendbuf, recvbuf, root: int = 0) -> None:
        self._run.blocking("Gatherv", calls.gatherv, (sendbuf, recvbuf, root))

    def Scatter(self, sendbuf, recvbuf, root: int = 0) -> None:
        self._run.blocking("Scatter", calls.scatter, (sendbuf, recvbuf, root))

    def Scatterv(self, sendbuf, recvbuf, root: int = 0) -> None:
        self._run.blocking("Scatterv", calls.scatterv, (sendbuf, recvbuf, root))

    def Scan(self, sendbuf, recvbuf, op=MPI.SUM) -> None:
        self._run.blocking("Scan", calls.scan, (sendbuf, recvbuf, op))

    def Exscan(self, sendbuf, recvbuf, op=MPI.SUM) -> None:
        self._run.blocking("Exscan", calls.exscan, (sendbuf, recvbuf, op))

    # -- nonblocking: hpccoll.mpi.Request, or MPI.Request when forwarded -----------------
    def Igather(self, sendbuf, recvbuf, root: int = 0):
        return self._nonblocking("Igather", calls.gather, sendbuf, recvbuf, root)

    def Igatherv(self, sendbuf, recvbuf, root: int = 0):
        return self._nonblocking("Igatherv", calls.gatherv, sendbuf, recvbuf, root)

    def Iscatter(self, sendbuf, recvbuf, root: int = 0):
        return self._nonblocking("Iscatter", calls.scatter, sendbuf, recvbuf, root)

    def Iscatterv(self, sendbuf, recvbuf, root: int = 0):
        return self._nonblocking("Iscatterv", calls.scatterv, sendbuf, recvbuf, root)

    def Iscan(self, sendbuf, recvbuf, op=MPI.SUM):
        return self._nonblocking("Iscan", calls.scan, sendbuf, recvbuf, op)

    def Iexscan(self, sendbuf, recvbuf, op=MPI.SUM):
        return self._nonblocking("Iexscan", calls.exscan, sendbuf, recvbuf, op)
