"""Work: the handle a nonblocking collective returns.

The engine's task (engine/task.py) *is* the Work: one object per collective, nothing to
keep in step and no reference cycle between a handle and its task.  This class holds the
public part; a finished collective keeps its result (or error) and its counters, never
the caller's other arrays."""
from __future__ import annotations

import threading

from ..errors import WaitTimeout

_LOCK = threading.Lock()   # guards completion vs. callback registration of every Work


class Work:
    """A pending collective.  ``wait()`` returns the result array once the collective
    completed; the waiting thread drives the engine itself meanwhile.  ``test()``
    never blocks.  (Its fields -- the engine, the result, the error once it failed, done,
    the callbacks -- are set by the engine's task, engine/task.py.)"""

    def wait(self, timeout: float | None = None):
        """The result buffer (recvbuf, or the array allocated for it).  Raises the
        collective's error, or WaitTimeout if ``timeout`` seconds pass first (the
        collective then stays pending)."""
        if not self._done:
            self._engine.wait(self, timeout)
            if not self._done:
                raise WaitTimeout(f"{self.describe()} not complete after {timeout} s "
                                  "(still pending)")
        if self.error is not None:
            raise self.error
        return self.result

    def test(self) -> bool:
        """True once the collective finished (successfully or not; wait() tells which).
        Makes one progress pass if the engine is free, like MPI_Test."""
        if not self._done:
            self._engine.poke(self)
        return self._done

    def exception(self):
        """The error the collective failed with; None if it succeeded or is pending."""
        return self.error if self._done else None

    def add_done_callback(self, fn) -> None:
        """Call ``fn(work)`` once, on completion: at once if already complete, else on the
        thread that completes it (the engine thread, or a thread in wait()), after it let
        go of the engine: fn may issue collectives and wait for them."""
        with _LOCK:
            if not self._done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                # _finish marks done before it looks for callbacks, without the lock: if it
                # did in between, it may have found none, and fn is ours to run
                if not self._done:
                    self._engine.wake.set()    # nobody may wait: the daemon must run it
                    return
                self._callbacks.remove(fn)
        fn(self)

    @property
    def counters(self) -> dict:
        return {"algo": self.lane.program.algo, "polls": self.polls, "tries": self.tries,
                "yields": self.yields, "yields_progress": self.yields_progress,
                "waits": self.lane.waits_done, "t_issue": self.t_issue,
                "t_start": self.t_start, "t_end": self.t_end,
                "queued_s": (self.t_start - self.t_issue) if self.t_start else None,
                "running_s": (self.t_end - self.t_start) if self.t_end and self.t_start
                else None}

    def _finish(self):
        """The collective completed (the engine's lock is held): returns its callbacks,
        which the engine runs once it let go of the lock."""
        if self.error is not None:
            self.result = None
        if self._callbacks is None:
            self._done = True       # add_done_callback re-checks under the lock
            if self._callbacks is None:
                return None
        with _LOCK:
            self._done = True
            callbacks, self._callbacks = self._callbacks, None
        return callbacks

    def __repr__(self) -> str:
        return f"<Work {self.describe()} {'done' if self._done else 'pending'}>"
