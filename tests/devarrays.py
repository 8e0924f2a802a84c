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


def host(x) -> np.ndarray:
    """The host copy of whatever hpccoll returned (a HostCAI or a simulator device array)."""
    if isinstance(x, HostCAI):
        return x.arr
    if hasattr(x, "copy_to_host"):
        return x.copy_to_host()
    return np.asarray(x)
