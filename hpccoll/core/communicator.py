"""The public Communicator: one method per collective, all the same shape (validate the
arguments into a Call, hand it to the communicator's state to issue), plus dup, split
and free.  Every method that communicates returns a ``Work`` at once; nothing blocks
except ``dup``/``split``/``free`` (collective)."""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..base.work import Work
from ..engine.crosscheck import free_check, unseen
from ..errors import ArgumentError, CollectiveTimeout, mpi_failure
from . import validate
from .state import CommState


class Communicator:
    """A group of ranks that collectives run on (its matching state: ``CommState``)."""

    def __init__(self, ctx, mpi_comm, name: str, uid: str):
        self._ctx = ctx
        self._state = st = CommState(ctx, mpi_comm, name, uid)
        self.name, self.uid = name, uid
        self.rank, self.size, self.world_ranks = st.rank, st.size, st.world_ranks
        self._children = 0
        self._blocks = ctx.settings.blocks
        # per collective, the Call of its last plain arrays (validate.Recent)
        self._recent = {c: validate.Recent() for c in (
            "allreduce", "reduce", "broadcast", "allgather", "reduce_scatter", "alltoall",
            "gather", "scatter", "scan", "exscan")}
        if st.mpi is not None:
            ctx._register(self)

    def __repr__(self) -> str:
        return f"<hpccoll.Communicator {self.name!r} rank {self.rank} of {self.size}>"

    @property
    def broken(self) -> Optional[BaseException]:
        """The error that made this communicator unusable, or None."""
        return self._state.broken

    def _ready(self) -> CommState:
        st = self._state
        if not st.ok:
            st.usable()
        return st

    def _extras(self, key, blocks):
        return validate.key_of(key), validate.blocks_of(blocks, self._blocks)

    # -- structure (collective over this communicator, on the calling thread) ----------
    def _all_here(self, st, what: str) -> None:
        """MPI's Comm_dup and Comm_split block until every member calls them, and no
        timeout reaches into them.  With a timeout set, a barrier under the watchdog
        comes first: a member that never calls ``what`` ends in CollectiveTimeout naming
        it, not in a hang."""
        if st.size < 2 or not self._ctx.settings.timeout:
            return
        try:
            self.barrier().wait()
        except CollectiveTimeout as exc:
            first, _, _ = str(exc.args[0]).partition("\n")
            raise CollectiveTimeout(
                f"{what} of communicator {self.name!r}: not every member called it (the "
                f"barrier hpccoll runs before it timed out: {first})", exc.report) from exc

    def dup(self, name: Optional[str] = None) -> "Communicator":
        st = self._ready()
        self._all_here(st, "dup()")
        self._children += 1
        try:
            newcomm = st.mpi.Dup()
        except self._ctx._MPI.Exception as exc:
            st.failed_child = True
            raise mpi_failure(f"dup() of {self.name!r}", exc, len(self._ctx._comms),
                              self._ctx._MPI) from exc
        return Communicator(self._ctx, newcomm, name or f"{self.name}.dup{self._children}",
                            f"{self.uid}/d{self._children}")

    def split(self, color: Optional[int], key: int = 0, name: Optional[str] = None):
        """Like MPI_Comm_split; ranks passing color=None get None."""
        st = self._ready()
        MPI = self._ctx._MPI
        if color is not None and (isinstance(color, bool) or not isinstance(color, (int, np.integer))
                                  or color < 0):
            raise ArgumentError(f"color: expected a non-negative integer or None, got {color!r}")
        self._all_here(st, "split()")
        self._children += 1
        try:
            newcomm = st.mpi.Split(MPI.UNDEFINED if color is None else int(color), int(key))
        except MPI.Exception as exc:
            st.failed_child = True
            raise mpi_failure(f"split() of {self.name!r}", exc, len(self._ctx._comms),
                              MPI) from exc
        if color is None:
            return None
        return Communicator(self._ctx, newcomm,
                            name or f"{self.name}.split{self._children}:{int(color)}",
                            f"{self.uid}/s{self._children}:{int(color)}")

    def free(self) -> None:
        """Collective: let this communicator's pending collectives complete, compare what
        every member issued here one last time (check_mismatch="deferred"), then release
        its MPI resources; later calls raise ContextClosed.  A mismatch the comparison
        finds, or one found earlier that no call here has raised yet, is raised on every
        member once all is released."""
        st = self._state
        if st.freed or st.mpi is None or self._ctx._closed:
            return
        st.freed = True
        st.stop()
        for work in st.pending():
            try:
                work.wait()
            except Exception:     # the collective's own error is its waiter's to see
                pass
        found = free_check(self._ctx._engine, st, self._ctx.settings.close_timeout)
        if found is None and unseen(st):
            found = st.unreported
        st.unreported = None
        self._ctx._unregister(self)
        st.free_mpi()
        if found is not None:
            raise found

    # -- collectives ---------------------------------------------------------------------
    # Every method is the same: ``collective`` (below) reads the arguments into a Call
    # (validate; a call on the arrays the last one of its collective had takes the kept
    # Call: validate.Recent), then the one issue (CommState.issue).
    def allreduce(self, sendbuf, recvbuf=None, op="sum", key=None, blocks=None) -> Work:
        st = self._state
        return collective(st, self._recent["allreduce"], self._blocks, validate.allreduce,
                          (st, sendbuf, recvbuf, op), sendbuf, recvbuf, op, None, key, blocks)

    def reduce(self, sendbuf, recvbuf=None, op="sum", root=0, key=None, blocks=None) -> Work:
        st = self._state
        return collective(st, self._recent["reduce"], self._blocks, validate.reduce,
                          (st, sendbuf, recvbuf, op, root), sendbuf, recvbuf, op, root, key,
                          blocks)

    def broadcast(self, buf, root=0, key=None, blocks=None) -> Work:
        st = self._state
        return collective(st, self._recent["broadcast"], self._blocks, validate.broadcast,
                          (st, buf, root), buf, buf, root, None, key, blocks)

    def allgather(self, sendbuf, recvbuf=None, key=None, blocks=None) -> Work:
        st = self._state
        return collective(st, self._recent["allgather"], self._blocks, validate.allgather,
                          (st, sendbuf, recvbuf), sendbuf, recvbuf, None, None, key, blocks)

    def reduce_scatter(self, sendbuf, recvbuf=None, op="sum", key=None, blocks=None) -> Work:
        st = self._state
        return collective(st, self._recent["reduce_scatter"], self._blocks,
                          validate.reduce_scatter, (st, sendbuf, recvbuf, op), sendbuf, recvbuf,
                          op, None, key, blocks)

    def alltoall(self, sendbuf, recvbuf=None, key=None, blocks=None) -> Work:
        st = self._state
        return collective(st, self._recent["alltoall"], self._blocks, validate.alltoall,
                          (st, sendbuf, recvbuf), sendbuf, recvbuf, None, None, key, blocks)

    def gather(self, sendbuf, recvbuf=None, root=0, key=None, blocks=None) -> Work:
        st = self._state
        return collective(st, self._recent["gather"], self._blocks, validate.gather,
                          (st, sendbuf, recvbuf, root), sendbuf, recvbuf, root, None, key,
                          blocks)

    def scatter(self, sendbuf, recvbuf=None, root=0, key=None, blocks=None) -> Work:
        st = self._state
        return collective(st, self._recent["scatter"], self._blocks, validate.scatter,
                          (st, sendbuf, recvbuf, root), sendbuf, recvbuf, root, None, key,
                          blocks)

    def scan(self, sendbuf, recvbuf=None, op="sum", key=None, blocks=None) -> Work:
        st = self._state
        return collective(st, self._recent["scan"], self._blocks, validate.scan,
                          (st, sendbuf, recvbuf, op), sendbuf, recvbuf, op, None, key, blocks)

    def exscan(self, sendbuf, recvbuf=None, op="sum", key=None, blocks=None) -> Work:
        st = self._state
        return collective(st, self._recent["exscan"], self._blocks, validate.exscan,
                          (st, sendbuf, recvbuf, op), sendbuf, recvbuf, op, None, key, blocks)

    def barrier(self, key=None) -> Work:
        st = self._state
        if not st.ok:
            st.usable()
        return st.issue(validate.BARRIER, None if key is None else validate.key_of(key), None)

    def _issue(self, call) -> Work:
        """A call validated elsewhere (the mpi4py adapter): un-keyed, default blocks."""
        st = self._state
        if not st.ok:
            st.usable()
        return st.issue(call, None, self._blocks)


def collective(st, recent, default_blocks, check, args: tuple, send, recv, a, b, key,
               blocks) -> Work:
    """The body of every collective method: the arguments read into a Call (``recent``:
    the collective's validate.Recent), then the one issue."""
    if not st.ok:
        st.usable()
    if key is not None or blocks is not None:
        key, blocks = validate.key_of(key), validate.blocks_of(blocks, default_blocks)
    else:
        blocks = default_blocks
    return st.issue(recent.read(check, args, send, recv, a, b), key, blocks)
