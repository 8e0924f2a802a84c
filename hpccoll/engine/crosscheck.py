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
- **close**: ``final_check`` compares every communicator's digest one last time, over
  the control communicator (close is collective), once every rank got there;
- **free**: ``free_check`` does the same for one communicator at ``free()``, with a
  message from each member to the others (its count, digest and fingerprint rows):
  every member decides the same verdict from the same messages.

Only whoever holds the engine calls into this (tick, messages); the messages travel on
the control communicator, never on a data communicator.
"""
from __future__ import annotations

import sys
import time
from typing import Optional

import numpy as np
from mpi4py import MPI

from ..base import mismatch
from ..errors import CollectiveMismatch, ContextClosed
from .control import TAG_FINAL, TAG_NOTE, TAG_PROBE, TAG_ROWS, TAG_VERDICT
from .lane import HELD


class _Probe:
    __slots__ = ("state", "rows", "waiting", "deadline")

    def __init__(self, state, rows, waiting, deadline):
        self.state, self.rows, self.waiting, self.deadline = state, rows, waiting, deadline


class CrossCheck:
    tags = (TAG_NOTE, TAG_PROBE, TAG_ROWS, TAG_VERDICT, TAG_FINAL)

    def __init__(self, engine):
        self.engine = engine
        s = engine.settings
        self.on = s.check_mismatch == "deferred"
        self.period = s.mismatch_ms / 1000.0
        self.answer_wait = max(1.0, s.report_wait)
        self.next_tick = 0.0
        self.probes: dict = {}
        self.count = 0
        self.finals: dict = {}      # uid -> {world rank: (count, digest, rows)} (free_check)
        self.closed: set = set()    # world ranks that closed their context or exited
        self.gone: set = set()      # world ranks that exited without closing (TAG_GONE)

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

    def probing(self, state) -> bool:
        """Whether this rank's probe of ``state``'s communicator awaits its answers."""
        return any(p.state is state for p in self.probes.values())

    def probe(self, state) -> None:
        if state.broken is not None or self.probing(state):
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
        if tag == TAG_FINAL:
            # a member frees the communicator: what it issued there is all it will issue
            self.finals.setdefault(state.uid, {})[src] = payload[1:]
            self.engine.on_closing(src, {state.uid: payload[1]}, "freed communicator")
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


def free_check(engine, state, timeout: float) -> Optional[CollectiveMismatch]:
    """``free()`` of ``state``'s communicator, once its own collectives completed or
    failed here: every member sends the others how many order-matched collectives it
    issued there, its digest and its fingerprint rows, and decides from what it
    receives.  Returns the CollectiveMismatch every member finds alike (None where they
    agree, or where a member closed its context or did not free within ``timeout``)."""
    cc, led = engine.crosscheck, state.ledger
    if not cc.on or led is None or state.size < 2 or engine.broken is not None:
        return None
    me = engine.control.rank
    # a communicator some member saw fail already (a mismatch, a peer's error) was
    # reported there: its counts may differ by the calls that raised; one only a peer's
    # free() or close() stopped (ContextClosed) is compared
    known = state.broken is not None and not isinstance(state.broken, ContextClosed)
    mine = (state.seq, led.digest, led.rows(), known)
    others = [w for w in state.world_ranks if w != me]
    with engine.lock:           # (only whoever holds the engine uses the control plane)
        engine.control.broadcast((state.uid,) + mine, others, TAG_FINAL)
    got = cc.finals.setdefault(state.uid, {})
    deadline = time.monotonic() + timeout
    while len(got) < len(others) and engine.broken is None:
        missing = set(others) - set(got)
        if missing & cc.closed:
            return None           # (its close() compares what is left, and says so)
        if time.monotonic() > deadline:
            print(f"hpccoll: rank {me}: free() of {state.name!r} compared nothing: "
                  f"rank(s) {sorted(missing)} did not free it within {timeout:g} s",
                  file=sys.stderr, flush=True)
            return None
        with engine.lock:
            engine._serve_control()
        time.sleep(0.0002)
    got = cc.finals.pop(state.uid, {})
    if len(got) < len(others):
        return None
    got[me] = mine
    if any(g[3] for g in got.values()) \
            or len({(count, digest) for count, digest, _, _ in got.values()}) == 1:
        return None
    found = mismatch.verdict({w: g[2] for w, g in got.items()})
    if found is not None:
        return state.mismatch_error(*found)
    counts: dict = {}
    for w in sorted(got):
        counts.setdefault(str(got[w][0]), []).append(w)
    majority = max(counts.values(), key=len)
    odd = sorted(w for ranks in counts.values() if ranks is not majority for w in ranks)
    return CollectiveMismatch(
        f"ranks disagree about communicator {state.name!r} at free(): collectives issued "
        "there: " + "; ".join(f"rank(s) {r} issued {c}" for c, r in counts.items()),
        ranks=odd, fields={"collectives issued": counts})


FIELDS = 4     # a final-check entry: communicator (its uid's hash), last sequence, digest, skip


def final_check(ctl, states, eligible: bool, deadline: float) -> list:
    """close(), once every rank got there (its barrier): compare every communicator's
    digest and last sequence number one last time, over the control communicator (a
    collective on a communicator's own data duplicate could meet one a peer left posted
    there and never completed); where members differ, exchange their fingerprint rows and
    decide.  ``eligible`` False (this rank abandoned collectives, or its engine broke):
    this rank's communicators are compared by nobody.  Returns the CollectiveMismatch of
    each communicator of this rank whose members disagree; [] where the exchange did not
    complete by ``deadline``."""
    mine = []
    for state in states:
        led = state.ledger
        if led is None or state.size < 2:
            continue
        # a communicator broken by a verdict no call has carried yet is compared again: a
        # peer the verdict has not reached must hear of it here, not never
        skip = (state.broken is not None and not unseen(state)) or not eligible
        mine.append((_uid(state.uid), led.seq, led.digest, int(skip)))
    table = _allgather(ctl, np.array(mine, np.int64).reshape(-1, FIELDS), deadline)
    if table is None:
        return []
    entries: dict = {}
    for rank, rows in enumerate(table):
        for uid, seq, digest, skip in rows:
            entries.setdefault(int(uid), []).append((int(seq), int(digest), int(skip)))
    # the same set on every rank: it comes from the same table
    differ = {uid for uid, got in entries.items()
              if not any(skip for _, _, skip in got) and len({g[:2] for g in got}) > 1}
    if not differ:
        return []
    ours = [st for st in states if st.ledger is not None and _uid(st.uid) in differ]
    rows = [np.column_stack([np.full(st.ledger.window, _uid(st.uid), np.int64),
                             st.ledger.padded(st.ledger.window)]) for st in ours]
    width = 1 + len(mismatch.FP_FIELDS)
    gathered = _allgather(ctl, np.concatenate(rows) if rows else np.empty((0, width), np.int64),
                          deadline)
    if gathered is None:
        return []
    errors = []
    for state in ours:
        uid = _uid(state.uid)
        found = mismatch.verdict({rank: got[got[:, 0] == uid][:, 1:]
                                  for rank, got in enumerate(gathered)
                                  if rank in state.world_ranks})
        if found is not None:
            errors.append(state.mismatch_error(*found))
            state.unreported = None      # (raised by close() now)
    return errors


def unseen(state) -> bool:
    """A verdict broke ``state`` after its collectives completed and no call on it has
    raised it yet (CommState.unreported)."""
    return isinstance(state.unreported, CollectiveMismatch)


def _uid(uid: str) -> int:
    return mismatch.stable_hash(uid.encode())


def _allgather(ctl, rows: np.ndarray, deadline: float):
    """Every rank's ``rows`` (k x width int64, k per rank), gathered over the control
    communicator with nonblocking collectives; None if that did not complete in time."""
    size = ctl.Get_size()
    counts = np.empty(size, np.int64)
    n = np.array([rows.size], np.int64)
    if not _wait(ctl.Iallgather(n, counts), deadline, n, counts):
        return None
    out = np.empty(int(counts.sum()), np.int64)
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
    mine = np.ascontiguousarray(rows, np.int64).reshape(-1)
    req = ctl.Iallgatherv(mine, [out, (counts, displs), MPI.INT64_T])
    if not _wait(req, deadline, mine, out, counts, displs):
        return None
    width = rows.shape[1]
    return [out[d:d + c].reshape(-1, width) for d, c in zip(displs, counts)]


def _wait(req, deadline: float, *arrays) -> bool:
    """Whether ``req`` completed by ``deadline``; where it did not, MPI may still read or
    write its ``arrays`` (mpi4py keeps no reference): they stay alive (lane.HELD)."""
    while not req.Test():
        if time.monotonic() > deadline:
            HELD.append((req, arrays))
            return False
        time.sleep(0.0002)
    return True
