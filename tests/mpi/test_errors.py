"""Mismatch detection and bad input, at any number of ranks.

The mismatch tests run under both checks: "every" (the mismatched call itself raises)
and "deferred", the default (the mismatched call, or one of the next mismatch_every on
its communicator, raises: the documented bound)."""
import contextlib

import numpy as np
import pytest

import hpccoll
from hpccoll import ArgumentError, ArgumentTypeError, CollectiveMismatch, ContextClosed

pytestmark = pytest.mark.mpi

EVERY = 8    # mismatch_every of the deferred context


@pytest.fixture(scope="module", params=["every", "deferred"])
def checked_ctx(request):
    c = hpccoll.init(timeout=60, check_mismatch=request.param, mismatch_every=EVERY)
    yield c
    c.close(raise_mismatch=False)


@pytest.fixture
def mcomm(checked_ctx):
    """A fresh duplicate per test: a mismatch breaks it."""
    c = checked_ctx.world.dup(name="test")
    yield c
    if c.broken is None:
        c.free()


def _mismatch(comm, call):
    """Every rank raises the same CollectiveMismatch, within the bound of its check, and
    never hangs: the mismatched call itself (check "every"), or it or one of the next
    EVERY collectives on the communicator (check "deferred")."""
    with pytest.raises(CollectiveMismatch) as info:
        call().wait(timeout=30)
        if comm._ctx.settings.check_mismatch == "deferred":
            for _ in range(EVERY):
                comm.barrier().wait(timeout=30)
    # the communicator is unusable afterwards, and says why
    with pytest.raises(ContextClosed, match="unusable"):
        comm.barrier()
    return info.value


@pytest.mark.mpi(min_size=2)
def test_mismatch_count(mcomm):
    comm = mcomm
    odd = comm.size - 1
    exc = _mismatch(comm, lambda: comm.allreduce(np.ones(10 + (comm.rank == odd), np.float32)))
    assert "count" in exc.fields
    assert exc.ranks == (odd,)
    assert f"rank {odd} has 11" in str(exc)


@pytest.mark.mpi(min_size=2)
def test_mismatch_op_same_sizes(mcomm):
    """Same bytes on the wire, different op: without the check some ranks would return garbage."""
    comm = mcomm
    op = "max" if comm.rank == 1 else "sum"
    exc = _mismatch(comm, lambda: comm.allreduce(np.arange(6, dtype=np.int32), op=op))
    assert set(exc.fields) == {"op"}
    assert exc.fields["op"]["max"] == [1]


@pytest.mark.mpi(min_size=2)
def test_mismatch_dtype_same_itemsize(mcomm):
    comm = mcomm
    dt = np.float32 if comm.rank == 0 else np.int32
    exc = _mismatch(comm, lambda: comm.allreduce(np.ones(4, dt)))
    assert set(exc.fields) == {"dtype"}


@pytest.mark.mpi(min_size=2)
def test_mismatch_root(mcomm):
    comm = mcomm
    root = 1 if comm.rank == 1 else 0
    exc = _mismatch(comm, lambda: comm.broadcast(np.ones(8), root=root))
    assert "root" in exc.fields


@pytest.mark.mpi(min_size=2)
def test_mismatch_collective_type(mcomm):
    comm = mcomm
    x = np.ones(4 * comm.size, np.float64)
    exc = _mismatch(comm, lambda: comm.allreduce(x) if comm.rank else comm.alltoall(x))
    assert "collective" in exc.fields


@pytest.mark.mpi(min_size=2)
def test_mismatch_large_count_different_algorithms(mcomm):
    """One rank's message is large (ring), the others' small (doubling): the data transfers
    cannot line up, the check lane still completes and names the count."""
    comm = mcomm
    n = 100_000 if comm.rank == 0 else 10
    exc = _mismatch(comm, lambda: comm.allreduce(np.ones(n, np.float32)))
    assert "count" in exc.fields


def test_bad_input_is_rejected_before_queueing(comm):
    x = np.ones(8, np.float32)
    cases = [
        (lambda: comm.allreduce([1, 2, 3]), ArgumentTypeError, "sendbuf: expected a numpy.ndarray"),
        (lambda: comm.allreduce(x, op="median"), ArgumentError, "op: expected one of"),
        (lambda: comm.allreduce(np.ones(4, np.int32), op="avg"), ArgumentError, "avg.*floating"),
        (lambda: comm.allreduce(x, np.empty(7, np.float32)), ArgumentError,
         "recvbuf: expected 8 elements"),
        (lambda: comm.allreduce(x, np.empty(8, np.float64)), ArgumentTypeError, "recvbuf: dtype"),
        (lambda: comm.allreduce(np.ones((4, 4), np.float32)[:, 1]), ArgumentError, "C-contiguous"),
        (lambda: comm.allreduce(x, np.ones((4, 4), np.float32)[:, :2]), ArgumentError,
         "C-contiguous"),
        (lambda: comm.reduce(x, root=comm.size), ArgumentError, r"root: expected an integer in \[0,"),
        (lambda: comm.broadcast(x, root=-1), ArgumentError, "root"),
        (lambda: comm.allreduce(np.ones(3, np.complex64), op="min"), ArgumentError, "not defined"),
        (lambda: comm.allreduce(np.ones(3, np.float128)), ArgumentTypeError, "not supported"),
        (lambda: comm.allgather(x, np.empty(8 * comm.size + 1, np.float32)), ArgumentError,
         "recvbuf: expected"),
        (lambda: comm.allreduce(x, key=5), ArgumentTypeError, "key: expected a str"),
        (lambda: comm.allreduce(x, x[1:]), ArgumentError, "recvbuf"),
    ]
    if comm.size > 1:
        cases.append((lambda: comm.reduce_scatter(np.ones(comm.size + 1)), ArgumentError,
                      "not a multiple"))
        cases.append((lambda: comm.alltoall(np.ones(comm.size * 2 + 1)), ArgumentError,
                      "not a multiple"))
    ro = np.ones(8, np.float32)
    ro.flags.writeable = False
    cases.append((lambda: comm.allreduce(x, ro), ArgumentError, "read-only"))
    for call, exc_type, pattern in cases:
        with pytest.raises(exc_type, match=pattern):
            call()
    # nothing was queued: the communicator is still in step on every rank
    got = comm.allreduce(np.ones(3, np.int64)).wait(timeout=30)
    np.testing.assert_array_equal(got, np.full(3, comm.size))


def test_errors_are_hpccoll_errors_and_builtin_types():
    assert issubclass(ArgumentError, hpccoll.HpcCollError) and issubclass(ArgumentError, ValueError)
    assert issubclass(ArgumentTypeError, TypeError)
    assert issubclass(hpccoll.CollectiveTimeout, hpccoll.HpcCollError)
    assert issubclass(hpccoll.CollectiveTimeout, TimeoutError)
    assert issubclass(CollectiveMismatch, hpccoll.HpcCollError)


@pytest.mark.mpi(min_size=2)
def test_duplicate_live_key(mpi_world):
    """Each rank's own key stays pending until the others issue it, which they do only
    after every rank tried the duplicate: the error cannot be raced away."""
    with hpccoll.init(policy="preemptive", timeout=30) as ctx:
        comm, r = ctx.world, ctx.rank
        mine = comm.allreduce(np.ones(2), key=f"grad{r}")
        with pytest.raises(ArgumentError, match="already pending"):
            comm.allreduce(np.ones(2), key=f"grad{r}")
        mpi_world.Barrier()
        others = [comm.allreduce(np.ones(2), key=f"grad{q}") for q in range(ctx.size) if q != r]
        for w in [mine] + others:
            np.testing.assert_array_equal(w.wait(timeout=30), np.full(2, ctx.size))


def test_wait_timeout_leaves_collective_pending(comm):
    """wait(timeout) raising does not cancel the collective."""
    if comm.size == 1:
        w = comm.allreduce(np.ones(2))
        assert (w.wait(timeout=10) == 1).all()
        return
    # rank 0 issues late: the others' wait(0.2) runs out, then the collective completes
    import time
    if comm.rank == 0:
        time.sleep(0.5)
    w = comm.allreduce(np.ones(2))
    if comm.rank != 0:
        with pytest.raises(hpccoll.WaitTimeout):
            w.wait(timeout=0.05)
    np.testing.assert_array_equal(w.wait(timeout=30), np.full(2, comm.size))


def test_not_a_member_and_closed_context(mpi_world):
    from mpi4py import MPI
    ctx = hpccoll.init(timeout=30)
    sub = mpi_world.Split(0 if mpi_world.rank == 0 else MPI.UNDEFINED)
    c = ctx.wrap(sub)
    if mpi_world.rank == 0:
        assert c.size == 1
        assert c.allreduce(np.ones(2)).wait() .tolist() == [1.0, 1.0]
        c.free()
        sub.Free()
    else:
        with pytest.raises(ArgumentError, match="not a member"):
            c.allreduce(np.ones(2))
    w = ctx.world
    ctx.close()
    ctx.close()   # idempotent
    with pytest.raises(ContextClosed, match="closed"):
        w.allreduce(np.ones(2))
    with pytest.raises(ContextClosed):
        ctx.world.dup()


def test_unknown_option_is_rejected():
    with pytest.raises(ArgumentError, match="unknown option"):
        hpccoll.init(spin_treshold=3)
    with pytest.raises(ArgumentError, match="policy"):
        hpccoll.init(policy="lifo")


@contextlib.contextmanager
def copies_fail_on(rank: int, me: int):
    """On ``rank`` (this rank is ``me``), every local division of hpccoll's own
    algorithms raises (a failure of one rank alone: an avg divides its input before it
    sends anything); restored on leaving."""
    from hpccoll.base import ops
    original = ops.scale
    if me == rank:
        def broken(dst, src, divisor):
            raise FloatingPointError("injected")
        ops.scale = broken
    try:
        yield
    finally:
        ops.scale = original


@pytest.mark.mpi(min_size=2)
def test_local_failure_reaches_every_member_promptly(mpi_world):
    """A collective that fails on one rank only (here: its first local copy raises, before
    it sent anything) fails on every member at once, naming that rank, instead of leaving
    them to their watchdog."""
    import time
    with hpccoll.init(timeout=60, mpi_coll_bytes=0, cell_bytes=0) as ctx:
        comm = ctx.world.dup(name="fragile")
        with copies_fail_on(1, ctx.rank):
            t0 = time.monotonic()
            with pytest.raises(hpccoll.HpcCollError) as info:
                comm.allreduce(np.ones(16, np.float64), op="avg").wait(timeout=30)
            assert time.monotonic() - t0 < 10          # long before the 60 s watchdog
            assert "injected" in str(info.value) or "failed on rank 1" in str(info.value)
        with pytest.raises(ContextClosed, match="unusable"):
            comm.barrier()
        # other communicators are unaffected
        np.testing.assert_array_equal(ctx.world.allreduce(np.ones(2)).wait(timeout=30),
                                      np.full(2, ctx.size))


@pytest.mark.mpi(min_size=2)
def test_a_failure_before_the_communicator_exists_here_still_reaches_this_rank(mpi_world,
                                                                               monkeypatch):
    """A peer's first collective on a new communicator can fail, and its notice arrive,
    before this rank's dup() has registered the communicator (the last collective call
    of dup() returns at different times on different ranks): the notice is kept, and the
    communicator is broken on arrival, so this rank's collective fails at once too instead
    of waiting for the watchdog (it was dropped, one run in six or so on a loaded node).
    Rank 0 registers only once the notice is in."""
    import time
    from hpccoll.core import context as ctx_mod
    with hpccoll.init(timeout=60, mpi_coll_bytes=0, cell_bytes=0) as ctx:
        if ctx.rank == 0:
            real = ctx_mod.Context._register

            def late(self, comm):
                deadline = time.monotonic() + 10
                while (comm.name == "late" and comm.uid not in self._engine.unclaimed
                       and time.monotonic() < deadline):
                    time.sleep(0.005)
                real(self, comm)
            monkeypatch.setattr(ctx_mod.Context, "_register", late)
        with copies_fail_on(1, ctx.rank):
            comm = ctx.world.dup(name="late")
            t0 = time.monotonic()
            with pytest.raises(hpccoll.HpcCollError, match="failed on rank 1|injected"):
                comm.allreduce(np.ones(16, np.float64), op="avg").wait(timeout=30)
            assert time.monotonic() - t0 < 10
        assert comm.broken is not None
        np.testing.assert_array_equal(ctx.world.allreduce(np.ones(2)).wait(timeout=30),
                                      np.full(2, ctx.size))
