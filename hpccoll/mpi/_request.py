"""Requests of the adapter's nonblocking collectives, with mpi4py's Request methods.

A ``Request`` wraps an hpccoll ``Work``.  Waiting drives hpccoll's engine, so a
collective progresses however the application waits.  ``Waitall``/``Testall`` (and
the lower-case, pickle-style ``waitall``/``testall``) take lists that mix these with
plain ``MPI.Request`` objects (what forwarded calls return).  ``MPI.Request.Waitall``
itself only knows MPI requests and raises TypeError for these.
"""
from __future__ import annotations

from ._types import MPI


def _empty(status) -> None:
    """MPI's empty status: what a completed collective reports."""
    if status is not None:
        status.Set_source(MPI.ANY_SOURCE)
        status.Set_tag(MPI.ANY_TAG)
        status.Set_error(MPI.SUCCESS)
        status.Set_elements(MPI.BYTE, 0)


class Request:
    """A pending native collective (like ``MPI.Request`` from ``Iallreduce`` etc.)."""

    __slots__ = ("_work",)

    def __init__(self, work):
        self._work = work

    def __repr__(self) -> str:
        return f"<hpccoll.mpi.Request {self._work!r}>"

    @property
    def work(self):
        """The hpccoll Work behind this request (counters, callbacks)."""
        return self._work

    def Wait(self, status=None) -> bool:
        self._work.wait()      # raises the collective's error, if any
        _empty(status)
        return True

    def Test(self, status=None) -> bool:
        if not self._work.test():
            return False
        return self.Wait(status)

    def wait(self, status=None):
        self.Wait(status)
        return None            # buffer collectives carry no object

    def test(self, status=None):
        return (self.Test(status), None)

    def Get_status(self, status=None) -> bool:
        """Whether it completed, without waiting (like MPI_Request_get_status)."""
        done = self._work.test()
        if done:
            _empty(status)
        return done

    # -- lists, mixed with MPI.Request ------------------------------------------------
    @staticmethod
    def Waitall(requests, statuses=None) -> bool:
        """Wait for every request; returns True (like ``MPI.Request.Waitall``)."""
        mine, theirs = _sort(requests)
        for i, r in mine:
            r.Wait(statuses[i] if statuses is not None else None)
        if theirs:
            sts = [statuses[i] for i, _ in theirs] if statuses is not None else None
            MPI.Request.Waitall([r for _, r in theirs], sts)
        return True

    @staticmethod
    def Testall(requests, statuses=None) -> bool:
        """True when every request completed (then their errors are raised)."""
        mine, theirs = _sort(requests)
        flags = [r._work.test() for _, r in mine]
        if theirs:
            sts = [statuses[i] for i, _ in theirs] if statuses is not None else None
            flags.append(MPI.Request.Testall([r for _, r in theirs], sts))
        if not all(flags):
            return False
        for i, r in mine:
            r.Wait(statuses[i] if statuses is not None else None)
        return True

    @staticmethod
    def waitall(requests, statuses=None) -> list:
        Request.Waitall(requests, statuses)
        return [None] * len(requests)

    @staticmethod
    def testall(requests, statuses=None):
        if Request.Testall(requests, statuses):
            return True, [None] * len(requests)
        return False, None


def _sort(requests):
    """(adapter requests, MPI requests), each as (position, request)."""
    requests = list(requests)
    mine, theirs = [], []
    for i, r in enumerate(requests):
        if isinstance(r, Request):
            mine.append((i, r))
        elif isinstance(r, MPI.Request):
            theirs.append((i, r))
        else:
            raise TypeError(f"Cannot convert {type(r).__name__} to a request "
                            "(expected hpccoll.mpi.Request or mpi4py.MPI.Request)")
    return mine, theirs
