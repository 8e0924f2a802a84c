"""The check lane: every member of a communicator agrees on one value, or they all find
out who differs and how.

The value is a fingerprint's hash (check_mismatch="every": each collective) or the
communicator's digest (the default: every ``mismatch_every`` collectives; see
core/mismatch.py).  Its shape depends only on the number of ranks, so it completes even
when the data of disagreeing ranks cannot.

Order-matched collectives agree with one MPI nonblocking allreduce (MIN) of (v, -v),
started with the collective (MPI needs a communicator's collectives started in the same
order on every rank, which the engine guarantees): all values are equal iff the minimum
is v and the maximum is v.  Only when they differ do the members exchange their rows
(fingerprints, with sequence numbers) to say who differs and how: a direct allgather on
the collective's next tag.  Keyed collectives may start in different orders on different
ranks, which MPI collectives forbid, so they exchange their rows directly (``direct``).
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..algorithms import build
from ..algorithms.spec import Spec
from ..transport.reduction import HostOps
from .code import built
from .lane import Lane
from .program import ProgramLane

_INT64 = np.dtype(np.int64)


def allgather_lane(rows: np.ndarray, comm, mpi_comm, tag) -> ProgramLane:
    """The direct (or Bruck) allgather of every member's rows (int64)."""
    n, r = comm.size, comm.rank
    mine = np.ascontiguousarray(rows, np.int64).reshape(-1)
    prog = build(Spec("allgather", r, n, mine.size), "direct" if n <= 16 else "bruck")
    return ProgramLane(prog, built(prog, _INT64, None), [
        mine, np.empty(n * mine.size, np.int64), np.empty(prog.scratch, np.int64)], None,
        mpi_comm, tag, HostOps)


class CheckLane(Lane):
    """See the module docstring.  ``rows``: this rank's fingerprint rows, an int64 array
    of shape (k, fields), the same k on every rank, or a function that makes them (they
    are needed only when the values differ)."""
    __slots__ = ("value", "_rows", "pair", "req", "detail", "done", "_args")

    def __init__(self, value: int, rows, comm, mpi_comm, tag, direct: bool = False):
        self.value = value
        self._rows = rows
        self.pair = None
        self.req = None
        self.done = False
        self._args = (comm, mpi_comm, tag)
        self.detail = allgather_lane(self.rows, comm, mpi_comm, tag) if direct else None

    @property
    def rows(self):
        if callable(self._rows):
            self._rows = self._rows()
        return self._rows

    def start(self) -> None:
        if self.detail is not None:
            self.detail.start()
            return
        pair = self.pair = np.empty(2, np.int64)
        pair[0], pair[1] = self.value, -self.value
        self.req = self._args[1].Iallreduce(MPI.IN_PLACE, pair, op=MPI.MIN)

    def run(self) -> bool:
        if self.detail is not None:
            moved = self.detail.run()
            self.done = self.detail.done
            return moved
        if not self.req.Test():
            return False
        if self.pair[0] == self.value and -self.pair[1] == self.value:
            self.done = True
            return True
        self.detail = allgather_lane(self.rows, *self._args)
        self.detail.start()
        self.done = self.detail.done
        return True

    def gathered(self):
        """Every member's rows, (size, k, fields), once the exchange ran; None if the
        values agreed."""
        if self.detail is None or not self.detail.done:
            return None
        n = self._args[0].size
        return self.detail.bufs[1].reshape(n, *np.shape(self.rows))

    def pending_peers(self):
        if self.detail is not None:
            return self.detail.pending_peers()
        return ({-1} if self.req is not None and not self.done else set()), set()

    def cancel(self) -> None:
        if self.detail is not None:
            self.detail.cancel()
