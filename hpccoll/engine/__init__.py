"""The progress engine: queues, policies, watchdog and control plane."""
from .engine import Engine

__all__ = ["Engine"]
