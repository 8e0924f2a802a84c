"""A calibration at work (any number of ranks): init loads rank 0's table, plans take its
picks where they can run, results stay those of NumPy; MPI's own reduce and
reduce_scatter (new candidates) give the same results as hpccoll's own; the measurement
gives every rank the same table."""
import os

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
from hpccoll.core import calibrate
from hpccoll.algorithms.calibration import Calibration
from hpccoll.transport.mpi import library_name as mpi_library

pytestmark = pytest.mark.timeout(120)


def _path(tmp_name):
    """One file for every rank: rank 0 names it."""
    comm = MPI.COMM_WORLD
    import tempfile
    path = os.path.join(tempfile.gettempdir(), f"hpccoll-cal-{os.getpid()}-{tmp_name}.h5") \
        if comm.rank == 0 else None
    return comm.bcast(path, root=0)


def _shape(ctx):
    return ctx.world._state.shape


def test_init_uses_rank_0s_picks_where_they_can_run():
    comm = MPI.COMM_WORLD
    size, rank = comm.size, comm.rank
    path = _path("picks")
    with hpccoll.init(timeout=60, calibration="off") as probe:
        r, p = _shape(probe)
    if rank == 0:
        Calibration({(r, p, "allreduce", "host"): [(8, "ring"), (1 << 20, "doubling")],
                     (r, p, "reduce", "host"): [(8, "binomial")],
                     (r, p, "broadcast", "host"): [(8, "chain")],
                     # this job's ranks may share no memory: then the built-in choice
                     (r, p, "reduce_scatter", "host"): [(8, "shm")]},
                    {}, "test", mpi_library()).save(path)
    comm.Barrier()
    try:
        # only rank 0's file counts: the others point at one that does not exist
        where = path if rank == 0 else path + ".missing"
        with hpccoll.init(timeout=60, calibration=where) as ctx:
            assert ctx.calibration_note == path
            w = ctx.world
            x = np.arange(4, dtype=np.int64) + rank
            res = w.allreduce(x)
            res.wait()
            if size > 1:
                assert res.counters["algo"] == "ring"
            np.testing.assert_array_equal(res.result, np.arange(4) * size + size * (size - 1) // 2)
            big = np.full(1 << 17, rank + 1, np.int64)       # 1 MiB: the doubling pick
            res = w.allreduce(big)
            res.wait()
            if size > 1:
                assert res.counters["algo"] == "doubling"
            assert np.all(res.result == size * (size + 1) // 2)
            red = w.reduce(x, root=size - 1)
            red.wait()
            if size > 1:
                assert red.counters["algo"] == "binomial"
            if rank == size - 1:
                np.testing.assert_array_equal(red.result, np.arange(4) * size + size * (size - 1) // 2)
            b = np.full(2, rank, np.float32)
            bw = w.broadcast(b, root=0)
            bw.wait()
            if size > 1:
                assert bw.counters["algo"] == "chain"
            assert np.all(b == 0)
            rs = w.reduce_scatter(np.ones(size, np.int32))
            rs.wait()
            if size > 1:
                shared = w._state.shm is not None and len(w._state.shm["local"]) == size
                assert (rs.counters["algo"] == "shm") == shared
            assert rs.result.tolist() == [size]
    finally:
        comm.Barrier()
        if rank == 0 and os.path.exists(path):
            os.unlink(path)


def test_a_file_rank_0_cannot_read_is_an_error_on_every_rank():
    bad = "/nonexistent/hpccoll/cal.h5"
    with pytest.raises(hpccoll.ArgumentError, match="calibration .*read on rank 0"):
        hpccoll.init(timeout=60, calibration=bad if MPI.COMM_WORLD.rank == 0 else "off")


@pytest.fixture(scope="module", params=["mpi", "cells"])
def small(request):
    """A context whose small reductions take MPI's own row, or cells (where they run:
    every rank on one node, C built; else MPI's own too)."""
    from hpccoll.engine import code
    c = hpccoll.init(timeout=60, cell_bytes=0 if request.param == "mpi" else 8 << 10)
    cells = request.param == "cells" and c.size > 1 and c.c_programs and code._native
    yield c, "cells" if cells else "mpi"
    c.close()


@pytest.mark.parametrize("dtype", ["int32", "float64"])
@pytest.mark.parametrize("count", [1, 3, 256])   # (up to shm_c_bytes at 4 ranks)
def test_mpi_own_reduce_and_reduce_scatter_match_numpy(small, dtype, count):
    ctx, row = small
    w = ctx.world
    size, rank = w.size, w.rank
    base = (np.arange(count * size) % 7).astype(dtype)
    for root in {0, size - 1}:
        red = w.reduce(base[:count] + rank, root=root, op="max")
        red.wait()
        # (float max stays NumPy's or MPI's: NaN rules; cells do not run it)
        assert red.counters["algo"] == (row if dtype == "int32" else "mpi")
        if rank == root:
            np.testing.assert_array_equal(red.result, base[:count] + size - 1)
    rs = w.reduce_scatter(base + rank)
    rs.wait()
    assert rs.counters["algo"] == row
    want = (base * size + size * (size - 1) // 2)[rank * count:(rank + 1) * count]
    np.testing.assert_array_equal(rs.result, want)
    # avg goes to hpccoll's own (MPI's would divide into an output of another size)
    avg = w.reduce_scatter(np.ones(count * size, np.float64), op="avg")
    avg.wait()
    assert avg.counters["algo"] != "mpi" and np.all(avg.result == 1.0)
    # in place on some ranks only: the same algorithm everywhere, the right blocks
    buf = base + rank
    inp = w.reduce_scatter(buf, buf if rank % 2 else None)
    inp.wait()
    assert inp.counters["algo"] == row
    got = buf[rank * count:(rank + 1) * count] if rank % 2 else inp.result
    np.testing.assert_array_equal(got, want)
    for root in {0, size - 1}:
        buf = base[:count] + rank
        inr = w.reduce(buf, buf if rank in (root, 1) else None, root=root)
        inr.wait()
        assert inr.counters["algo"] == row
        if rank == root:
            np.testing.assert_array_equal(inr.result, base[:count] * size + size * (size - 1) // 2)


def test_measure_gives_every_rank_the_same_table(ctx):
    cal = calibrate.measure(ctx, sizes=(8, 128 << 10), collectives=("allreduce", "reduce"),
                            rounds=2, round_s=2e-4)
    states = MPI.COMM_WORLD.allgather(cal.state())
    assert all(s == states[0] for s in states)
    shape = _shape(ctx)
    assert cal.shapes() == [shape]
    for coll in ("allreduce", "reduce"):
        for n in (8, 128 << 10):
            assert cal.choose(coll, "host", n, *shape) != ""
    # the communicator measured was freed, and the world plans as before
    assert ctx.world._state.prefer == {}
    w = ctx.world.allreduce(np.ones(3, np.int64))
    w.wait()
    assert w.result.tolist() == [ctx.world.size] * 3


def test_init_can_measure_the_table_itself():
    with hpccoll.init(timeout=60, calibration="init") as ctx:
        assert ctx.calibration_note == "measured at init"
        shape = _shape(ctx)
        assert ctx.calibration.shapes() == [shape]
        picks = MPI.COMM_WORLD.allgather(ctx.calibration.state()["picks"])
        assert all(p == picks[0] for p in picks)
        x = np.arange(1 << 16, dtype=np.float32)        # 256 KiB: a measured size
        w = ctx.world.allreduce(x)
        w.wait()
        assert w.counters["algo"] == ctx.calibration.choose("allreduce", "host", x.nbytes,
                                                            *shape) or shape[0] == 1
        np.testing.assert_array_equal(w.result, x * ctx.world.size)
