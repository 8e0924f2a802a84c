"""Compile each (target, op, dtype, sources) kernel once, keep it, and remember what
compiling cost.  Numba compiles lazily on the first launch with new argument types; the
registry forces that first launch on tiny arrays (warm-up), so the cost lands where the
caller chooses (at init, or before a collective is queued) and never inside the engine's
progress loop."""
from __future__ import annotations

import threading
import time

_LOCK = threading.Lock()
_KERNELS: dict = {}
COMPILE_SECONDS: dict = {}   # (target, kind, op, dtype, k) -> seconds the first use took


def get(key: tuple, build):
    """The kernel for ``key``; ``build()`` makes and warms it up the first time."""
    k = _KERNELS.get(key)
    if k is not None:
        return k
    with _LOCK:
        k = _KERNELS.get(key)
        if k is None:
            t0 = time.perf_counter()
            k = build()
            COMPILE_SECONDS[key] = time.perf_counter() - t0
            _KERNELS[key] = k
    return k


def compiled() -> dict:
    return dict(COMPILE_SECONDS)
