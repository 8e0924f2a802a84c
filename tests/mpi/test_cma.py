"""Single-copy collectives (algorithms/cma.py, transport/cma.py): the probe agreed by
every rank, the table's picks, results exact against MPI's own collectives in every form
(in place, unaligned counts, every root, two communicators progressing in opposite
orders), the setting that turns it off, and a read the kernel refuses on one rank failing
the collective on every rank instead of hanging."""
import time

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
from hpccoll import ContextClosed, HpcCollError, algorithms
from hpccoll.engine import program

pytestmark = pytest.mark.mpi(min_size=2)

M = 70_001     # elements per block: not a multiple of anything


@pytest.fixture(scope="module")
def cctx():
    c = hpccoll.init(trace=True, timeout=60)
    yield c
    c.close()


def forced(ctx, name="cma", cname="cma"):
    comm = ctx.world.dup(name=cname)
    comm._state.prefer = {c: name for c in ("allgather", "alltoall", "broadcast", "allreduce",
                                            "reduce_scatter")}
    return comm


def algos(ctx):
    return {(r["coll"], r["algo"]) for r in ctx.trace(clear=True) if r["coll"] != "barrier"}


def ints(n, rank, salt=0, dtype=np.int32):
    return ((np.arange(n) * 7 + rank * 5 + salt) % 1009 - 500).astype(dtype)


def test_every_rank_agrees_it_may_read_its_peers(cctx, mpi_world):
    area = cctx.world._state.shm["area"]
    ok = mpi_world.allgather(area.cma)
    assert len(set(ok)) == 1
    # (Linux, one user, no container: what CI and workstations have)
    assert area.cma, "process_vm_readv between this job's ranks was refused"
    assert sorted(mpi_world.allgather(area.pids[cctx.world.rank])) == sorted(area.pids)


def test_the_table_picks_single_copy_where_it_was_measured_ahead(cctx, mpi_world):
    """alltoall above 64 KiB (above 2 MiB at 2 ranks, where shared memory runs in C);
    allreduce above 4 MiB at 2 ranks; the others only where a calibration picks it
    (algorithms/__init__.py)."""
    w = cctx.world
    n = w.size
    # 1 MiB and more; at 2 ranks past where shared memory takes it
    per = (1 << 18) if n > 2 else algorithms.EXCHANGE_C2_BYTES // 4 // n + 1
    x = ints(n * per, w.rank)
    w.alltoall(x).wait(timeout=30)
    w.alltoall(x[:n * 4]).wait(timeout=30)               # small: staged
    w.allgather(x[:1 << 18]).wait(timeout=30)
    w.broadcast(x.copy(), root=0).wait(timeout=30)
    big = np.ones(3 << 20, np.float32)                   # 12 MiB
    np.testing.assert_array_equal(w.allreduce(big).wait(timeout=30), np.full(3 << 20, n))
    got = algos(cctx)
    # (cells, and staged programs this small, only where the C executor runs them; in an
    # install without a C compiler the table takes MPI's own up to 64 KiB)
    small = ("shm" if n * 4 * 4 > cctx.settings.cell_bytes else "cells") if cctx.c_programs \
        else "mpi"
    assert {("alltoall", "cma"), ("alltoall", small)} <= got
    assert ("allgather", "cma") not in got and ("broadcast", "cma") not in got
    assert (("allreduce", "cma") in got) == (n == 2)


def test_gathers_write_into_the_root_where_that_was_measured_ahead(cctx, mpi_world):
    """A gather is single copy (each peer writes the head of its block into the root's
    output, the root reads the tail) above 128 KiB, staged at and below; exact against
    MPI's own either way, for every root."""
    w = cctx.world
    n, r = w.size, w.rank
    bound = algorithms.CMA_GATHER_BYTES
    for total in (bound, bound + 4 * n):
        m = total // (4 * n)
        x = ints(m, r, total)
        for root in range(n):
            want = np.empty(n * m, np.int32) if r == root else None
            mpi_world.Gather(x, want, root=root)
            got = w.gather(x, root=root).wait(timeout=30)
            if r == root:
                np.testing.assert_array_equal(got, want)
        got = {a for c, a in algos(cctx) if c == "gather"}
        assert got == ({"cma"} if total > bound else {"shm"}), (total, got)


@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.float64])
def test_results_exact_against_mpi(cctx, mpi_world, dtype):
    comm = forced(cctx)
    n, r = comm.size, comm.rank
    for m in (1, 3, M):
        x = ints(n * m, r, m, dtype)
        want = np.empty_like(x)
        mpi_world.Alltoall(x, want)
        np.testing.assert_array_equal(comm.alltoall(x).wait(timeout=30), want)
        np.testing.assert_array_equal(x, ints(n * m, r, m, dtype))       # input untouched
        z = x.copy()
        comm.alltoall(z, z).wait(timeout=30)                              # in place
        np.testing.assert_array_equal(z, want)
        y = x[:m].copy()
        g = np.empty(n * m, dtype)
        mpi_world.Allgather(y, g)
        np.testing.assert_array_equal(comm.allgather(y).wait(timeout=30), g)
        buf = np.zeros(n * m, dtype)
        buf[r * m:(r + 1) * m] = y
        comm.allgather(buf[r * m:(r + 1) * m], buf).wait(timeout=30)     # in place
        np.testing.assert_array_equal(buf, g)
        for root in range(n):
            b = y.copy() if r == root else np.full(m, 3, dtype)
            comm.broadcast(b, root=root).wait(timeout=30)
            np.testing.assert_array_equal(b, ints(n * m, root, m, dtype)[:m])
    assert algos(cctx) == {("alltoall", "cma"), ("allgather", "cma"), ("broadcast", "cma")}
    comm.free()


@pytest.mark.parametrize("dtype,op", [(np.int32, "sum"), (np.int64, "max"), (np.uint8, "prod"),
                                      (np.float32, "sum"), (np.float16, "sum")])
def test_reductions_exact_against_mpi(cctx, mpi_world, dtype, op):
    """allreduce and reduce_scatter, in place or not, counts below the rank count too;
    float data are small integers (exact in any order); float16 runs in Python."""
    comm = forced(cctx)
    n, r = comm.size, comm.rank
    mop = {"sum": MPI.SUM, "max": MPI.MAX, "prod": MPI.PROD}[op]
    for count in (1, n + 1, M):
        x = ints(count, r, count, dtype) if op != "prod" else (np.arange(count) % 3 + 1).astype(dtype)
        wide = x.astype(np.float64) if dtype == np.float16 else x
        want = np.empty_like(wide)
        mpi_world.Allreduce(wide, want, op=mop)
        want = want.astype(dtype)
        np.testing.assert_array_equal(comm.allreduce(x, op=op).wait(timeout=30), want)
        z = x.copy()
        comm.allreduce(z, z, op=op).wait(timeout=30)
        np.testing.assert_array_equal(z, want)
        y = np.concatenate([x] * n)
        got = comm.reduce_scatter(y, op=op).wait(timeout=30)
        np.testing.assert_array_equal(got, want)
        comm.reduce_scatter(y, y[r * count:(r + 1) * count], op=op).wait(timeout=30)
        np.testing.assert_array_equal(y[r * count:(r + 1) * count], want)
    assert algos(cctx) == {("allreduce", "cma"), ("reduce_scatter", "cma")}
    comm.free()


def test_avg(cctx, mpi_world):
    comm = forced(cctx)
    x = np.linspace(0, 1, M) * (comm.rank + 1)
    want = np.empty_like(x)
    mpi_world.Allreduce(x, want)
    np.testing.assert_allclose(comm.allreduce(x, op="avg").wait(timeout=30), want / comm.size)
    comm.free()


def test_two_communicators_in_opposite_orders(cctx, mpi_world):
    """Each rank issues on the two in the other's order, several at once, then waits for
    all: every collective completes with MPI's result (their flags are their own)."""
    a, b = forced(cctx, cname="a"), forced(cctx, cname="b")
    n, r = a.size, a.rank
    order = [a, b] if r % 2 == 0 else [b, a]
    for rep in range(3):
        xs = {c.name: ints(n * M, r, rep + len(c.name) + (c is b)) for c in (a, b)}
        works = []
        for c in order:
            works.append((c, "alltoall", c.alltoall(xs[c.name])))
            works.append((c, "allgather", c.allgather(xs[c.name][:M])))
        for c, coll, wk in works:
            theirs = [ints(n * M, q, rep + len(c.name) + (c is b)) for q in range(n)]
            lo = r * M if coll == "alltoall" else 0
            want = np.concatenate([t[lo:lo + M] for t in theirs])
            np.testing.assert_array_equal(wk.wait(timeout=30), want, err_msg=f"{c.name} {coll}")
    a.free()
    b.free()


def test_off_by_setting(mpi_world):
    with hpccoll.init(trace=True, timeout=60, cma=False) as ctx:
        assert not ctx.world._state.shm["area"].cma
        n = ctx.size
        x = ints(n * (1 << 18), ctx.rank)
        want = np.empty_like(x)
        mpi_world.Alltoall(x, want)
        np.testing.assert_array_equal(ctx.world.alltoall(x).wait(timeout=30), want)
        assert ("alltoall", "cma") not in algos(ctx)


def test_a_refused_read_fails_the_collective_on_every_rank(mpi_world):
    """Rank 1 reads from a process that does not exist (its view of rank 0's pid spoilt
    before the plan is made): rank 1's collective fails with the kernel's error, the
    others' name rank 1, long before the watchdog; the communicator is unusable after."""
    with hpccoll.init(timeout=60) as ctx:
        comm = forced(ctx, cname="spoilt")
        area = comm._state.shm["area"]
        if ctx.rank == 1:
            area.pids = (2 ** 22 + 12_345,) + area.pids[1:]
        t0 = time.monotonic()
        with pytest.raises(HpcCollError) as info:
            comm.allgather(ints(M, ctx.rank)).wait(timeout=30)
        assert time.monotonic() - t0 < 10
        text = str(info.value)
        if ctx.rank == 1:
            assert "process_vm_readv" in text
        else:
            assert "failed on rank 1" in text
        with pytest.raises(ContextClosed, match="unusable"):
            comm.barrier()
        np.testing.assert_array_equal(ctx.world.allreduce(np.ones(2)).wait(timeout=30),
                                      np.full(2, ctx.size))


def test_a_refused_write_fails_the_gather_on_every_rank(mpi_world):
    """Rank 1 writes its block into a process that does not exist (its view of the root's
    pid spoilt): rank 1's gather fails with the kernel's error, the others' name rank 1,
    long before the watchdog; the communicator is unusable after on every rank.  Another
    peer may write into the root's output after the root failed (it had seen the root's
    READY): the root keeps that buffer alive (a freed one gave that peer EFAULT)."""
    with hpccoll.init(timeout=60) as ctx:
        comm = ctx.world.dup(name="spoilt-gather")
        comm._state.prefer = {"gather": "cma"}
        area = comm._state.shm["area"]
        if ctx.rank == 1:
            area.pids = (2 ** 22 + 12_345,) + area.pids[1:]
        t0 = time.monotonic()
        text = ""
        try:
            comm.gather(ints(M, ctx.rank), root=0).wait(timeout=30)
        except HpcCollError as e:
            text = str(e)
        assert time.monotonic() - t0 < 10
        if ctx.rank == 1:
            assert "process_vm_writev" in text
        elif ctx.rank == 0 or text:
            assert "failed on rank 1" in text
        if ctx.rank == 0:
            # the root's output, where another peer may still be writing, is kept alive
            assert any(b[1] is not None and b[1].size == ctx.size * M for b in program.HELD)
        # (a rank whose gather completed learns it from the failure notice: the first
        # error it sees names rank 1)
        with pytest.raises(HpcCollError, match="unusable"):
            comm.barrier().wait(timeout=30)
        np.testing.assert_array_equal(ctx.world.allreduce(np.ones(2)).wait(timeout=30),
                                      np.full(2, ctx.size))


def test_empty_messages(cctx):
    """Nothing to read: every collective still completes on every rank (flags only)."""
    comm = forced(cctx)
    x = np.empty(0, np.int32)
    for _ in range(3):
        for coll in ("alltoall", "allgather", "allreduce", "reduce_scatter"):
            assert getattr(comm, coll)(x).wait(timeout=30).shape == (0,)
        comm.alltoall(x, x).wait(timeout=30)
        assert comm.broadcast(np.empty(0, np.int32), root=comm.size - 1).wait(timeout=30).shape == (0,)
    assert {a for _, a in algos(cctx)} == {"cma"}
    comm.free()
