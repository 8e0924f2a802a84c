"""The one op table (hpccoll/core/ops.py): every backend gives the same bits as the NumPy
reference for every (op, dtype) on the same inputs -- NumPy, numba_kernels' CPU kernels,
their CUDA kernels (Numba's simulator here, a GPU in scripts/device_check.sh) and the MPI
library's own ops (``Op.Reduce_local``, for the dtypes MPI has) -- and the rules the
table states: float16 accumulates in float32 and rounds once; avg never overflows where
the average fits; min and max propagate NaN like NumPy."""
import warnings

import numpy as np
import pytest

from hpccoll.base import ops
from hpccoll.transport.reduction import CpuKernelOps, HostOps

DTYPES = list(ops.CONTRACT_DTYPES) + (["bfloat16"] if ops.BFLOAT16 is not None else [])
N = 33


def inputs(op, dtype, k, seed):
    """k arrays of N values: small integers, or floats near 1 with a NaN, an inf and a
    signed zero for min and max."""
    dt = ops.DTYPES[dtype]
    rng = np.random.default_rng(seed)
    if ops.dtype_kind(dt) == "f":
        srcs = [rng.uniform(0.5, 1.5, N).astype(np.float32).astype(dt) for _ in range(k)]
        if op in ("min", "max"):
            srcs[0][3], srcs[-1][5], srcs[0][7], srcs[-1][7] = np.nan, np.inf, 0.0, -0.0
        return srcs
    lo = 0 if dt.kind == "u" else -4
    return [rng.integers(lo, 5, N).astype(dt) for _ in range(k)]


def reference(op, srcs, divisor):
    out = np.empty_like(srcs[0])
    ops.reduce_n(op, out, srcs, divisor)
    return out


def same_bits(got, want, what):
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(got).view(np.uint8), want.view(np.uint8),
                                  err_msg=what)


def cases():
    for dtype in DTYPES:
        for op in ops.KERNEL_OPS:
            if ops.dtype_kind(ops.DTYPES[dtype]) in ops.OPS[op].kinds:
                yield op, dtype


@pytest.fixture(scope="module")
def cuda():
    from numba import config, cuda
    if not config.ENABLE_CUDASIM and not cuda.is_available():
        pytest.skip("no CUDA GPU and the simulator is off (HPCCOLL_TEST_REAL_GPU=1)")
    from numba_kernels import cuda as kernels
    return cuda, kernels


@pytest.mark.parametrize("op,dtype", list(cases()))
def test_cpu_kernels_match_the_reference(op, dtype):
    backend = CpuKernelOps(2)
    for k in (1, 2, 3, 5):
        if k == 1 and op != "avg":
            continue
        srcs = inputs(op, dtype, k, seed=k)
        divisor = 3 if op == "avg" else 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)    # int8 prod wraps, as MPI's does
            want = reference(op, srcs, divisor)
            got = np.empty_like(srcs[0])
            backend.reduce_n(op, got, srcs, divisor)
            same_bits(got, want, f"{op} {dtype} k={k}")
            if k == 2 and op != "avg":
                pair = np.empty_like(srcs[0])
                backend.reduce(op, pair, *srcs)
                same_bits(pair, want, f"{op} {dtype} binary")
                HostOps.reduce(op, pair, *srcs)
                same_bits(pair, want, f"{op} {dtype} NumPy binary")


@pytest.mark.parametrize("op,dtype", [c for c in cases() if c[1] != "bfloat16"])
def test_cuda_kernels_match_the_reference(cuda, op, dtype):
    cu, kernels = cuda
    for k in (2, 3, 5):
        srcs = inputs(op, dtype, k, seed=10 + k)
        divisor = 3 if op == "avg" else 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            want = reference(op, srcs, divisor)
            out = cu.device_array(N, srcs[0].dtype)
            kernels.reduce(op, out, [cu.to_device(s) for s in srcs], blocks=2,
                           threads_per_block=8, divisor=divisor)
        same_bits(out.copy_to_host(), want, f"{op} {dtype} k={k}")


@pytest.mark.parametrize("op,dtype", [c for c in cases() if ops.mpi_native(c[0], ops.DTYPES[c[1]])])
def test_mpi_ops_match_the_reference(op, dtype):
    """The ``mpi`` row: MPI combines two contributions (avg: each divided first, as the
    MpiLane does) with its own op, which the table names; the adapter maps it back."""
    from hpccoll.transport import mpi as transport
    a, b = inputs(op, dtype, 2, seed=7)
    if op in ("min", "max"):
        # MPI's MIN/MAX are C comparisons: NaN and which zero a tie of 0.0 and -0.0 gives
        # are the MPI library's choice (it does not say in which order it combines)
        a, b = (np.where(x == 0, 0, np.nan_to_num(x, nan=0.25)).astype(x.dtype) for x in (a, b))
    divisor = 2 if op == "avg" else 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = reference(op, [a, b], divisor)
        if divisor:
            ops.scale(a, a, divisor)
            ops.scale(b, b, divisor)
        mpi_op = transport.mpi_op(op)
        mpi_op.Reduce_local(a, b)       # b = a (op) b
    same_bits(b, want, f"{op} {dtype}")
    if op != "avg":
        assert transport.op_of_mpi(mpi_op) == op


def test_float16_accumulates_in_float32_and_rounds_once(cuda):
    """Pairwise in float16, 2048 + 1 rounds back to 2048 three times; in float32 the sum is
    2051, rounded once to 2052: on every backend."""
    srcs = [np.full(4, 2048, np.float16)] + [np.ones(4, np.float16)] * 3
    for backend in (HostOps, CpuKernelOps(2)):
        out = np.empty(4, np.float16)
        backend.reduce_n("sum", out, srcs)
        assert out.tolist() == [2052.0] * 4, backend.name
    cu, kernels = cuda
    dev = cu.device_array(4, np.float16)
    kernels.reduce("sum", dev, [cu.to_device(s) for s in srcs], blocks=1, threads_per_block=4)
    assert dev.copy_to_host().tolist() == [2052.0] * 4


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_avg_does_not_overflow_where_the_average_fits(cuda, dtype):
    big = {"float16": 40000.0, "float32": 3e38}[dtype]
    for k in (2, 3):
        srcs = [np.full(5, big, dtype) for _ in range(k)]
        for backend in (HostOps, CpuKernelOps(2)):
            out = np.empty(5, dtype)
            backend.reduce_n("avg", out, srcs, k)
            assert np.isfinite(out).all() and np.allclose(out, big, rtol=1e-3), backend.name
        cu, kernels = cuda
        dev = cu.device_array(5, dtype)
        kernels.reduce("avg", dev, [cu.to_device(s) for s in srcs], blocks=1,
                       threads_per_block=4, divisor=k)
        assert np.isfinite(dev.copy_to_host()).all()


def test_check_op_names_the_argument():
    with pytest.raises(ops.ArgumentError, match="op: expected one of"):
        ops.check_op("median", np.dtype(np.float32))
    with pytest.raises(ops.ArgumentError, match="avg.*floating"):
        ops.check_op("avg", np.dtype(np.int32))
    assert ops.check_op("SUM", np.dtype(np.int32)) == "sum"
    assert ops.accumulator(np.dtype(np.float16)) == np.float32
