"""The control-plane side of the deferred mismatch check (check_mismatch="deferred";
core/mismatch.py states the guarantee and its bound).

- **notes**: ``mismatch_ms`` after its last note, a communicator with new collectives
  sends (sequence, digest) to its next member; a member whose digest at that sequence
  differs (once it got there) probes;
- **probes**: a member that suspects a mismatch (a differing note, a wait without
  progress for ``mismatch_ms``, a truncated message) asks every member for its
  fingerprint rows, decides with ``mismatch.verdict`` once all answered (or after
  ``report_wait``), and sends the verdict to every member; each raises the same
  CollectiveMismatch on its pending collectives of that communicator, or on its next
  call there;
- **close**: ``final_check`` compares every communicator's digest one last time, with
  MPI's own nonblocking collectives (close is collective).

Only whoever holds the engine calls into this (tick, messages); the messages travel on
the control communicator, never on a data communicator.
"""
from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from ..base import mismatch
from .control import TAG_NOTE, TAG_PROBE, TAG_ROWS, TAG_VERDICT


class _Probe:
    __slots__ = ("state", "rows", "waiting", "deadline")

    def __init__(self, state, rows, waiting, deadline):
        self.state, self.rows, self.waiting, self.deadline = state, rows, waiting, deadline


class CrossCheck:
    tags = (TAG_NOTE, TAG_PROBE, TAG_ROWS, TAG_VERDICT)

    def __init__(self, engine):
        self.engine = engine
        s = engine.settings
        self.on = s.check_mismatch == "deferred"
        self.period = s.mismatch_ms / 1000.0
        self.answer_wait = max(1.0, s.report_wait)
        self.next_tick = 0.0
        self.probes: dict = {}
        self.count = 0

    # -- driven by the engine -------------------------------------------------------------
    def tick(self) -> None:
        """Notes that are due, notes that can be compared now, stalled waits, probes whose
        answers are overdue.  Cheap when nothing is due."""
        if not self.on:
            return
        now = time.monotonic()
        if now < self.next_tick:
            return
        self.next_tick = now + self.period / 2
        ctl = self.engine.control
        for state in self.engine.ctx._states():
            led = state.ledger
            if led is None or state.size < 2 or state.broken is not None:
                continue
            if led.pending:
                self._compare_pending(state)
            if led.seq > led.noted and now - state.noted_at >= self.period:
                led.noted, state.noted_at = led.seq, now
                ctl.send((state.uid, led.seq, led.digest),
                         state.world_ranks[(state.rank + 1) % state.size], TAG_NOTE)
        for task in self.engine.live():
            if (not task.probed and task.key is None and task.t_start is not None
                    and now - task.last_progress > self.period and task.comm.ledger is not None):
                task.probed = True
                self.probe(task.comm)
        for pid in [p for p, pr in self.probes.items() if now > pr.deadline]:
            self._decide(pid)

    def suspect(self, state) -> None:
        """Something on ``state``'s communicator looks like a mismatch (a truncated message)."""
        if self.on and state.ledger is not None:
            self.probe(state)

    def probe(self, state) -> None:
        if state.broken is not None or any(p.state is state for p in self.probes.values()):
            return
        ctl = self.engine.control
        self.count += 1
        pid = (ctl.rank, self.count)
        others = [w for w in state.world_ranks if w != ctl.rank]
        self.probes[pid] = _Probe(state, {ctl.rank: state.ledger.rows()}, set(others),
                                  time.monotonic() + self.answer_wait)
        for w in others:
            ctl.send((state.uid, pid), w, TAG_PROBE)

    def on_message(self, src: int, tag: int, payload) -> None:
        state = self.engine.ctx._state_by_uid(payload[0])
        if state is None or state.ledger is None:
            return
        if tag == TAG_PROBE:
            self.engine.control.send((state.uid, payload[1], state.ledger.rows()), src, TAG_ROWS)
        elif tag == TAG_ROWS:
            probe = self.probes.get(payload[1])
            if probe is not None:
                probe.rows[src] = payload[2]
                probe.waiting.discard(src)
                if not probe.waiting:
                    self._decide(payload[1])
        elif tag == TAG_NOTE:     # compared now, or once this rank got that far
            state.ledger.pending.append(payload[1:])
            self._compare_pending(state)
        elif tag == TAG_VERDICT:
            self.apply(state, *payload[1:])

    # -- deciding ----------------------------------------------------------------------------
    def _compare_pending(self, state) -> None:
        led = state.ledger
        keep = []
        for seq, digest in led.pending:
            if seq > led.seq:
                keep.append((seq, digest))
            elif led.digest_at(seq) not in (None, digest):
                self.probe(state)
        led.pending = keep

    def _decide(self, pid) -> None:
        probe = self.probes.pop(pid)
        state = probe.state
        found = mismatch.verdict(probe.rows)
        if found is None or state.broken is not None:
            return
        payload = (state.uid,) + found
        ctl = self.engine.control
        for w in state.world_ranks:
            if w != ctl.rank:
                ctl.send(payload, w, TAG_VERDICT)
        self.apply(state, *found)

    def apply(self, state, seq, fields, odd) -> None:
        """Every member raises the same CollectiveMismatch: on its pending collectives of
        the communicator now, or on its next call there."""
        if state.broken is not None:
            return
        exc = state.mismatch_error(seq, fields, odd)
        if not self.engine.pending_on(state):
            state.unreported = exc     # nothing pending carries it: the next call does
        self.engine.break_comm(state, exc)


def final_check(states, deadline: float) -> list:
    """close(): compare every communicator's digest and last sequence number one last time
    (MPI's own nonblocking allreduce, posted on every communicator in creation order, which
    is the same on every rank); where they differ, exchange the rows and decide.  Returns
    the CollectiveMismatch of each communicator whose ranks disagree."""
    pending = []
    for state in states:
        led = state.ledger
        if led is None or state.size < 2 or state.broken is not None or led.seq <= led.agreed:
            continue
        pair = np.array((led.digest, -led.digest, led.seq, -led.seq), np.int64)
        pending.append((state, pair, state.data.Iallreduce(MPI.IN_PLACE, pair, op=MPI.MIN)))
    if not pending:
        return []
    errors = []
    detail = []
    for state, pair, req in pending:
        if not _wait(req, deadline):
            return errors
        led = state.ledger
        if pair[0] != led.digest or -pair[1] != led.digest or pair[2] != led.seq or -pair[3] != led.seq:
            rows = led.padded(led.window)
            everyone = np.empty((state.size,) + rows.shape, np.int64)
            detail.append((state, everyone, state.data.Iallgather(rows, everyone)))
    for state, everyone, req in detail:
        if not _wait(req, deadline):
            break
        world = state.world_ranks
        found = mismatch.verdict({world[r]: everyone[r] for r in range(state.size)})
        if found is not None:
            errors.append(state.mismatch_error(*found))
    return errors


def _wait(req, deadline: float) -> bool:
    while not req.Test():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.0002)
    return True
