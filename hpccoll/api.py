"""The public API: init, Context, Communicator."""
from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import weakref
from typing import Any, Optional

import numpy as np

from . import collectives, submit
from .config import Settings, resolve
from .errors import ArgumentError, ArgumentTypeError, ContextClosed, HpcCollError
from .work import Work

# yield_polls on an oversubscribed node (4 ranks on 2 cores, an 8 B allreduce: 1,000 yields
# and no cap were alike, 340-350 us; sleeping from the first fruitless poll, 730-850 us)
OVERSUBSCRIBED_YIELDS = 1000


def _mpi():
    """Import mpi4py with MPI_THREAD_MULTIPLE: the engine thread and the application
    thread both call MPI (p2p on the engine, dup/split on the application)."""
    import mpi4py
    if "mpi4py.MPI" not in sys.modules:
        mpi4py.rc.thread_level = "multiple"
    from mpi4py import MPI
    if not MPI.Is_initialized():
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        names = {MPI.THREAD_SINGLE: "SINGLE", MPI.THREAD_FUNNELED: "FUNNELED",
                 MPI.THREAD_SERIALIZED: "SERIALIZED"}
        raise HpcCollError(
            "hpccoll needs MPI_THREAD_MULTIPLE (its engine thread makes MPI calls while the "
            f"application does too), but MPI provides MPI_THREAD_{names.get(MPI.Query_thread(), '?')}. "
            "Do not lower mpi4py.rc.thread_level before importing mpi4py.MPI, or use an MPI "
            "library built with thread support (the 'mpich' wheel has it).")
    return MPI


class Communicator:
    """A group of ranks that collectives run on.  Every method that communicates returns
    a ``Work`` at once; nothing blocks except ``dup``/``split``/``free`` (collective)."""

    def __init__(self, ctx: "Context", mpi_comm, name: str, uid: str):
        MPI = ctx._MPI
        self._ctx = ctx
        self.name = name
        self.uid = uid
        self.broken: Optional[BaseException] = None
        self._lock = threading.Lock()
        self._seq = 0
        self._children = 0
        self._live_keys: dict = {}
        self._key_uses: dict = {}      # key -> how many times it was issued (ordered policy)
        self._last_ordered = None      # the last order-matched task (start order, see Task.prev)
        from .pool import BufferPool
        self._pool = BufferPool()      # scratch space, reused by the collectives
        self._freed = False
        self._express = None
        if mpi_comm == MPI.COMM_NULL:
            self._mpi = None
            self.rank, self.size, self.world_ranks = -1, 0, ()
            return
        self._mpi = mpi_comm
        self.rank, self.size = mpi_comm.Get_rank(), mpi_comm.Get_size()
        world_group = ctx._ctl.Get_group()
        group = mpi_comm.Get_group()
        self.world_ranks = tuple(MPI.Group.Translate_ranks(group, list(range(self.size)), world_group))
        group.Free()
        world_group.Free()
        # private duplicates: one for order-matched collectives, one for keyed ones
        self._data = mpi_comm.Dup()
        self._keyed = mpi_comm.Dup()
        from .transport import shm
        self._shm = shm.create(mpi_comm, self.world_ranks, ctx.settings)
        ub = ctx._ctl.Get_attr(MPI.TAG_UB) or 32767
        self._tag_space = max(2, (int(ub) + 1) // 2)
        ctx._register(self)
        from .express import Express
        self._express = Express(self)

    def __repr__(self) -> str:
        return f"<hpccoll.Communicator {self.name!r} rank {self.rank} of {self.size}>"

    # -- structure (collective over this communicator, on the calling thread) ----------
    def _check(self) -> None:
        self._ctx._check_open()
        if self._mpi is None:
            raise ArgumentError(f"this rank (world rank {self._ctx.rank}) is not a member of "
                                f"communicator {self.name!r}")
        if self._freed:
            raise ContextClosed(f"communicator {self.name!r} was freed")
        if self.broken is not None:
            raise ContextClosed(f"communicator {self.name!r} is unusable after: {self.broken}") \
                from self.broken

    def dup(self, name: Optional[str] = None) -> "Communicator":
        self._check()
        self._children += 1
        uid = f"{self.uid}/d{self._children}"
        return Communicator(self._ctx, self._mpi.Dup(), name or f"{self.name}.dup{self._children}", uid)

    def split(self, color: Optional[int], key: int = 0, name: Optional[str] = None):
        """Like MPI_Comm_split; ranks passing color=None get None."""
        self._check()
        MPI = self._ctx._MPI
        if color is not None and (isinstance(color, bool) or not isinstance(color, (int, np.integer))
                                  or color < 0):
            raise ArgumentError(f"color: expected a non-negative integer or None, got {color!r}")
        self._children += 1
        newcomm = self._mpi.Split(MPI.UNDEFINED if color is None else int(color), int(key))
        if color is None:
            return None
        uid = f"{self.uid}/s{self._children}:{int(color)}"
        return Communicator(self._ctx, newcomm,
                            name or f"{self.name}.split{self._children}:{int(color)}", uid)

    def free(self) -> None:
        """Release this communicator's MPI resources (collective); later calls raise."""
        if self._freed or self._mpi is None:
            return
        self._freed = True
        self._ctx._unregister(self)
        self._free_mpi()

    def _free_mpi(self) -> None:
        if getattr(self, "_shm", None):
            self._shm["area"].free()
            self._shm = None
        for c in (self._data, self._keyed, self._mpi):
            try:
                c.Free()
            except Exception:
                pass

    # -- collectives ---------------------------------------------------------------------
    def allreduce(self, sendbuf, recvbuf=None, op="sum", key=None, blocks=None) -> Work:
        if key is None and blocks is None and self._express is not None:
            work = self._express.allreduce(sendbuf, recvbuf, op)
            if work is not None:
                return work
        self._check()
        return self._submit(collectives.allreduce(self, sendbuf, recvbuf, op), key, blocks)

    def reduce(self, sendbuf, recvbuf=None, op="sum", root=0, key=None, blocks=None) -> Work:
        self._check()
        return self._submit(collectives.reduce(self, sendbuf, recvbuf, op, root), key, blocks)

    def broadcast(self, buf, root=0, key=None, blocks=None) -> Work:
        if key is None and blocks is None and self._express is not None:
            work = self._express.broadcast(buf, root)
            if work is not None:
                return work
        self._check()
        return self._submit(collectives.broadcast(self, buf, root), key, blocks)

    def allgather(self, sendbuf, recvbuf=None, key=None, blocks=None) -> Work:
        if key is None and blocks is None and self._express is not None:
            work = self._express.allgather(sendbuf, recvbuf)
            if work is not None:
                return work
        self._check()
        return self._submit(collectives.allgather(self, sendbuf, recvbuf), key, blocks)

    def reduce_scatter(self, sendbuf, recvbuf=None, op="sum", key=None, blocks=None) -> Work:
        self._check()
        return self._submit(collectives.reduce_scatter(self, sendbuf, recvbuf, op), key, blocks)

    def alltoall(self, sendbuf, recvbuf=None, key=None, blocks=None) -> Work:
        if key is None and blocks is None and self._express is not None:
            work = self._express.alltoall(sendbuf, recvbuf)
            if work is not None:
                return work
        self._check()
        return self._submit(collectives.alltoall(self, sendbuf, recvbuf), key, blocks)

    def barrier(self, key=None) -> Work:
        if key is None and self._express is not None:
            work = self._express.barrier()
            if work is not None:
                return work
        self._check()
        return self._submit(collectives.barrier(self), key, None)

    def _submit(self, call: collectives.Call, key: Optional[str], blocks) -> Work:
        return submit.submit(self, call, key, blocks)

    def _retire(self, task) -> None:
        if task.key is not None:
            with self._lock:
                self._live_keys.pop(task.key, None)


class Context:
    """hpccoll's state on one rank: settings, the engine thread, the control
    communicator and every Communicator.  Use as a context manager or call close()."""

    def __init__(self, comm=None, settings: Optional[Settings] = None):
        MPI = _mpi()
        self._MPI = MPI
        from .engine.task import Task   # imports mpi4py.MPI: only once MPI is initialised
        self._Task = Task
        self.settings = settings or resolve()
        base = MPI.COMM_WORLD if comm is None else comm
        if base == MPI.COMM_NULL:
            raise ArgumentError("comm: expected a communicator this rank belongs to, got COMM_NULL")
        self._closed = False
        self._allocs: list = []        # registered allocations (ctx.empty)
        self._node = None              # this node's ranks (_meet_node; registered buffers)
        self._node_index: dict = {}
        self._epoch = time.time() - time.monotonic()   # monotonic -> wall clock, for traces
        self._comms: list = []
        self._ctl = base.Dup()
        self.rank, self.size = self._ctl.Get_rank(), self._ctl.Get_size()
        self._meet_node()
        from .engine import Engine
        self._engine = Engine(self, self.settings, self._ctl)
        self.world = Communicator(self, base.Dup(), "world", "w")
        _OPEN.add(self)

    def _meet_node(self) -> None:
        """The ranks on this node (for registered buffers) and whether they outnumber the
        CPUs they may run on.  Oversubscribed, a rank that spins takes the core a peer
        needs to make the progress it waits for: then waiters do not spin (``spin_polls``
        0) but hand the CPU over (``yield_polls`` 1000, then sleep), unless those settings
        were set explicitly."""
        from .transport import shm
        self._node = shm.node_comm(self._ctl, list(range(self.size)), None)
        try:
            cpus = frozenset(os.sched_getaffinity(0))
        except AttributeError:       # not Linux: every CPU of the machine
            cpus = frozenset(range(os.cpu_count() or 1))
        met = self._node.allgather((self.rank, cpus))
        self._node_index = {w: i for i, (w, _) in enumerate(met)}
        self.oversubscribed = len(met) > len(frozenset().union(*(c for _, c in met)))
        s = self.settings
        if self.oversubscribed:
            values, sources = s.as_dict(), dict(s.sources)
            for name, value in (("spin_polls", 0), ("yield_polls", OVERSUBSCRIBED_YIELDS)):
                if sources.get(name) == "default":
                    values[name], sources[name] = value, "oversubscribed node"
            self.settings = Settings(values, sources)

    def __repr__(self) -> str:
        state = "closed" if self._closed else self.settings.policy
        return f"<hpccoll.Context rank {self.rank} of {self.size} ({state})>"

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def policy(self) -> str:
        return self.settings.policy

    def wrap(self, mpi_comm, name: Optional[str] = None) -> Communicator:
        """A Communicator over an existing mpi4py communicator (collective over it).  Ranks
        that pass MPI.COMM_NULL get a Communicator whose collectives raise."""
        self._check_open()
        if mpi_comm == self._MPI.COMM_NULL:
            return Communicator(self, mpi_comm, name or "null", "null")
        n = len(self._comms)
        return Communicator(self, mpi_comm.Dup(), name or f"wrapped{n}", f"x{n}:{name}")

    def stats(self) -> dict:
        """Engine counters: passes, parks, wakeups, context switches, policy."""
        return self._engine.stats()

    # -- registered (node-shared, symmetric) buffers -----------------------------------------
    def empty(self, n: int, dtype=np.float64) -> np.ndarray:
        """A NumPy array of n elements in node-shared memory that every rank on the node can
        read: collectives on such arrays skip the copy into shared memory.  Collective over
        the world, symmetric: every rank asks for the same n and dtype, and uses the same
        array (same offset) in a collective on every rank."""
        self._check_open()
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ArgumentError(f"n: expected a non-negative integer, got {n!r}")
        try:
            dt = np.dtype(dtype)
        except TypeError:
            raise ArgumentTypeError(f"dtype: not a NumPy dtype: {dtype!r}") from None
        nbytes = int(n) * dt.itemsize
        sizes = self._ctl.allgather(nbytes)
        if len(set(sizes)) != 1:
            raise ArgumentError(f"n: registered buffers are symmetric: every rank must allocate "
                                f"the same size; got {sorted(set(sizes))} bytes on different ranks")
        from .transport import shm
        alloc = shm.Registered(len(self._allocs) + 1, self._node, nbytes)
        self._allocs.append(alloc)
        return alloc.mine[:nbytes].view(dt)

    def zeros(self, n: int, dtype=np.float64) -> np.ndarray:
        """Like empty(), filled with zeros (collective)."""
        arr = self.empty(n, dtype)
        arr[...] = 0
        self._ctl.Barrier()    # nobody reads a peer's array before the peer zeroed it
        return arr

    def trace(self, clear: bool = False) -> list:
        """Completed collectives, one dict each, when the context was made with trace=True:
        comm, ident, coll, dtype, count, bytes, algo, state, t_issue/t_start/t_end
        (time.time() seconds), tries, yields, yields_progress, polls, gseq, yield_times."""
        engine = self._engine
        if engine.trace is None:
            raise HpcCollError("tracing is off: hpccoll.init(trace=True) or HPCCOLL_TRACE=1")
        with engine.lock:
            records = list(engine.trace)
            if clear:
                engine.trace.clear()
        shift = self._epoch
        for r in records:
            for k in ("t_issue", "t_start", "t_end"):
                if r[k] is not None:
                    r[k] += shift
            r["yield_times"] = [t + shift for t in r["yield_times"]]
        return records

    # -- internals ---------------------------------------------------------------------
    def _register(self, comm: Communicator) -> None:
        self._comms.append(comm)

    def _unregister(self, comm: Communicator) -> None:
        if comm in self._comms:
            self._comms.remove(comm)

    def _communicators(self) -> list:
        return list(self._comms)

    def _check_open(self) -> None:
        if self._closed:
            raise ContextClosed("this hpccoll context is closed; create a new one with hpccoll.init()")
        broken = self._engine.broken
        if broken is not None:
            first = str(broken).splitlines()[0]
            raise ContextClosed(
                f"this hpccoll context is unusable after {type(broken).__name__} ({first}); "
                "close it and restart the job") from broken

    # -- shutdown ----------------------------------------------------------------------
    def close(self) -> None:
        """Collective and idempotent: finish pending collectives, stop the engine, wait for
        the other ranks (up to close_timeout), free every private communicator."""
        if self._closed:
            return
        self._closed = True
        _OPEN.discard(self)
        engine = self._engine
        deadline = time.monotonic() + self.settings.close_timeout
        while engine.pending() and engine.broken is None:
            if time.monotonic() > deadline:
                print(f"hpccoll: rank {self.rank}: close() abandons {engine.pending()} collective(s) "
                      f"still pending after {self.settings.close_timeout:g} s", file=sys.stderr)
                break
            time.sleep(0.001)
        # wait for the other ranks with the engine still running: it keeps answering their
        # watchdog report requests (a rank whose timeout fired a moment later than ours)
        healthy = engine.broken is None
        wait = self.settings.close_timeout if healthy else self.settings.report_wait + 2.0
        req = self._ctl.Ibarrier()
        deadline = time.monotonic() + wait
        synced = True
        while not req.Test():
            if time.monotonic() > deadline:
                synced = False
                if healthy:
                    print(f"hpccoll: rank {self.rank}: close() gave up waiting for the other ranks "
                          f"after {wait:g} s", file=sys.stderr)
                break
            time.sleep(0.0005)
        engine.stop()
        if synced:
            for c in self._comms:
                c._free_mpi()
            for alloc in self._allocs:
                alloc.free()
            if self._node is not None:
                self._node.Free()
        self._comms = []
        self.world._freed = True

    def _abandon(self) -> None:
        """At interpreter exit without close(): stop the engine, nothing collective."""
        if not self._closed:
            self._closed = True
            self._engine.stop(wait=1.0)


_OPEN: "weakref.WeakSet[Context]" = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    for ctx in list(_OPEN):
        ctx._abandon()


def init(comm=None, policy: Optional[str] = None, timeout: Optional[float] = None,
         **options: Any) -> Context:
    """Start hpccoll on ``comm`` (default MPI.COMM_WORLD); collective over it.

    policy: "preemptive" | "ordered" | "fifo".  timeout: seconds without progress before a
    collective raises CollectiveTimeout (None = off).  options: the engine knobs of
    hpccoll.config (max_active, spin_threshold, stickiness, head_tries, idle_polls,
    chunk_bytes, ...).  HPCCOLL_<NAME> environment variables override defaults; explicit
    arguments win.
    """
    overrides = dict(options)
    if policy is not None:
        overrides["policy"] = policy
    if timeout is not None:
        overrides["timeout"] = timeout
    return Context(comm, resolve(overrides))
