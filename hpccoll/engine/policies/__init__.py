"""Scheduling policies, one per module with the same shape.  Every hook the engine calls:

    class XPolicy:
        name: str
        early: bool             # may a slotless task (lane.needs_slot False: MPI runs it)
                                #   start on the calling thread at issue (adopt)?
        solo: bool              # may a program start there too, when nothing else runs?
        control_tags: tuple     # control-plane tags it handles (on_control)
        park_seconds: float     # optional: how often a parked engine looks for messages
        hot: bool               # a walk is under way: the engine polls without sleeping
        def __init__(self, settings)
        def bind(self, engine)  # once, before anything is admitted
        def admit(self, task)   # a queued task enters the policy
        def adopt(self, task)   # a task the caller already started enters the policy
        def step(self, engine)  # one pass: poll, start, switch; True if anything progressed
        def live(self)          # tasks not finished, in the policy's order
        def remove(self, task)  # drop a finished task
        def on_control(self, src, tag, payload)

``Policy`` below holds the defaults.  The table is ordered from the recommended default
to the baseline.
"""
from __future__ import annotations

from collections import deque

from ..task import started


class Policy:
    """Defaults of the hooks (see the module docstring)."""
    name = ""
    early = False
    solo = False
    control_tags: tuple = ()
    hot = False

    def __init__(self, settings):
        self.settings = settings

    def bind(self, engine) -> None:
        self.engine = engine

    def adopt(self, task) -> None:
        raise AssertionError(f"the {self.name} policy starts every collective itself")

    def on_control(self, src: int, tag: int, payload) -> None:
        raise AssertionError(f"the {self.name} policy handles no control messages")


class Parking:
    """Order-matched tasks that cannot start because their communicator's previous
    collective has not started (Task.startable), per communicator, in issue order.
    A policy keeps them here instead of looking at each of them on every pass, so that a
    thousand collectives issued before any wait cost each one what a few do; the first
    of a communicator comes out (``ready``) once its predecessor started, and the next
    one's predecessor is then that task, so it stays."""
    __slots__ = ("waiting",)

    def __init__(self):
        self.waiting: dict = {}      # communicator state -> deque of tasks

    def __bool__(self) -> bool:
        return bool(self.waiting)

    def park(self, task) -> bool:
        """Keep ``task`` if it cannot start yet; False: it may (the policy takes it)."""
        prev = task.prev
        if prev is None or started(prev):
            return False
        tasks = self.waiting.get(task.comm)
        if tasks is None:
            tasks = self.waiting[task.comm] = deque()
        tasks.append(task)
        return True

    def ready(self, comm):
        """``comm``'s first parked task if its predecessor started (it leaves), or None."""
        tasks = self.waiting.get(comm)
        if not tasks or not started(tasks[0].prev):
            return None
        task = tasks.popleft()
        if not tasks:
            del self.waiting[comm]
        return task

    def all_ready(self) -> list:
        return [t for t in (self.ready(c) for c in list(self.waiting)) if t is not None]

    def tasks(self) -> list:
        out = []
        for tasks in self.waiting.values():
            out += tasks
        return out

    def remove(self, task) -> bool:
        """Drop ``task`` (failed before it started); False if it was not parked."""
        tasks = self.waiting.get(task.comm)
        if tasks is None or task not in tasks:
            return False
        tasks.remove(task)
        if not tasks:
            del self.waiting[task.comm]
        return True


from .fifo import FifoPolicy  # noqa: E402
from .ordered import OrderedPolicy  # noqa: E402
from .preemptive import PreemptivePolicy  # noqa: E402

# preemptive first: deadlock-free without coordination, and the default;
# ordered: deadlock-free by a negotiated global launch order (a token round per burst);
# fifo last: the NCCL-like baseline that may deadlock.
POLICIES = {
    "preemptive": PreemptivePolicy,
    "ordered": OrderedPolicy,
    "fifo": FifoPolicy,
}


def make(settings):
    return POLICIES[settings.policy](settings)
