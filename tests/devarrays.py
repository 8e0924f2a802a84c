"""Device-array stand-ins for tests without a GPU: objects exposing
__cuda_array_interface__ over host memory, as mpi4py's own tests do.  hpccoll treats them
as device arrays (under the CUDA simulator the "device" is host memory)."""
import numpy as np


class HostCAI:
    def __init__(self, arr: np.ndarray, stream=None):
        self.arr = arr
        self.stream = stream

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.arr.shape, "typestr": self.arr.dtype.str,
                "data": (self.arr.ctypes.data, not self.arr.flags.writeable),
                "version": 3, "stream": self.stream,
                "strides": None if self.arr.flags.c_contiguous else self.arr.strides}


class InstanceCAI:
    """The interface as an attribute of the instance, not a property of its type, as
    mpi4py's own GPU-like test arrays carry it: found only by looking at the object."""

    def __init__(self, arr: np.ndarray):
        self.arr = arr
        self.__cuda_array_interface__ = {
            "shape": arr.shape, "typestr": arr.dtype.str, "version": 3, "stream": None,
            "data": (arr.ctypes.data, not arr.flags.writeable),
            "strides": None if arr.flags.c_contiguous else arr.strides}


class RaisingCAI:
    """A __cuda_array_interface__ property that raises, as torch's does for a tensor that
    requires grad: recognising it must not read it."""

    def __init__(self, arr: np.ndarray):
        self.arr = arr

    @property
    def __cuda_array_interface__(self):
        raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires grad")


def host(x) -> np.ndarray:
    """The host copy of whatever hpccoll returned (a HostCAI or a simulator device array)."""
    if isinstance(x, (HostCAI, InstanceCAI)):
        return x.arr
    if hasattr(x, "copy_to_host"):
        return x.copy_to_host()
    return np.asarray(x)
