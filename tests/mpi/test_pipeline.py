"""The one pipeline (hpccoll/core): every collective is validated once, planned once per
call signature, then started on the calling thread when the MPI library runs it itself
(tiny messages, the ``mpi`` row, under the preemptive policy) or queued for the engine.
Results against the MPI library's own collectives, on every path and in every argument
form; mismatches still raise on every rank; bad input raises before anything is queued."""
import contextlib
import time

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
from hpccoll.core import plan as plans

DTYPES = ["int8", "uint8", "int32", "int64", "float32", "float64"]
MPI_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}


@pytest.fixture(scope="module")
def pctx():
    # (MPI's own row for the small collectives here: tests/mpi/test_cells.py has cells')
    c = hpccoll.init(policy="preemptive", timeout=60, cell_bytes=0)
    yield c
    c.close()


def started_at_issue(work) -> bool:
    return work.counters["t_start"] is not None


@contextlib.contextmanager
def _daemon_aside(engine):
    """The progress thread stays out of the engine (as it does while a waiter drives):
    a program starts at issue only if the engine's lock is free at that moment."""
    with engine._want_lock:
        engine._want += 1
        engine._resume.clear()
    # a pass the daemon is in finishes first; one it reached for before it saw _want (it
    # re-checks under the lock) is over by the second take
    for _ in range(2):
        with engine.lock:
            pass
        time.sleep(0.001)
    try:
        yield
    finally:
        with engine._want_lock:
            engine._want -= 1
            if engine._want == 0:
                engine._resume.set()


def at_issue_alone(engine, make):
    """``make()``'s collective, issued on an idle engine with its daemon aside, where it
    must start at issue on every rank (nothing before it left to post, no slot or gate
    taken, the lock free).  A rank where it did not waits for it before it fails, so its
    peers are not left waiting for a collective it never finished; ranks never issue a
    second try (they would issue different numbers of collectives)."""
    deadline = time.monotonic() + 30
    while not engine.idle() and time.monotonic() < deadline:
        time.sleep(0.001)          # what earlier tests left unwaited completes first
    assert engine.idle(), "the engine did not become idle"
    with _daemon_aside(engine):
        w = make()
    if not started_at_issue(w):
        w.wait()
        raise AssertionError(f"{w!r} did not start at issue on an idle engine")
    return w


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
def test_tiny_allreduce_matches_mpi_in_every_form(pctx, mpi_world, dtype, op):
    r = pctx.rank
    x = ((np.arange(5) + r) % 3 + 1).astype(dtype)
    ref = np.empty_like(x)
    mpi_world.Allreduce(x, ref, op=MPI_OPS[op])
    out = np.empty_like(x)
    w = at_issue_alone(pctx._engine, lambda: pctx.world.allreduce(x, out, op=op))
    assert w.wait() is out
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(pctx.world.allreduce(x, op=op).wait(), ref)   # new array
    y = x.copy()
    w = at_issue_alone(pctx._engine, lambda: pctx.world.allreduce(y, y, op=op))  # in place
    assert w.wait() is y
    np.testing.assert_array_equal(y, ref)


def test_avg_and_multidim(pctx):
    n, r = pctx.size, pctx.rank
    x = np.full((2, 3), float(r), np.float64)
    w = at_issue_alone(pctx._engine, lambda: pctx.world.allreduce(x, op="avg"))
    np.testing.assert_allclose(w.wait(), np.full(6, sum(range(n)) / n))
    y = x.copy()
    pctx.world.allreduce(y, y, op="avg").wait()
    np.testing.assert_allclose(y.reshape(-1), np.full(6, sum(range(n)) / n))


@pytest.mark.parametrize("root_of", [lambda n: 0, lambda n: n - 1])
def test_broadcast_and_barrier(pctx, root_of):
    n, r = pctx.size, pctx.rank
    root = root_of(n)
    buf = np.full(7, r, np.int32)
    w = at_issue_alone(pctx._engine, lambda: pctx.world.broadcast(buf, root=root))
    assert w.wait() is buf
    np.testing.assert_array_equal(buf, np.full(7, root, np.int32))
    b = at_issue_alone(pctx._engine, lambda: pctx.world.barrier())
    assert b.wait() is None


@pytest.mark.parametrize("dtype", DTYPES)
def test_tiny_allgather_and_alltoall_match_mpi(pctx, mpi_world, dtype):
    """Every form: recvbuf=None, a separate recvbuf, in place (the same array), and NCCL's
    view form of allgather (sendbuf is block rank of recvbuf)."""
    n, r = pctx.size, pctx.rank
    x = ((np.arange(3) * 7 + r * 5) % 11).astype(dtype)
    ref = np.empty(n * 3, dtype)
    mpi_world.Allgather(x, ref)
    w = at_issue_alone(pctx._engine, lambda: pctx.world.allgather(x))
    np.testing.assert_array_equal(w.wait(), ref)
    out = np.zeros(n * 3, dtype)
    w = pctx.world.allgather(x, out)
    assert w.wait() is out
    np.testing.assert_array_equal(out, ref)
    full = np.zeros(n * 3, dtype)
    full[r * 3:(r + 1) * 3] = x
    w = pctx.world.allgather(full, full)
    assert w.wait() is full
    np.testing.assert_array_equal(full, ref)
    view = np.zeros(n * 3, dtype)
    view[r * 3:(r + 1) * 3] = x
    pctx.world.allgather(view[r * 3:(r + 1) * 3], view).wait()
    np.testing.assert_array_equal(view, ref)

    y = ((np.arange(n * 2) * 3 + r * 7) % 13).astype(dtype)
    ref = np.empty_like(y)
    mpi_world.Alltoall(y, ref)
    w = at_issue_alone(pctx._engine, lambda: pctx.world.alltoall(y))
    np.testing.assert_array_equal(w.wait(), ref)
    out = np.zeros_like(y)
    assert pctx.world.alltoall(y, out).wait() is out
    np.testing.assert_array_equal(out, ref)
    assert pctx.world.alltoall(y, y).wait() is y
    np.testing.assert_array_equal(y, ref)


@pytest.mark.parametrize("dtype", ["int32", "float64"])
def test_tiny_reduce_and_reduce_scatter_match_mpi(pctx, mpi_world, dtype):
    """On persistent requests too (more calls than a plan has): every root, in place at
    the root, reduce_scatter out of and in place, new data every call."""
    n, r = pctx.size, pctx.rank
    for i in range(plans.PERSISTENT_SLOTS + 2):
        for root in range(n):
            x = ((np.arange(5) * 3 + r + i) % 7).astype(dtype)
            ref = np.empty_like(x)
            mpi_world.Reduce(x, ref, op=MPI.MAX, root=root)
            out = np.full_like(x, -1)
            w = at_issue_alone(pctx._engine,
                               lambda: pctx.world.reduce(x, out, op="max", root=root))
            w.wait()
            if r == root:
                np.testing.assert_array_equal(out, ref)
                y = x.copy()
                pctx.world.reduce(y, y, op="max", root=root).wait()
                np.testing.assert_array_equal(y, ref)
            else:
                pctx.world.reduce(x.copy(), x.copy(), op="max", root=root).wait()
        y = ((np.arange(n * 3) * 5 + r * 3 + i) % 11).astype(dtype)
        ref = np.empty(3, dtype)
        mpi_world.Reduce_scatter_block(y, ref)
        out = np.empty(3, dtype)
        w = at_issue_alone(pctx._engine, lambda: pctx.world.reduce_scatter(y, out))
        assert w.wait() is out
        np.testing.assert_array_equal(out, ref)
        assert pctx.world.reduce_scatter(y, y).wait() is y
        np.testing.assert_array_equal(y[r * 3:(r + 1) * 3], ref)


def test_ranks_that_differ_in_place_take_the_same_persistent_requests(pctx):
    """In place on some ranks only (a reduce's root; an allreduce), alternating with out
    of place: the plans differ between ranks, the persistent requests may not (MPI
    matches them by the order of their initialisation)."""
    n, r = pctx.size, pctx.rank
    comm = pctx.world.dup(name="inplace")
    for i in range(3 * plans.PERSISTENT_SLOTS):
        x = np.full(2, i + r, np.int64)
        if r == 0 and i % 2:
            out = x
        else:
            out = np.empty_like(x)
        assert comm.allreduce(x, out).wait() is out
        assert (out == n * i + n * (n - 1) // 2).all()
        y = np.full(3, i + r, np.int64)
        if r == i % n:
            z = y if i % 3 else np.empty_like(y)
            comm.reduce(y, z, root=r).wait()
            assert (z == n * i + n * (n - 1) // 2).all()
        else:
            comm.reduce(y, None if i % 3 else np.empty_like(y), root=i % n).wait()
    comm.free()


def test_persistent_requests_with_many_calls_in_flight(pctx, mpi_world):
    """More identical tiny calls in flight than a plan has persistent requests, on fresh
    and reused buffers, waited in any order: every result is right."""
    n = pctx.size
    xs = [np.full(3, i, np.int64) for i in range(3 * plans.PERSISTENT_SLOTS)]
    works = [pctx.world.allreduce(x) for x in xs]
    for i in reversed(range(len(xs))):
        np.testing.assert_array_equal(works[i].wait(), np.full(3, i * n))
    out = np.empty(3, np.int64)
    for i in range(20):
        x = np.full(3, i + pctx.rank, np.int64)
        np.testing.assert_array_equal(pctx.world.allreduce(x, out).wait(),
                                      np.full(3, n * i + sum(range(n))))


def test_a_second_identical_call_does_no_planning(pctx, monkeypatch):
    made = []
    real = plans.make
    monkeypatch.setattr(plans, "make", lambda *a: made.append(a) or real(*a))
    comm = pctx.world
    for _ in range(5):
        comm.allreduce(np.ones(7, np.float32)).wait()
    assert len(made) == 1
    comm.allreduce(np.ones(8, np.float32)).wait()      # another count: another plan
    assert len(made) == 2


def test_many_in_flight_and_callbacks(pctx):
    """Tiny collectives in flight at once, completed in any wait order; a callback fires
    on completion and may itself issue and wait for a collective; counters say what ran."""
    n = pctx.size
    xs = [np.full(3, i, np.int64) for i in range(8)]
    works = [pctx.world.allreduce(x) for x in xs]
    seen = []

    def callback(w):
        seen.append(w)
        seen.append(pctx.world.allreduce(np.ones(2, np.int64)).wait())
    works[3].add_done_callback(callback)
    for i in reversed(range(8)):
        np.testing.assert_array_equal(works[i].wait(), np.full(3, i * n))
    deadline = time.monotonic() + 10
    while len(seen) < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert seen[0] is works[3]
    np.testing.assert_array_equal(seen[1], np.full(2, n))
    c = works[0].counters
    assert c["algo"] == "mpi" and c["waits"] == 1 and c["running_s"] is not None


def test_never_waited_completes_on_the_daemon(pctx):
    w = pctx.world.allreduce(np.ones(2, np.float32))
    deadline = time.monotonic() + 10
    while not w.test() and time.monotonic() < deadline:
        time.sleep(0.005)          # nobody waits: the engine thread (or test()) completes it
    assert w.test()
    np.testing.assert_array_equal(w.wait(), np.full(2, pctx.size, np.float32))


def at_issue(w) -> bool:
    """Whether ``w`` started on the calling thread when it was issued."""
    return w.t_start is not None and w.t_start == w.t_issue


def _loose(comm, x, out):
    """An allreduce started at issue (on the calling thread, not by the daemon): MPI's own
    collective, or a shared-memory program on an engine whose slots bind nothing."""
    w = at_issue_alone(comm._ctx._engine, lambda: comm.allreduce(x, out))
    assert at_issue(w)
    return w


def test_a_loose_collective_completes_in_its_waiter(pctx):
    """A collective MPI runs itself starts at issue and waits in ``engine.started``: its
    waiter takes it and polls it, and afterwards nothing of it is left with the engine."""
    n, engine = pctx.size, pctx._engine
    x, out = np.full(3, pctx.rank + 1, np.int64), np.empty(3, np.int64)
    w = _loose(pctx.world, x, out)
    assert w in engine.started and engine.pending() >= 1
    assert w.wait() is out and w not in engine.started and w.retired
    np.testing.assert_array_equal(out, np.full(3, n * (n + 1) // 2))
    c = w.counters
    assert c["algo"] == "mpi" and c["t_end"] is not None and c["running_s"] is not None
    w = _loose(pctx.world, x, out)
    deadline = time.monotonic() + 10
    while not w.test() and time.monotonic() < deadline:     # test() polls it too
        pass
    assert w.test() and w not in engine.started
    np.testing.assert_array_equal(out, np.full(3, n * (n + 1) // 2))


def test_a_loose_collective_nobody_waits_for_is_adopted(pctx):
    """Nobody waits: the engine takes it over (it then shows in reports and completes on
    the daemon)."""
    x, out = np.ones(2, np.float32), np.empty(2, np.float32)
    engine = pctx._engine
    w = _loose(pctx.world, x, out)
    deadline = time.monotonic() + 10
    while w in engine.started and time.monotonic() < deadline:
        time.sleep(0.001)
    assert w not in engine.started
    while not w._done and time.monotonic() < deadline:
        time.sleep(0.001)
    assert w._done
    np.testing.assert_array_equal(w.wait(), np.full(2, pctx.size, np.float32))


def test_free_and_callbacks_take_loose_collectives_along(pctx):
    """free() lets a loose collective complete first; a callback added to a loose one
    runs (the engine adopts it to run it)."""
    n = pctx.size
    comm = pctx.world.dup(name="loose")
    x, out = np.full(4, 2, np.int32), np.empty(4, np.int32)
    w = _loose(comm, x, out)
    comm.free()
    assert w.test()
    np.testing.assert_array_equal(w.wait(), np.full(4, 2 * n))
    seen = []
    w = _loose(pctx.world, x, out)
    w.add_done_callback(seen.append)
    w.wait()
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:
        time.sleep(0.001)
    assert seen == [w]


def test_the_same_arrays_again_are_read_once(pctx, mpi_world, monkeypatch):
    """A loop on the same buffers validates them once; a change of the arrays (flags,
    dtype, another array, another op) is seen, and an allocated result is never shared."""
    from hpccoll.core import validate
    comm = pctx.world.dup(name="recent")
    seen = []
    real = validate.allreduce
    monkeypatch.setattr(validate, "allreduce", lambda *a: seen.append(a) or real(*a))
    x, out = np.zeros(6, np.float32), np.empty(6, np.float32)
    for i in range(5):
        x[:] = i + pctx.rank
        comm.allreduce(x, out).wait()
        assert (out == i * pctx.size + sum(range(pctx.size))).all()
    assert len(seen) == 1
    comm.allreduce(x, out, op="max").wait()                 # another op: read again
    assert len(seen) == 2 and (out == 4 + pctx.size - 1).all()
    out.flags.writeable = False
    with pytest.raises(hpccoll.ArgumentError, match="recvbuf"):
        comm.allreduce(x, out)
    out.flags.writeable = True
    xi, outi = x.view(np.int32), out.view(np.int32)          # the same memory, as int32
    x.dtype = out.dtype = np.int32                          # and the kept arrays retyped
    xi[:] = pctx.rank + 1
    ref = np.empty(6, np.int32)
    mpi_world.Allreduce(xi, ref)
    comm.allreduce(x, out).wait()
    np.testing.assert_array_equal(outi, ref)
    a, b = comm.allreduce(x).wait(), comm.allreduce(x).wait()
    assert a is not b and a is not out
    comm.free()


def test_large_arrays_again_are_read_once_and_held_weakly(pctx, mpi_world, monkeypatch):
    """Above validate.RECENT_BYTES the arrays are held by weak references: a loop on the
    same 1 MiB buffers is validated once, another array is read again, and a dropped
    buffer is freed at once."""
    import gc
    import weakref
    from hpccoll.core import validate
    comm = pctx.world.dup(name="recent-large")
    n, r = 1 << 18, pctx.rank
    seen = {"broadcast": 0, "allgather": 0}
    for name in seen:
        real = getattr(validate, name)

        def counted(*a, real=real, name=name):
            seen[name] += 1
            return real(*a)
        monkeypatch.setattr(validate, name, counted)
    buf = np.empty(n, np.int32)
    out = np.empty(n * pctx.size, np.int32)
    for i in range(4):
        buf[:] = i if r == 0 else -1
        comm.broadcast(buf, root=0).wait()
        assert (buf == i).all()
        buf[:] = r + i
        comm.allgather(buf, out).wait()
        ref = np.empty_like(out)
        mpi_world.Allgather(buf, ref)
        np.testing.assert_array_equal(out, ref)
    assert seen == {"broadcast": 1, "allgather": 1}
    gc.collect()
    # the kept Call's count stays right because NumPy refuses to resize an array with
    # weak references (validate.Recent relies on it); a new array is read again
    with pytest.raises(ValueError):
        buf.resize(n + 5, refcheck=False)
    buf = np.arange(n + 5, dtype=np.int32) if r == 0 else np.zeros(n + 5, np.int32)
    comm.broadcast(buf, root=0).wait()
    assert seen["broadcast"] == 2
    np.testing.assert_array_equal(buf, np.arange(n + 5))
    gone = [weakref.ref(buf), weakref.ref(out)]
    del buf, out
    deadline = time.monotonic() + 5
    while any(g() is not None for g in gone) and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.001)
    assert all(g() is None for g in gone)
    comm.free()


def test_what_mpi_does_not_run_is_queued_and_right(pctx, mpi_world):
    """Large, float16, keyed, a key, blocks=: hpccoll's own algorithms, through the
    engine's queue; each result against MPI's."""
    n, r = pctx.size, pctx.rank
    comm = pctx.world

    def allreduce_ref(x):
        ref = np.empty_like(x)
        mpi_world.Allreduce(x.astype(np.float64) if x.dtype == np.float16 else x,
                            ref if x.dtype != np.float16 else (ref := np.empty(x.size)))
        return ref.astype(x.dtype)
    big = (np.arange(32768) % 5 + r).astype(np.float32)
    cases = [
        (lambda: comm.allreduce(big), allreduce_ref(big)),                      # > 64 KiB
        (lambda: comm.allreduce(np.full(8, r + 1, np.float16)),
         np.full(8, sum(range(1, n + 1)), np.float16)),                         # float16
        (lambda: comm.allreduce(np.full(4, r, np.int32), key="k"),
         np.full(4, sum(range(n)), np.int32)),                                  # keyed
        (lambda: comm.allreduce(np.full(4, r, np.int32), op="SUM"),
         np.full(4, sum(range(n)), np.int32)),                                  # spelled
        (lambda: comm.allreduce(np.full(4, r, np.int32), blocks=1),
         np.full(4, sum(range(n)), np.int32)),
        (lambda: comm.broadcast(np.full(4, r, np.int32), root=np.int64(n - 1)),
         np.full(4, n - 1, np.int32)),
        (lambda: comm.allgather(np.full(16384 // n + 1, r, np.float32)),
         np.repeat(np.arange(n, dtype=np.float32), 16384 // n + 1)),            # > 64 KiB
        (lambda: comm.alltoall(np.arange(4 * n, dtype=np.int32) + 100 * r, key="a2a"),
         np.concatenate([np.arange(4 * r, 4 * r + 4, dtype=np.int32) + 100 * q
                         for q in range(n)])),
    ]
    for make, want in cases:
        got = make().wait()
        np.testing.assert_array_equal(got, want)


def test_bad_arguments_raise_before_queueing(pctx):
    x = np.ones(4, np.float32)
    with pytest.raises(hpccoll.ArgumentError, match="recvbuf"):
        pctx.world.allreduce(x, np.empty(3, np.float32))
    with pytest.raises(hpccoll.ArgumentError, match="op"):
        pctx.world.allreduce(x, op="nope")
    with pytest.raises(hpccoll.ArgumentError, match="avg"):
        pctx.world.allreduce(np.ones(4, np.int32), op="avg")
    with pytest.raises(hpccoll.ArgumentError, match="root"):
        pctx.world.broadcast(x, root=pctx.size)
    with pytest.raises(hpccoll.ArgumentError, match="contiguous"):
        pctx.world.allreduce(np.ones((4, 4), np.float32)[:, 0])
    both = np.ones(8, np.float32)
    with pytest.raises(hpccoll.ArgumentError, match="overlaps"):
        pctx.world.allreduce(both[:4], both[2:6])
    # views are fine where their memory does not meet, and the same memory through two
    # view objects is the in-place form
    buf = np.arange(8, dtype=np.int64)
    pctx.world.allreduce(buf[:4], buf[4:]).wait()
    np.testing.assert_array_equal(buf, np.r_[np.arange(4), np.arange(4) * pctx.size])
    buf = np.arange(8, dtype=np.int64)
    pctx.world.allreduce(buf[2:6], buf.reshape(2, 4)[:, :].reshape(-1)[2:6]).wait()
    np.testing.assert_array_equal(buf, np.r_[0, 1, np.arange(2, 6) * pctx.size, 6, 7])
    # the in-place forms of allgather and reduce_scatter: this rank's block, no other
    n, r = pctx.size, pctx.rank
    out = np.arange(2 * n + 1, dtype=np.int64)
    with pytest.raises(hpccoll.ArgumentError, match=f"sendbuf must be block {r} of recvbuf"):
        pctx.world.allgather(out[2 * r + 1:2 * r + 3], out[:2 * n])
    with pytest.raises(hpccoll.ArgumentError, match=f"recvbuf must be block {r} of sendbuf"):
        pctx.world.reduce_scatter(out[:2 * n], out[2 * r + 1:2 * r + 3])
    out = np.zeros(2 * n, np.int64)
    out[2 * r:2 * r + 2] = r
    pctx.world.allgather(out[2 * r:2 * r + 2], out).wait()
    np.testing.assert_array_equal(out, np.repeat(np.arange(n), 2))
    pctx.world.reduce_scatter(out, out[2 * r:2 * r + 2]).wait()
    np.testing.assert_array_equal(out[2 * r:2 * r + 2], [r * n] * 2)
    odd = np.frombuffer(bytearray(65), np.float64, count=8, offset=1)
    with pytest.raises(hpccoll.ArgumentError, match="sendbuf: expected an array aligned"):
        pctx.world.allreduce(odd)
    # nothing was queued by the failed calls: the next collective pairs up normally
    np.testing.assert_array_equal(pctx.world.allreduce(x).wait(), np.full(4, pctx.size))


@pytest.mark.mpi(min_size=2)
def test_a_rank_starting_at_issue_and_a_rank_queueing_agree(mpi_world):
    """Rank 0 starts tiny collectives on the calling thread, the others queue them
    (express=False): the same MPI calls in the same order and the same fingerprints, so
    results are right and no mismatch is reported, under every mismatch check."""
    r = mpi_world.rank
    for check in ("deferred", "every"):
        with hpccoll.init(policy="preemptive", timeout=60, express=(r == 0),
                          check_mismatch=check, mismatch_every=4) as ctx:
            n = ctx.size
            for i in range(20):
                x = np.full(3, i + r, np.int64)
                np.testing.assert_array_equal(ctx.world.allreduce(x).wait(),
                                              np.full(3, n * i + sum(range(n))))
            buf = np.full(2, r, np.int32)
            ctx.world.broadcast(buf, root=n - 1).wait()
            np.testing.assert_array_equal(buf, n - 1)
            ctx.world.barrier().wait()
            np.testing.assert_array_equal(ctx.world.allgather(np.full(2, r, np.int32)).wait(),
                                          np.repeat(np.arange(n), 2))
            np.testing.assert_array_equal(
                ctx.world.alltoall(np.arange(n, dtype=np.int64) + 10 * r).wait(),
                10 * np.arange(n) + r)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mixed", [False, True])
def test_per_call_check_raises_on_every_rank(mpi_world, mixed):
    """check_mismatch="every": rank 0 allreduces 2 elements, the others 3 (or rank 0
    broadcasts...): every rank raises CollectiveMismatch from that very wait(), naming the
    field, whether it started the collective at issue or queued it."""
    r = mpi_world.rank
    with hpccoll.init(policy="preemptive", timeout=60, check_mismatch="every",
                      express=(r == 0) or not mixed) as ctx:
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
            field = case.split()[-1]
            with pytest.raises(hpccoll.CollectiveMismatch) as info:
                w.wait()
            assert field in info.value.fields and field in str(info.value)
            assert 0 in info.value.ranks or 1 in info.value.ranks
            with pytest.raises(hpccoll.ContextClosed):
                comm.allreduce(np.ones(2, np.int64))     # the communicator is unusable
        # the world communicator was never touched: still fine
        np.testing.assert_array_equal(ctx.world.allreduce(np.ones(2, np.int64)).wait(),
                                      np.full(2, ctx.size))


@pytest.mark.parametrize("policy", ["fifo", "ordered"])
def test_other_policies_keep_their_launch_order(policy):
    with hpccoll.init(policy=policy, timeout=60) as ctx:
        for i in range(5):
            np.testing.assert_array_equal(
                ctx.world.allreduce(np.full(2, i, np.float32)).wait(),
                np.full(2, i * ctx.size, np.float32))


@pytest.mark.mpi(min_size=2)
def test_truncation_is_explained_by_the_check(mpi_world, monkeypatch):
    """An MPI truncation error on rank 0's data request (forced here) does not fail the
    task at once: the check still runs, so every rank gets the same CollectiveMismatch
    naming the field, and nobody waits for rank 0's fingerprint in vain."""
    from hpccoll.transport import mpi as transport
    r = mpi_world.rank
    with hpccoll.init(policy="preemptive", timeout=60, check_mismatch="every") as ctx:
        comm = ctx.world.dup()      # (its barrier, under the timeout, before the fault)
        if r == 0:
            class Truncating:
                def Test(self):
                    raise MPI.Exception(MPI.ERR_TRUNCATE)

            # the real collective, so the peers' complete; its request tests truncated
            for name in ("start", "start_slot"):
                real = getattr(transport, name)
                monkeypatch.setattr(transport, name,
                                    lambda *a, real=real: real(*a) and Truncating())
        w = comm.allreduce(np.ones(2 if r == 0 else 3, np.int64))
        with pytest.raises(hpccoll.CollectiveMismatch, match="count"):
            w.wait()


def test_an_mpi_error_at_start_fails_the_collective(mpi_world, monkeypatch):
    """An MPI error when a collective starts fails that collective with an error naming
    it, on every rank (each rank's start fails here, or a peer's failure notice comes
    first and the call itself raises), and the communicator is unusable after it."""
    from hpccoll.transport import mpi as transport

    def start(*args):
        raise MPI.Exception(MPI.ERR_OTHER)
    with hpccoll.init(policy="preemptive", timeout=60, cell_bytes=0) as ctx:
        comm = ctx.world.dup()      # (its barrier, under the timeout, before the fault)
        monkeypatch.setattr(transport, "start", start)
        monkeypatch.setattr(transport, "start_slot", start)
        with pytest.raises(hpccoll.HpcCollError, match=r"allreduce .*#0 int64 x2"):
            comm.allreduce(np.ones(2, np.int64)).wait()
        with pytest.raises(hpccoll.HpcCollError):
            comm.allreduce(np.ones(2, np.int64)).wait()


def test_the_plan_cache_is_bounded_and_evicted_plans_free_their_requests(ctx, monkeypatch):
    """A program whose sizes keep changing keeps at most PLAN_CACHE plans and sets of
    persistent requests per communicator; evicted requests are freed, and results stay
    right."""
    from hpccoll.core import state as st_mod
    monkeypatch.setattr(st_mod, "PLAN_CACHE", 8)
    comm = ctx.world.dup(name="sizes")
    try:
        st = comm._state
        for n in range(1, 41):
            w = comm.allreduce(np.full(n, comm.rank + 1, np.int64))
            assert w.wait().tolist() == [comm.size * (comm.size + 1) // 2] * n
            assert len(st.plans) <= 8 and len(st.persist) <= 8
        # every plan left is one of the newest sizes
        assert all(sig[2] > 40 - 8 for sig in st.plans)
        assert all(key[2] > 40 - 8 for key in st.persist)
        assert st.orphans == []
    finally:
        comm.free()


def test_evicting_plans_while_their_collectives_wait_keeps_ranks_in_step(monkeypatch):
    """A plan evicted while a collective that takes its persistent request is still
    queued on one rank and already started on another: no rank may initialise a request
    the others do not (it would shift MPI's collective order on the communicator and hang
    a later collective).  Rank 0 lets its engine start the tiny one before the eviction,
    the others evict at once; one persistent request per plan, three plans kept."""
    import time

    from hpccoll.core import plan as plan_mod, state as st_mod
    monkeypatch.setattr(st_mod, "PLAN_CACHE", 3)
    monkeypatch.setattr(plan_mod, "PERSISTENT_SLOTS", 1)
    with hpccoll.init(policy="fifo", timeout=20) as c:
        comm = c.world.dup(name="churn")
        size, rank = comm.size, comm.rank
        total = size * (size + 1) // 2
        for step in range(12):
            big = comm.allreduce(np.full((1 << 16) + step, rank + 1, np.int64))  # a new plan
            tiny = comm.allreduce(np.full(1, rank + 1, np.int64))   # queued behind it
            if rank == 0:
                time.sleep(0.02)
            new = comm.allreduce(np.full(100 + step, rank + 1, np.int64))  # evicts the oldest
            assert big.wait().tolist() == [total] * ((1 << 16) + step)
            assert tiny.wait().tolist() == [total]
            assert new.wait().tolist() == [total] * (100 + step)
        assert len(comm._state.plans) <= 3
        comm.free()


# -- shared-memory programs run by their waiter -------------------------------------------
BIG = 70_001      # float32: above shm_min_bytes, so flat node-shared memory takes it


def _want(mpi_world, x):
    want = np.empty_like(x)
    mpi_world.Allreduce(x, want)
    return want


@pytest.mark.mpi(min_size=2)
def test_a_shared_memory_program_runs_on_its_waiter(pctx, mpi_world):
    """On an idle engine a shared-memory program starts at issue, compiled, and its waiter
    (or test()) runs it to the end without the engine; one nobody waits for is adopted by
    the daemon, and free() and callbacks take it along.  Results exact against MPI."""
    engine = pctx._engine
    x = ((np.arange(BIG) * 7 + pctx.rank) % 13 - 6).astype(np.float32)
    want = _want(mpi_world, x)
    out = np.empty_like(x)
    w = _loose(pctx.world, x, out)
    assert w.lane.native is not None or w.lane.code is not None
    assert w.plan.algo == "shm" and w.admitted
    assert w.wait() is out and w.retired and engine.idle()
    np.testing.assert_array_equal(out, want)
    assert w.counters["t_end"] is not None
    gate = pctx.world._state.gate
    assert gate.held == 0
    out[:] = 0
    w = _loose(pctx.world, x, out)
    deadline = time.monotonic() + 10
    while not w.test() and time.monotonic() < deadline:
        pass
    assert w.test() and w.retired and gate.held == 0
    np.testing.assert_array_equal(out, want)
    out[:] = 0
    w = _loose(pctx.world, x, out)
    while not w._done and time.monotonic() < deadline:   # nobody waits: the daemon runs it
        time.sleep(0.001)
    assert w._done
    np.testing.assert_array_equal(w.wait(), want)
    assert gate.held == 0 and engine.idle()
    comm = pctx.world.dup(name="loose-program")
    out[:] = 0
    w = _loose(comm, x, out)
    seen = []
    w.add_done_callback(seen.append)
    comm.free()
    assert w.test()
    np.testing.assert_array_equal(w.wait(), want)
    while not seen and time.monotonic() < deadline:
        time.sleep(0.001)
    assert seen == [w]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("small", [False, True])
def test_loose_programs_in_opposite_orders_complete(pctx, mpi_world, small):
    """Two communicators, opposite issue and wait orders on alternating ranks: a program
    waited for while another program (or a loose MPI collective, ``small``) of this rank
    is left unpolled would wait for peers that wait for that one.  The waiter hands both
    to the engine instead; every iteration completes, exact."""
    a, b = pctx.world.dup(name="opp-a"), pctx.world.dup(name="opp-b")
    r = pctx.rank
    xa = ((np.arange(BIG) + r) % 11 - 5).astype(np.float32)
    xb = (np.arange(8 if small else BIG) % 7 + r).astype(np.float32)
    wa, wb = _want(mpi_world, xa), _want(mpi_world, xb)
    oa, ob = np.empty_like(xa), np.empty_like(xb)
    for it in range(20):
        oa[:] = 0
        ob[:] = 0
        if (r + it) % 2:
            w1, w2 = b.allreduce(xb, ob), a.allreduce(xa, oa)
        else:
            w1, w2 = a.allreduce(xa, oa), b.allreduce(xb, ob)
        (w1 if r % 2 else w2).wait()
        (w2 if r % 2 else w1).wait()
        np.testing.assert_array_equal(oa, wa)
        np.testing.assert_array_equal(ob, wb)
    assert pctx._engine.idle()
    a.free()
    b.free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("settings,loose", [
    ({"policy": "preemptive", "max_active": 1}, False),
    ({"policy": "ordered", "max_active": 1}, False), ({"policy": "fifo"}, False),
    ({"policy": "preemptive", "express": False}, False), ({"policy": "ordered"}, True)])
def test_programs_start_on_the_engine_where_slots_or_order_bind(mpi_world, settings, loose):
    """A bounded slot count (a program started at issue would hold none, and under ordered
    it needs a place in the launch order), fifo, or express off: programs are never loose.
    Under ordered with unbounded slots a program needs no place in the order, and starts at
    issue as under preemptive.  Results exact."""
    ctx = hpccoll.init(timeout=60, **settings)
    try:
        x = ((np.arange(BIG) * 3 + ctx.rank) % 9 - 4).astype(np.float32)
        want = _want(mpi_world, x)
        seen = set()
        for _ in range(4):        # (every mismatch_every-th call carries the check)
            w = ctx.world.allreduce(x)
            seen.add(at_issue(w))
            np.testing.assert_array_equal(w.wait(), want)
        assert seen == {False} if not loose else True in seen
    finally:
        ctx.close()


@pytest.mark.mpi(min_size=2)
def test_loose_programs_from_two_threads(pctx, mpi_world):
    """Two application threads, each with its own communicator, issuing and waiting for
    shared-memory programs at once: each started at issue when the engine's lock is free,
    and driven by whichever waiter holds it; every result exact."""
    import threading
    comms = [pctx.world.dup(name=f"thread{i}") for i in range(2)]
    xs = [((np.arange(BIG) * (i + 2) + pctx.rank) % 9 - 4).astype(np.float32)
          for i in range(2)]
    wants = [_want(mpi_world, x) for x in xs]
    errors = []

    def worker(i):
        try:
            out = np.empty_like(xs[i])
            for _ in range(25):
                out[:] = 0
                comms[i].allreduce(xs[i], out).wait()
                np.testing.assert_array_equal(out, wants[i])
        except Exception as exc:      # reported below, on the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads) and not errors, errors
    for c in comms:
        c.free()
