"""Work: the handle a nonblocking collective returns."""
from __future__ import annotations

import threading

from ..errors import WaitTimeout

_LOCK = threading.Lock()   # guards completion vs. callback registration of every Work


class Work:
    """A pending collective.  ``wait()`` returns the result array once the collective
    completed; the waiting thread drives the engine itself meanwhile.  ``test()``
    never blocks."""

    __slots__ = ("coll", "_done", "_task", "_engine", "_result", "_error", "_callbacks",
                 "__weakref__")

    def __init__(self, coll: str, engine=None):
        self.coll = coll
        self._done = False
        self._task = None
        self._engine = engine
        self._result = None
        self._error = None
        self._callbacks = None

    def wait(self, timeout: float | None = None):
        """The result buffer (recvbuf, or the array allocated for it).  Raises the
        collective's error, or WaitTimeout if ``timeout`` seconds pass first (the
        collective then stays pending)."""
        if not self._done:
            self._engine.drive(self, timeout)
            if not self._done:
                what = self._task.describe() if self._task is not None else self.coll
                raise WaitTimeout(f"{what} not complete after {timeout} s (still pending)")
        if self._error is not None:
            raise self._error
        return self._result

    def test(self) -> bool:
        """True once the collective finished (successfully or not; wait() tells which).
        Makes one progress pass if the engine is free, like MPI_Test."""
        if not self._done:
            self._engine.poke()
        return self._done

    def exception(self):
        """The error the collective failed with; None if it succeeded or is pending."""
        return self._error

    def add_done_callback(self, fn) -> None:
        """Call ``fn(work)`` once, on completion: at once if already complete, else on the
        thread that completes it (the engine thread, or a thread in wait()), after it let
        go of the engine: fn may issue collectives and wait for them."""
        with _LOCK:
            if not self._done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                self._engine.wake.set()    # nobody may wait: the daemon must run it
                return
        fn(self)

    @property
    def counters(self) -> dict:
        t = self._task
        if t is None:
            return {}
        return {"algo": t.program.algo, "polls": t.polls, "tries": t.tries, "yields": t.yields,
                "yields_progress": t.yields_progress, "waits": t.lane.waits_done,
                "t_issue": t.t_issue, "t_start": t.t_start, "t_end": t.t_end,
                "queued_s": (t.t_start - t.t_issue) if t.t_start else None,
                "running_s": (t.t_end - t.t_start) if t.t_end and t.t_start else None}

    def _finish(self, task) -> list:
        """The collective completed: keep its result or error; returns the callbacks, which
        the engine runs once it let go of its lock."""
        with _LOCK:
            self._error = task.error
            self._result = task.result if task.error is None else None
            self._done = True
            callbacks, self._callbacks = self._callbacks, None
        return callbacks

    def __repr__(self) -> str:
        state = "done" if self._done else "pending"
        what = self._task.describe() if self._task is not None else self.coll
        return f"<Work {what} {state}>"
