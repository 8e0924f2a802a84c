"""The express path (hpccoll/express.py): tiny order-matched collectives started on the
calling thread.  Results against the MPI library's own collectives; the same fingerprint
as the general path (a rank on each path agrees); mismatches still raise on every rank;
everything outside the accept test takes the general path."""
import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
from hpccoll.express import ExpressTask

DTYPES = ["int8", "uint8", "int32", "int64", "float32", "float64"]


def express(work) -> bool:
    return isinstance(work._task, ExpressTask)


@pytest.fixture(scope="module", autouse=True)
def patient_lock():
    """The express path gives up on the engine's lock after 1 ms and takes the general
    path.  Ranks outnumbering cores (4 on 2 in CI) can deschedule the engine thread in
    the middle of its pass for longer; here the assertions are about what the express
    path does once it runs, so it waits for the lock."""
    from hpccoll import express as module
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(module, "LOCK_WAIT", 5.0)
        yield


@pytest.fixture(scope="module")
def ectx():
    c = hpccoll.init(policy="preemptive", timeout=60)
    yield c
    c.close()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
def test_allreduce_matches_mpi(ectx, mpi_world, dtype, op):
    r = ectx.rank
    x = ((np.arange(5) + r) % 3 + 1).astype(dtype)
    ref = np.empty_like(x)
    mpi_world.Allreduce(x, ref, op={"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN,
                                    "max": MPI.MAX}[op])
    out = np.empty_like(x)
    w = ectx.world.allreduce(x, out, op=op)
    assert express(w)
    assert w.wait() is out
    np.testing.assert_array_equal(out, ref)
    w2 = ectx.world.allreduce(x, op=op)           # recvbuf=None: a new 1-D array
    np.testing.assert_array_equal(w2.wait(), ref)
    y = x.copy()
    w3 = ectx.world.allreduce(y, y, op=op)       # in place
    assert express(w3) and w3.wait() is y
    np.testing.assert_array_equal(y, ref)


def test_express_task_sets_every_task_field(ectx):
    """ExpressTask.__init__ sets Task's fields itself (Task.__init__ would build a check it
    does not use): a field added to Task must be set there too."""
    from hpccoll.engine.task import Task
    w = ectx.world.allreduce(np.ones(2, np.int32))
    assert express(w)
    unset = [f for f in Task.__slots__ + ExpressTask.__slots__ if not hasattr(w._task, f)]
    assert unset == []
    w.wait()


def test_avg_and_multidim(ectx, mpi_world):
    n, r = ectx.size, ectx.rank
    x = np.full((2, 3), float(r), np.float64)
    w = ectx.world.allreduce(x, op="avg")
    assert express(w)
    np.testing.assert_allclose(w.wait(), np.full(6, sum(range(n)) / n))


@pytest.mark.parametrize("root_of", [lambda n: 0, lambda n: n - 1])
def test_broadcast_and_barrier(ectx, root_of):
    n, r = ectx.size, ectx.rank
    root = root_of(n)
    buf = np.full(7, r, np.int32)
    w = ectx.world.broadcast(buf, root=root)
    assert express(w) and w.wait() is buf
    np.testing.assert_array_equal(buf, np.full(7, root, np.int32))
    b = ectx.world.barrier()
    assert express(b)
    assert b.wait() is None


@pytest.mark.parametrize("dtype", DTYPES)
def test_allgather_and_alltoall_match_mpi(ectx, mpi_world, dtype):
    """Every form the express path takes: recvbuf=None, a separate recvbuf, in place
    (the same array); NCCL's view form of allgather takes the general path."""
    n, r = ectx.size, ectx.rank
    x = ((np.arange(3) * 7 + r * 5) % 11).astype(dtype)
    ref = np.empty(n * 3, dtype)
    mpi_world.Allgather(x, ref)
    w = ectx.world.allgather(x)
    assert express(w)
    np.testing.assert_array_equal(w.wait(), ref)
    out = np.zeros(n * 3, dtype)
    w = ectx.world.allgather(x, out)
    assert express(w) and w.wait() is out
    np.testing.assert_array_equal(out, ref)
    full = np.zeros(n * 3, dtype)
    full[r * 3:(r + 1) * 3] = x
    w = ectx.world.allgather(full, full)
    assert express(w) and w.wait() is full
    np.testing.assert_array_equal(full, ref)
    view = np.zeros(n * 3, dtype)
    view[r * 3:(r + 1) * 3] = x
    w = ectx.world.allgather(view[r * 3:(r + 1) * 3], view)
    assert not express(w) or n == 1
    w.wait()
    np.testing.assert_array_equal(view, ref)

    y = ((np.arange(n * 2) * 3 + r * 7) % 13).astype(dtype)
    ref = np.empty_like(y)
    mpi_world.Alltoall(y, ref)
    w = ectx.world.alltoall(y)
    assert express(w)
    np.testing.assert_array_equal(w.wait(), ref)
    out = np.zeros_like(y)
    w = ectx.world.alltoall(y, out)
    assert express(w) and w.wait() is out
    np.testing.assert_array_equal(out, ref)
    w = ectx.world.alltoall(y, y)
    assert express(w) and w.wait() is y
    np.testing.assert_array_equal(y, ref)


def test_many_in_flight_and_callbacks(ectx):
    """Several express collectives in flight at once, completed in any wait order; a
    callback fires on completion; counters say what ran."""
    n = ectx.size
    xs = [np.full(3, i, np.int64) for i in range(8)]
    works = [ectx.world.allreduce(x) for x in xs]
    seen = []
    works[3].add_done_callback(lambda w: seen.append(w))
    for i in reversed(range(8)):
        np.testing.assert_array_equal(works[i].wait(), np.full(3, i * n))
    assert seen == [works[3]]
    c = works[0].counters
    assert c["algo"] == "mpi" and c["waits"] == 1 and c["running_s"] is not None


def test_never_waited_completes_on_the_daemon(ectx):
    import time
    w = ectx.world.allreduce(np.ones(2, np.float32))
    deadline = time.monotonic() + 10
    while not w._done and time.monotonic() < deadline:
        time.sleep(0.005)          # nobody waits or tests: the engine thread completes it
    assert w._done
    np.testing.assert_array_equal(w.wait(), np.full(2, ectx.size, np.float32))


def test_general_path_for_what_express_does_not_take(ectx):
    n = ectx.size
    cases = [
        lambda c: c.allreduce(np.ones(32768, np.float32)),          # > mpi_coll_bytes
        lambda c: c.allreduce(np.ones(8, np.float16)),              # not an MPI dtype
        lambda c: c.allreduce(np.ones(4, np.int32), key="k"),      # keyed
        lambda c: c.allreduce(np.ones(4, np.int32), op="SUM"),     # spelled differently
        lambda c: c.allreduce(np.ones(4, np.int32), blocks=1),
        lambda c: c.broadcast(np.ones(4, np.int32), root=np.int64(0)),
        lambda c: c.allgather(np.ones(16384 // n + 1, np.float32)),  # n x that > mpi_coll_bytes
        lambda c: c.alltoall(np.ones(4 * n, np.int32), key="a2a"),
    ]
    for make in cases:
        w = make(ectx.world)
        assert not express(w)
        assert (np.asarray(w.wait()) == n).all() or w.coll in ("broadcast", "allgather",
                                                                "alltoall")


def test_bad_arguments_still_raise_before_queueing(ectx):
    x = np.ones(4, np.float32)
    with pytest.raises(hpccoll.ArgumentError, match="recvbuf"):
        ectx.world.allreduce(x, np.empty(3, np.float32))
    with pytest.raises(hpccoll.ArgumentError, match="op"):
        ectx.world.allreduce(x, op="nope")
    with pytest.raises(hpccoll.ArgumentError, match="avg"):
        ectx.world.allreduce(np.ones(4, np.int32), op="avg")
    with pytest.raises(hpccoll.ArgumentError, match="root"):
        ectx.world.broadcast(x, root=ectx.size)
    with pytest.raises(hpccoll.ArgumentError, match="contiguous"):
        ectx.world.allreduce(np.ones((4, 4), np.float32)[:, 0])
    both = np.ones(8, np.float32)
    with pytest.raises(hpccoll.ArgumentError, match="overlaps"):
        ectx.world.allreduce(both[:4], both[2:6])
    # nothing was queued by the failed calls: the next collective pairs up normally
    np.testing.assert_array_equal(ectx.world.allreduce(x).wait(), np.full(4, ectx.size))


@pytest.mark.mpi(min_size=2)
def test_express_and_general_ranks_agree(mpi_world):
    """Rank 0 takes the express path, the others the general one (express=False): same
    MPI calls in the same order and the same fingerprint, so results are right and no
    mismatch is reported."""
    r = mpi_world.rank
    with hpccoll.init(policy="preemptive", timeout=60, express=(r == 0)) as ctx:
        for i in range(20):
            x = np.full(3, i + r, np.int64)
            w = ctx.world.allreduce(x)
            assert express(w) == (r == 0)
            np.testing.assert_array_equal(w.wait(), np.full(3, ctx.size * i + sum(range(ctx.size))))
        buf = np.full(2, r, np.int32)
        ctx.world.broadcast(buf, root=ctx.size - 1).wait()
        np.testing.assert_array_equal(buf, ctx.size - 1)
        ctx.world.barrier().wait()
        n = ctx.size
        w = ctx.world.allgather(np.full(2, r, np.int32))
        assert express(w) == (r == 0)
        np.testing.assert_array_equal(w.wait(), np.repeat(np.arange(n), 2))
        w = ctx.world.alltoall(np.arange(n, dtype=np.int64) + 10 * r)
        assert express(w) == (r == 0)
        np.testing.assert_array_equal(w.wait(), 10 * np.arange(n) + r)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mixed", [False, True])
def test_mismatch_raises_on_every_rank(mpi_world, mixed):
    """Rank 0 allreduces 2 elements, the others 3 (or rank 0 broadcasts): every rank
    raises CollectiveMismatch naming the field, on the express path and across paths."""
    r = mpi_world.rank
    with hpccoll.init(policy="preemptive", timeout=60, express=(r == 0) or not mixed) as ctx:
        for case in ("count", "collective", "allgather count", "alltoall collective"):
            comm = ctx.world.dup()
            if case == "count":
                w = comm.allreduce(np.ones(2 if r == 0 else 3, np.int64))
            elif case == "collective":
                w = (comm.broadcast(np.ones(2, np.int64)) if r == 0
                     else comm.allreduce(np.ones(2, np.int64)))
            elif case == "allgather count":
                w = comm.allgather(np.ones(2 if r == 0 else 3, np.int64))
            else:
                w = (comm.alltoall(np.ones(2 * ctx.size, np.int64)) if r == 0
                     else comm.allgather(np.ones(2, np.int64)))
            case = case.split()[-1]
            with pytest.raises(hpccoll.CollectiveMismatch) as info:
                w.wait()
            assert case in str(info.value)
            assert 0 in info.value.ranks or 1 in info.value.ranks
            with pytest.raises(hpccoll.ContextClosed):
                comm.allreduce(np.ones(2, np.int64))     # the communicator is unusable
        # the world communicator was never touched: still fine
        np.testing.assert_array_equal(ctx.world.allreduce(np.ones(2, np.int64)).wait(),
                                      np.full(2, ctx.size))


@pytest.mark.parametrize("policy", ["fifo", "ordered"])
def test_other_policies_keep_their_launch_order(policy):
    with hpccoll.init(policy=policy, timeout=60) as ctx:
        w = ctx.world.allreduce(np.ones(2, np.float32))
        assert not express(w)
        np.testing.assert_array_equal(w.wait(), np.full(2, ctx.size, np.float32))


@pytest.mark.mpi(min_size=2)
def test_truncation_leaves_the_explanation_to_the_check(mpi_world, monkeypatch):
    """An MPI truncation error on rank 0's data request (forced here) does not fail the
    task at once: the check still runs, so every rank gets the same CollectiveMismatch
    naming the field, and nobody waits for rank 0's fingerprint in vain."""
    from hpccoll.express import ExpressLane
    r = mpi_world.rank
    if r == 0:
        real = ExpressLane.post

        class Truncating:
            def Test(self):
                raise MPI.Exception(MPI.ERR_TRUNCATE)

        def post(lane):
            real(lane)               # the real collective, so the peers' completes
            lane.req = Truncating()
            return lane.req
        monkeypatch.setattr(ExpressLane, "post", post)
    with hpccoll.init(policy="preemptive", timeout=60) as ctx:
        comm = ctx.world.dup()
        w = comm.allreduce(np.ones(2 if r == 0 else 3, np.int64))
        assert express(w)
        with pytest.raises(hpccoll.CollectiveMismatch, match="count"):
            w.wait()


def test_an_mpi_error_at_post_fails_the_collective(mpi_world, monkeypatch):
    """The express path posts before it builds its task; an MPI error there fails that
    collective with an error naming it, as the general path's launch does, on every
    rank (each rank's post fails here), and the communicator is unusable after it."""
    from hpccoll.express import ExpressLane

    def post(lane):
        raise MPI.Exception(MPI.ERR_OTHER)
    monkeypatch.setattr(ExpressLane, "post", post)
    with hpccoll.init(policy="preemptive", timeout=60) as ctx:
        comm = ctx.world.dup()
        w = comm.allreduce(np.ones(2, np.int64))
        assert express(w)
        with pytest.raises(hpccoll.HpcCollError, match=r"allreduce .*#0 int64 x2"):
            w.wait()
        with pytest.raises(hpccoll.HpcCollError):
            comm.allreduce(np.ones(2, np.int64)).wait()
