"""What every policy shares: the defaults of the hooks (``Policy``) and the parking of
tasks that cannot start yet (``Parking``).  The hooks are listed in the package's
docstring (engine/policies/__init__.py)."""
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

    def started_only(self):
        """Where a step would do nothing but poll started collectives (none waits to
        start or for a slot), those collectives, for a waiter to poll directly; else
        None (a whole step)."""
        return None

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
