"""Real-GPU checks: CuPy arrays and numba_kernels on an actual device.  They run from
scripts/device_check.sh (HPCCOLL_TEST_REAL_GPU=1) on a machine with a GPU, and are
skipped elsewhere with the reason, never faked: CI has no GPU."""
import os

import numpy as np
import pytest

REASON = "needs a CUDA GPU, CuPy and HPCCOLL_TEST_REAL_GPU=1 (scripts/device_check.sh sets it)"


def _gpu_available() -> bool:
    if os.environ.get("HPCCOLL_TEST_REAL_GPU") != "1":
        return False
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _gpu_available(), reason=REASON)]


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "int64", "float16", "float32", "float64"])
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
def test_kernels_match_cupy(dtype, op):
    import cupy
    from numba import cuda
    from numba_kernels import cuda as k
    n = 1_000_003
    rng = cupy.random.default_rng(0)
    a = (rng.integers(-3, 4, n) if np.dtype(dtype).kind in "iu" else rng.uniform(0.5, 1.5, n)).astype(dtype)
    b = (rng.integers(0, 4, n) if np.dtype(dtype).kind in "iu" else rng.uniform(0.5, 1.5, n)).astype(dtype)
    out = cupy.empty(n, dtype)
    k.reduce(op, cuda.as_cuda_array(out), (cuda.as_cuda_array(a), cuda.as_cuda_array(b)),
             blocks=37, threads_per_block=256)
    cuda.synchronize()
    want = {"sum": cupy.add, "prod": cupy.multiply, "min": cupy.minimum, "max": cupy.maximum}[op](a, b)
    if np.dtype(dtype).kind == "f":
        cupy.testing.assert_allclose(out, want, rtol=4 * np.finfo(dtype).eps)
    else:
        cupy.testing.assert_array_equal(out, want)


def test_single_rank_allreduce_of_cupy_arrays():
    import cupy
    import hpccoll
    with hpccoll.init() as ctx:
        x = cupy.arange(1000, dtype=cupy.float32)
        got = ctx.world.allreduce(x, op="avg").wait()
        assert isinstance(got, cupy.ndarray) and got.device == x.device
        cupy.testing.assert_array_equal(got, x)
