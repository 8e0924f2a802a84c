"""The express path: a tiny order-matched collective started on the calling thread.

An allreduce, broadcast, allgather, alltoall or barrier that the algorithm table would
give to the MPI library's own nonblocking collective (the ``mpi`` row: no key, host
arrays, an MPI dtype and op, at most ``mpi_coll_bytes``) needs none of the general path's planning: no
algorithm choice, no program, no scratch, no queue.  Here it is recognised by a short
accept test, posts its MPI collectives (the check's, then the data's) and only then becomes
a Task over an ``ExpressLane``, so the peers' contributions arrive while this rank does its
bookkeeping; ``wait()`` then polls that one request pair.  Anything the accept test
does not recognise (another type, a non-contiguous array, a key, blocks=, a bad argument)
returns None and takes the general path, which is also where the error messages come from.

It is the same task as on the general path, so nothing else changes: the mismatch check
(the fingerprint is the one the general path computes, so a rank on the express path and
a rank on the general path agree), watchdog reports, traces, callbacks, counters.

Why starting at once is safe:

- MPI needs a communicator's collectives started in the same order on every rank.  An
  express collective starts only when this communicator's previous order-matched
  collective has started (``engine.task.started``, as ``Task.startable`` requires), and
  it takes its sequence number under the communicator's lock while holding the engine, so
  no queued task of the communicator can slip in front of it.
- It never blocks: the MPI library progresses the collective, and the task waits in the
  engine's express list, polled by ``wait()`` or by the daemon, without an execution
  slot.  That is what the preemptive policy would do with it anyway (a waiting
  collective yields its slot).  The fifo and ordered policies promise a launch order
  (issue order with run-to-completion slots; a global order negotiated by the token), so
  under them every collective takes the general path.
"""
from __future__ import annotations

from time import monotonic

import numpy as np
from mpi4py import MPI

from .algorithms import ALGO_CODES, Program
from .algorithms.spec import COLLECTIVES
from .buffers import dtype_code, op_code
from .engine.lane import MPI_OPS, start_collective
from .engine.task import DONE, RUNNING, HashCheck, Task, started
from .submit import MPI_NATIVE_DTYPES, MPI_NATIVE_OPS
from .work import Work

_OPS = {op: MPI_OPS[op] for op in MPI_NATIVE_OPS}     # avg: MPI_SUM, then divided
# the dtypes the general path hands to MPI, and their fingerprint codes
_DTYPES = {dt: dtype_code(dt) for dt in MPI_NATIVE_DTYPES}
_OP_CODES = {op: op_code(op) for op in _OPS}
_COLL_CODES = {c: COLLECTIVES.index(c) + 1
               for c in ("allreduce", "broadcast", "allgather", "alltoall", "barrier")}
_MPI_ALGO = ALGO_CODES["mpi"]
PROGRAM = Program("mpi", (), 0, 1, 0, True)    # what traces, counters and reports show
_NONE = {}                                      # an express lane has no point-to-point transfers
LOCK_WAIT = 0.001                               # seconds: longer than one engine pass


class _MpiOps:
    name = "mpi"


class ExpressLane:
    """The data lane of an express collective: one MPI nonblocking collective.  Same
    interface as a Lane for Task.poll, which takes over only to explain a mismatch."""
    __slots__ = ("mpi", "tag", "kind", "send", "recv", "mop", "root", "divisor", "req", "done",
                 "waits_done", "bytes_moved")
    program = PROGRAM
    ops = _MpiOps
    inflight = _NONE

    def __init__(self, mpi_comm, tag, kind, send, recv, mop=None, root=0, divisor=0):
        self.mpi, self.tag, self.kind = mpi_comm, tag, kind
        self.send, self.recv, self.mop, self.root, self.divisor = send, recv, mop, root, divisor
        self.req = None
        self.done = False
        self.waits_done = self.bytes_moved = 0

    def post(self):
        self.req = start_collective(self.mpi, self.kind, self.send, self.recv, self.mop,
                                    self.root)
        return self.req

    def finish(self) -> None:
        """The request completed."""
        if self.divisor:      # avg: every rank divides the same sum by the same number
            np.divide(self.recv, self.divisor, out=self.recv, casting="unsafe")
        self.done = True
        self.waits_done = 1
        self.bytes_moved = self.recv.nbytes if self.recv is not None else 0

    def run(self) -> bool:
        if self.done or not self.req.Test():
            return False
        self.finish()
        return True

    def pending_peers(self):
        return ({-1} if not self.done else set()), set()   # -1: every peer (an MPI collective)

    def cancel(self) -> None:
        """MPI collectives cannot be cancelled; the communicator is broken anyway."""

    def release(self) -> None:
        """Nothing pooled."""


class ExpressTask(Task):
    """A Task whose MPI collectives, the check's and the data's (in that order, like the
    general path), were posted before it was built, and whose poll tests the two
    requests.  The check is a HashCheck; it becomes the task's check lane (and Task.poll
    takes over) only to explain a mismatch or a truncated message."""
    __slots__ = ("hc",)

    def __init__(self, work, comm, coll, dtype, count, root, op, seq, data, result, fp, hc):
        self.work, self.comm = work, comm
        self.coll, self.dtype, self.count, self.root, self.op = coll, dtype, count, root, op
        self.seq, self.key, self.key_instance = seq, None, 0
        self.data, self.fp, self.check, self.prev = data, fp, None, None
        self.express = True
        self.result = result
        self.state = RUNNING     # started: its collectives are posted
        self.error = self.doomed = self.gseq = self.yield_times = None
        self.retired = False
        self.t_issue = self.t_start = self.last_progress = monotonic()
        self.t_end = None
        self.polls = self.tries = self.yields = self.yields_progress = 0
        self.spins = self.threshold = 0
        self.consecutive = 1
        self.made_progress = False
        self.hc = hc             # the check while it runs; None once every hash agreed

    def start(self) -> None:
        """Posted before the task was built (Express._start)."""

    def poll(self) -> bool:
        if self.check is not None:
            return Task.poll(self)      # explaining a mismatch: the general path
        if self.state != RUNNING:
            return False
        self.polls += 1
        progressed = False
        try:
            # The check completes even where the data cannot (ranks disagree).  Until it
            # has, its Test is the poll's only MPI call: it progresses the data's
            # collective too, and the task cannot end before the check anyway.
            hc = self.hc
            if hc is not None:
                if not hc.req.Test():
                    return False
                if not hc.agreed():
                    return self._explain()
                self.hc = None
                progressed = True
            data = self.data
            if not data.done and data.req.Test():
                data.finish()
                progressed = True
        except MPI.Exception as exc:
            self._mpi_error(exc)
            return True
        if data.done and self.hc is None:
            self.state = DONE
            self.t_end = monotonic()
        if progressed:
            self.last_progress = monotonic()
        return progressed

    def _explain(self) -> bool:
        """Hashes differ: the HashCheck, as the check lane, exchanges the full fingerprints
        and Task.poll raises the CollectiveMismatch that names who differs."""
        self.check = self.hc
        Task.poll(self)
        return True

    def _mpi_error(self, exc) -> None:
        """A truncated message: as on the general path, the check (still running) gets
        the chance to say who differs and how before the task fails."""
        if self.hc is not None and self.check is None:
            self.check = self.hc
        Task._mpi_error(self, exc)


class Express:
    """A communicator's express path (see the module docstring).  Each method returns the
    started collective's Work, or None: take the general path."""

    def __init__(self, comm):
        ctx = comm._ctx
        s = ctx.settings
        self.comm, self.engine = comm, ctx._engine
        self.ctx = ctx
        self.limit = s.mpi_coll_bytes
        self.check = s.check_mismatch and comm.size > 1
        self.size = comm.size

    def _ready(self) -> bool:
        comm, eng = self.comm, self.engine
        return (comm.broken is None and eng.broken is None and not comm._freed
                and not self.ctx._closed and eng.express_ok and started(comm._last_ordered))

    def allreduce(self, x, out, op):
        if x.__class__ is not np.ndarray or op.__class__ is not str:
            return None
        mop = _OPS.get(op)
        dt = x.dtype
        code = _DTYPES.get(dt)
        if (mop is None or code is None or x.nbytes > self.limit or not x.size
                or not x.flags.c_contiguous or (op == "avg" and dt.kind != "f")):
            return None
        if out is None:
            send, recv = x, np.empty(x.size, dt)
            result = recv
        elif out is x:
            if not x.flags.writeable:
                return None
            send, recv, result = MPI.IN_PLACE, x, x
        elif self._separate(x, out, x.size):
            send, recv, result = x, out, out
        else:
            return None
        return self._start("allreduce", dt, code, x.size, 0, op, result,
                           send, recv, mop, 0, self.size if op == "avg" else 0)

    def broadcast(self, buf, root):
        if (buf.__class__ is not np.ndarray or root.__class__ is not int
                or not 0 <= root < self.size):
            return None
        dt = buf.dtype
        code = _DTYPES.get(dt)
        if (code is None or buf.nbytes > self.limit or not buf.size
                or not buf.flags.c_contiguous
                or (root != self.comm.rank and not buf.flags.writeable)):
            return None
        return self._start("broadcast", dt, code, buf.size, root, None, buf,
                           None, buf, None, root, 0)

    def allgather(self, x, out):
        return self._gather("allgather", x, out)

    def alltoall(self, x, out):
        return self._gather("alltoall", x, out)

    def _gather(self, coll, x, out):
        """allgather: x is this rank's block, or in place (out is x) the whole output with
        this rank's block at block rank; alltoall: x holds a block for every rank."""
        if x.__class__ is not np.ndarray:
            return None
        n = self.size
        dt = x.dtype
        code = _DTYPES.get(dt)
        total = x.size if (out is x or coll == "alltoall") else n * x.size
        if (code is None or total * dt.itemsize > self.limit or not x.size or total % n
                or not x.flags.c_contiguous):
            return None
        if out is None:
            send, recv = x, np.empty(total, dt)
        elif out is x:
            if not x.flags.writeable:
                return None
            send, recv = MPI.IN_PLACE, x
        elif self._separate(x, out, total):
            send, recv = x, out
        else:                    # NCCL's view form, or a bad recvbuf: the general path
            return None
        return self._start(coll, dt, code, total // n, 0, None, recv, send, recv, None, 0, 0)

    @staticmethod
    def _separate(x, out, size) -> bool:
        """``out`` is a receive buffer the MPI call can take as it is, apart from ``x``."""
        return (out.__class__ is np.ndarray and out.dtype == x.dtype and out.size == size
                and out.flags.c_contiguous and out.flags.writeable
                and not np.may_share_memory(x, out))

    def barrier(self):
        if self.limit <= 0:
            return None
        return self._start("barrier", _U8, _DTYPES[_U8], 0, 0, None, None,
                           None, None, None, 0, 0)

    def _start(self, coll, dt, code, count, root, op, result, send, recv, mop, mroot, divisor):
        eng, comm = self.engine, self.comm
        # Only the daemon can hold the engine when nobody waits, and only for one pass; a
        # thread in wait() may hold it for long: then the general path, without waiting.
        if not self._ready() or eng._want:
            return None
        lock = eng.lock
        if not lock.acquire(False) and not lock.acquire(timeout=LOCK_WAIT):
            return None
        try:
            with comm._lock:
                # again, now that no submission can interleave
                if not started(comm._last_ordered):
                    return None
                seq = comm._seq
                comm._seq += 1
                tag = (seq % comm._tag_space) * 2
                lane = ExpressLane(comm._data, tag, coll, send, recv, mop, mroot, divisor)
                hc = fp = None
                if self.check:    # exactly the general path's fingerprint (submit.py)
                    fp = (_COLL_CODES[coll], code, count, root, _OP_CODES.get(op, 0), seq, 0,
                          _MPI_ALGO)
                    hc = HashCheck(fp, comm, lane.mpi, tag + 1)
                # Post first, book-keep after: the peers' contributions arrive meanwhile
                # (an MPI library sends a tiny message when the collective is posted).
                error = None
                try:
                    if hc is not None:
                        hc.start()
                    lane.post()
                except Exception as exc:    # MPI errors at post time, as Engine.launch
                    error = exc
                work = Work(coll, eng)
                task = ExpressTask(work, comm, coll, dt, count, root, op, seq, lane, result,
                                   fp, hc)
                work._task = task
                comm._last_ordered = task
                eng.start_express(task, error)
            return work
        finally:
            lock.release()


_U8 = np.dtype(np.uint8)
