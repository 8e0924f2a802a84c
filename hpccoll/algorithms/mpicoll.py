"""Tiny messages through the MPI library's own nonblocking collectives.

Below a few KiB a collective is all latency, and the MPI library's tuned nonblocking
collectives (one C call, progressed by MPI) beat any sequence of Python-driven messages.
The step machine is one ``Coll`` and one ``Wait``: the collective is still a task of the
engine, can yield while the request is in flight, and is timed, traced and checked like
every other."""
from __future__ import annotations

from .primitives import RECV, SEND, Coll, Region, Scale, Wait
from .spec import Spec


def allreduce(spec: Spec):
    whole = Region(RECV, 0, spec.count)
    yield Coll(0, "allreduce", whole if spec.inplace else Region(SEND, 0, spec.count), whole)
    yield Wait(0)
    if spec.avg and spec.size > 1:
        yield Scale(whole, spec.size)


def broadcast(spec: Spec):
    whole = Region(RECV, 0, spec.count)
    yield Coll(0, "broadcast", whole, whole, spec.root)
    yield Wait(0)


def allgather(spec: Spec):
    """count: this rank's block; in place, it already sits in block ``rank`` of RECV."""
    whole = Region(RECV, 0, spec.size * spec.count)
    yield Coll(0, "allgather", whole if spec.inplace else Region(SEND, 0, spec.count), whole)
    yield Wait(0)


def alltoall(spec: Spec):
    """count: the block for each peer."""
    whole = Region(RECV, 0, spec.size * spec.count)
    yield Coll(0, "alltoall", whole if spec.inplace else Region(SEND, 0, spec.size * spec.count),
               whole)
    yield Wait(0)


def barrier(spec: Spec):
    empty = Region(RECV, 0, 0)
    yield Coll(0, "barrier", empty, empty)
    yield Wait(0)
