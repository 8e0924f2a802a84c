"""The per-call path in C (core/_express.c, setting calls_in_c) against MPI's own
collectives and against the Python path: every collective it takes, on changing data,
on two communicators in opposite orders on alternate ranks; the ledger it records (the
mismatch check's) the same as the Python path's; the calls it leaves to Python (the
digest check, a busy persistent request, avg, keys, explicit blocks) in between; and the
Work API on the tasks it makes; and its route for node-shared-memory programs (the
reductions from 16 KiB), alone and stepped beside MPI-run collectives."""
import os

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
from hpccoll.core import state as _state

pytestmark = pytest.mark.mpi

REQUIRED = os.environ.get("HPCCOLL_REQUIRE_NATIVE") == "1"
# element counts: 1, a few, the largest persistent request (4 KiB of int32: staging
# copies), and 64 KiB (MPI's nonblocking call on the caller's arrays)
COUNTS = (1, 7, 1024, 16384)


def need_express():
    """Skip where the C part is not built, fail where it must be (CI)."""
    if _state._express is None:
        if REQUIRED:
            pytest.fail("HPCCOLL_REQUIRE_NATIVE=1 but hpccoll.core._express is not built")
        pytest.skip("hpccoll.core._express is not built here (no C compiler at install)")


def counts():
    return _state._express.counts()


def program_counts():
    return _state._express.program_counts()


def _programs_run_in_c(ctx) -> bool:
    """Whether this context's shared-memory programs can take the C route: every rank
    on one node runs them in C (agreed at init; the CI builds it)."""
    return ctx.c_programs and _state._express is not None


@pytest.fixture(scope="module")
def contexts():
    """Two contexts alike but for calls_in_c (the default policy: the C path is its)."""
    need_express()
    on = hpccoll.init(timeout=60, calls_in_c=True)
    off = hpccoll.init(timeout=60, calls_in_c=False)
    yield on, off
    on.close()
    off.close()


def reference(mpi, coll, x, n, root):
    """MPI's own blocking collective's result on this rank (None where it has none)."""
    if coll == "allreduce":
        out = np.empty_like(x)
        mpi.Allreduce(x, out)
    elif coll == "reduce":
        out = np.empty_like(x) if mpi.rank == root else None
        mpi.Reduce(x, out, root=root)
    elif coll == "broadcast":
        out = x.copy()
        mpi.Bcast(out, root=root)
    elif coll == "allgather":
        out = np.empty(x.size * n, x.dtype)
        mpi.Allgather(x, out)
    elif coll == "reduce_scatter":
        out = np.empty(x.size // n, x.dtype)
        mpi.Reduce_scatter_block(x, out)
    else:
        out = np.empty_like(x)
        mpi.Alltoall(x, out)
    return out


COLLS = ("allreduce", "reduce", "broadcast", "allgather", "reduce_scatter", "alltoall")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("count", COUNTS)
def test_every_collective_matches_mpi_on_changing_data(contexts, mpi_world, count):
    on, _ = contexts
    n, r = mpi_world.size, mpi_world.rank
    comms = [on.world.dup(name=f"x{c}") for c in range(2)]
    mpis = [mpi_world.Dup() for _ in range(2)]
    order = (0, 1) if r % 2 == 0 else (1, 0)
    root = n - 1
    m = count * n if count > 1 else n     # divisible by n: alltoall, reduce_scatter
    before = counts()
    before_p = program_counts()
    calls = 0
    try:
        for coll in COLLS:
            sends = [np.empty(m, np.int32) for _ in range(2)]
            outs = {"allgather": m * n, "reduce_scatter": m // n}
            recvs = [np.empty(outs.get(coll, m), np.int32) for _ in range(2)]
            for it in range(40):
                for c in range(2):   # new data every call: the staging copy is made each time
                    sends[c][:] = (np.arange(m) * 7 + r * 3 + it * 11 + c) % 1000 - 500
                works = []
                for c in order:
                    if coll == "broadcast":
                        works.append((c, comms[c].broadcast(sends[c], root=root)))
                    elif coll == "reduce":
                        works.append((c, comms[c].reduce(sends[c], recvs[c], root=root)))
                    else:
                        works.append((c, getattr(comms[c], coll)(sends[c], recvs[c])))
                    calls += 1
                got = {c: w.wait() for c, w in works}
                for c in range(2):
                    src = (np.arange(m) * 7 + r * 3 + it * 11 + c) % 1000 - 500
                    want = reference(mpis[c], coll, src.astype(np.int32), n, root)
                    if coll == "broadcast":
                        np.testing.assert_array_equal(sends[c], want, err_msg=f"{coll} it {it}")
                    elif want is not None:
                        np.testing.assert_array_equal(got[c], want, err_msg=f"{coll} it {it}")
    finally:
        for c in comms:
            c.free()
        for c in mpis:
            c.Free()
    issued, completed, _ = (a - b for a, b in zip(counts(), before))
    p_issued, p_completed = (a - b for a, b in zip(program_counts(), before_p))
    # the C path took many calls (the Python path: the first use of each persistent
    # request and of each shared-memory plan, every 64th call); from 16 KiB the
    # reductions and allgather run in shared memory, through its programs' route
    assert issued + p_issued > calls // 3, (issued, p_issued, calls)
    assert completed + p_completed > 0, (completed, p_completed, calls)


@pytest.mark.mpi(min_size=2)
def test_the_ledger_is_the_python_paths(contexts, mpi_world):
    """The same calls through C and through Python leave the same fingerprints and digest
    (the deferred mismatch check compares digests across ranks: a digest C computed
    differently on every rank alike would go unnoticed there)."""
    ledgers = []
    for ctx in contexts:
        c = ctx.world.dup(name="ledger")
        try:
            x = np.arange(5, dtype=np.int64)
            y = np.empty(5 * mpi_world.size, np.int64)
            big = np.arange(8192, dtype=np.int64)     # 64 KiB: a shared-memory program
            for it in range(150):
                c.allreduce(x, x.copy() if it % 50 == 0 else np.empty_like(x)).wait()
                c.allgather(x, y).wait()
                c.broadcast(x, root=it % mpi_world.size).wait()
                c.allreduce(big, np.empty_like(big)).wait()
            led = c._state.ledger
            ledgers.append((led.digest, led.seq, list(led.fps), list(led.digests)))
        finally:
            c.free()
    assert ledgers[0] == ledgers[1]


@pytest.mark.mpi(min_size=2)
def test_calls_left_to_python_in_between(contexts, mpi_world):
    """Busy persistent requests (17 identical calls before any wait), avg, keys and
    explicit blocks go the Python way, between calls that go the C way; all exact."""
    on, _ = contexts
    n, r = mpi_world.size, mpi_world.rank
    c = on.world.dup(name="between")
    try:
        xs = [np.full(3, r + i, np.int64) for i in range(17)]
        outs = [np.empty(3, np.int64) for _ in range(17)]
        works = [c.allreduce(xs[i], outs[i]) for i in range(17)]
        for i, w in enumerate(works):
            np.testing.assert_array_equal(w.wait(), np.full(3, n * (n - 1) // 2 + n * i))
        f = np.full(4, float(r + 1))
        np.testing.assert_array_equal(c.allreduce(f, op="avg").wait(),
                                      np.full(4, (n + 1) / 2))
        k = c.allreduce(np.full(2, r, np.int64), key="k").wait()
        np.testing.assert_array_equal(k, np.full(2, n * (n - 1) // 2))
        b = c.allreduce(np.full(2, r, np.int64), blocks=2).wait()
        np.testing.assert_array_equal(b, np.full(2, n * (n - 1) // 2))
        y = np.empty(2, np.int64)
        for it in range(70):     # crosses the 64th call: the digest check rides along
            c.allreduce(np.full(2, it + r, np.int64), y).wait()
            np.testing.assert_array_equal(y, np.full(2, n * it + n * (n - 1) // 2))
    finally:
        c.free()


@pytest.mark.mpi(min_size=2)
def test_work_api_on_tasks_made_in_c(contexts, mpi_world):
    on, _ = contexts
    n, r = mpi_world.size, mpi_world.rank
    c = on.world.dup(name="api")
    try:
        x = np.full(4, r, np.int32)
        y = np.empty(4, np.int32)
        for _ in range(20):
            c.allreduce(x, y).wait()       # the plan and the 16 persistent requests made
        before = counts()[0]
        w = c.allreduce(x, y)
        assert counts()[0] == before + 1, "the C path did not take the call"
        assert "allreduce" in repr(w)
        seen = []
        w.add_done_callback(seen.append)
        while not w.test():
            pass
        assert w.wait(timeout=10) is y and seen == [w] and w.exception() is None
        np.testing.assert_array_equal(y, np.full(4, n * (n - 1) // 2))
        assert w.counters["algo"] == "mpi" and w.counters["t_end"] >= w.counters["t_start"]
        # its flight record is the one flight.Recorder.append makes (the C path writes
        # the same row itself)
        w3 = c.allreduce(x, y)
        w3.wait()
        ring = on._engine.flight.ring
        mine = ring[-1]
        ring.pop()
        on._engine.flight.append(w3)
        assert ring[-1] == mine
        w2 = c.allreduce(x, y)
        assert w2.wait(timeout=10) is y
        assert not c._state.pending()
    finally:
        c.free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("persistent", [False, True])
def test_an_mpi_error_at_start_fails_the_collective(mpi_world, persistent):
    """MPI's error when the C path starts a collective (its nonblocking call, or a
    persistent request's Start: both forced here, on every rank) fails that collective
    with an error naming it on every rank, as on the Python path, and the communicator
    is unusable after it."""
    need_express()
    from mpi4py import MPI

    def fail(*args):
        raise MPI.Exception(MPI.ERR_OTHER)

    class Failing:
        Start = Free = fail

    with hpccoll.init(timeout=60, calls_in_c=True, cma=False) as ctx:
        comm = ctx.world.dup()
        n = 2 if persistent else 65536     # (1 MiB and up, single copy off: MPI runs it)
        x = np.ones(n, np.int64)
        y = np.empty(n * ctx.size, np.int64)
        for _ in range(20):
            comm.allgather(x, y).wait()
        # every rank is done with those before any fails (a failure notice breaks the
        # communicator, with whatever is pending on it)
        mpi_world.Barrier()
        st = comm._state
        (plan,) = [p for p in st.plans.values() if p.coll == "allgather"]
        if persistent:
            for slot in st.persist[plan.recipe.persist].slots:
                slot.req = Failing()
        else:
            plan.recipe.post = fail
        before = counts()[2]
        with pytest.raises(hpccoll.HpcCollError, match=r"allgather .*#20 int64"):
            comm.allgather(x, y).wait()
        # (a rank whose peer's failure notice came first raises at the call itself)
        started = mpi_world.allreduce(counts()[2] - before)
        assert started >= 1, "the C path started it nowhere"
        with pytest.raises(hpccoll.HpcCollError):
            comm.allgather(x, y).wait()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("count,iters,route", [(6, 200, "mpi"), (8192, 100, "programs")])
def test_ranks_with_and_without_it_work_together(mpi_world, count, iters, route):
    """The C path makes the same MPI calls as the Python one (the same persistent request,
    the same order), and runs the same shared-memory programs on the same epochs, so no
    agreement is needed: ranks that have it off (as a rank whose install could not build
    it) run beside ranks that have it on, exact, on two communicators in opposite orders,
    with the mismatch check's digests agreeing (every 64th call compares them).  8 B:
    collectives MPI runs; 64 KiB: shared-memory programs."""
    need_express()
    n, r = mpi_world.size, mpi_world.rank
    taken = counts if route == "mpi" else program_counts
    with hpccoll.init(timeout=60, calls_in_c=r % 2 == 0) as ctx:
        comms = [ctx.world.dup(name=f"mix{c}") for c in range(2)]
        order = (0, 1) if r % 2 == 0 else (1, 0)
        x = [np.empty(count, np.int64) for _ in range(2)]
        y = [np.empty(count, np.int64) for _ in range(2)]
        before = taken()[0]
        for it in range(iters):      # crosses the digest check
            for c in range(2):
                x[c][:] = np.arange(count) + r * 10 + it + c
            works = [comms[c].allreduce(x[c], y[c]) for c in order]
            for w in works:
                w.wait()
            for c in range(2):
                want = np.arange(count) * n + 10 * n * (n - 1) // 2 + n * (it + c)
                np.testing.assert_array_equal(y[c], want)
        took = taken()[0] - before
        in_c = r % 2 == 0 and (route == "mpi" or _programs_run_in_c(ctx))
        assert (took > 0) == in_c, took
        for c in comms:
            c.free()


REDUCTIONS = ("allreduce", "reduce", "reduce_scatter")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dtype", [np.int32, np.float64])
@pytest.mark.parametrize("count", [4096, 65536])
def test_programs_match_mpi_beside_mpi_run_collectives(contexts, mpi_world, dtype, count):
    """The reductions node-shared memory runs (16 KiB and up), issued through C on two
    communicators in opposite orders on alternate ranks, with a small alltoall MPI runs
    on a third between them (so waiters step programs and MPI requests together), on
    changing data: exact against MPI's own, and the C route took them."""
    on, _ = contexts
    n, r = mpi_world.size, mpi_world.rank
    root = n - 1
    m = count * n
    comms = [on.world.dup(name=f"p{c}") for c in range(3)]
    mpis = [mpi_world.Dup() for _ in range(2)]
    order = (0, 1) if r % 2 == 0 else (1, 0)
    before = program_counts()
    small = np.arange(2 * n, dtype=np.int64) + r
    small_out = np.empty_like(small)
    small_want = reference(mpi_world, "alltoall", small, n, root)
    try:
        for coll in REDUCTIONS:
            sends = [np.empty(m, dtype) for _ in range(2)]
            recvs = [np.empty(m // n if coll == "reduce_scatter" else m, dtype)
                     for _ in range(2)]
            for it in range(12):
                for c in range(2):
                    sends[c][:] = (np.arange(m) * 5 + r * 3 + it * 7 + c) % 97 - 48
                works = []
                for c in order:
                    if coll == "reduce":
                        works.append((c, comms[c].reduce(sends[c], recvs[c], root=root)))
                    else:
                        works.append((c, getattr(comms[c], coll)(sends[c], recvs[c])))
                    if c == order[0]:
                        small_w = comms[2].alltoall(small, small_out)
                got = {c: w.wait() for c, w in reversed(works)}
                np.testing.assert_array_equal(small_w.wait(), small_want)
                for c in range(2):
                    want = reference(mpis[c], coll, sends[c].copy(), n, root)
                    if want is not None:
                        np.testing.assert_array_equal(got[c], want, err_msg=f"{coll} it {it}")
    finally:
        for c in comms:
            c.free()
        for c in mpis:
            c.Free()
    issued, completed = (a - b for a, b in zip(program_counts(), before))
    if _programs_run_in_c(on):
        assert issued > 0 and completed > 0, (issued, completed)
    else:
        assert issued == 0


@pytest.mark.mpi(min_size=2)
def test_programs_left_to_python(contexts, mpi_world):
    """A second program of a communicator issued before the first completed waits for its
    slots (queued, the Python way), and while registered memory exists the Python path
    looks at where each call's buffers lie: all exact, in between calls C takes."""
    on, _ = contexts
    n, r = mpi_world.size, mpi_world.rank
    c = on.world.dup(name="p-left")
    try:
        xs = [np.full(8192, r + i, np.int64) for i in range(3)]
        held = 0
        for _ in range(4):
            before = program_counts()[0]
            works = [c.allreduce(x) for x in xs]     # the 2nd and 3rd: slots held
            took = program_counts()[0] - before
            # (on a loaded node this rank's engine may have run the first to its end, with
            # its peers, before the second was issued: then nothing was held, and the
            # second rightly took the C route; a first still pending now was pending then)
            if not works[0].finished:
                held += 1
                assert took <= 1, took
                assert not works[1].loose and not works[2].loose
            for i, w in enumerate(works):
                np.testing.assert_array_equal(w.wait(), np.full(8192, n * (n - 1) // 2 + n * i))
        assert held, "the first collective completed before the next was issued, every time"
    finally:
        c.free()
    # (a context of its own: registered memory stays until its context closes)
    with hpccoll.init(timeout=60, calls_in_c=True) as ctx:
        c = ctx.world.dup(name="p-reg")
        reg = ctx.empty(8192, np.int64)
        reg[:] = np.arange(8192) + r
        want = np.arange(8192) * n + n * (n - 1) // 2
        before = program_counts()[0]
        for x in (xs[0], reg, reg.copy()):
            for _ in range(3):
                got = c.allreduce(x).wait()
                np.testing.assert_array_equal(got, want if x is not xs[0] else
                                              np.full(8192, n * (n - 1) // 2))
        assert program_counts()[0] == before
        c.free()


@pytest.mark.mpi(min_size=2)
def test_an_error_in_a_programs_first_run_fails_it(mpi_world):
    """An error where the C route runs a program's first steps (forced here on every rank:
    the executor raises) fails that collective with an error naming it, as Task.poll's
    failure would on the Python path."""
    need_express()
    from hpccoll.engine import code, lane, reduction
    if code._native is None:
        pytest.skip("engine/_native.c is not built here")

    def broken(*args):
        raise RuntimeError("executor broken for this test")

    with hpccoll.init(timeout=60, calls_in_c=True) as ctx:
        if not _programs_run_in_c(ctx):
            pytest.skip("shared-memory programs do not run in C on every rank here")
        comm = ctx.world.dup(name="p-error")
        x = np.ones(8192, np.int64)
        for _ in range(3):
            comm.allreduce(x).wait()
        mpi_world.Barrier()
        before = program_counts()[0]
        _state._express.bind_programs(lane.ProgramLane, reduction.HostOps,
                                      _state.plans._NO_SCRATCH, broken)
        try:
            with pytest.raises(hpccoll.HpcCollError, match=r"allreduce .*#3 int64.*broken"):
                comm.allreduce(x).wait()
        finally:
            _state._express.bind_programs(lane.ProgramLane, reduction.HostOps,
                                          _state.plans._NO_SCRATCH, code._native.run)
        assert program_counts()[0] == before
        mpi_world.Barrier()
