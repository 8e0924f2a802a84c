"""preemptive: DFCCL's daemon.  Collectives that wait for a peer yield their slot.

Every unfinished task sits in the task queue in issue order.  At most
``max_active`` of them hold an execution slot (are polled).  A task in a slot
that polls ``threshold`` times without progress *yields*: it keeps its context
(program counter, transfers in flight, partial buffers) and gives the slot to
the next task.  Nothing is redone when it gets a slot again.

Slots reflect real resources.  What a collective holds from start to end (lane.Gate:
a communicator's node-shared slots, the GPU) bounds which tasks may start; with
``max_active`` None (the default) nothing else does, so every startable task holds a
slot at once, collectives on different communicators progress concurrently (as MPI's
own nonblocking ones do) and nobody yields: there is nobody to yield to.  A finite
``max_active`` (1 models a GPU one collective fills) brings the walk below into play.

The walk (who gets the next slot):
- the head of the queue (the oldest collective) gets up to ``head_tries`` tries
  in a row; try k has threshold ``spin_threshold * min(k, head_tries)``;
- then every other waiting task gets one try (threshold ``spin_threshold``), in
  queue order; when the walk wraps around, the head's tries start again;
- stickiness: when a wait completes after k fruitless polls, the task's threshold
  becomes ``max(threshold, stickiness * k)`` for the rest of this try, so a
  collective whose peers are active holds on longer: approximate gang
  scheduling without a coordinator.

Collectives the MPI library runs itself (the ``mpi`` algorithm row: lane.needs_slot
False) take no slot at all: once started, MPI progresses them, so a slot would only
make them yield.  They start as soon as their communicator's previous collective
started: on the calling thread at issue (``early``, ``adopt``), or here in the walk,
and are polled on every pass (``detached``).

Many collectives in flight cost each one the same as a few (a program that issues a
thousand before it waits): a task whose communicator's previous collective has not
started cannot start either (Task.startable), nor can any later one of that
communicator, so such tasks wait *parked* per communicator, out of the walk, and enter
it one at a time as their predecessor starts; and a collective the MPI library runs
leaves the walk once started (it is polled with the detached ones).  The walk then holds
the started programs and at most one not-started collective per communicator (plus keyed
ones), so a pass no longer scans everything issued (8 B allreduces at 2 ranks, 1,024
issued then waited: 120-139 us per collective before, 18.5-19.8 after, MPI's own 13-14).

Why it cannot deadlock, with any bound of one slot or more: every task gets a slot
infinitely often (the walk visits all of them), and a slot is never held longer than its
threshold without progress.  A gate (a resource held to the end) is only ever waited for
by a later collective of the same communicator -- the one that holds it is earlier in
that communicator's order on every member -- or, for the GPU, by any device collective:
the holder keeps being polled (with slots, in the walk), so it completes once its peers
progress, and they do by the same argument.  So on every rank every issued collective posts its
transfers and is polled again and again; once all members posted, MPI completes
the transfers, and the collective advances.  No rank can wait forever on a peer
that holds its slot for something else.
"""
from __future__ import annotations

import time
from collections import deque

from .base import Parking, Policy


class PreemptivePolicy(Policy):
    name = "preemptive"
    early = True

    def __init__(self, settings):
        super().__init__(settings)
        # unbounded: every startable task runs, nobody yields (see the module docstring)
        self.bounded = settings.max_active is not None
        # a collective started at issue holds no slot: only where slots bound nothing
        self.solo = not self.bounded
        self.max_active = settings.max_active or float("inf")
        self.spin_threshold = settings.spin_threshold
        self.stickiness = settings.stickiness
        self.head_tries = settings.head_tries
        self.queue: deque = deque()   # the walk: tasks that may start or hold slots
        self.parked = Parking()       # tasks behind a not-started one of their communicator
        self.active: list = []        # tasks holding a slot
        self.detached: dict = {}      # started tasks MPI progresses (no slot), as keys
        self.cursor = 1               # walk position (index into queue) after the head
        self.head = None              # the head task whose streak is counted
        self.head_streak = 0          # consecutive tries the head got
        self.last = None              # last task given a slot (context switches)
        self.fruitless = 0            # yields in a row without any progress
        self.hot = False              # a walk after a yield is under way: poll without sleeping

    def admit(self, task) -> None:
        if not self.parked.park(task):
            self.queue.append(task)

    def _unpark(self, comm) -> None:
        task = self.parked.ready(comm)
        if task is not None:
            self.queue.append(task)

    def adopt(self, task) -> None:
        """A task started at issue: polled with the detached ones, never in the walk."""
        task.adopted = True
        self.detached[task] = None

    def live(self) -> list:
        return list(self.queue) + list(self.detached) + self.parked.tasks()

    def started_only(self):
        """The detached collectives, where the walk and the parking are empty (a step is
        then their polls alone)."""
        if self.queue or self.parked.waiting:
            return None
        return self.detached

    def remove(self, task) -> None:
        if task is self.last:       # (nor do these keep a finished collective's result)
            self.last = None
        if task is self.head:
            self.head = None
        if self.detached.pop(task, 0) is None:    # (started: no longer in the walk)
            return
        if task in self.active:
            self.active.remove(task)
        if task in self.queue:
            self._drop(task)
        else:
            self.parked.remove(task)             # (failed before it started)

    def _drop(self, task) -> None:
        """``task`` leaves the walk; the walk's position stays on the task it was at."""
        q = self.queue
        i = q.index(task)
        del q[i]
        if 0 < i < self.cursor:
            self.cursor -= 1

    # -- one scheduling pass -----------------------------------------------------------
    def step(self, engine) -> bool:
        if self.parked.waiting:     # (not Parking.__bool__: a waiter's every poll is a step)
            self.queue.extend(self.parked.all_ready())
        progressed = engine.poll_each(self.detached) if self.detached else False
        if not self.queue:          # nothing to start, no slot held (active is in the walk)
            return progressed
        for task in tuple(self.active):
            if task.finished:
                continue
            if task.poll():
                progressed = True
                self.fruitless = 0
                self.hot = False
                task.made_progress = True
                if task.spins:
                    task.threshold = max(task.threshold, self.stickiness * task.spins)
                task.spins = 0
                if task.finished:
                    engine.retire(task)
            else:
                task.spins += 1
                if task.spins > task.threshold and self.bounded:
                    self._yield(task)
        while len(self.active) < self.max_active:
            task = self._next()
            if task is None:
                break
            self._try(engine, task)
            progressed = True
        return progressed

    def _yield(self, task) -> None:
        """Give the slot up; the context stays in the task.  Once every task had a
        fruitless try (a whole walk), the engine may sleep between polls again."""
        task.yields += 1
        if task.yield_times is not None:
            task.yield_times.append(time.monotonic())
        if task.made_progress:
            task.yields_progress += 1
        self.active.remove(task)
        self.fruitless += 1
        self.hot = self.fruitless <= len(self.queue) + self.head_tries

    def _try(self, engine, task) -> None:
        if not task.lane.needs_slot:      # MPI runs it: start it, no slot, no try
            self._drop(task)
            self.detached[task] = None
            engine.launch(task)
            if task.finished:
                engine.retire(task)
            elif self.parked:
                self._unpark(task.comm)
            return
        task.tries += 1
        task.spins = 0
        task.made_progress = False
        task.threshold = self.spin_threshold * min(task.consecutive, self.head_tries)
        self.active.append(task)
        if task is not self.last:
            engine.switches += 1
            self.last = task
        if task.t_start is None:
            engine.launch(task)       # first try: post the first transfers
            if task.finished:
                engine.retire(task)
            elif self.parked:
                self._unpark(task.comm)

    def _busy(self, task) -> bool:
        return task in self.active or task.t_start is not None and not task.lane.needs_slot

    def _next(self):
        """The next task to give a slot to, following the walk; None if all are active."""
        q = self.queue
        if not q:
            return None
        head = q[0]
        if head is not self.head:     # a new head starts a new streak
            self.head, self.head_streak, self.cursor = head, 0, 1
        busy = self._busy
        if not busy(head) and self.head_streak < self.head_tries and head.startable():
            self.head_streak += 1
            head.consecutive = self.head_streak
            return head
        n = len(q)
        for _ in range(2):            # at most one wrap-around
            while self.cursor < n:
                task = q[self.cursor]
                self.cursor += 1
                if not busy(task) and task.startable():
                    task.consecutive = 1
                    return task
            # wrapped: the head gets its streak of tries again
            self.cursor = 1
            self.head_streak = 0
            if not busy(head) and head.startable():
                self.head_streak = 1
                head.consecutive = 1
                return head
        return None
