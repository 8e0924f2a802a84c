"""A collective in flight on one rank.

A task runs one or two *lanes* (engine/lane.py): a program, its program counter
and the transfers it has posted -- all the context a suspended collective needs.

- the data lane carries the collective itself;
- the check (``check_mismatch``) compares every member's fingerprint (collective,
  dtype, count, root, op, sequence, buffers, algorithm).  Its shape depends only on
  the number of ranks, so it completes even when the data lanes of disagreeing ranks
  cannot; the task completes only when both did and all fingerprints agree.  So every
  member either gets a correct result or raises the same CollectiveMismatch naming
  who differs.

  Order-matched collectives (no key) check with one MPI nonblocking allreduce (MIN) of
  (h, -h), h a hash of the fingerprint, started with the collective: cheap, and it
  runs concurrently with the data.  Only when the hashes differ do the ranks exchange
  their full fingerprints (direct messages on the collective's next tag) to say who
  differs and how.  Keyed collectives may start in different orders on different
  ranks, which MPI collectives forbid, so they always exchange full fingerprints.

Tasks are only touched by whoever holds the engine (its thread, normally).
"""
from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from ..algorithms import build
from ..algorithms.spec import COLLECTIVES, Spec
from ..buffers import DTYPES, OPS, dtype_name
from ..errors import CollectiveMismatch, HpcCollError
from .lane import Lane

QUEUED, RUNNING, DONE, FAILED = "queued", "running", "done", "failed"

FP_FIELDS = ("collective", "dtype", "count", "root", "op", "sequence", "buffers", "algorithm")
TRUNCATE_GRACE = 2.0   # seconds a task that saw a truncated message waits for the check lane


def fingerprint_lane(fp, comm, mpi_comm, tag):
    """The direct (or Bruck) allgather of every member's full fingerprint (a tuple of ints)."""
    n, r = comm.size, comm.rank
    mine = np.array(fp, np.int64)
    chk = build(Spec("allgather", r, n, len(mine)), "direct" if n <= 16 else "bruck")
    return Lane(chk, [mine, np.empty(n * len(mine), np.int64), np.empty(chk.scratch, np.int64)],
                None, mpi_comm, tag)


HASH_MASK = (1 << 62) - 1


class HashCheck:
    """The cheap check of order-matched collectives (see the module docstring).  Same
    interface as a Lane for Task.poll: run(), done, pending_peers(), cancel(), rows.
    The hash of a tuple of ints is the same in every process (only str and bytes hashes
    are salted per process)."""
    __slots__ = ("fp", "h", "pair", "req", "detail", "done", "_args")

    def __init__(self, fp, comm, mpi_comm, tag):
        self.fp = fp
        self.h = hash(fp) & HASH_MASK
        self.pair = np.array((self.h, -self.h), np.int64)
        self.req = None
        self.detail = None
        self.done = False
        self._args = (comm, mpi_comm, tag)

    def run(self) -> bool:
        if self.detail is not None:
            moved = self.detail.run()
            self.done = self.detail.done
            return moved
        if self.req is None:        # started with the collective, in issue order
            self.start()
        if not self.req.Test():
            return False
        if self.agreed():
            self.done = True        # min and max of every member's hash are ours
            return True
        self.detail = fingerprint_lane(self.fp, *self._args)
        return self.run()

    def start(self) -> None:
        self.req = self._args[1].Iallreduce(MPI.IN_PLACE, self.pair, op=MPI.MIN)

    def agreed(self) -> bool:
        """Once the allreduce completed: min and max of every member's hash are ours."""
        return self.pair[0] == self.h and -self.pair[1] == self.h

    @property
    def rows(self):
        return self.detail.bufs[1] if self.detail is not None else None

    def pending_peers(self):
        if self.detail is not None:
            return self.detail.pending_peers()
        return ({-1} if self.req is not None and not self.done else set()), set()

    def cancel(self) -> None:
        if self.detail is not None:
            self.detail.cancel()


def started(prev) -> bool:
    """``prev``, a communicator's previous order-matched task (or None), has started (or
    ended), so the next one may start its MPI collectives: see Task.startable."""
    return prev is None or prev.t_start is not None or prev.finished


class Task:
    __slots__ = (
        "work", "comm", "coll", "dtype", "count", "root", "op", "seq", "key", "key_instance",
        "data", "check", "prev", "express",
        "fp", "state", "error", "result", "doomed", "retired", "gseq",
        # counters and times (reports, traces, policies)
        "t_issue", "t_start", "t_end", "last_progress", "polls", "tries", "yields",
        "yields_progress", "spins", "threshold", "consecutive", "made_progress", "yield_times",
    )

    def __init__(self, work, comm, coll, dtype, count, root, op, seq, key, data, result, fp):
        self.work = work
        self.comm = comm
        self.coll, self.dtype, self.count, self.root, self.op = coll, dtype, count, root, op
        self.seq, self.key = seq, key
        self.key_instance = 0
        self.data = data             # the collective's lane (host or device)
        self.fp = fp                 # fingerprint (tuple of ints), or None: checks off / 1 rank
        self.check = None
        if fp is not None:
            self.check = (HashCheck if key is None else fingerprint_lane)(fp, comm, data.mpi,
                                                                          data.tag + 1)
        self.prev = None             # the communicator's previous order-matched task
        self.express = False         # started on the calling thread (hpccoll/express.py)
        self.result = result
        self.state = QUEUED
        self.error = None
        self.doomed = None           # (deadline, error) after a truncated message
        self.retired = False
        self.gseq = None             # global sequence number (ordered policy)
        now = time.monotonic()
        self.t_issue, self.t_start, self.t_end = now, None, None
        self.last_progress = now
        self.polls = self.tries = self.yields = self.yields_progress = 0
        self.spins = self.threshold = 0
        self.consecutive = 1
        self.made_progress = False
        self.yield_times = None      # a list when tracing

    # -- identity -----------------------------------------------------------------
    @property
    def ident(self) -> str:
        return f"{self.comm.name}#{self.seq}" if self.key is None else f"{self.comm.name}[{self.key!r}]"

    def describe(self) -> str:
        return f"{self.coll} {self.ident} {dtype_name(self.dtype)} x{self.count}"

    @property
    def finished(self) -> bool:
        return self.state in (DONE, FAILED)

    @property
    def program(self):
        return self.data.program

    # -- execution ------------------------------------------------------------------
    def startable(self) -> bool:
        """Order-matched collectives start MPI collectives (the check, tiny messages), which
        every rank must start in the same order on a communicator: a task starts only after
        its communicator's previous order-matched task started."""
        return started(self.prev)

    def start(self) -> None:
        """Take an execution slot: post the first transfers and run to the first wait."""
        self.state = RUNNING
        self.t_start = self.last_progress = time.monotonic()
        self.prev = None
        self.poll()

    def poll(self) -> bool:
        """Test what the task waits on and continue where it can.  True on progress."""
        if self.finished:
            return False
        self.polls += 1
        progressed = False
        try:
            if self.check is not None and not self.check.done and self.check.run():
                progressed = True
                if self.check.done:
                    self._verify()
            if self.doomed is None:
                if not self.data.done and self.data.run():
                    progressed = True
            elif time.monotonic() > self.doomed[0]:
                self.fail(self.doomed[1])
                return True
            if self.data.done and (self.check is None or self.check.done):
                self.state = DONE
                self.t_end = time.monotonic()
                progressed = True
        except MPI.Exception as exc:
            self._mpi_error(exc)
            return True
        except CollectiveMismatch as exc:
            self.fail(exc)
            return True
        except Exception as exc:    # a kernel or copy failed: this collective, not the engine
            err = HpcCollError(f"{self.describe()} failed on this rank: {exc!r}")
            err.__cause__ = exc
            self.fail(err)
            return True
        if progressed:
            self.last_progress = time.monotonic()
        return progressed

    def _verify(self) -> None:
        """Every member's fingerprint is here: all equal, or raise naming who differs."""
        rows = (self.check.rows if isinstance(self.check, HashCheck)
                else self.check.bufs[1])
        if rows is None:
            return
        rows = rows.reshape(self.comm.size, len(self.fp))
        if (rows == np.array(self.fp, np.int64)).all():
            return
        world = self.comm.world_ranks
        fields, odd = {}, set()
        for i, name in enumerate(FP_FIELDS):
            values = {}
            for r, v in enumerate(rows[:, i]):
                values.setdefault(_fp_text(name, v), []).append(world[r])
            if len(values) > 1:
                fields[name] = values
                majority = max(values.values(), key=len)
                odd.update(r for ranks in values.values() if ranks is not majority for r in ranks)
        parts = ["{}: {}".format(name, "; ".join(
            f"rank{'s' if len(rs) > 1 else ''} {','.join(map(str, rs))} {'have' if len(rs) > 1 else 'has'} {v}"
            for v, rs in vals.items())) for name, vals in fields.items()]
        raise CollectiveMismatch(
            f"ranks disagree about collective #{self.seq if self.key is None else self.key!r} on "
            f"communicator {self.comm.name!r} (this rank {world[self.comm.rank]} issued "
            f"{self.describe()}): " + " | ".join(parts), ranks=sorted(odd), fields=fields)

    def _mpi_error(self, exc) -> None:
        """A truncated message (MPI_ERR_TRUNCATE, or MPI_ERR_IN_STATUS from a Testall
        over several requests) means a peer sent more than this rank expects."""
        if exc.Get_error_class() not in (MPI.ERR_TRUNCATE, MPI.ERR_IN_STATUS):
            self.fail(HpcCollError(f"MPI error in {self.describe()}: {exc}"))
            return
        peers = sorted({self.comm.world_ranks[p] for _, d, _ in self.data.inflight.values()
                        for kind, p, _ in d if kind == "recv"})
        error = CollectiveMismatch(
            f"collective {self.ident} on communicator {self.comm.name!r}: a message from "
            f"rank(s) {peers} was longer than this rank expects; ranks disagree on the count "
            f"or dtype (this rank: {self.describe()}; MPI: {exc})", ranks=tuple(peers))
        if self.check is None:
            self.fail(error)
        else:  # the check lane will say who differs and how
            self.doomed = (time.monotonic() + TRUNCATE_GRACE, error)

    def fail(self, exc: BaseException) -> None:
        if not self.finished:
            self.state = FAILED
            self.error = exc
            self.t_end = time.monotonic()

    def cancel_transfers(self) -> None:
        """Give up on a failed task: cancel the receives it still has posted."""
        self.data.cancel()
        if self.check is not None:
            self.check.cancel()

    def trace_record(self, rank: int) -> dict:
        """One trace entry (monotonic seconds; Context.trace() adds wall-clock times)."""
        itemsize = self.dtype.itemsize
        return {
            "rank": rank, "comm": self.comm.name, "ident": self.ident, "coll": self.coll,
            "dtype": dtype_name(self.dtype), "count": self.count, "bytes": self.count * itemsize,
            "algo": self.data.program.algo, "ops": self.data.ops.name, "state": self.state,
            "t_issue": self.t_issue,
            "t_start": self.t_start, "t_end": self.t_end, "tries": self.tries,
            "yields": self.yields, "yields_progress": self.yields_progress, "polls": self.polls,
            "gseq": self.gseq, "yield_times": list(self.yield_times or ()),
        }

    # -- diagnosis --------------------------------------------------------------------
    def snapshot(self) -> dict:
        """What this task is doing, for timeout reports (world ranks)."""
        world = self.comm.world_ranks
        recv_from, send_to = self.data.pending_peers()
        if self.check is not None:
            crecv, csend = self.check.pending_peers()
            recv_from |= crecv
            send_to |= csend
        now = time.monotonic()
        return {
            "comm": self.comm.name, "members": list(world), "seq": self.seq,
            "key": self.key, "ident": self.ident, "coll": self.coll, "dtype": dtype_name(self.dtype),
            "count": self.count, "root": self.root, "op": self.op, "state": self.state,
            "algo": self.data.program.algo, "waits_done": self.data.waits_done,
            "waits": self.data.program.waits, "bytes_moved": self.data.bytes_moved,
            # -1: an MPI collective, which waits for every other member
            "waiting_on": sorted(w for i, w in enumerate(world) if i != self.comm.rank)
            if -1 in recv_from else sorted(world[p] for p in recv_from),
            "sending_to": sorted(world[p] for p in send_to), "age": now - self.t_issue,
            "idle": now - self.last_progress, "yields": self.yields, "gseq": self.gseq,
        }


def _fp_text(field: str, value) -> str:
    value = int(value)
    if field == "buffers":
        return "ordinary arrays" if value == 0 else f"registered buffers (id {value:#x})"
    if field == "algorithm":
        from ..algorithms import ALGO_CODES
        names = {v: k for k, v in ALGO_CODES.items()}
        return names.get(value, str(value))
    names = {"collective": COLLECTIVES, "dtype": list(DTYPES), "op": ["none"] + list(OPS)}
    if field in names:
        table = names[field]
        idx = value if field == "op" else value - 1
        return table[idx] if 0 <= idx < len(table) else str(value)
    return str(value)
