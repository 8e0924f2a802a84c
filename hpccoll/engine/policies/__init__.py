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
        def started_only(self)  # where a step would only poll started tasks: those
        def remove(self, task)  # drop a finished task
        def on_control(self, src, tag, payload)

``Policy`` (policies/base.py) holds the defaults.  The table is ordered from the
recommended default to the baseline.
"""
from __future__ import annotations

from .base import Parking, Policy  # noqa: F401  (what every policy shares)
from .fifo import FifoPolicy
from .ordered import OrderedPolicy
from .preemptive import PreemptivePolicy

# preemptive first: deadlock-free without coordination, and the default;
# ordered: deadlock-free by a negotiated global launch order (hpccoll/ordering: a tree);
# fifo last: the NCCL-like baseline that may deadlock.
POLICIES = {
    "preemptive": PreemptivePolicy,
    "ordered": OrderedPolicy,
    "fifo": FifoPolicy,
}


def make(settings):
    return POLICIES[settings.policy](settings)
