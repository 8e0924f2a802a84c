"""fifo: the NCCL-like baseline.

At most ``max_active`` collectives hold an execution slot (one when the setting is
None); they start in issue order and run to completion.  When ranks issue collectives on different
communicators in different orders this deadlocks, exactly like NCCL; the
watchdog turns that into CollectiveTimeout.
"""
from __future__ import annotations

from collections import deque

from .base import Policy


class FifoPolicy(Policy):
    name = "fifo"

    def __init__(self, settings, on_launch=None, slots=None):
        super().__init__(settings)
        # the NCCL-like baseline runs one at a time unless told otherwise; the ordered
        # policy passes its own bound
        self.max_active = slots if slots is not None else settings.max_active or 1
        self.queue: deque = deque()
        self.active: list = []
        self.on_launch = on_launch    # the ordered policy logs launches

    def admit(self, task) -> None:
        self.queue.append(task)

    def live(self) -> list:
        return self.active + list(self.queue)

    def remove(self, task) -> None:
        if task in self.active:
            self.active.remove(task)
        elif task in self.queue:
            self.queue.remove(task)

    def step(self, engine) -> bool:
        """Poll every active task once; fill free slots in issue order (a task whose
        communicator has an earlier collective not yet started waits at the head)."""
        progressed = engine.poll_each(self.active)
        while len(self.active) < self.max_active and self.queue and self.queue[0].startable():
            task = self.queue.popleft()
            self.active.append(task)
            if self.on_launch is not None:
                self.on_launch(task)
            engine.launch(task)
            progressed = True
            if task.finished:
                engine.retire(task)
        return progressed
