"""The adapter's native buffer collectives (Allreduce, Reduce, Bcast, Allgather(v),
Alltoall(v), Reduce_scatter(_block), Barrier and their nonblocking forms), as methods every
adapter class inherits (``_comm.py``): one place for all of them, like the object methods
(``_objects.py``) and the rooted and prefix ones (``_rooted.py``).

Each reads its arguments like mpi4py (``_calls.py``) and either runs the collective on
hpccoll or forwards the very same call to the wrapped communicator, counted in ``stats``.
"""
from __future__ import annotations

import numpy as np

from . import _calls as calls
from ._types import MPI

_ND = np.ndarray
_IN_PLACE = MPI.IN_PLACE


class BufferCalls:
    """Mixed into the adapter classes: uses their ``_stats``, ``_last_bcast``,
    ``_last_allreduce``, ``_run`` (calls.Runner) and ``_nonblocking``."""

    # -- blocking collectives -------------------------------------------------------------
    def Barrier(self) -> None:
        self._run.blocking("Barrier", calls.barrier, ())

    def Bcast(self, buf, root: int = 0) -> None:
        # the adapter's per-call cost: the same small array again, unchanged, was read
        # already: its Call and counters are kept beside it and the Runner runs it again
        # (no Kept reading; Free empties the list); anything else goes through the
        # Runner, which keeps it
        # (the Runner's bound ``again`` is kept too: two attribute lookups fewer a call)
        last = self._last_bcast
        if (buf is last[0] and root == last[1] and type(buf) is _ND
                and buf.flags.num == last[2] and buf.dtype is last[3] and buf.ndim == 1):
            last[6](last[4], last[5])
            return
        run = self._run
        call = run.blocking("Bcast", calls.bcast, (buf, root))
        if call is not None and call.send is buf and buf.nbytes <= calls.RECENT_BYTES:
            last[:] = (buf, root, buf.flags.num, buf.dtype, call, self._stats["Bcast"],
                       run.again)

    def Reduce(self, sendbuf, recvbuf, op=MPI.SUM, root: int = 0) -> None:
        self._run.blocking("Reduce", calls.reduce, (sendbuf, recvbuf, op, root))

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM) -> None:
        last = self._last_allreduce     # as Bcast: the last small Call kept, with its run
        if (recvbuf is last[1] and sendbuf is last[0] and op is last[2]
                and type(recvbuf) is _ND and recvbuf.flags.num == last[4] and recvbuf.dtype is last[5]
                and recvbuf.ndim == 1 and (sendbuf is _IN_PLACE or (
                    sendbuf.flags.num == last[3] and sendbuf.dtype is last[5]
                    and sendbuf.ndim == 1))):
            last[8](last[6], last[7])
            return
        run = self._run
        call = run.blocking("Allreduce", calls.allreduce, (sendbuf, recvbuf, op))
        if (call is not None and call.recv is recvbuf
                and recvbuf.nbytes <= calls.RECENT_BYTES
                and (call.send is sendbuf or sendbuf is _IN_PLACE)):
            last[:] = (sendbuf, recvbuf, op,
                       0 if sendbuf is _IN_PLACE else sendbuf.flags.num,
                       recvbuf.flags.num, recvbuf.dtype, call, self._stats["Allreduce"],
                       run.again)

    def Allgather(self, sendbuf, recvbuf) -> None:
        self._run.blocking("Allgather", calls.allgather, (sendbuf, recvbuf))

    def Allgatherv(self, sendbuf, recvbuf) -> None:
        self._run.blocking("Allgatherv", calls.allgatherv, (sendbuf, recvbuf))

    def Alltoall(self, sendbuf, recvbuf) -> None:
        self._run.blocking("Alltoall", calls.alltoall, (sendbuf, recvbuf))

    def Alltoallv(self, sendbuf, recvbuf) -> None:
        self._run.blocking("Alltoallv", calls.alltoallv, (sendbuf, recvbuf))

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=MPI.SUM) -> None:
        self._run.blocking("Reduce_scatter_block", calls.reduce_scatter_block,
                           (sendbuf, recvbuf, op))

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM) -> None:
        self._run.blocking("Reduce_scatter", calls.reduce_scatter,
                           (sendbuf, recvbuf, recvcounts, op))

    # -- nonblocking collectives: hpccoll.mpi.Request, or MPI.Request when forwarded ----
    def Ibarrier(self):
        return self._nonblocking("Ibarrier", calls.barrier)

    def Ibcast(self, buf, root: int = 0):
        return self._nonblocking("Ibcast", calls.bcast, buf, root)

    def Ireduce(self, sendbuf, recvbuf, op=MPI.SUM, root: int = 0):
        return self._nonblocking("Ireduce", calls.reduce, sendbuf, recvbuf, op, root)

    def Iallreduce(self, sendbuf, recvbuf, op=MPI.SUM):
        return self._nonblocking("Iallreduce", calls.allreduce, sendbuf, recvbuf, op)

    def Iallgather(self, sendbuf, recvbuf):
        return self._nonblocking("Iallgather", calls.allgather, sendbuf, recvbuf)

    def Iallgatherv(self, sendbuf, recvbuf):
        return self._nonblocking("Iallgatherv", calls.allgatherv, sendbuf, recvbuf)

    def Ialltoall(self, sendbuf, recvbuf):
        return self._nonblocking("Ialltoall", calls.alltoall, sendbuf, recvbuf)

    def Ialltoallv(self, sendbuf, recvbuf):
        return self._nonblocking("Ialltoallv", calls.alltoallv, sendbuf, recvbuf)

    def Ireduce_scatter_block(self, sendbuf, recvbuf, op=MPI.SUM):
        return self._nonblocking("Ireduce_scatter_block", calls.reduce_scatter_block,
                                 sendbuf, recvbuf, op)

    def Ireduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM):
        return self._nonblocking("Ireduce_scatter", calls.reduce_scatter, sendbuf, recvbuf,
                                 recvcounts, op)
