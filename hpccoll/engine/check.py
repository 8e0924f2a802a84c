"""The check lane: every member of a communicator agrees on one value, or they all find
out who differs and how.

The value is a fingerprint's hash (check_mismatch="every": each collective) or the
communicator's digest (the default: every ``mismatch_every`` collectives; see
core/mismatch.py).  Its shape depends only on the number of ranks, so it completes even
when the data of disagreeing ranks cannot.

The digest of a communicator whose members share one node is compared on the node's
digest board instead (``BoardCheckLane``, at the end: no MPI call).  Elsewhere,
order-matched collectives agree with one MPI nonblocking allreduce (MIN) of (v, -v),
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


def digest_check(digest: int, seq: int, comm, mpi_comm, tag) -> "CheckLane":
    """The check that collective ``seq`` carries of its communicator's digest (deferred
    mode, every ``mismatch_every``-th): on the board of its node-shared area where every
    member shares this node (no MPI call), else one MPI allreduce."""
    ledger = comm.ledger
    shm = comm.shm
    if shm and len(shm["local"]) == comm.size:
        return BoardCheckLane(digest, comm, shm["area"], seq // ledger.every)
    return CheckLane(digest, ledger.padded_later(ledger.every), comm, mpi_comm, tag)


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
    __slots__ = ("value", "_rows", "pair", "req", "detail", "_args")

    def __init__(self, value: int, rows, comm, mpi_comm, tag, direct: bool = False):
        Lane.__init__(self)
        self.value = value
        self._rows = rows
        self.pair = None
        self.req = None
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


class BoardCheckLane(CheckLane):
    """The digest check of a communicator whose members share this node, on the board
    of its node-shared area (transport/shm.py ``post_digest``): each member posts its
    digest at start and reads its peers' (the allreduce's job, no MPI call: every 64th
    8 B collective cost 10-46 us more through MPI's allreduce, 3-4 us through the board).
    Every member reads the same entries, so where digests differ every member sees it:
    each probes over the control plane (engine/crosscheck.py), whose verdict fails the
    collective carrying the check on every member with the same CollectiveMismatch; it
    stays pending until then.  A peer that already reused the entry (BOARD_ENTRIES
    checks ahead) left a later digest: compared once this rank got that far, as a
    control-plane note is (``Ledger.pending``)."""
    __slots__ = ("area", "number", "probed")

    def __init__(self, value: int, comm, area, number: int):
        CheckLane.__init__(self, value, None, comm, None, None)
        self.area, self.number = area, number
        self.probed = False

    def start(self) -> None:
        self.area.post_digest(self.number, self.value)

    def run(self) -> bool:
        comm = self._args[0]
        if self.probed:
            if comm.broken is None and not comm.engine.crosscheck.probing(comm):
                self.done = True     # the probe decided and found nothing to name
                return True
            return False
        area, number = self.area, self.number
        differ = False
        later = []
        every = comm.ledger.every
        for q in range(area.size):
            if q == area.rank:
                continue
            got, digest = area.digest_of(q, number)
            if got < number:
                return False         # q has not posted it yet (or is rewriting it)
            if got > number:
                later.append(((got + 1) * every - 1, digest))
            elif digest != self.value:
                differ = True
        if differ:
            self.probed = True
            comm.engine.crosscheck.probe(comm)
            return True
        if later:
            comm.ledger.pending.extend(later)
        self.done = True
        return True

    def gathered(self):
        return None

    def pending_peers(self):
        if self.done:
            return set(), set()
        peers = {q for q in range(self.area.size) if q != self.area.rank
                 and self.area.digest_of(q, self.number)[0] < self.number}
        return {self._args[0].shm["local"][q] for q in peers}, set()

    def cancel(self) -> None:
        pass
