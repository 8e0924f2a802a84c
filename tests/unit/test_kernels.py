"""numba_kernels: every op x dtype, odd sizes, several block/thread shapes, k sources,
dst aliasing a source; CUDA kernels in Numba's simulator (tests/conftest.py), CPU kernels
for real; compared with NumPy."""
import warnings

import numpy as np
import pytest

from numba_kernels import ops, registry

NP = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


def sources(dtype, n, k, seed):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return [rng.uniform(0.5, 1.5, n).astype(dtype) for _ in range(k)]
    lo = 0 if np.dtype(dtype).kind == "u" else -3
    return [rng.integers(lo, 4, n).astype(dtype) for _ in range(k)]


def expected(op, srcs):
    dt = srcs[0].dtype
    acc = srcs[0].astype(np.float32) if dt == np.float16 else srcs[0].copy()
    for s in srcs[1:]:
        NP[op](acc, s, out=acc, casting="unsafe")
    return acc.astype(dt)


def close(got, want):
    if got.dtype.kind == "f":
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                   rtol=2 * np.finfo(got.dtype).eps * 4)
    else:
        np.testing.assert_array_equal(got, want)


@pytest.fixture(scope="module")
def cuda():
    from numba import config, cuda
    if not config.ENABLE_CUDASIM and not cuda.is_available():
        pytest.skip("no CUDA GPU and the simulator is off (HPCCOLL_TEST_REAL_GPU=1)")
    from numba_kernels import cuda as kernels
    return cuda, kernels


@pytest.mark.parametrize("dtype", ops.DTYPES)
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
def test_cuda_reduce_every_op_dtype(cuda, dtype, op):
    cu, k = cuda
    for n, (blocks, tpb), nsrc in [(0, (1, 1), 2), (1, (1, 4), 2), (37, (2, 8), 3), (301, (3, 16), 5)]:
        srcs = sources(dtype, n, nsrc, seed=n)
        dev = [cu.to_device(s) for s in srcs]
        out = cu.device_array(n, dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)   # int8 prod wraps, as MPI's does
            k.reduce(op, out, dev, blocks=blocks, threads_per_block=tpb)
            want = expected(op, srcs)
        close(out.copy_to_host(), want)


@pytest.mark.parametrize("dtype", ["float16", "float32", "int32"])
def test_cuda_dst_aliases_a_source(cuda, dtype):
    cu, k = cuda
    a, b = sources(dtype, 53, 2, seed=1)
    da, db = cu.to_device(a), cu.to_device(b)
    k.reduce("sum", da, [da, db], blocks=2, threads_per_block=8)
    close(da.copy_to_host(), expected("sum", [a, b]))


def test_cuda_float16_accumulates_in_float32(cuda):
    """Four float16 values whose pairwise float16 sums round away the small ones."""
    cu, k = cuda
    big = np.full(4, 2048, np.float16)
    one = np.ones(4, np.float16)
    out = cu.device_array(4, np.float16)
    k.reduce("sum", out, [cu.to_device(x) for x in (big, one, one, one)], blocks=1,
             threads_per_block=4)
    # pairwise in float16: 2048+1 -> 2048 three times; float32 accumulation: 2051 -> 2052
    assert out.copy_to_host().tolist() == [2052.0] * 4


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_cuda_scale_and_copy(cuda, dtype):
    cu, k = cuda
    x = np.arange(29, dtype=dtype)
    d = cu.to_device(x)
    k.scale(d, d, 4, blocks=2, threads_per_block=4)
    close(d.copy_to_host(), (x.astype(np.float32) / 4).astype(dtype))
    e = cu.device_array(29, dtype)
    k.copy(e, d, blocks=3, threads_per_block=2)
    np.testing.assert_array_equal(e.copy_to_host(), d.copy_to_host())


def test_default_blocks_rule():
    from numba_kernels import cuda as k
    assert k.default_blocks(0, 256, 64) == 1
    assert k.default_blocks(256 * 8, 256, 64) == 1
    assert k.default_blocks(256 * 8 + 1, 256, 64) == 2
    assert k.default_blocks(1 << 30, 256, 64) == 64


@pytest.mark.parametrize("dtype", ops.DTYPES)
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
def test_cpu_reduce_every_op_dtype(dtype, op):
    from numba_kernels import cpu
    for n, threads, nsrc in [(0, 1, 2), (1, 1, 2), (37, 2, 3), (1001, 2, 4)]:
        srcs = sources(dtype, n, nsrc, seed=n)
        out = np.empty(n, dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            cpu.reduce(op, out, srcs, blocks=threads)
            want = expected(op, srcs) if np.dtype(dtype) == np.float16 else \
                __import__("functools").reduce(lambda a, b: NP[op](a, b), srcs)
        close(out, want)


def test_cpu_scale_copy_and_aliasing():
    from numba_kernels import cpu
    a = np.arange(10, dtype=np.float64)
    b = np.ones(10)
    cpu.reduce("sum", a, (a, b), blocks=2)
    np.testing.assert_array_equal(a, np.arange(10) + 1)
    cpu.scale(a, a, 2, blocks=2)
    np.testing.assert_array_equal(a, (np.arange(10) + 1) / 2)
    c = np.empty(10)
    cpu.copy(c, a, blocks=1)
    np.testing.assert_array_equal(c, a)


def test_registry_compiles_once_and_records_the_cost():
    from numba_kernels import cpu
    cpu.prepare("max", np.int16)
    key = ("cpu", "reduce", "max", np.dtype(np.int16).str, 2)
    assert key in registry.COMPILE_SECONDS and registry.COMPILE_SECONDS[key] > 0
    first = registry._KERNELS[key]
    cpu.prepare("max", np.int16)
    assert registry._KERNELS[key] is first


def test_import_is_lazy():
    import subprocess
    import sys
    code = "import sys, numba_kernels, hpccoll; print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
