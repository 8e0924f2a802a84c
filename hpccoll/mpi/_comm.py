"""``hpccoll.mpi.Comm``: an mpi4py intracommunicator whose buffer collectives run on hpccoll.

    comm = hpccoll.mpi.Comm(MPI.COMM_WORLD)      # the one changed line
    comm.Allreduce(x, y, op=MPI.SUM)              # runs on hpccoll
    comm.Gather(x, y, root=0)                     # forwarded to MPI.COMM_WORLD

Natively run methods read their arguments like mpi4py and either start the collective
on hpccoll or forward the very same call to the wrapped communicator (see
``_calls.py``).  Every other attribute is the wrapped communicator's.  ``stats`` counts,
per method, the calls that ran natively and those forwarded.
"""
from __future__ import annotations

from collections import defaultdict

from ..core.context import init
from ..errors import ArgumentError
from . import _calls as calls
from ._request import Request
from ._objects import ObjectCalls
from ._rooted import RootedCalls
from ._types import MPI


class Comm(ObjectCalls, RootedCalls):
    """mpi4py's ``Intracomm`` with hpccoll under its buffer collectives.

    ``Comm(comm, **init_options)`` starts an hpccoll context on ``comm`` (collective,
    like ``hpccoll.init(comm, **init_options)``: policy, timeout, engine knobs).
    ``Comm(comm, context=ctx)`` runs on an existing context instead.  ``Dup``, ``Clone``,
    ``Split`` and ``Split_type`` return adapters on the same context, so collectives of
    all of them share one engine (and its deadlock-free scheduling)."""

    def __init__(self, comm, context=None, **init_options):
        if isinstance(comm, Comm):
            comm = comm._mpi
        if isinstance(comm, MPI.Comm) and comm == MPI.COMM_NULL:
            raise ArgumentError("comm: expected a communicator this rank belongs to, got COMM_NULL")
        if not isinstance(comm, MPI.Intracomm):
            raise TypeError(f"comm: expected an mpi4py intracommunicator, got {type(comm).__name__}")
        if context is None:
            ctx = init(comm, **init_options)
            hc = ctx.world
        else:
            if init_options:
                raise ArgumentError(f"{', '.join(init_options)}: with context= the context's "
                                    "settings apply; pass options to hpccoll.init instead")
            ctx, hc = context, context.wrap(comm)
        self._setup(comm, ctx, hc)

    def _setup(self, mpi_comm, ctx, hc) -> None:
        self._mpi = mpi_comm
        self._ctx = ctx
        self._hc = hc
        self._st, self._blocks = hc._state, hc._blocks
        self._freed = False
        self._stats = defaultdict(lambda: {"native": 0, "forwarded": 0})
        # the Call of the last small plain arrays of Bcast and Allreduce (calls.RECENT_BYTES)
        self._last_bcast = [None, None, 0, None, None]
        self._last_allreduce = [None, None, None, 0, 0, None, None]

    def _child(self, mpi_comm):
        if mpi_comm == MPI.COMM_NULL:
            return mpi_comm
        child = Comm.__new__(Comm)
        child._setup(mpi_comm, self._ctx, self._ctx.wrap(mpi_comm))
        return child

    def __repr__(self) -> str:
        if "_mpi" not in self.__dict__:
            return "<hpccoll.mpi.Comm (not constructed)>"
        state = " freed" if self._freed else ""
        return f"<hpccoll.mpi.Comm rank {self.rank} of {self.size}{state} over {self._mpi!r}>"

    # -- what it wraps ------------------------------------------------------------------
    @property
    def mpi_comm(self):
        """The wrapped mpi4py communicator (forwarded calls run on it)."""
        return self._mpi

    @property
    def communicator(self):
        """The hpccoll Communicator native calls run on."""
        return self._hc

    @property
    def context(self):
        """The hpccoll Context (its engine serves this communicator and its Dup/Split
        children; ``context.close()`` is collective)."""
        return self._ctx

    @property
    def stats(self) -> dict:
        """{method: {"native": calls run on hpccoll, "forwarded": calls run by mpi4py}}."""
        return {name: dict(counts) for name, counts in self._stats.items()}

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        attr = getattr(self._mpi, name)
        if not callable(attr):
            return attr
        stats = self._stats

        def forwarded(*args, **kwargs):
            stats[name]["forwarded"] += 1
            return attr(*args, **kwargs)
        forwarded.__name__ = name
        forwarded.__doc__ = attr.__doc__
        # kept: the next call finds it with one attribute lookup
        self.__dict__[name] = forwarded
        return forwarded

    def __setattr__(self, name, value):
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:   # mpi4py's settable properties (name, info) belong to the wrapped communicator
            setattr(self._mpi, name, value)

    # -- the engine of every native method ---------------------------------------------
    def _forward(self, name: str, *args):
        """The call as mpi4py runs it, on the wrapped communicator (counted)."""
        self._stats[name]["forwarded"] += 1
        return getattr(self._mpi, name)(*args)

    def _run(self, name: str, read, *args):
        """(Work, None) when it ran natively, (None, mpi4py's return value) when forwarded.
        ``read`` checks the arguments once and returns the call the pipeline issues."""
        if self._freed:
            raise MPI.Exception(MPI.ERR_COMM)
        call = read(self._hc, *args)
        if call is calls.FORWARD:
            return None, self._forward(name, *args)
        self._stats[name]["native"] += 1
        return self._hc._issue(call), None

    def _blocking(self, name: str, read, *args) -> None:
        """Run natively, waiting on the calling thread (CommState.run), or forward."""
        if self._freed:
            raise MPI.Exception(MPI.ERR_COMM)
        call = read(self._hc, *args)
        if call is calls.FORWARD:
            self._forward(name, *args)
            return
        self._stats[name]["native"] += 1
        self._st.issue(call, None, self._blocks).wait()

    def _nonblocking(self, name: str, plan, *args):
        work, request = self._run(name, plan, *args)
        return Request(work) if work is not None else request

    # -- structure ----------------------------------------------------------------------
    def Get_rank(self) -> int:
        return self._mpi.Get_rank()

    def Get_size(self) -> int:
        return self._mpi.Get_size()

    @property
    def rank(self) -> int:
        return self._mpi.Get_rank()

    @property
    def size(self) -> int:
        return self._mpi.Get_size()

    def Dup(self, info=None) -> "Comm":
        self._stats["Dup"]["native"] += 1
        return self._child(self._mpi.Dup() if info is None else self._mpi.Dup(info))

    def Clone(self) -> "Comm":
        self._stats["Clone"]["native"] += 1
        return self._child(self._mpi.Clone())

    def Split(self, color: int = 0, key: int = 0):
        """An adapter for this rank's part, or MPI.COMM_NULL for color MPI.UNDEFINED."""
        self._stats["Split"]["native"] += 1
        return self._child(self._mpi.Split(color, key))

    def Split_type(self, split_type: int, key: int = 0, info=MPI.INFO_NULL):
        self._stats["Split_type"]["native"] += 1
        return self._child(self._mpi.Split_type(split_type, key, info))

    def Free(self) -> None:
        """Free the wrapped communicator (as mpi4py does: MPI.COMM_WORLD raises) and the
        hpccoll communicator over it.  Like MPI_Comm_free it does not synchronize; the
        hpccoll context stays up for the other adapters on it, until ``context.close()``
        or the end of the program."""
        self._mpi.Free()
        self._stats["Free"]["native"] += 1
        self._freed = True
        self._hc.free()

    # -- blocking collectives -------------------------------------------------------------
    def Barrier(self) -> None:
        self._blocking("Barrier", calls.barrier)

    def Bcast(self, buf, root: int = 0) -> None:
        # the adapter's per-call cost: read, count, run (what _blocking does, unrolled)
        if self._freed:
            raise MPI.Exception(MPI.ERR_COMM)
        last = self._last_bcast
        if (buf is last[0] and root == last[1] and buf.flags.num == last[2]
                and buf.dtype is last[3] and buf.ndim == 1):
            call = last[4]    # the same small array again, unchanged: read already
        else:
            call = calls.bcast(self._hc, buf, root)
            if call is calls.FORWARD:
                self._forward("Bcast", buf, root)
                return
            if call.send is buf and buf.nbytes <= calls.RECENT_BYTES:
                last[:] = buf, root, buf.flags.num, buf.dtype, call
        self._stats["Bcast"]["native"] += 1
        self._st.issue(call, None, self._blocks).wait()

    def Reduce(self, sendbuf, recvbuf, op=MPI.SUM, root: int = 0) -> None:
        self._blocking("Reduce", calls.reduce, sendbuf, recvbuf, op, root)

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM) -> None:
        if self._freed:           # as Bcast: _blocking unrolled, the last Call kept
            raise MPI.Exception(MPI.ERR_COMM)
        last = self._last_allreduce
        if (recvbuf is last[1] and sendbuf is last[0] and op is last[2]
                and recvbuf.flags.num == last[4] and recvbuf.dtype is last[5]
                and recvbuf.ndim == 1 and (sendbuf is MPI.IN_PLACE or (
                    sendbuf.flags.num == last[3] and sendbuf.dtype is last[5]
                    and sendbuf.ndim == 1))):
            call = last[6]
        else:
            call = calls.allreduce(self._hc, sendbuf, recvbuf, op)
            if call is calls.FORWARD:
                self._forward("Allreduce", sendbuf, recvbuf, op)
                return
            if (call.recv is recvbuf and recvbuf.nbytes <= calls.RECENT_BYTES
                    and (call.send is sendbuf or sendbuf is MPI.IN_PLACE)):
                last[:] = (sendbuf, recvbuf, op,
                           0 if sendbuf is MPI.IN_PLACE else sendbuf.flags.num,
                           recvbuf.flags.num, recvbuf.dtype, call)
        self._stats["Allreduce"]["native"] += 1
        self._st.issue(call, None, self._blocks).wait()

    def Allgather(self, sendbuf, recvbuf) -> None:
        self._blocking("Allgather", calls.allgather, sendbuf, recvbuf)

    def Allgatherv(self, sendbuf, recvbuf) -> None:
        self._blocking("Allgatherv", calls.allgatherv, sendbuf, recvbuf)

    def Alltoall(self, sendbuf, recvbuf) -> None:
        self._blocking("Alltoall", calls.alltoall, sendbuf, recvbuf)

    def Alltoallv(self, sendbuf, recvbuf) -> None:
        self._blocking("Alltoallv", calls.alltoallv, sendbuf, recvbuf)

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=MPI.SUM) -> None:
        self._blocking("Reduce_scatter_block", calls.reduce_scatter_block, sendbuf, recvbuf, op)

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM) -> None:
        self._blocking("Reduce_scatter", calls.reduce_scatter, sendbuf, recvbuf, recvcounts, op)

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
