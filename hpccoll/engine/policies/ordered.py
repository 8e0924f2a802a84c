"""ordered: one global launch order for all communicators, negotiated by a token.

A collective waits (unordered) until the token has seen every member issue it and
gave it a global sequence number (gseq); every rank then launches its collectives
strictly in gseq order and runs them like fifo (``max_active`` slots; None: as many as
their resources allow, lane.Gate).  The
protocol is hpccoll.ordering; the argument for its correctness is docs/ordering.md.

Only collectives that hold something bounded which collectives of other communicators
also take need a place in the global order: an execution slot under a finite
``max_active``, or a shared gate (the GPU).  The others -- the MPI library's own
collectives (no slot: MPI progresses each independently, as its nonblocking collectives
never deadlock), programs with unbounded slots, collectives on single-rank
communicators -- cannot be part of a circular wait, so they launch as soon as their
communicator's previous collective started, with no token round (on the calling thread
at issue, where MPI runs them).  See docs/ordering.md.
"""
from __future__ import annotations

from collections import deque

from ...ordering import KIND_REST, KIND_TOKEN, KIND_WAKE, TokenRing
from ..control import TAG_REST, TAG_TOKEN, TAG_WAKE
from . import Parking, Policy
from .fifo import FifoPolicy

_KIND_TAG = {KIND_TOKEN: TAG_TOKEN, KIND_REST: TAG_REST, KIND_WAKE: TAG_WAKE}
_TAG_KIND = {v: k for k, v in _KIND_TAG.items()}


class OrderedPolicy(Policy):
    name = "ordered"
    early = True              # MPI's own collectives need no order: start them at issue
    control_tags = tuple(_TAG_KIND)
    park_seconds = 0.001      # a parked rank may be handed the token: look often

    def __init__(self, settings):
        super().__init__(settings)
        self.ring = None            # TokenRing, made on first use (needs the world rank)
        self.engine = None
        self.unordered: dict = {}   # cid -> task
        # ordered tasks run like fifo, in gseq order: its queue is our ready queue
        self.bounded = settings.max_active is not None
        # a program needs no place in the order where slots bound nothing: it may start
        # at issue, as under preemptive (engine.py: loose programs)
        self.solo = not self.bounded
        self.run = FifoPolicy(settings, on_launch=self._launched,
                              slots=settings.max_active or float("inf"))
        self.launch_log: deque = deque(maxlen=100_000)   # (gseq, cid) in launch order
        self.loose: dict = {}       # tasks that need no order (as keys, issue order)
        self.parked = Parking()     # those behind a not-started one of their communicator

    def _launched(self, task) -> None:
        self.launch_log.append((task.gseq, self.cid(task)))

    @staticmethod
    def cid(task):
        if task.key is None:
            return (task.comm.uid, task.seq)
        return (task.comm.uid, ("key", task.key, task.key_instance))

    def needs_order(self, task) -> bool:
        lane = task.lane
        if task.comm.size == 1:
            return False
        gate = lane.holds
        return gate is not None and gate.shared or lane.needs_slot and self.bounded

    def adopt(self, task) -> None:
        """A task started at issue (MPI runs it): polled with the loose ones."""
        task.adopted = True
        self.loose[task] = None

    def admit(self, task) -> None:
        if not self.needs_order(task):
            if not self.parked.park(task):
                self.loose[task] = None
            return
        self._ring_engine()
        cid = self.cid(task)
        self.unordered[cid] = task
        members = 0
        for w in task.comm.world_ranks:
            members |= 1 << w
        self.ring.issue(cid, members)

    def _ring_engine(self):
        if self.ring is None:
            ctl = self.engine.control
            self.ring = TokenRing(ctl.rank, ctl.size)
        return self.ring

    def _send(self, msgs) -> None:
        for dest, kind, payload in msgs:
            self.engine.control.send(payload, dest, _KIND_TAG[kind])

    def _learn(self, learned) -> None:
        for gseq, cid in learned:
            task = self.unordered.pop(cid, None)
            if task is not None:
                task.gseq = gseq
                self.run.admit(task)

    def on_control(self, src: int, tag: int, payload) -> None:
        self._ring_engine()
        msgs, learned = self.ring.on_message(src, _TAG_KIND[tag], payload)
        self._send(msgs)
        self._learn(learned)

    def live(self) -> list:
        return (self.run.live() + list(self.unordered.values()) + list(self.loose)
                + self.parked.tasks())

    def remove(self, task) -> None:
        if task in self.loose:
            del self.loose[task]
        elif self.unordered.pop(self.cid(task), None) is None and not self.parked.remove(task):
            self.run.remove(task)

    def step(self, engine) -> bool:
        if self.ring is not None and self.ring.unannounced:
            msgs, learned = self.ring.flush()
            self._send(msgs)
            self._learn(learned)
        progressed = self.run.step(engine)
        if self.parked:
            for task in self.parked.all_ready():
                self.loose[task] = None
        if self.loose:
            for task in tuple(self.loose):
                if task.t_start is None and task.startable():
                    engine.launch(task)
                    progressed = True
            # (a task not started yet polls as no progress; a failed start retires here)
            progressed = engine.poll_each(self.loose) or progressed
        return progressed
