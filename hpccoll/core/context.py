"""The Context (hpccoll's state on one rank) and ``init``."""
from __future__ import annotations

import atexit
import itertools
import os
import sys
import time
import warnings
import weakref
from typing import Any, Optional

import numpy as np
from mpi4py import MPI

from ..algorithms import calibration
from ..base.ops import DTYPE_CODE, DTYPES, dtype_name
from .. import config
from ..config import Settings, resolve
from ..engine import code, progress
from ..engine.control import TAG_CLOSING, TAG_GONE
from ..engine.crosscheck import final_check, unseen
from ..engine.engine import Engine
from ..engine.task import TRACE_FIELDS
from ..errors import (ArgumentError, ArgumentTypeError, CollectiveTimeout, ContextClosed,
                      HpcCollError, ResourcesExhausted)
from ..transport import mpi as transport
from ..transport import shm
from . import calibrate
from .communicator import Communicator


def mpi():
    """mpi4py's MPI, initialised with MPI_THREAD_MULTIPLE: the engine thread and the
    application thread both call MPI (p2p on the engine, dup/split on the application).
    (mpi4py's default thread level; a program that lowered mpi4py.rc.thread_level before
    importing hpccoll gets the error below.)"""
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


def _all_here(base, timeout: Optional[float]) -> None:
    """Init's MPI calls (Comm_dup, Comm_split_type, ...) block until every rank of
    ``base`` calls init, and no timeout reaches into them: with a timeout set, a polled
    Ibarrier comes first, and a rank that never calls init ends in CollectiveTimeout.
    (There is no engine yet to ask the others what they do instead.)  Every rank posts it,
    whatever its timeout: the timeout is a setting, which may differ between ranks or be
    invalid on one (init then raises on every rank, in Context._agree)."""
    size = base.Get_size()
    if size < 2:
        return
    req = base.Ibarrier()
    deadline = time.monotonic() + timeout if timeout else None
    while not req.Test():
        if deadline is not None and time.monotonic() > deadline:
            raise CollectiveTimeout(
                f"hpccoll.init (rank {base.Get_rank()} of {size}): not every rank of the "
                f"communicator called init within the timeout ({timeout:g} s): a rank that "
                "never calls it, fails before it, or calls it on another communicator")
        time.sleep(1e-4)


class Context:
    """hpccoll's state on one rank: settings, the engine thread, the control
    communicator and every Communicator.  Use as a context manager or call close()."""

    def __init__(self, comm=None, settings: Optional[Settings] = None,
                 overrides: Optional[dict] = None):
        MPI = mpi()
        self._MPI = MPI
        error = None
        if settings is None:
            try:
                settings = resolve(overrides)
            except ArgumentError as exc:   # (every rank must hear of it: see _agree)
                error = exc
        self.settings = settings
        base = MPI.COMM_WORLD if comm is None else comm
        if base == MPI.COMM_NULL:
            raise ArgumentError("comm: expected a communicator this rank belongs to, got COMM_NULL")
        _all_here(base, settings.timeout if settings is not None else None)
        self._closed = False
        self._pid = os.getpid()
        self._allocs: list = []        # registered allocations (ctx.empty)
        self._node = None              # this node's ranks (_meet_node; registered buffers)
        self._fence_win = None         # shm_fence's window
        self.c_programs = False        # every rank runs shared-memory programs in C (_meet_node)
        self._node_index: dict = {}
        self._epoch = time.time() - time.monotonic()   # monotonic -> wall clock, for traces
        self._comms: list = []
        self._wraps = 0                # wrap(): the next identity number (never reused)
        self._by_uid: dict = {}
        self.persistent_ok = transport.persistent_collectives()
        self._ctl = base.Dup()
        self.rank, self.size = self._ctl.Get_rank(), self._ctl.Get_size()
        self._agree(error)
        self._meet_node()
        self.calibration, self.calibration_note = self._load_calibration()
        self._engine = Engine(self, self.settings, self._ctl)
        self.world = Communicator(self, base.Dup(), "world", "w")
        self._made = next(_MADE)   # creation order: the same on every rank (init is collective)
        _OPEN.add(self)
        _close_before_finalize(MPI)
        if self.settings.calibration == "init":
            try:
                self.calibration = calibrate.measure(self, calibrate.QUICK_SIZES,
                                                     buffers=("host",), rounds=3)
            except BaseException:
                self.close()
                raise
            self.calibration_note = "measured at init"

    def _agree(self, error: Optional[ArgumentError]) -> None:
        """Every rank's settings are valid, and those that decide what the ranks exchange
        are the same on every rank (config.Setting.agree): or every rank raises the same
        error, naming the setting and the ranks, before anything else is set up.  (A rank
        alone with a bad value would otherwise leave the others waiting in init.)"""
        mine = (None if error is None else str(error),
                None if self.settings is None else config.agreed(self.settings))
        got = self._ctl.allgather(mine)
        bad = [(r, e) for r, (e, _) in enumerate(got) if e is not None]
        text = None
        if bad:
            text = bad[0][1] if len(bad) == len(got) else "; ".join(
                f"rank {r}: {e}" for r, e in bad[:4]) + (" ..." if len(bad) > 4 else "")
        else:
            text = config.disagreement([values for _, values in got])
        if text is not None:
            self._ctl.Free()
            raise ArgumentError(text) from error

    def _meet_node(self) -> None:
        """The ranks on this node (for registered buffers) and whether they outnumber the
        CPUs they may run on.  Oversubscribed, a rank that spins takes the core a peer
        needs to make the progress it waits for: then waiters do not spin (``spin_polls``
        0) but hand the CPU over (``yield_polls`` 1000, then sleep), unless those settings
        were set explicitly."""
        self._node = shm.node_comm(self._ctl, list(range(self.size)), None)
        try:
            cpus = frozenset(os.sched_getaffinity(0))
        except AttributeError:       # not Linux: every CPU of the machine
            cpus = frozenset(range(os.cpu_count() or 1))
        met = self._node.allgather((self.rank, cpus))
        self._node_index = {w: i for i, (w, _) in enumerate(met)}
        # every rank's node (its lowest rank): the shape of a communicator, the same on
        # every rank, picks its calibration
        # and whether every rank has the C executor of shared-memory programs: they must
        # all choose the same algorithms (core/plan.py)
        built = code._native is not None
        got = self._ctl.allgather((min(w for w, _ in met), bool(self.settings.shm_in_c), built))
        self._node_of = tuple(g[0] for g in got)
        self.c_programs = all(on and b for _, on, b in got)
        lacking = [w for w, (_, on, b) in enumerate(got) if on and not b]
        if lacking and len(lacking) < len(got) and self.rank == 0:
            # some ranks have it and would run faster: say who costs everybody that
            warnings.warn(
                f"hpccoll: shared-memory programs run in Python on every rank: rank(s) "
                f"{', '.join(map(str, lacking[:8]))}{' ...' if len(lacking) > 8 else ''} "
                f"lack the C executor (hpccoll/engine/_native.c, built at install where a C "
                f"compiler is present; `python -m hpccoll config` says so per install)",
                RuntimeWarning, stacklevel=3)
        if self.settings.node_size:
            self._node_of = tuple(w // self.settings.node_size for w in range(self.size))
        self.oversubscribed = len(met) > len(frozenset().union(*(c for _, c in met)))
        s = self.settings
        if self.oversubscribed:
            values, sources = s.as_dict(), dict(s.sources)
            for name, value in zip(("spin_polls", "spin_us", "yield_polls"),
                                   progress.YIELDING):
                if sources.get(name) == "default":
                    values[name], sources[name] = value, "oversubscribed node"
            self.settings = Settings(values, sources)
        # how fast a cache line goes from core to core here decides how far copies into
        # node-shared memory stream (engine/code.py: SLOT_STREAMING); measured where
        # every rank has a core of its own to spin on
        self.handoff_ns = float("nan")
        if self.c_programs and not self.oversubscribed and self._node.size > 1:
            self.handoff_ns = code.handoff_ns(self._node)
        self.slot_streaming = code.stream_slots(self.handoff_ns)

    def _load_calibration(self):
        """The ``calibration`` setting's table, as rank 0 reads it (every rank must choose
        the same algorithms).  A file that cannot be read is an error on every rank."""
        value = self.settings.calibration
        got = None
        if self.rank == 0:
            try:
                cal, note = calibration.load_setting(value, transport.library_name())
                got = (cal.state(), note, None)
            except Exception as exc:      # on every rank, not only here
                got = (None, "", f"{type(exc).__name__}: {exc}")
        state, note, error = self._ctl.bcast(got, root=0)
        if error is not None:
            raise ArgumentError(f"calibration ({value!r}, read on rank 0): {error}")
        return calibration.Calibration.from_state(state), note

    def shape_of(self, world_ranks) -> tuple:
        """(ranks, most of them on one node) of a communicator: the key of its
        calibration, the same on every member."""
        count: dict = {}
        for w in world_ranks:
            node = self._node_of[w]
            count[node] = count.get(node, 0) + 1
        return len(world_ranks), max(count.values(), default=0)

    def __repr__(self) -> str:
        state = "closed" if self._closed else self.settings.policy
        return f"<hpccoll.Context rank {self.rank} of {self.size} ({state})>"

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, etype, exc, tb) -> None:
        self.close(raise_mismatch=etype is None)

    @property
    def policy(self) -> str:
        return self.settings.policy

    def wrap(self, mpi_comm, name: Optional[str] = None) -> Communicator:
        """A Communicator over an existing mpi4py communicator (collective over it).  Ranks
        that pass MPI.COMM_NULL get a Communicator whose collectives raise."""
        self._check_open()
        if mpi_comm == self._MPI.COMM_NULL:
            return Communicator(self, mpi_comm, name or "null", "null")
        dup = mpi_comm.Dup()
        # an identity every member agrees on and this rank never gives again (it keys
        # control messages: a peer's failure notice, a mismatch probe, a closing count, which
        # may arrive after the communicator it meant was freed); the number of
        # communicators alive here repeated after each free, and differs between ranks
        n = dup.allreduce(self._wraps, op=self._MPI.MAX)
        self._wraps = n + 1
        return Communicator(self, dup, name or f"wrapped{n}", f"x{n}:{name}")

    def stats(self) -> dict:
        """Engine counters: passes, parks, wakeups, context switches, policy."""
        return self._engine.stats()

    def shm_fence(self):
        """The full memory barrier that orders node-shared data and counters
        (transport/shm.py): MPI_Win_sync of a window of this process alone, locked for its
        whole life.  Made once, at the first communicator that shares memory."""
        if self._fence_win is None:
            MPI = self._MPI
            win = MPI.Win.Allocate_shared(8, 1, comm=MPI.COMM_SELF)
            win.Lock_all(MPI.MODE_NOCHECK)
            self._fence_win = win
        return self._fence_win.Sync

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
        if dt not in DTYPE_CODE:      # before anything is allocated
            raise ArgumentTypeError(f"dtype: {dt} is not supported; expected one of "
                                    f"{', '.join(DTYPES)}")
        nbytes = int(n) * dt.itemsize
        # MPI maps the window from /dev/shm and touches its pages only when the program
        # does: where they cannot be had then, a SIGBUS.  Probed first, on every node
        short = shm.room(nbytes * self._node.Get_size(), shm.shm_dir())
        got = self._ctl.allgather((nbytes, short))
        sizes = [b for b, _ in got]
        if len(set(sizes)) != 1:
            raise ArgumentError(f"n: registered buffers are symmetric: every rank must allocate "
                                f"the same size; got {sorted(set(sizes))} bytes on different ranks")
        short = [(r, why) for r, (_, why) in enumerate(got) if why]
        if short:
            raise ResourcesExhausted(
                f"n: {n} x {dt} ({nbytes} bytes per rank) of node-shared memory cannot be "
                f"had on the node of rank {short[0][0]}: {short[0][1]}; ask for less, or "
                "give the container more /dev/shm (docker --shm-size)")
        try:
            shm.headroom(self._node)
            alloc = shm.Registered(len(self._allocs) + 1, self._node, nbytes)
        except self._MPI.Exception as exc:
            raise HpcCollError(
                f"n: {n} x {dt} ({nbytes} bytes) of node-shared memory could not be "
                f"allocated on this node: {exc.Get_error_string().splitlines()[0]}; ask for "
                "less, or free registered arrays you no longer use") from exc
        self._allocs.append(alloc)
        return alloc.hand_out().view(dt)

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
        out = []
        for values in records:
            r = dict(zip(TRACE_FIELDS, values))
            r["dtype"] = dtype_name(r["dtype"])
            for k in ("t_issue", "t_start", "t_end"):
                if r[k] is not None:
                    r[k] += shift
            r["yield_times"] = [t + shift for t in r["yield_times"] or ()]
            out.append(r)
        return out

    # -- internals ---------------------------------------------------------------------
    def _register(self, comm: Communicator) -> None:
        self._comms.append(comm)
        self._by_uid[comm.uid] = comm._state
        # a peer's collective on it may have failed before it was registered here
        payload = self._engine.unclaimed.pop(comm.uid, None)
        if payload is not None:
            comm._state.stop(self._engine.failure_notice(comm._state, payload))

    def _unregister(self, comm: Communicator) -> None:
        if comm in self._comms:
            self._comms.remove(comm)
        self._by_uid.pop(comm.uid, None)

    def _communicators(self) -> list:
        return list(self._comms)

    def _states(self) -> list:
        """Every live communicator's state, in creation order (the same on every rank)."""
        return [c._state for c in list(self._comms)]

    def _state_by_uid(self, uid):
        return self._by_uid.get(uid)

    def _check_open(self) -> None:
        if self._engine.forked is not None:
            raise self._engine.forked
        if self._closed:
            raise ContextClosed("this hpccoll context is closed; create a new one with hpccoll.init()")
        broken = self._engine.broken
        if broken is not None:
            first = str(broken).splitlines()[0]
            raise ContextClosed(
                f"this hpccoll context is unusable after {type(broken).__name__} ({first}); "
                "close it and restart the job") from broken

    # -- shutdown ----------------------------------------------------------------------
    def close(self, raise_mismatch: bool = True) -> None:
        """Collective and idempotent: finish pending collectives, wait for the other ranks
        (up to close_timeout), compare every communicator's mismatch digest one last time,
        stop the engine, free every private communicator.  A mismatch found there is
        printed on every rank and raised (``raise_mismatch``) once all is freed.  The other
        ranks hear at once how far this rank got on each communicator: a collective of
        theirs it will never join fails there (ContextClosed) instead of waiting."""
        if self._closed:
            return
        self._closed = True
        _OPEN.discard(self)
        if self._engine.forked is not None:   # a forked child: nothing of MPI is its own
            return
        states = self._states()
        for st in states:
            st.stop()
        engine = self._engine
        if engine.broken is None and self.size > 1:
            with engine.lock:
                engine.control.broadcast({st.uid: st.seq for st in states},
                                         range(self.size), TAG_CLOSING)
        deadline = time.monotonic() + self.settings.close_timeout
        abandoned = False
        while engine.pending() and engine.broken is None:
            if time.monotonic() > deadline:
                print(f"hpccoll: rank {self.rank}: close() abandons {engine.pending()} collective(s) "
                      f"still pending after {self.settings.close_timeout:g} s", file=sys.stderr)
                abandoned = True
                break
            time.sleep(0.001)
        # wait for the other ranks with the engine still running: it keeps answering their
        # watchdog report requests (a rank whose timeout fired a moment later than ours)
        healthy = engine.broken is None
        wait = self.settings.close_timeout if healthy else self.settings.report_wait + 2.0
        req = self._ctl.Ibarrier()
        deadline = time.monotonic() + wait
        synced = True
        gone = engine.crosscheck.gone
        while not req.Test():
            if gone:          # (they will never get here)
                synced = False
                print(f"hpccoll: rank {self.rank}: close() does not wait for rank(s) "
                      f"{sorted(gone)}, which exited without closing", file=sys.stderr)
                break
            if time.monotonic() > deadline:
                synced = False
                if healthy:
                    print(f"hpccoll: rank {self.rank}: close() gave up waiting for the other ranks "
                          f"after {wait:g} s", file=sys.stderr)
                break
            time.sleep(0.0005)
        mismatches = []
        if synced and self.settings.check_mismatch == "deferred" and self.size > 1:
            # (every rank takes part; one that abandoned collectives or broke says so, and
            # its communicators are compared by nobody)
            with engine.lock:           # notices that came in meanwhile break what they break
                engine._serve_control()
            mismatches = final_check(self._ctl, states, not abandoned and engine.broken is None,
                                     time.monotonic() + wait)
        # a verdict that broke a communicator after its collectives completed, which no
        # call there has raised yet and the comparison above did not raise again (a peer
        # had seen it): this rank's caller has not heard of it
        for st in states:
            if unseen(st):
                mismatches.append(st.unreported)
                st.unreported = None
        for exc in mismatches:      # (one write: the ranks' lines do not interleave)
            sys.stderr.write(f"hpccoll: rank {self.rank}: {exc}\n")
            sys.stderr.flush()
        engine.stop()
        if synced:
            for st in states:
                st.free_mpi()
            self._free_allocations()
            if self._node is not None:
                self._node.Free()
            if self._fence_win is not None:
                self._fence_win.Unlock_all()
                self._fence_win.Free()
                self._fence_win = None
        for st in states:
            st.stop()
        self._comms = []
        self.world._state.freed = True
        self.world._state.stop()
        if mismatches and raise_mismatch:
            raise mismatches[0]

    def _forked_in_child(self) -> None:
        """This process was forked after init (os.register_at_fork): its copy of the
        context shares its parent's MPI connections, so nothing of it may be used."""
        error = HpcCollError(
            f"this process (pid {os.getpid()}) was forked from rank {self.rank} (pid "
            f"{self._pid}) after hpccoll.init: its collectives would travel on its parent's "
            "MPI connections and be taken for the parent's.  Use hpccoll in the parent "
            "only; start worker processes before hpccoll.init, or with the 'spawn' or "
            "'forkserver' method")
        engine = self._engine
        engine.forked = engine.broken = error
        for st in self._states():
            st.stop(error)

    def _free_allocations(self) -> None:
        """Free the registered allocations no array uses on any rank of the node any more
        (freeing a shared window is collective over the node: the ranks agree first); keep
        the others mapped until MPI_Finalize, so such arrays stay valid after close()."""
        if not self._allocs:
            return
        used = np.array([a.in_use() for a in self._allocs], np.uint8)
        self._node.Allreduce(self._MPI.IN_PLACE, used, op=self._MPI.MAX)
        for alloc, keep in zip(self._allocs, used):
            if keep:
                alloc.keep()
            else:
                alloc.free()
        self._allocs = []

    def _abandon(self) -> None:
        """At interpreter exit after an unhandled exception: tell the other ranks how far
        this one got on each communicator (a collective of theirs it will never join
        fails there, and their close() does not wait for it), stop the engine, nothing
        collective."""
        if self._closed:
            return
        self._closed = True
        _OPEN.discard(self)
        engine = self._engine
        if engine.forked is None and engine.broken is None and self.size > 1:
            states = self._states()
            if engine.lock.acquire(timeout=1.0):    # (a thread stuck driving: say nothing)
                try:
                    engine.control.broadcast({st.uid: st.seq for st in states},
                                             range(self.size), TAG_GONE)
                finally:
                    engine.lock.release()
        engine.stop(wait=1.0)


_OPEN: "weakref.WeakSet[Context]" = weakref.WeakSet()


def _forked_child() -> None:
    for ctx in list(_OPEN):
        ctx._forked_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked_child)


@atexit.register
def _close_at_exit() -> None:
    """Interpreter exit with contexts still open (a program on the adapter never closes
    its own): each closes as close() does, its last mismatch comparison included, so a
    mismatch in the program's last collectives is printed on every rank; after an
    unhandled exception, where the other ranks may never get here, each is abandoned."""
    close_open(failed=getattr(sys, "last_value", None) is not None, why="at exit")


def close_open(failed: bool = False, why: str = "") -> None:
    """Close every open context of this process, in the order they were made (the same
    on every rank); a mismatch found is printed, never raised (no caller would see it)."""
    for ctx in sorted(_OPEN, key=lambda c: c._made):
        if failed:
            ctx._abandon()
            continue
        try:
            ctx.close(raise_mismatch=False)
        except Exception as exc:      # (close prints what it found on every rank)
            print(f"hpccoll: rank {ctx.rank}: closing {why}: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)
            ctx._abandon()


_MADE = itertools.count()
_FINALIZE_HOOK: list = []


def _close_before_finalize(MPI) -> None:
    """Once per process: an attribute on MPI.COMM_SELF whose deletion, the first thing
    MPI_Finalize does (MPI-4 11.2.4), closes every open context.  A program that calls
    MPI.Finalize() itself while hpccoll is open then finalizes a quiet MPI, as mpi4py
    does at exit after ``_close_at_exit`` closed everything."""
    if _FINALIZE_HOOK:
        return
    def closing(comm, keyval, value):
        close_open(why="at MPI_Finalize")
    try:
        keyval = MPI.Comm.Create_keyval(delete_fn=closing)
        MPI.COMM_SELF.Set_attr(keyval, True)
    except Exception:      # an MPI without attribute callbacks: exit still closes
        return
    _FINALIZE_HOOK.append(keyval)


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
    return Context(comm, overrides=overrides)
