"""Device (CUDA) arrays as collective arguments: recognition, validation and views.
Imported only when a collective receives a device array.

Accepted: CuPy arrays, Numba device arrays, any object with ``__cuda_array_interface__``
(v2/v3), and DLPack producers whose ``__dlpack_device__`` is CUDA (through CuPy).  The
engine works on Numba device-array views of the user's memory (no copy); how their
bytes reach MPI is hpccoll/transport/staging.py's part.

Stream semantics: submitting a collective never blocks the host.  hpccoll's kernels and
copies run on its own stream (one per process), which waits, on the device, for an event
recorded on the stream named in the array's ``__cuda_array_interface__`` (``order_after``:
work already queued there is finished before hpccoll reads the array; 1 and 2 name the
legacy and the per-thread default stream); ``wait()`` returns once hpccoll's stream has
finished, so the result is ready then.
"""
from __future__ import annotations

import ctypes
from typing import Any, NamedTuple

import numpy as np

from ..base.ops import CONTRACT_DTYPES, dtype_name
from ..engine.lane import DetourLane
from ..engine.program import DeviceLane
from ..errors import ArgumentError, ArgumentTypeError, HpcCollError
from ..transport import staging
from ..transport.reduction import CudaOps

DEVICE_DTYPES = tuple(np.dtype(d) for d in CONTRACT_DTYPES)


def _cuda():
    try:
        from numba import cuda
    except ImportError as exc:  # pragma: no cover - numba is a dependency
        raise HpcCollError("device arrays need numba (pip install numba)") from exc
    return cuda


def simulated() -> bool:
    from numba import config
    return bool(config.ENABLE_CUDASIM)


def _has_cai(obj: Any) -> bool:
    """Whether obj offers __cuda_array_interface__, without reading it: it may be a
    property that raises (torch, for tensors that require grad)."""
    return (hasattr(type(obj), "__cuda_array_interface__")
            or "__cuda_array_interface__" in getattr(obj, "__dict__", ()))


def is_device_array(obj: Any) -> bool:
    if isinstance(obj, np.ndarray):
        return False
    if _has_cai(obj):
        return True
    if type(obj).__name__ == "FakeCUDAArray":
        return True
    dev = getattr(obj, "__dlpack_device__", None)
    if dev is not None:
        try:
            return dev()[0] in (2, 13)     # kDLCUDA, kDLCUDAManaged
        except Exception:
            return False
    return False


def _interface(obj: Any, name: str) -> dict:
    if type(obj).__name__ == "FakeCUDAArray":   # the simulator's own arrays
        a = obj._ary
        return {"shape": a.shape, "typestr": a.dtype.str, "strides": None if a.flags.c_contiguous
                else a.strides, "data": (a.__array_interface__["data"][0], not a.flags.writeable),
                "version": 3, "stream": None}
    if not _has_cai(obj):     # DLPack producer on a CUDA device
        try:
            import cupy
        except ImportError:
            raise ArgumentTypeError(f"{name}: a DLPack CUDA array needs CuPy to be imported "
                                    "(pip install cupy-cuda12x)") from None
        try:
            obj = cupy.from_dlpack(obj)
        except Exception as exc:
            raise ArgumentTypeError(f"{name}: CuPy could not take this DLPack array: "
                                    f"{type(exc).__name__}: {exc}") from exc
    try:
        cai = obj.__cuda_array_interface__      # a property: torch raises for some tensors
        tuple(cai["shape"]), cai["typestr"]     # present and well-formed, or raise here
        int(cai["data"][0] or 0), bool(cai["data"][1])
    except Exception as exc:
        raise ArgumentTypeError(
            f"{name}: {type(obj).__name__}'s __cuda_array_interface__ is not usable "
            f"({type(exc).__name__}: {exc}); pass a CuPy or Numba device array, or a "
            f"contiguous tensor that exports one") from exc
    return cai


def _contiguous(shape, strides, itemsize) -> bool:
    if strides is None:
        return True
    expected = itemsize
    for dim, stride in zip(reversed(shape), reversed(strides)):
        if dim > 1 and stride != expected:
            return False
        expected *= dim
    return True


def _view(obj: Any, cai: dict, dtype: np.dtype, n: int):
    """A 1-D Numba device-array view of the memory (no copy)."""
    cuda = _cuda()
    if type(obj).__name__ == "FakeCUDAArray":
        return obj.ravel() if hasattr(obj, "ravel") else obj
    if simulated():
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
        ptr = cai["data"][0]
        if n == 0:
            return FakeCUDAArray(np.empty(0, dtype))
        raw = (ctypes.c_byte * (n * dtype.itemsize)).from_address(ptr)
        view = FakeCUDAArray(np.frombuffer(raw, dtype=dtype))
        view._hpccoll_owner = obj    # the memory belongs to obj: keep it alive with the view
        return view
    if not hasattr(obj, "__cuda_array_interface__"):
        import cupy
        obj = cupy.from_dlpack(obj)
    try:    # no host synchronize of the array's stream: order_after orders on the device
        arr = cuda.as_cuda_array(obj, sync=False)
    except TypeError:          # a Numba without the argument
        arr = cuda.as_cuda_array(obj)
    return arr.reshape(n) if arr.ndim != 1 else arr


class DeviceArray(NamedTuple):
    """A validated device array: the user's object, a flat Numba view of its memory, its
    device pointer, the stream its producer named (CAI v3), if any, and its GPU (None:
    the current one)."""
    obj: Any
    view: Any
    ptr: int
    stream: Any
    device: Any = None

    @property
    def nbytes(self) -> int:
        return self.view.size * np.dtype(self.view.dtype).itemsize


def as_device(obj: Any, name: str, *, writable: bool = False) -> DeviceArray:
    cai = _interface(obj, name)
    try:
        dtype = np.dtype(cai["typestr"])
    except TypeError:
        raise ArgumentTypeError(f"{name}: unknown typestr {cai['typestr']!r}") from None
    if dtype not in DEVICE_DTYPES:
        if dtype.kind == "V":       # no NumPy type: bfloat16 and other 2-byte floats say '<V2'
            what = (f"raw {dtype.itemsize}-byte elements (typestr {cai['typestr']!r}: "
                    f"bfloat16, as DLPack and some libraries export it, looks like this)")
        else:
            what = dtype_name(dtype)
        raise ArgumentTypeError(f"{name}: dtype {what} is not supported on the device; "
                                f"expected one of {', '.join(CONTRACT_DTYPES)}")
    shape = tuple(cai["shape"])
    if not _contiguous(shape, cai.get("strides"), dtype.itemsize):
        raise ArgumentError(f"{name}: expected a C-contiguous device array")
    ptr, readonly = cai["data"]
    if writable and readonly:
        raise ArgumentError(f"{name}: expected a writable device array, got a read-only one")
    n = int(np.prod(shape)) if shape else 1
    stream = cai.get("stream") if cai.get("version", 0) >= 3 else None
    try:
        view = _view(obj, cai, dtype, n)
    except HpcCollError:
        raise
    except Exception as exc:    # no CUDA driver or GPU (Numba's CudaSupportError), ...
        raise ArgumentTypeError(
            f"{name}: a device array ({type(obj).__name__} with __cuda_array_interface__), "
            f"but CUDA cannot take it here ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); pass a NumPy array, or run "
            "where a GPU and its driver are") from exc
    return DeviceArray(obj, view, int(ptr or 0), stream, _device_of(obj, int(ptr or 0)))


def _device_of(obj: Any, ptr: int):
    """The GPU the memory is on: CuPy says it; for any other pointer, CUDA's pointer
    attributes (through CuPy, when it is there); None (the current device) otherwise."""
    dev = getattr(obj, "device", None)
    ident = getattr(dev, "id", None)
    if isinstance(ident, int):
        return ident
    if not ptr or simulated():
        return None
    try:
        import cupy
        return int(cupy.cuda.runtime.pointerGetAttributes(ptr).device)
    except Exception:
        return None


def new_device_array(like: DeviceArray, n: int) -> DeviceArray:
    """recvbuf=None: an array of the same kind as the input, on the same device."""
    obj = like.obj
    dt = np.dtype(like.view.dtype)
    if type(obj).__module__.split(".")[0] == "cupy":
        import cupy
        with cupy.cuda.Device(obj.device.id):
            out = cupy.empty(n, dtype=dt)
    else:
        out = _cuda().device_array(n, dtype=dt)
    return as_device(out, "recvbuf", writable=True)


def order_after(handle, engine_stream) -> None:
    """Make ``engine_stream`` wait, on the device, for the work queued so far on an
    array's own stream (CAI v3 ``stream``): an event recorded there and waited on by
    hpccoll's stream.  The host never blocks.  None: the producer asks for no ordering."""
    if handle in (None, 0) or simulated():     # the simulator runs every launch at once
        return
    cuda = _cuda()
    if handle == 1:
        source = cuda.legacy_default_stream()
    elif handle == 2:
        source = cuda.per_thread_default_stream()
    else:
        source = cuda.external_stream(handle)
    event = cuda.event(timing=False)
    event.record(stream=source)
    event.wait(stream=engine_stream)


# -- the lanes of device collectives (core/state.py makes them) ------------------------------
def _engine_stream_after(call):
    """(GPU of the call's arrays, hpccoll's stream there), the stream ordered after the
    work queued so far on the arrays' own streams (on the device: the host never
    blocks)."""
    sdev, rdev = call.device
    gpu = sdev.device if sdev.device is not None else rdev.device   # validate: the same
    stream = staging.engine_stream(gpu)
    with staging.on_device(gpu):
        order_after(sdev.stream, stream)
        if rdev.obj is not sdev.obj and rdev.stream != sdev.stream:
            order_after(rdev.stream, stream)
    return gpu, stream


def detour_lane(plan, call) -> DetourLane:
    """A small device collective through the host (engine/lane.py: DetourLane)."""
    gpu, stream = _engine_stream_after(call)
    return DetourLane(plan.detour, call.send, call.recv, call.device, call.inplace,
                      stream, gpu)


def device_lane(plan, settings, call, tag, mpi_comm) -> DeviceLane:
    """Device arrays: CUDA kernels with the plan's blocks, on hpccoll's stream, ordered
    (on the device) after the work queued on the arrays' own streams; scratch from the
    device pool."""
    gpu, stream = _engine_stream_after(call)
    direct = {"yes": True, "no": False}.get(settings.cuda_aware)
    if direct is None:
        direct = staging.mpi_cuda_aware()
    scratch, raw = staging.scratch(plan.program.scratch, plan.dtype, gpu)
    lane = DeviceLane(plan.program, plan.code, [call.send, call.recv, scratch], plan.op,
                      mpi_comm, tag, CudaOps(plan.blocks, settings.threads_per_block, gpu),
                      direct)
    if raw is not None:       # back to the pool when the collective is released
        lane.pool, lane._pooled = staging.scratch_pool(gpu), raw
    return lane
