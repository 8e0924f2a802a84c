"""Device arrays through the whole stack, without a GPU: objects exposing
__cuda_array_interface__ over host memory (as mpi4py's tests do), reduced by
numba_kernels' CUDA kernels in Numba's simulator, moved by MPI either staged through
host buffers or directly (cuda_aware="yes"); results compared with MPI's own."""
import time

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
from tests.devarrays import HostCAI, host

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module", params=["no", "yes"], ids=["staged", "direct"])
def dctx(request):
    # small sizes, so that a few thousand elements already run hpccoll's own algorithms
    # on the device (5 elements take the host detour)
    c = hpccoll.init(timeout=120, threads_per_block=4, chunk_bytes=4096, small_msg_bytes=512,
                     device_host_bytes=64, cuda_aware=request.param)
    yield c
    c.close()


def ints(n, rank, dtype=np.int32, salt=0):
    return ((np.arange(n) * 7 + rank * 3 + salt) % 11 - 5).astype(dtype)


@pytest.mark.parametrize("dtype", ["int32", "float32", "float16", "int8"])
@pytest.mark.parametrize("count", [0, 5, 3001])
def test_allreduce_device(dctx, mpi_world, dtype, count):
    w = dctx.world
    x = ints(count, w.rank, dtype)
    for op in ["sum", "max"]:
        out = np.zeros(count, dtype)
        got = w.allreduce(HostCAI(x), HostCAI(out), op=op).wait()
        assert isinstance(got, HostCAI) and got.arr is out
        allx = np.empty((w.size, count), dtype)
        mpi_world.Allgather(x.view(np.uint8), allx.view(np.uint8))
        want = (allx.astype(np.float32).sum(0) if op == "sum" else allx.max(0)).astype(dtype)
        np.testing.assert_array_equal(out, want)


def test_recvbuf_none_returns_a_device_array(dctx):
    w = dctx.world
    got = w.allreduce(HostCAI(np.ones(7, np.float32)), op="avg").wait()
    assert not isinstance(got, np.ndarray) and hasattr(got, "copy_to_host")
    np.testing.assert_array_equal(host(got), np.ones(7, np.float32))


def test_every_collective_on_device(dctx, mpi_world):
    w = dctx.world
    n, r, m = w.size, w.rank, 13
    x = ints(n * m, r, np.int64)
    # reduce to the last rank
    out = np.zeros(n * m, np.int64)
    w.reduce(HostCAI(x), HostCAI(out), root=n - 1).wait()
    want = np.empty_like(x)
    mpi_world.Allreduce(x, want)
    if r == n - 1:
        np.testing.assert_array_equal(out, want)
    # broadcast in place
    b = ints(m, r, np.int64, salt=1)
    ref = b.copy()
    mpi_world.Bcast(ref, root=0)
    w.broadcast(HostCAI(b), root=0).wait()
    np.testing.assert_array_equal(b, ref)
    # allgather
    g = np.zeros(n * m, np.int64)
    w.allgather(HostCAI(x[:m]), HostCAI(g)).wait()
    gref = np.empty(n * m, np.int64)
    mpi_world.Allgather(x[:m], gref)
    np.testing.assert_array_equal(g, gref)
    # reduce_scatter
    rs = np.zeros(m, np.int64)
    w.reduce_scatter(HostCAI(x), HostCAI(rs)).wait()
    np.testing.assert_array_equal(rs, want[r * m:(r + 1) * m])
    # alltoall, in place
    a = x.copy()
    aref = np.empty_like(x)
    mpi_world.Alltoall(x, aref)
    w.alltoall(HostCAI(a), HostCAI(a)).wait()
    np.testing.assert_array_equal(a, aref)


def test_blocks_per_call_and_in_place(dctx, mpi_world):
    w = dctx.world
    x = ints(2001, w.rank, np.float32)
    want = np.empty_like(x)
    mpi_world.Allreduce(x, want)
    for blocks in (1, 3):
        y = x.copy()
        w.allreduce(HostCAI(y), HostCAI(y), blocks=blocks).wait()
        np.testing.assert_array_equal(y, want)


def test_device_input_errors(dctx):
    w = dctx.world
    with pytest.raises(hpccoll.ArgumentTypeError, match="recvbuf: sendbuf is a device array"):
        w.allreduce(HostCAI(np.ones(3, np.float32)), np.ones(3, np.float32))
    with pytest.raises(hpccoll.ArgumentTypeError, match="not supported on the device"):
        w.allreduce(HostCAI(np.ones(3, np.complex64)))
    ro = np.ones(3, np.float32)
    ro.flags.writeable = False
    with pytest.raises(hpccoll.ArgumentError, match="read-only"):
        w.allreduce(HostCAI(np.ones(3, np.float32)), HostCAI(ro))
    with pytest.raises(hpccoll.ArgumentError, match="C-contiguous"):
        w.allreduce(HostCAI(np.ones((4, 4), np.float32)[:, 1]))
    for blocks in (0, 10**6):
        with pytest.raises(hpccoll.ArgumentError, match="blocks: expected an integer from 1 "
                                                        "to 65536"):
            w.allreduce(HostCAI(np.ones(3, np.float32)), blocks=blocks)

    class Raising:         # torch's property raises for tensors that require grad
        @property
        def __cuda_array_interface__(self):
            raise RuntimeError("Can't export tensors that require grad")

    class Malformed:
        __cuda_array_interface__ = {"shape": (3,), "version": 3}

    class BFloat16:        # what a 2-byte float NumPy does not know looks like
        def __init__(self):
            self.raw = np.ones(3, np.float16)
            self.__cuda_array_interface__ = {
                "shape": (3,), "typestr": "<V2", "version": 3, "strides": None,
                "data": (self.raw.__array_interface__["data"][0], False)}

    with pytest.raises(hpccoll.ArgumentTypeError,
                       match="sendbuf: Raising's __cuda_array_interface__ is not usable "
                             r"\(RuntimeError: Can't export"):
        w.allreduce(Raising())
    with pytest.raises(hpccoll.ArgumentTypeError, match="Malformed's __cuda_array_interface__ "
                                                        r"is not usable \(KeyError"):
        w.allreduce(Malformed())
    with pytest.raises(hpccoll.ArgumentTypeError, match="raw 2-byte elements .*bfloat16"):
        w.allreduce(BFloat16())
    # nothing was queued: still in step
    assert host(w.allreduce(HostCAI(np.ones(2, np.float32))).wait()).tolist() == [w.size] * 2


def test_host_arrays_with_cpu_threads(mpi_world):
    """blocks= on host arrays: Numba CPU kernels on that many threads (as many as this
    rank has cores: Intel MPI and Open MPI bind a rank to one by default)."""
    from numba_kernels import cpu
    with hpccoll.init(timeout=60) as ctx:
        x = ints(100_003, ctx.rank, np.float64)
        want = np.empty_like(x)
        mpi_world.Allreduce(x, want)
        for blocks in sorted({1, min(2, cpu.max_threads())}):
            got = ctx.world.allreduce(x, blocks=blocks).wait()
            np.testing.assert_array_equal(got, want)
        with pytest.raises(hpccoll.ArgumentError, match="CPU threads"):
            ctx.world.allreduce(x, blocks=cpu.max_threads() + 1)


def test_submitting_never_synchronizes_the_host(dctx, mpi_world, monkeypatch):
    """No stream, event or device synchronize on the calling thread while a device
    collective is submitted (issue 16: it orders by events on the device instead): every
    synchronize Numba offers is wrapped and counted, per thread.  (The first collective of
    an op and dtype compiles its kernels, with a warm-up launch that synchronizes, once:
    done before counting.)  The scratch it takes comes from the device pool and goes back
    when the collective is done."""
    import threading
    from numba import cuda
    from numba.cuda.simulator import api
    from hpccoll.transport import staging
    calls = []
    me = threading.get_ident()

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            if threading.get_ident() == me:
                calls.append(name)
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(api.stream, "synchronize", counted("stream", api.stream.synchronize))
    monkeypatch.setattr(api.Event, "synchronize", counted("event", api.Event.synchronize))
    monkeypatch.setattr(cuda, "synchronize", counted("device", cuda.synchronize))
    w = dctx.world
    x = ints(3001, w.rank, np.float32)
    want = np.empty_like(x)
    mpi_world.Allreduce(x, want)
    w.allreduce(HostCAI(x), HostCAI(np.zeros_like(x))).wait()     # compiles, once
    calls.clear()
    for _ in range(3):
        out = np.zeros_like(x)
        mpi_world.Barrier()
        work = w.allreduce(HostCAI(x), HostCAI(out))
        assert calls == [], f"submit synchronized: {calls}"
        calls_before_wait = len(calls)
        work.wait()
        np.testing.assert_array_equal(out, want)
        del calls[calls_before_wait:]      # wait() may synchronize: that is its job
    pool = staging.scratch_pool(None)
    assert pool.allocated > 0
    free = sum(len(v) for v in pool._free.values())
    assert free >= 1, "the device scratch did not go back to its pool"


@pytest.mark.mpi(min_size=2)
def test_staging_polls_its_events_instead_of_waiting(dctx, mpi_world, monkeypatch):
    """Events that complete only after a few polls (the simulator's complete at once): the
    transfers wait for them without blocking the engine, results stay right, the pinned
    buffers come back to their pool, and the device stream is synchronized once per
    collective, at its end, by the engine alone."""
    from hpccoll.transport import staging
    polls = []

    class SlowEvent:
        def __init__(self):
            self.left = 3

        def query(self):
            polls.append(1)
            self.left -= 1
            return self.left < 0

    monkeypatch.setattr(staging, "record", lambda stream: SlowEvent())
    w = dctx.world
    for count in (5, 3001):
        x = ints(count, w.rank, np.float32)
        want = np.empty_like(x)
        mpi_world.Allreduce(x, want)
        out = np.zeros_like(x)
        w.allreduce(HostCAI(x), HostCAI(out)).wait()
        np.testing.assert_array_equal(out, want)
    assert len(polls) >= 4, polls
    before = staging.STAGING.allocated
    w.allreduce(HostCAI(ints(3001, w.rank, np.float32)),
                HostCAI(np.zeros(3001, np.float32))).wait()
    assert staging.STAGING.allocated == before, "pinned buffers were not given back"


def test_the_arrays_gpu_is_current_where_the_collective_runs(dctx, mpi_world):
    """Arrays that say which GPU they are on (CuPy's .device.id): the collective's kernels
    and copies run on that GPU's stream with it current; arrays on two GPUs are refused
    before anything is queued."""
    from types import SimpleNamespace
    from hpccoll.transport import staging

    class OnGpu(HostCAI):
        def __init__(self, arr, gpu):
            super().__init__(arr)
            self.device = SimpleNamespace(id=gpu)

    w = dctx.world
    x = ints(3001, w.rank, np.float32)
    want = np.empty_like(x)
    mpi_world.Allreduce(x, want)
    out = np.zeros_like(x)
    w.allreduce(OnGpu(x, 0), OnGpu(out, 0)).wait()
    np.testing.assert_array_equal(out, want)
    assert 0 in staging._STREAMS
    assert w.size == 1 or 0 in staging._SCRATCH     # one rank: no scratch needed
    with pytest.raises(hpccoll.ArgumentError, match="recvbuf: on GPU 1, but sendbuf is on GPU 0"):
        w.allreduce(OnGpu(x, 0), OnGpu(np.zeros_like(x), 1))
    # nothing was queued: still in step
    assert host(w.allreduce(HostCAI(np.ones(2, np.float32))).wait()).tolist() == [w.size] * 2


# -- small device collectives through the host ----------------------------------------------
@pytest.fixture(scope="module")
def hctx():
    c = hpccoll.init(timeout=60, threads_per_block=4)     # device_host_bytes: the default
    yield c
    c.close()


def test_small_device_collectives_go_through_the_host(hctx, mpi_world):
    """Up to device_host_bytes, every collective over device arrays is one copy to host,
    MPI's own collective on pinned buffers, one copy back: in place or not, every root,
    avg; exact against MPI's own; the pinned buffers go back to their pool."""
    from hpccoll.transport import staging
    w = hctx.world
    n, r, m = w.size, w.rank, 6
    x = ints(n * m, r, np.int64)
    total = np.empty_like(x)
    mpi_world.Allreduce(x, total)

    def run(work):
        assert work.plan.detour is not None and work.counters["algo"] == "mpi"
        return work.wait()

    for _ in range(2):      # the second round reuses the pinned buffers
        before = staging.STAGING.allocated
        out = np.zeros_like(x)
        run(w.allreduce(HostCAI(x), HostCAI(out)))
        np.testing.assert_array_equal(out, total)
        y = x.copy()
        run(w.allreduce(HostCAI(y), HostCAI(y), op="max"))
        mx = np.empty_like(x)
        mpi_world.Allreduce(x, mx, op=MPI.MAX)
        np.testing.assert_array_equal(y, mx)
        f = ints(m, r, np.float32)
        fo = np.zeros_like(f)
        run(w.allreduce(HostCAI(f), HostCAI(fo), op="avg"))
        fs = np.empty_like(f)
        mpi_world.Allreduce(f, fs)
        np.testing.assert_allclose(fo, fs / n, rtol=1e-6)
        for root in {0, n - 1}:
            out = np.zeros_like(x)
            run(w.reduce(HostCAI(x), HostCAI(out), root=root))
            np.testing.assert_array_equal(out, total if r == root else np.zeros_like(x))
            b = ints(m, r, np.int64, salt=root)
            ref = b.copy()
            mpi_world.Bcast(ref, root=root)
            run(w.broadcast(HostCAI(b), root=root))
            np.testing.assert_array_equal(b, ref)
        g = np.zeros(n * m, np.int64)
        run(w.allgather(HostCAI(x[:m]), HostCAI(g)))
        gref = np.empty(n * m, np.int64)
        mpi_world.Allgather(x[:m], gref)
        np.testing.assert_array_equal(g, gref)
        g2 = np.zeros(n * m, np.int64)
        g2[r * m:(r + 1) * m] = x[:m]
        run(w.allgather(HostCAI(g2[r * m:(r + 1) * m]), HostCAI(g2)))   # in place
        np.testing.assert_array_equal(g2, gref)
        rs = np.zeros(m, np.int64)
        run(w.reduce_scatter(HostCAI(x), HostCAI(rs)))
        np.testing.assert_array_equal(rs, total[r * m:(r + 1) * m])
        a = x.copy()
        aref = np.empty_like(x)
        mpi_world.Alltoall(x, aref)
        run(w.alltoall(HostCAI(a), HostCAI(a)))
        np.testing.assert_array_equal(a, aref)
        assert staging.STAGING.allocated == before or _ == 0


@pytest.mark.mpi(min_size=2)
def test_host_detour_posts_in_the_communicators_order(hctx, mpi_world, monkeypatch):
    """The detour posts MPI's collective only once its copy to host is done (slow events
    here: three polls), and the communicator's next collective may start only after that:
    even ranks let the detour post before they issue a host collective, odd ranks issue it
    at once; MPI still sees the same order everywhere, and both results are exact."""
    from hpccoll.transport import staging

    class SlowEvent:
        def __init__(self):
            self.left = 3

        def query(self):
            self.left -= 1
            return self.left < 0

    monkeypatch.setattr(staging, "record", lambda stream: SlowEvent())
    w = hctx.world
    r = w.rank
    x = ints(40, r, np.int32)
    want = np.empty_like(x)
    mpi_world.Allreduce(x, want)
    h = ints(3, r, np.float64, salt=2)
    hwant = np.empty_like(h)
    mpi_world.Allreduce(h, hwant, op=MPI.MAX)
    for it in range(10):
        out, hout = np.zeros_like(x), np.zeros_like(h)
        wd = w.allreduce(HostCAI(x), HostCAI(out))
        if (r + it) % 2 == 0:
            deadline = time.monotonic() + 10
            while not wd.lane.mpi_posted and time.monotonic() < deadline:
                wd.test()
        wh = w.allreduce(h, hout, op="max")
        assert not (wh.t_start == wh.t_issue) or wd.lane.mpi_posted
        if r % 2:
            wh.wait()
            wd.wait()
        else:
            wd.wait()
            wh.wait()
        np.testing.assert_array_equal(out, want)
        np.testing.assert_array_equal(hout, hwant)


def test_device_collectives_above_the_detour_size_run_hpccolls_own(hctx, mpi_world):
    """Larger than device_host_bytes, or a dtype MPI cannot reduce (float16): hpccoll's
    own algorithms on the device, as before."""
    w = hctx.world
    big = ints((64 << 10) // 4 + 1, w.rank, np.float32)
    want = np.empty_like(big)
    mpi_world.Allreduce(big, want)
    out = np.zeros_like(big)
    work = w.allreduce(HostCAI(big), HostCAI(out))
    assert work.plan.detour is None and work.counters["algo"] != "mpi"
    work.wait()
    np.testing.assert_array_equal(out, want)
    half = ints(9, w.rank, np.float16)
    work = w.allreduce(HostCAI(half))
    assert work.plan.detour is None
    np.testing.assert_array_equal(host(work.wait()), (half.astype(np.float32) * 0 + sum(
        ints(9, q, np.float32) for q in range(w.size))).astype(np.float16))


@pytest.mark.mpi(min_size=2)
def test_host_detour_waits_for_the_per_call_check(mpi_world):
    """check_mismatch="every": the detour posts MPI's own collective only once every
    member's fingerprint agreed, as MPI's own collectives on host arrays do, so a count or
    collective that differs raises CollectiveMismatch on every rank instead of reaching
    MPI; agreeing calls are exact."""
    r = mpi_world.rank
    with hpccoll.init(timeout=60, check_mismatch="every") as ctx:
        x = ints(6, r, np.int64)
        want = np.empty_like(x)
        mpi_world.Allreduce(x, want)
        for _ in range(3):
            out = np.zeros_like(x)
            work = ctx.world.allreduce(HostCAI(x), HostCAI(out))
            assert work.plan.detour is not None
            work.wait()
            np.testing.assert_array_equal(out, want)
        for case in ("count", "collective"):
            comm = ctx.world.dup()
            if case == "count":
                w = comm.allreduce(HostCAI(np.ones(6 if r == 0 else 7, np.int64)))
            else:
                w = (comm.broadcast(HostCAI(np.ones(6, np.int64))) if r == 0
                     else comm.allreduce(HostCAI(np.ones(6, np.int64))))
            with pytest.raises(hpccoll.CollectiveMismatch) as info:
                w.wait()
            assert case in info.value.fields
            assert not w.lane.mpi_posted        # MPI never saw the mismatched call
        np.testing.assert_array_equal(host(ctx.world.allreduce(HostCAI(np.ones(2, np.int64)))
                                           .wait()), np.full(2, ctx.size))
