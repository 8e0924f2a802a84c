"""Scheduling policies, one per module with the same shape:

    class XPolicy:
        name: str
        def __init__(self, settings)
        def admit(self, task)      # a submitted task enters the policy
        def step(self, engine)     # one pass: poll, start, switch; True if anything progressed
        def live(self)             # tasks not finished, in the policy's order
        def remove(self, task)     # drop a task that failed outside the policy

The table is ordered from the recommended default to the baseline.
"""
from __future__ import annotations

from .fifo import FifoPolicy
from .ordered import OrderedPolicy
from .preemptive import PreemptivePolicy

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
