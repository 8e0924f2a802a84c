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

POLICIES = {
    "fifo": FifoPolicy,
}


def make(settings):
    return POLICIES[settings.policy](settings)
