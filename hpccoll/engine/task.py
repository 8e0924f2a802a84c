"""A collective in flight on one rank: one class for every collective, and the Work the
caller holds (core/work.py: its public part).

A task runs its plan's lane (engine/lane.py: the data) and, when the mismatch check asks
for it, a check lane (engine/check.py: every member's fingerprint or digest agrees, or
they all learn who differs).  It completes only when both did, so every member either
gets a correct result or raises the same CollectiveMismatch.

Tasks are only touched by whoever holds the engine (its thread, or a thread in wait()).
"""
from __future__ import annotations

import errno
import time
from time import monotonic

from mpi4py import MPI

from ..base import mismatch
from ..base.ops import dtype_name
from ..base.work import Work
from ..errors import CollectiveMismatch, HpcCollError

QUEUED, RUNNING, DONE, FAILED = "queued", "running", "done", "failed"
TRUNCATE_GRACE = 2.0   # seconds a task that saw a truncated message waits for an explanation


def started(prev) -> bool:
    """``prev``, a communicator's previous order-matched task (or None), has posted its MPI
    collectives (or failed), so the next one may post its own: see Task.startable."""
    return prev is None or prev.posted or prev.state is FAILED


def setup(task, engine, comm, plan, seq, key, lane, result, check, prev, gated):
    """Every field of a new task (its one initialisation: Task() and ``new`` alike)."""
    task._engine = engine
    task._done = False
    task._callbacks = task.error = None
    task.key_instance = 0
    task.doomed = task.gseq = task.yield_times = task.fault = None
    task.retired = task.probed = task.made_progress = task.adopted = task.admitted = False
    task.posted = False  # every MPI collective of it is posted (the next may post its own)
    task.t_start = task.t_end = None
    task.polls = task.tries = task.yields = task.yields_progress = task.spins = 0
    task.threshold = 0
    task.consecutive = 1
    task.comm = comm             # the communicator's state (core/state.py)
    task.plan = plan
    task.seq, task.key = seq, key
    task.lane = lane
    task.check = check
    task.prev = prev             # the communicator's previous order-matched task
    task.result = result         # what wait() returns
    task.state = QUEUED
    # the data waits for the check: nothing moves until every member's fingerprint agreed
    # (check_mismatch="every" on MPI's own collectives, which a mismatched call can make
    # the MPI library itself abort)
    task.gated = gated
    task.t_issue = task.last_progress = monotonic()
    return task


def new(engine, comm, plan, seq, key, lane, result, check=None, prev=None, gated=False):
    """A new task: Task(...) without the call's argument parsing (the per-call path's)."""
    return setup(Task.__new__(Task), engine, comm, plan, seq, key, lane, result, check, prev,
                 gated)


# the names of a trace record's values (Task.trace_record), in order
TRACE_FIELDS = ("rank", "comm", "ident", "coll", "dtype", "count", "bytes", "algo", "ops",
                "state", "t_issue", "t_start", "t_end", "tries", "yields", "yields_progress",
                "polls", "gseq", "yield_times")


class Task(Work):
    def __init__(self, engine, comm, plan, seq, key, lane, result, check=None, prev=None,
                 gated=False):
        setup(self, engine, comm, plan, seq, key, lane, result, check, prev, gated)

    # -- identity -------------------------------------------------------------------------
    @property
    def coll(self):
        return self.plan.coll

    @property
    def dtype(self):
        return self.plan.dtype

    @property
    def count(self):
        return self.plan.count

    @property
    def root(self):
        return self.plan.root

    @property
    def op(self):
        return self.plan.op

    @property
    def ident(self) -> str:
        return f"{self.comm.name}#{self.seq}" if self.key is None else f"{self.comm.name}[{self.key!r}]"

    def describe(self) -> str:
        return f"{self.coll} {self.ident} {dtype_name(self.dtype)} x{self.count}"

    @property
    def finished(self) -> bool:
        return self.state is DONE or self.state is FAILED

    @property
    def program(self):
        return self.lane.program

    # -- execution ------------------------------------------------------------------------
    def startable(self) -> bool:
        """Order-matched collectives start MPI collectives (the check, the MPI row), which
        every rank must start in the same order on a communicator: a task starts only after
        its communicator's previous order-matched task started (and, on the MPI row, once
        the persistent request it takes is free again).  A lane that holds a bounded
        resource (lane.Gate) starts only while the resource has room; once started (a
        task that yielded its slot) it holds it."""
        lane = self.lane
        gate = lane.holds
        return (started(self.prev)
                and (gate is None or gate.held < gate.capacity or self.t_start is not None)
                and (lane.needs_slot or lane.startable()))

    def start(self, now=None) -> None:
        """Post the check's collective, then the data's (the same order on every rank), and
        run to the first wait."""
        self.state = RUNNING
        self.t_start = self.last_progress = now or monotonic()
        self.prev = None
        if self.lane.holds is not None:
            self.lane.holds.held += 1       # given back when the task completes (engine)
        if self.check is not None:
            self.check.start()
        if self.lane.needs_slot:
            self.poll()         # posts the first transfers; MPI errors are the poll's to explain
        elif not self.gated:
            self.lane.start()   # MPI runs it from here
        # last: the communicator's next collective reads it without a lock
        self.posted = not self.gated and not self.lane.late_post

    def poll(self) -> bool:
        """Test what the task waits on and continue where it can.  True on progress."""
        if self.state is not RUNNING:
            return False
        self.polls += 1
        progressed = False
        lane, check = self.lane, self.check
        try:
            if check is None and self.doomed is None:      # most calls: the data alone
                if not lane.run():
                    return False
                if not self.posted and lane.mpi_posted:      # (a late post: DetourLane)
                    self.posted = True
                now = self.last_progress = monotonic()
                if lane.done:
                    self.state = DONE
                    self.t_end = now
                return True
            if check is not None and not check.done and check.run():
                progressed = True
                if check.done:
                    self._verify()
            if self.gated and check.done:
                self.gated = False
                lane.start()
                self.posted = not lane.late_post
            if self.doomed is None:
                if not lane.done and not self.gated and lane.run():
                    progressed = True
                    if not self.posted and lane.mpi_posted:      # (a late post)
                        self.posted = True
            elif monotonic() > self.doomed[0]:
                self.fail(self.doomed[1])
                return True
            if lane.done and (check is None or check.done):
                self.state = DONE
                self.t_end = monotonic()
                progressed = True
        except Exception as exc:
            self.fail_from(exc)
            return True
        if progressed:
            self.last_progress = monotonic()
        return progressed

    def fail_from(self, exc: Exception) -> None:
        """What polling raised: MPI's error (explained, where ranks disagree), a mismatch,
        or a kernel or copy that failed (this collective's failure, not the engine's)."""
        if isinstance(exc, MPI.Exception):
            self._mpi_error(exc)
        elif isinstance(exc, OSError) and exc.errno == errno.EFAULT:
            self._suspect(CollectiveMismatch(
                f"collective {self.ident} on communicator {self.comm.name!r}: a peer's "
                "buffer this rank reads or writes in place was not where or as large as "
                "this rank expects; ranks disagree on the root, count or dtype (this rank: "
                f"{self.describe()}; {exc.strerror})", local=True))
        elif isinstance(exc, CollectiveMismatch):
            self.fail(exc)
        else:
            err = HpcCollError(f"{self.describe()} failed on this rank: {exc!r}")
            err.__cause__ = exc
            self.fail(err)

    def _verify(self) -> None:
        """The check finished: all agreed, or raise naming who differs."""
        rows = self.check.gathered()
        if rows is None:
            return
        world = self.comm.world_ranks
        found = mismatch.verdict({world[r]: rows[r] for r in range(len(rows))})
        if found is not None:
            # keyed: the sequence field holds the key's hash (the check's one row)
            own = self.seq if self.key is None else int(self.check.rows[-1][mismatch.SEQ])
            raise self.comm.mismatch_error(*found, task=self if found[0] == own else None)

    def _mpi_error(self, exc) -> None:
        """A truncated message (MPI_ERR_TRUNCATE, or MPI_ERR_IN_STATUS from a Testall
        over several requests) means a peer sent more than this rank expects."""
        if exc.Get_error_class() not in (MPI.ERR_TRUNCATE, MPI.ERR_IN_STATUS):
            self.fail(HpcCollError(f"MPI error in {self.describe()}: {exc}"))
            return
        peers = sorted({self.comm.world_ranks[p] for p in self.lane.recv_peers()})
        source = f"rank(s) {peers}" if peers else "a peer"
        self._suspect(CollectiveMismatch(
            f"collective {self.ident} on communicator {self.comm.name!r}: a message from "
            f"{source} was longer than this rank expects; ranks disagree on the count "
            f"or dtype (this rank: {self.describe()}; MPI: {exc})", ranks=tuple(peers),
            local=True))

    def _suspect(self, error) -> None:
        """What this rank saw (``error``) says the ranks disagree: the check, or a probe
        of the communicator's ledger, may still say who differs and how; until then (or
        TRUNCATE_GRACE) the task is doomed."""
        self.doomed = (monotonic() + TRUNCATE_GRACE, error)
        if self.check is None:
            self.comm.suspect(self)

    def fail(self, exc: BaseException) -> None:
        if not self.finished:
            self.state = FAILED
            self.error = exc
            self.t_end = monotonic()
            if self.comm.unreported is not None and isinstance(exc, CollectiveMismatch):
                # the verdict came while nothing seemed pending (this one had passed
                # usable() but was not queued yet, or its own check found it too): this
                # collective reports the mismatch, the next call must not report it again
                self.comm.unreported = None

    def cancel_transfers(self) -> None:
        """Give up on a failed task: cancel the receives it still has posted."""
        self.lane.cancel()
        if self.check is not None:
            self.check.cancel()

    def trace_record(self, rank: int) -> tuple:
        """One trace entry, the values of TRACE_FIELDS in order (monotonic seconds):
        a tuple, because a record is taken at every completion of a traced run and a dict
        of 19 keys would be most of the cost; Context.trace() makes the dicts."""
        return (rank, self.comm.name, self.ident, self.coll, self.dtype, self.count,
                self.count * self.dtype.itemsize, self.lane.program.algo, self.plan.backend,
                self.state, self.t_issue, self.t_start, self.t_end, self.tries, self.yields,
                self.yields_progress, self.polls, self.gseq, self.yield_times)

    # -- diagnosis --------------------------------------------------------------------
    def snapshot(self) -> dict:
        """What this task is doing, for timeout reports (world ranks)."""
        world = self.comm.world_ranks
        recv_from, send_to = self.lane.pending_peers()
        if self.check is not None:
            crecv, csend = self.check.pending_peers()
            recv_from = recv_from | crecv
            send_to = send_to | csend
        now = monotonic()
        return {
            "comm": self.comm.name, "members": list(world), "seq": self.seq,
            "key": self.key, "ident": self.ident, "coll": self.coll, "dtype": dtype_name(self.dtype),
            "count": self.count, "root": self.root, "op": self.op, "state": self.state,
            "algo": self.lane.program.algo, "waits_done": self.lane.waits_done,
            "waits": self.lane.program.waits, "bytes_moved": self.lane.bytes_moved,
            # -1: an MPI collective, which waits for every other member
            "waiting_on": sorted(w for i, w in enumerate(world) if i != self.comm.rank)
            if -1 in recv_from else sorted(world[p] for p in recv_from),
            "sending_to": sorted(world[p] for p in send_to), "age": now - self.t_issue,
            "idle": now - self.last_progress, "yields": self.yields, "gseq": self.gseq,
        }
