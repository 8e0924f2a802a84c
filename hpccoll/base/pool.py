"""Reusable buffers by size class (powers of two), so that collectives do not allocate
memory proportional to the message on every call: scratch space per communicator (host)
and pinned staging buffers (device)."""
from __future__ import annotations

import threading
from typing import Callable

import numpy as np

MIN_BYTES = 4096


class BufferPool:
    def __init__(self, allocate: Callable[[int], np.ndarray] = lambda n: np.empty(n, np.uint8)):
        self._allocate = allocate
        self._free: dict = {}
        self._lock = threading.Lock()
        self.allocated = 0      # bytes ever allocated (the pool's footprint)

    def get(self, nbytes: int) -> np.ndarray:
        """A uint8 buffer of at least nbytes (its size is the size class)."""
        size = max(MIN_BYTES, 1 << (max(1, nbytes) - 1).bit_length())
        with self._lock:
            free = self._free.get(size)
            if free:
                return free.pop()
            self.allocated += size
        return self._allocate(size)

    def put(self, buf: np.ndarray) -> None:
        with self._lock:
            self._free.setdefault(buf.size, []).append(buf)
