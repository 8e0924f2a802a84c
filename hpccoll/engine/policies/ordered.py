"""ordered: one global launch order for all communicators, negotiated over a tree.

A collective waits (unordered) until the root of the control plane's tree has seen every
member issue it and gave it a global sequence number (gseq); every rank then launches
its collectives strictly in gseq order and runs them like fifo (``max_active`` slots;
None: as many as their resources allow, lane.Gate).  The protocol is
hpccoll.ordering.sequencer, over hpccoll.ordering.tree; the argument for its
correctness and its cost are in docs/ordering.md.

Only collectives that hold something bounded which collectives of other communicators
also take need a place in the global order: an execution slot under a finite
``max_active``, or a shared gate (the GPU).  The others -- the MPI library's own
collectives (no slot: MPI progresses each independently, as its nonblocking collectives
never deadlock), programs with unbounded slots, collectives on single-rank
communicators -- cannot be part of a circular wait, so they launch as soon as their
communicator's previous collective started, with no negotiation (on the calling thread
at issue, where MPI runs them).  See docs/ordering.md.
"""
from __future__ import annotations

from collections import deque

from ...ordering import KIND_DOWN, KIND_UP, Sequencer, Tree
from ..control import TAG_ORDER_DOWN, TAG_ORDER_UP
from .base import Parking, Policy
from .fifo import FifoPolicy

_KIND_TAG = {KIND_UP: TAG_ORDER_UP, KIND_DOWN: TAG_ORDER_DOWN}
_TAG_KIND = {v: k for k, v in _KIND_TAG.items()}


class OrderedPolicy(Policy):
    name = "ordered"
    early = True              # MPI's own collectives need no order: start them at issue
    control_tags = tuple(_TAG_KIND)
    # an idle rank may have a report or a batch to pass on for its subtree: look often
    park_seconds = 0.001

    def __init__(self, settings):
        super().__init__(settings)
        self.seq = None             # Sequencer, made on first use (needs the world's nodes)
        self.engine = None
        self.unordered: dict = {}   # (sid, index) -> task waiting for its gseq
        self.place: dict = {}       # task -> (sid, index)
        self.issued: dict = {}      # sid -> this rank's ordered collectives on it so far
        self.runs: dict = {}        # communicator uid -> its members on the tree
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

    @property
    def ring(self):
        """The protocol's state machine (the name tests/mpi/test_policies.py reads its
        ``hops`` by, from when it was a token ring)."""
        return self.seq

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
        seq = self._sequencer()
        comm = task.comm
        # a stream: what every member issues in the same order (module ordering.sequencer)
        sid = (comm.uid, task.key)
        index = self.issued.get(sid, 0)
        self.issued[sid] = index + 1
        self.unordered[(sid, index)] = task
        self.place[task] = (sid, index)
        runs = self.runs.get(comm.uid)
        if runs is None:
            runs = self.runs[comm.uid] = self._tree.members(comm.world_ranks)
        seq.issue(sid, runs)

    def _sequencer(self) -> Sequencer:
        if self.seq is None:
            ctl = self.engine.control
            # every rank's node, as the context met them (the lowest rank of each)
            node_of = getattr(self.engine.ctx, "_node_of", None)
            if node_of is None or len(node_of) != ctl.size:
                node_of = range(ctl.size)        # a binomial tree over the ranks
            self._tree = Tree(node_of)
            self.seq = Sequencer(ctl.rank, self._tree)
        return self.seq

    def _send(self, msgs) -> None:
        for dest, kind, payload in msgs:
            self.engine.control.send(payload, dest, _KIND_TAG[kind])

    def _learn(self, learned) -> None:
        for gseq, sid, index in learned:
            task = self.unordered.pop((sid, index), None)
            if task is not None:          # (None: it failed while it waited)
                del self.place[task]
                task.gseq = gseq
                self.run.admit(task)

    def on_control(self, src: int, tag: int, payload) -> None:
        seq = self._sequencer()
        msgs, learned = seq.on_message(src, _TAG_KIND[tag], payload)
        self._send(msgs)
        self._learn(learned)
        if seq.pending:
            # a report from below goes on at the next step, with whatever else arrives
            # in this pass; the engine steps only while it has tasks, and ``hot`` keeps
            # it from sleeping before that step
            if self._busy():
                self.hot = True
            else:
                self._flush()

    def _busy(self) -> bool:
        return bool(self.run.active or self.run.queue or self.unordered or self.loose
                    or self.parked)

    def _flush(self) -> None:
        self.hot = False
        msgs, learned = self.seq.flush()
        self._send(msgs)
        self._learn(learned)

    def live(self) -> list:
        return (self.run.live() + list(self.unordered.values()) + list(self.loose)
                + self.parked.tasks())

    def remove(self, task) -> None:
        if task in self.loose:
            del self.loose[task]
        elif task in self.place:
            # its index stays taken: the others' batches still count it
            del self.unordered[self.place.pop(task)]
        elif not self.parked.remove(task):
            self.run.remove(task)
        if self.hot and not self._busy():
            self._flush()           # the last task is gone: no step will come for it

    def step(self, engine) -> bool:
        if self.seq is not None and self.seq.pending:
            # (not progress of this rank's collectives: the watchdog's idle clock runs on)
            self._flush()
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
