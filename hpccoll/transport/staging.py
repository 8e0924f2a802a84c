"""Device memory and MPI: what a collective over device arrays needs at run time.

- ``mpi_cuda_aware()``: whether the MPI library takes device pointers itself
  (``MPIX_Query_cuda_support``);
- ``mpi_view``: what to hand such an MPI for a device region;
- ``STAGING``: pinned host buffers, reused by size class, that device data passes through
  when MPI is not CUDA-aware (device -> host before a send, host -> device after a receive);
- ``engine_stream(device)``: hpccoll's stream on a GPU (one per process and device), on
  which every kernel and copy of a device collective on that GPU runs, so they stay
  ordered whichever thread drives the engine; ``on_device`` makes a GPU current;
- ``scratch_pool``/``scratch``: device scratch memory by size class and GPU, reused by later
  collectives (all on hpccoll's stream, so in stream order) instead of a cudaMalloc and
  a deferred free (which synchronizes the whole device) per collective.

Under ``NUMBA_ENABLE_CUDASIM=1`` (tests without a GPU) "device" memory is host memory:
views are the simulator's arrays over it, and the direct path hands MPI host pointers.
"""
from __future__ import annotations

import contextlib
import ctypes
import threading
from typing import Any

import numpy as np
from mpi4py import MPI

from ..base.pool import BufferPool


def _cuda():
    from numba import cuda
    return cuda


_AWARE = None


def mpi_cuda_aware() -> bool:
    """MPIX_Query_cuda_support() of the MPI library mpi4py is linked to (False if unknown)."""
    global _AWARE
    if _AWARE is None:
        try:
            fn = getattr(ctypes.CDLL(MPI.__file__), "MPIX_Query_cuda_support", None)
            _AWARE = bool(fn()) if fn is not None else False
        except OSError:
            _AWARE = False
    return _AWARE


def mpi_view(dev) -> Any:
    """What to hand MPI for a device region on the direct (CUDA-aware) path."""
    if type(dev).__name__ == "FakeCUDAArray":
        return dev._ary.view(np.uint8)
    return [dev, MPI.BYTE]


def _pinned(nbytes: int):
    return _cuda().pinned_array(nbytes, dtype=np.uint8)


STAGING = BufferPool(_pinned)
_STREAMS: dict = {}
_STREAM_LOCK = threading.Lock()


def on_device(device):
    """A context manager making GPU ``device`` current (None: leave the current one)."""
    if device is None:
        return contextlib.nullcontext()
    return _cuda().gpus[device]


def engine_stream(device=None):
    """hpccoll's stream on ``device`` (None: the current one): one per process and GPU,
    used by whichever thread drives the engine."""
    stream = _STREAMS.get(device)
    if stream is None:
        with _STREAM_LOCK:
            stream = _STREAMS.get(device)
            if stream is None:
                with on_device(device):
                    stream = _STREAMS[device] = _cuda().stream()
    return stream


def record(stream) -> Any:
    """An event recorded now on ``stream``: done once everything queued before it is."""
    cuda = _cuda()
    try:
        event = cuda.event(timing=False)
    except TypeError:          # the simulator's takes no argument
        event = cuda.event()
    event.record(stream=stream)
    return event


def done(event) -> bool:
    """Has the event completed?  Polled, never waited for (the simulator's have no query:
    everything it queues has run by the time it returns)."""
    query = getattr(event, "query", None)
    return True if query is None else bool(query())


def empty(n: int, dtype) -> Any:
    """Device memory of its own (not pooled)."""
    return _cuda().device_array(max(0, n), dtype=dtype)


_SCRATCH: dict = {}


def scratch_pool(device=None) -> BufferPool:
    """Device scratch by size class, one pool per GPU."""
    pool = _SCRATCH.get(device)
    if pool is None:
        def allocate(nbytes):
            with on_device(device):
                return _cuda().device_array(nbytes, dtype=np.uint8)
        pool = _SCRATCH.setdefault(device, BufferPool(allocate))
    return pool


def scratch(n: int, dtype, device=None) -> tuple:
    """(n elements of device scratch typed ``dtype`` on ``device``, the pooled buffer
    under it to give back to scratch_pool(device), or None when n is 0)."""
    if n <= 0:
        with on_device(device):
            return empty(0, dtype), None
    nbytes = n * np.dtype(dtype).itemsize
    raw = scratch_pool(device).get(nbytes)
    return raw[:nbytes].view(dtype), raw
