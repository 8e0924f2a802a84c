"""Cells: small collectives in one handoff through node-shared memory (the ``cells`` row,
engine/_native.c).  Every collective cells run (allreduce, reduce, reduce_scatter,
broadcast, allgather, alltoall, gather, scatter, barrier), for every dtype and op, in place and out,
against the MPI library's own (exact: integer-valued data); back to back on several
communicators in opposite orders, more at once than a ring holds, a rank late by 100 ms,
and a mismatch between ranks; larger broadcasts, gathers and scatters by reference, the
same ways.  (A rank stopped or killed mid-collective: tests/unit/test_cells_fault.py.)"""
import time

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
from hpccoll.algorithms import C_SHM_COLLECTIVES, Choice, message_bytes, select
from hpccoll.engine import code

pytestmark = pytest.mark.mpi

DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
          np.float32, np.float64, np.float16]
OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}
COUNTS = [1, 7, 64]          # 7 x 8 B: the data shares its line with the sequence word


@pytest.fixture(scope="module")
def cctx():
    c = hpccoll.init(trace=True, timeout=60, calibration="off")
    yield c
    c.close()


def expect_cells(ctx, coll, dtype, op=None):
    """Whether cells run this call here: every rank on one node, C built, its reduction."""
    if ctx.size == 1 or code._native is None or not ctx.c_programs:
        return False
    return op is None or code.c_reduces(np.dtype(dtype), op)


def algos(ctx):
    return [(r["coll"], r["algo"]) for r in ctx.trace(clear=True)]


def data(count, rank, dtype, salt=0):
    """Small integers (exact in every dtype and under every op at 4 ranks)."""
    v = (np.arange(count) * 3 + rank * 5 + salt) % 3 + (1 if np.dtype(dtype).kind == "u" else -1)
    return v.astype(dtype)


def mpi_type_ok(dtype):
    return np.dtype(dtype) != np.float16


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", list(OPS))
def test_allreduce_reduce_reduce_scatter_exact(cctx, mpi_world, dtype, op):
    w = cctx.world
    n, r = w.size, w.rank
    cctx.trace(clear=True)
    for count in COUNTS:
        x = data(count, r, dtype)
        want = np.empty_like(x)
        if mpi_type_ok(dtype):
            mpi_world.Allreduce(x, want, op=OPS[op])
        else:
            want = np.stack(mpi_world.allgather(x)).astype(np.float32)
            want = getattr(np, {"sum": "sum", "prod": "prod", "max": "max", "min": "min"}[op])(
                want, axis=0).astype(dtype)
        np.testing.assert_array_equal(w.allreduce(x, op=op).wait(), want)
        inplace = x.copy()
        w.allreduce(inplace, inplace, op=op).wait()
        np.testing.assert_array_equal(inplace, want)
        for root in range(n):
            out = w.reduce(x, root=root, op=op).wait()
            if r == root:
                np.testing.assert_array_equal(out, want)
        full = np.concatenate([data(count, r, dtype, salt=q) for q in range(n)])
        whole = np.empty_like(full)
        if mpi_type_ok(dtype):
            mpi_world.Allreduce(full, whole, op=OPS[op])
            np.testing.assert_array_equal(w.reduce_scatter(full, op=op).wait(),
                                          whole[r * count:(r + 1) * count])
    used = {a for _, a in algos(cctx)}
    if expect_cells(cctx, "allreduce", dtype, op):
        assert used == {"cells"}, used
    else:
        assert "cells" not in used


@pytest.mark.parametrize("dtype", DTYPES)
def test_broadcast_allgather_alltoall_gather_scatter_barrier_exact(cctx, mpi_world, dtype):
    w = cctx.world
    n, r = w.size, w.rank
    cctx.trace(clear=True)
    for count in COUNTS:
        x = data(count, r, dtype)
        for root in range(n):
            got = w.broadcast(x.copy(), root=root).wait()
            np.testing.assert_array_equal(got, data(count, root, dtype))
        gathered = np.concatenate([data(count, q, dtype) for q in range(n)])
        np.testing.assert_array_equal(w.allgather(x).wait(), gathered)
        inplace = np.zeros(n * count, dtype)
        inplace[r * count:(r + 1) * count] = x
        w.allgather(inplace[r * count:(r + 1) * count], inplace).wait()
        np.testing.assert_array_equal(inplace, gathered)
        send = np.concatenate([data(count, r, dtype, salt=q) for q in range(n)])
        want = np.concatenate([data(count, q, dtype, salt=r) for q in range(n)])
        np.testing.assert_array_equal(w.alltoall(send).wait(), want)
        for root in range(n):
            got = w.gather(x, root=root).wait()
            if r == root:
                np.testing.assert_array_equal(got, gathered)
            blocks = np.concatenate([data(count, q, dtype, salt=root) for q in range(n)])
            got = w.scatter(blocks if r == root else None, np.empty(count, dtype),
                            root=root).wait()
            np.testing.assert_array_equal(got, data(count, r, dtype, salt=root))
            if r == root:      # in place at the root
                whole = np.zeros(n * count, dtype)
                whole[r * count:(r + 1) * count] = x
                w.gather(whole, whole, root=root).wait()
                np.testing.assert_array_equal(whole, gathered)
                sb = blocks.copy()
                w.scatter(sb, sb[r * count:(r + 1) * count], root=root).wait()
                np.testing.assert_array_equal(sb, blocks)
            else:
                w.gather(x, root=root).wait()
                w.scatter(None, np.empty(count, dtype), root=root).wait()
        w.barrier().wait()
    used = {a for _, a in algos(cctx)}
    if expect_cells(cctx, "broadcast", dtype):
        assert used == {"cells"}, used


def test_the_largest_cell_and_one_byte_more(cctx, mpi_world):
    """Up to cell_bytes the whole result takes cells; a byte more, something else."""
    w = cctx.world
    n, r = w.size, w.rank
    limit = cctx.settings.cell_bytes
    cctx.trace(clear=True)
    for nbytes, count in ((limit, limit // n), (limit + 1, limit // n + 1)):
        send = (np.arange(n * count) + r).astype(np.uint8)
        got = w.alltoall(send).wait()
        want = np.empty_like(send)
        mpi_world.Alltoall(send, want)
        np.testing.assert_array_equal(got, want)
        x = (np.arange(nbytes) % 7 + r).astype(np.uint8)
        want = np.empty_like(x)
        mpi_world.Allreduce(x, want)
        np.testing.assert_array_equal(w.allreduce(x).wait(), want)
    used = algos(cctx)
    if expect_cells(cctx, "alltoall", np.uint8):
        assert used[0][1] == "cells" and used[1][1] == "cells"
        assert used[2][1] != "cells" and used[3][1] != "cells"


@pytest.mark.mpi(min_size=2)
def test_back_to_back_on_communicators_in_opposite_orders(cctx, mpi_world):
    """Three communicators, each rank issuing them in a rotated order, many nonblocking
    collectives of several kinds before any wait; more per communicator than a ring holds
    (a writer waits for its readers then, and nothing deadlocks)."""
    w = cctx.world
    n, r = w.size, w.rank
    comms = [w.dup(name=f"cells{i}") for i in range(3)]
    try:
        order = comms[r % 3:] + comms[:r % 3]
        cctx.trace(clear=True)
        for it in range(30):
            works = []
            for c in order:
                for k in range(3):
                    x = np.full(3, it * 10 + k + r, np.int64)
                    works.append((c, "allreduce", it * 10 + k, c.allreduce(x)))
                    works.append((c, "broadcast", it * 10 + k,
                                  c.broadcast(np.full(2, it * 10 + k + r, np.int32),
                                              root=(it + k) % n)))
            for c, kind, base, wk in reversed(works):
                got = wk.wait()
                if kind == "allreduce":
                    np.testing.assert_array_equal(got, n * base + n * (n - 1) // 2)
                else:
                    np.testing.assert_array_equal(got, base + (it + (base - it * 10)) % n)
        if expect_cells(cctx, "allreduce", np.int64, "sum"):
            assert {a for _, a in algos(cctx)} == {"cells"}
        # a ring of cells per communicator, many times over
        many = [comms[0].allreduce(np.full(1, i + r, np.int64)) for i in range(50)]
        for i, wk in enumerate(many):
            np.testing.assert_array_equal(wk.wait(), n * i + n * (n - 1) // 2)
    finally:
        for c in comms:
            c.free()


@pytest.mark.mpi(min_size=2)
def test_a_rank_late_by_100_ms(cctx):
    w = cctx.world
    n, r = w.size, w.rank
    for late in range(min(n, 2)):
        if r == late:
            time.sleep(0.1)
        t0 = time.monotonic()
        got = w.allreduce(np.full(4, r + 1, np.int32)).wait()
        np.testing.assert_array_equal(got, n * (n + 1) // 2)
        got = w.broadcast(np.full(2, r, np.int16), root=late).wait()
        np.testing.assert_array_equal(got, late)
        w.barrier().wait()
        if r != late:
            assert time.monotonic() - t0 >= 0.05    # it waited for the late one


@pytest.mark.mpi(min_size=2)
def test_ranks_calling_different_cell_collectives_get_a_mismatch_not_silent_data(mpi_world):
    """One rank's allreduce against the others' broadcast of the same size: the per-call
    check names the mismatch on every rank (cells exchange no fingerprint themselves)."""
    with hpccoll.init(timeout=30, check_mismatch="every") as ctx:
        w = ctx.world
        x = np.ones(2, np.float64)
        work = w.allreduce(x) if w.rank == 0 else w.broadcast(x, root=0)
        with pytest.raises(hpccoll.CollectiveMismatch):
            work.wait(timeout=20)


# -- by reference: a broadcast, gather or scatter larger than a cell -------------------

def by_reference(ctx):
    """Whether cells run large broadcasts, gathers and scatters by reference here (every
    rank may read the others' memory)."""
    return expect_cells(ctx, "broadcast", np.uint8) and ctx.world._state.shm["area"].cma


def ref_counts(ctx, itemsize):
    """Elements per block around and inside the table's by-reference rows at 2 to 4 ranks
    (algorithms/__init__.py; their bounds are the whole message: the root's buffer)."""
    cell = ctx.settings.cell_bytes
    return sorted({cell // itemsize + 1, 3 * cell // itemsize + 5, (20 << 10) // itemsize,
                   (200 << 10) // itemsize + 3})


def ref_gather_count(ctx, itemsize):
    """A block of a gather the table has by reference beyond 2 ranks (a whole of more
    than a cell and at most REF_GATHER_BYTES; at 2 ranks it runs staged)."""
    return (ctx.settings.cell_bytes // ctx.world.size + 3 * itemsize) // itemsize


def table_picks_cells(ctx, coll, count, itemsize):
    """Whether the table picks cells for ``coll`` of ``count`` elements a block here (by
    reference where it is larger than a cell)."""
    n = ctx.world.size
    in_c = ctx.c_programs and coll in C_SHM_COLLECTIVES     # (core/plan.py: c_bytes)
    choice = Choice(message_bytes(coll, count, n, itemsize), shm="flat", cma=True,
                    ranks=n, cell_bytes=ctx.settings.cell_bytes,
                    shm_c_bytes=ctx.settings.shm_c_bytes if in_c else 0)
    return select(coll, choice) == "cells"   # (cells lead every collective's candidates)


def ref_bcast_count(itemsize):
    """A broadcast by reference beyond 2 ranks (above BCAST_C_BYTES; at 2 ranks staged)."""
    return (160 << 10) // itemsize + 1


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.float64, np.float16])
def test_by_reference_broadcast_gather_scatter_exact(cctx, mpi_world, dtype):
    """Every root, in place and out, against the MPI library's own; the by-reference
    cells take part where the table has them (the layout says so)."""
    w = cctx.world
    n, r = w.size, w.rank
    cctx.trace(clear=True)
    raw = np.uint16 if dtype == np.float16 else dtype     # MPI moves the bits
    for count in ref_counts(cctx, np.dtype(dtype).itemsize):
        x = data(count, r, dtype, salt=count)
        for root in range(n):
            got = w.broadcast(x.copy(), root=root).wait()
            want = x.copy()
            mpi_world.Bcast(want.view(raw), root=root)
            np.testing.assert_array_equal(got, want)
            want = np.zeros(n * count, dtype) if r == root else None
            mpi_world.Gather(x.view(raw), None if want is None else want.view(raw), root=root)
            got = w.gather(x, root=root).wait()
            blocks = np.concatenate([data(count, q, dtype, salt=root) for q in range(n)])
            mine = np.empty(count, dtype)
            mpi_world.Scatter(blocks.view(raw), mine.view(raw), root=root)
            out = w.scatter(blocks if r == root else None, np.empty(count, dtype),
                            root=root).wait()
            np.testing.assert_array_equal(out, mine)
            if r == root:
                np.testing.assert_array_equal(got, want)
                whole = np.zeros(n * count, dtype)      # in place at the root
                whole[r * count:(r + 1) * count] = x
                w.gather(whole, whole, root=root).wait()
                np.testing.assert_array_equal(whole, want)
                sb = blocks.copy()
                w.scatter(sb, sb[r * count:(r + 1) * count], root=root).wait()
                np.testing.assert_array_equal(sb, blocks)
            else:
                w.gather(x, root=root).wait()
                w.scatter(None, np.empty(count, dtype), root=root).wait()
    used = {(c, a) for c, a in algos(cctx)}
    if by_reference(cctx):
        itemsize = np.dtype(dtype).itemsize
        want = {(coll, "cells") for coll in ("broadcast", "gather", "scatter")
                if any(table_picks_cells(cctx, coll, count, itemsize)
                       for count in ref_counts(cctx, itemsize))}
        # (at 2 ranks a large broadcast is staged, a large scatter single copy instead:
        # algorithms/__init__.py)
        assert (("broadcast", "cells") in want) == (n > 2), want
        assert (("scatter", "cells") in want) == (n > 2), want
        assert want <= used, used


@pytest.mark.mpi(min_size=2)
def test_by_reference_in_opposite_orders_on_three_communicators(cctx):
    """A writer returns only once its readers have read its buffer: with every rank
    issuing on three communicators in a rotated order before any wait, each waits for
    readers that wait on another communicator first, and nothing deadlocks.  The buffers
    are changed right after each wait: nobody reads them late."""
    w = cctx.world
    n, r = w.size, w.rank
    gcount, bcount = ref_gather_count(cctx, 8), ref_bcast_count(8)
    comms = [w.dup(name=f"ref{i}") for i in range(3)]
    try:
        order = comms[r % 3:] + comms[:r % 3]
        cctx.trace(clear=True)
        for it in range(10):
            works = []
            for c in order:
                root = (it + comms.index(c)) % n
                b = np.full(bcount, 1000 * it + root, np.int64) if r == root else \
                    np.zeros(bcount, np.int64)
                works.append(("broadcast", root, b, c.broadcast(b, root=root)))
                x = np.full(gcount, 1000 * it + r, np.int64)
                works.append(("gather", root, x, c.gather(x, root=root)))
            for kind, root, buf, wk in reversed(works):
                got = wk.wait()
                if kind == "broadcast":
                    np.testing.assert_array_equal(got, 1000 * it + root)
                elif r == root:
                    np.testing.assert_array_equal(
                        got, np.repeat(1000 * it + np.arange(n), gcount))
                buf[:] = -1          # the caller may reuse it now
        if by_reference(cctx):
            used = algos(cctx)      # (once: it clears the trace)
            assert ({a for c, a in used if c == "broadcast"} == {"cells"}) == \
                table_picks_cells(cctx, "broadcast", bcount, 8)
            assert ({a for c, a in used if c == "gather"} == {"cells"}) == \
                table_picks_cells(cctx, "gather", gcount, 8)
    finally:
        for c in comms:
            c.free()


@pytest.mark.mpi(min_size=2)
def test_by_reference_a_rank_late_by_100_ms(cctx):
    """A broadcast's root returns only once the late reader has read its buffer (where the
    table has it by reference: beyond 2 ranks)."""
    w = cctx.world
    n, r = w.size, w.rank
    late = n - 1
    cctx.trace(clear=True)
    if r == late:
        time.sleep(0.1)
    t0 = time.monotonic()
    b = np.full(ref_bcast_count(4), 7 if r == 0 else 0, np.int32)
    np.testing.assert_array_equal(w.broadcast(b, root=0).wait(), 7)
    waited = time.monotonic() - t0
    count = ref_gather_count(cctx, 4)
    got = w.gather(np.full(count, r, np.int32), root=late).wait()
    if r == late:
        np.testing.assert_array_equal(got, np.repeat(np.arange(n), count))
    if by_reference(cctx):
        used = algos(cctx)          # (once: it clears the trace)
        bcast = table_picks_cells(cctx, "broadcast", ref_bcast_count(4), 4)
        assert ({a for c, a in used if c == "broadcast"} == {"cells"}) == bcast
        assert ({a for c, a in used if c == "gather"} == {"cells"}) == \
            table_picks_cells(cctx, "gather", count, 4)
        if r == 0 and bcast:
            assert waited >= 0.05    # the root waited for the late reader (no other did)
