"""Every collective x op x dtype x size class against mpi4py's own collectives on the
same inputs: exact for integers, floats within a tolerance derived from the number of
ranks (sums of positive values: relative error <= n * eps)."""
import numpy as np
import pytest
from mpi4py import MPI

from hpccoll.base.ops import CONTRACT_DTYPES

pytestmark = pytest.mark.mpi

COUNTS = [0, 1, 7, 1000, 70_001]   # 70_001: shared memory on one node (test_algorithms_mpi.py: rings)
MPI_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}


def ops_for(dtype):
    kind = np.dtype(dtype).kind
    return ["sum", "prod", "min", "max"] + (["avg"] if kind == "f" else [])


def make_input(dtype, count, rank, salt=0):
    rng = np.random.default_rng(1000 * rank + count + salt)
    if np.dtype(dtype).kind == "f":
        # positive and near 1: sums and products without cancellation or overflow
        return rng.uniform(0.5, 1.5, size=count).astype(dtype)
    if np.dtype(dtype).kind == "u":
        return rng.integers(0, 4, size=count).astype(dtype)
    return rng.integers(-3, 4, size=count).astype(dtype)


def reference_reduce(mpi_world, x, op):
    """MPI's own Allreduce; float16 (which MPI lacks) by Allgather + NumPy in rank order."""
    if x.dtype == np.float16:
        allx = np.empty((mpi_world.size, x.size), dtype=x.dtype)
        mpi_world.Allgather(x, allx)
        fn = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum,
              "max": np.maximum}[op]
        out = allx[0].copy()
        for row in allx[1:]:
            fn(out, row, out=out)
    else:
        out = np.empty_like(x)
        mpi_world.Allreduce(x, out, op=MPI_OPS["sum" if op == "avg" else op])
    if op == "avg":
        out = (out / mpi_world.size).astype(x.dtype)
    return out


def assert_close(got, want, dtype, n, what):
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        eps = np.finfo(dt).eps
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                   rtol=4 * n * eps, atol=0, err_msg=what)


@pytest.mark.parametrize("dtype", CONTRACT_DTYPES)
@pytest.mark.parametrize("count", COUNTS)
def test_allreduce(comm, mpi_world, dtype, count):
    for op in ops_for(dtype):
        x = make_input(dtype, count, comm.rank)
        got = comm.allreduce(x, op=op).wait()
        assert got.dtype == x.dtype and got.shape == (count,)
        assert_close(got, reference_reduce(mpi_world, x, op), dtype, comm.size, f"{op} {count}")


@pytest.fixture(scope="module")
def p2p_comm():
    """mpi_coll_bytes=0: small allreduces, broadcasts, allgathers and alltoalls run
    hpccoll's own point-to-point algorithms (recursive doubling, binomial tree, Bruck,
    pairwise) instead of the MPI library's."""
    import hpccoll
    with hpccoll.init(timeout=60, mpi_coll_bytes=0, cell_bytes=0) as c:
        yield c.world


@pytest.mark.parametrize("dtype", CONTRACT_DTYPES)
@pytest.mark.parametrize("count", [1, 7, 1000])
def test_small_messages_on_point_to_point(p2p_comm, mpi_world, dtype, count):
    comm = p2p_comm
    for op in ops_for(dtype):
        x = make_input(dtype, count, comm.rank)
        w = comm.allreduce(x, op=op)
        assert_close(w.wait(), reference_reduce(mpi_world, x, op), dtype, comm.size, op)
        assert comm.size == 1 or w.counters["algo"] != "mpi"
    root = comm.size - 1
    x = make_input(dtype, count, comm.rank, salt=root)
    want = x.copy()
    mpi_world.Bcast(want.view(np.uint8), root=root)
    w = comm.broadcast(x, root=root)
    w.wait()
    np.testing.assert_array_equal(x, want)
    assert comm.size == 1 or w.counters["algo"] != "mpi"
    n, r = comm.size, comm.rank
    x = make_input(dtype, count, r, salt=5)
    want = np.empty(n * count, dtype=dtype)
    mpi_world.Allgather(x.view(np.uint8), want.view(np.uint8))
    full = np.zeros(n * count, dtype=dtype)
    full[r * count:(r + 1) * count] = x
    for w in (comm.allgather(x), comm.allgather(full, full)):
        np.testing.assert_array_equal(w.wait(), want)
        assert comm.size == 1 or w.counters["algo"] != "mpi"
    x = make_input(dtype, n * count, r, salt=6)
    want = np.empty_like(x)
    mpi_world.Alltoall(x.view(np.uint8), want.view(np.uint8))
    y = x.copy()
    for w in (comm.alltoall(x), comm.alltoall(y, y)):          # separate, then in place
        np.testing.assert_array_equal(w.wait(), want)
        assert comm.size == 1 or w.counters["algo"] != "mpi"


@pytest.mark.parametrize("dtype", CONTRACT_DTYPES)
@pytest.mark.parametrize("count", COUNTS)
def test_reduce(comm, mpi_world, dtype, count):
    for op in ops_for(dtype):
        for root in sorted({0, comm.size - 1}):
            x = make_input(dtype, count, comm.rank, salt=root)
            got = comm.reduce(x, op=op, root=root).wait()
            want = reference_reduce(mpi_world, x, op)
            if comm.rank == root:
                assert_close(got, want, dtype, comm.size, f"{op} root {root}")


@pytest.mark.parametrize("dtype", CONTRACT_DTYPES)
@pytest.mark.parametrize("count", COUNTS)
def test_broadcast(comm, mpi_world, dtype, count):
    for root in sorted({0, comm.size // 2, comm.size - 1}):
        x = make_input(dtype, count, comm.rank, salt=root)
        want = x.copy()
        mpi_world.Bcast(want.view(np.uint8), root=root)
        got = comm.broadcast(x, root=root).wait()
        assert got is x
        np.testing.assert_array_equal(x, want)


@pytest.mark.parametrize("dtype", CONTRACT_DTYPES)
@pytest.mark.parametrize("count", COUNTS)
def test_allgather(comm, mpi_world, dtype, count):
    x = make_input(dtype, count, comm.rank)
    want = np.empty(comm.size * count, dtype=dtype)
    mpi_world.Allgather(x.view(np.uint8), want.view(np.uint8))
    np.testing.assert_array_equal(comm.allgather(x).wait(), want)


@pytest.mark.parametrize("dtype", CONTRACT_DTYPES)
@pytest.mark.parametrize("count", COUNTS)
def test_reduce_scatter(comm, mpi_world, dtype, count):
    n = comm.size
    for op in ops_for(dtype):
        x = make_input(dtype, n * count, comm.rank)
        full = reference_reduce(mpi_world, x, op)
        got = comm.reduce_scatter(x, op=op).wait()
        assert got.shape == (count,)
        assert_close(got, full[comm.rank * count:(comm.rank + 1) * count], dtype, n, op)


@pytest.mark.parametrize("dtype", CONTRACT_DTYPES)
@pytest.mark.parametrize("count", COUNTS)
def test_alltoall(comm, mpi_world, dtype, count):
    n = comm.size
    x = make_input(dtype, n * count, comm.rank)
    want = np.empty_like(x)
    mpi_world.Alltoall(x.view(np.uint8), want.view(np.uint8))
    np.testing.assert_array_equal(comm.alltoall(x).wait(), want)


def test_barrier(comm, mpi_world):
    """After the barrier every rank has seen every other rank's write (ordering check via
    a one-sided counter would need RMA; a timestamp exchange shows nobody left early)."""
    import time
    start = np.array([time.time()])
    if comm.rank == 0:
        time.sleep(0.2)
        start[0] = time.time()
    latest = np.empty(1)
    comm.barrier().wait()
    after = time.time()
    mpi_world.Allreduce(start, latest, op=MPI.MAX)
    assert after >= latest[0] - 0.01


@pytest.mark.parametrize("count", [5, 70_001])
def test_in_place_every_collective(comm, mpi_world, count):
    n, r = comm.size, comm.rank
    dt = np.int32
    x = make_input(dt, count, r)
    want = reference_reduce(mpi_world, x, "sum")
    buf = x.copy()
    assert comm.allreduce(buf, buf).wait() is buf
    np.testing.assert_array_equal(buf, want)

    buf = x.copy()
    comm.reduce(buf, buf, root=n - 1).wait()
    if r == n - 1:
        np.testing.assert_array_equal(buf, want)

    # allgather, the same array: this rank's block is its input
    full = np.zeros(n * count, dt)
    full[r * count:(r + 1) * count] = x
    gathered = np.empty(n * count, dt)
    mpi_world.Allgather(x, gathered)
    assert comm.allgather(full, full).wait() is full
    np.testing.assert_array_equal(full, gathered)
    # NCCL's form: sendbuf is block r of recvbuf
    full2 = np.zeros(n * count, dt)
    full2[r * count:(r + 1) * count] = x
    comm.allgather(full2[r * count:(r + 1) * count], full2).wait()
    np.testing.assert_array_equal(full2, gathered)

    # reduce_scatter, the same array: block r receives the result
    y = make_input(dt, n * count, r, salt=3)
    ysum = reference_reduce(mpi_world, y, "sum")
    buf = y.copy()
    comm.reduce_scatter(buf, buf).wait()
    np.testing.assert_array_equal(buf[r * count:(r + 1) * count], ysum[r * count:(r + 1) * count])
    buf = y.copy()
    comm.reduce_scatter(buf, buf[r * count:(r + 1) * count]).wait()
    np.testing.assert_array_equal(buf[r * count:(r + 1) * count], ysum[r * count:(r + 1) * count])

    want_a2a = np.empty_like(y)
    mpi_world.Alltoall(y, want_a2a)
    buf = y.copy()
    comm.alltoall(buf, buf).wait()
    np.testing.assert_array_equal(buf, want_a2a)


def test_given_recvbuf_and_shapes(comm, mpi_world):
    """recvbuf given: written and returned; multi-dimensional C-contiguous arrays are flat."""
    x = np.arange(12, dtype=np.float64).reshape(3, 4) + comm.rank
    out = np.empty((4, 3))
    assert comm.allreduce(x, out).wait() is out
    want = np.empty(12)
    mpi_world.Allreduce(x.reshape(-1), want)
    np.testing.assert_allclose(out.reshape(-1), want)


def test_many_outstanding_then_wait_all(comm, mpi_world):
    xs = [make_input(np.int64, 100 + i, comm.rank, salt=i) for i in range(40)]
    works = [comm.allreduce(x) for x in xs]
    for x, w in zip(xs, works):
        np.testing.assert_array_equal(w.wait(), reference_reduce(mpi_world, x, "sum"))


def test_callbacks_run_once_on_completion(comm):
    seen = []
    w = comm.allreduce(np.ones(10))
    w.add_done_callback(lambda work: seen.append(work))
    w.wait()
    import time
    deadline = time.time() + 5
    while not seen and time.time() < deadline:
        time.sleep(0.001)
    assert seen == [w]
    late = []
    w.add_done_callback(late.append)   # already complete: runs at once
    assert late == [w] and seen == [w]
    assert w.test()


def test_dup_and_split(ctx, mpi_world):
    n, r = ctx.size, ctx.rank
    d = ctx.world.dup(name="copy")
    assert (d.rank, d.size, d.name) == (r, n, "copy")
    half = ctx.world.split(r % 2, key=-r)
    assert half.size == len(range(r % 2, n, 2))
    assert half.rank == sorted(range(r % 2, n, 2), reverse=True).index(r)
    got = half.allreduce(np.array([r], dtype=np.int64)).wait()
    assert got[0] == sum(range(r % 2, n, 2))
    none = ctx.world.split(None if r == 0 else 1)
    if r == 0:
        assert none is None
    else:
        assert none.size == n - 1
        none.free()
    d.free()
    half.free()


def test_keyed_in_different_order():
    """Keyed collectives match by key, so ranks may issue them in any order.  Under fifo
    that needs as many execution slots as keys in flight; preemption needs no such bound
    (tests/mpi/test_deadlock.py)."""
    import hpccoll
    with hpccoll.init(policy="fifo", max_active=4, timeout=30) as c:
        comm = c.world
        keys = [f"bucket{i}" for i in range(3)]
        order = keys if comm.rank % 2 == 0 else keys[::-1]
        works = {k: comm.allreduce(np.full(5, keys.index(k) + 1, np.int64), key=k) for k in order}
        for k in keys:
            np.testing.assert_array_equal(works[k].wait(), np.full(5, (keys.index(k) + 1) * comm.size))
        # a key is free again once its collective completed
        again = comm.allreduce(np.ones(3, np.int64), key="bucket0").wait()
        np.testing.assert_array_equal(again, np.full(3, comm.size))


@pytest.mark.slow
def test_allreduce_hundreds_of_mib(comm, mpi_world):
    """256 MiB + 3 elements: uneven ring blocks, hundreds of chunks per step."""
    count = (1 << 26) + 3
    x = np.full(count, comm.rank + 1, dtype=np.float32)
    x[::7] = -1.0
    got = comm.allreduce(x).wait(timeout=600)
    want = np.empty_like(x)
    mpi_world.Allreduce(x, want)
    assert np.array_equal(got, want)
