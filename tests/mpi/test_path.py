"""The one per-call path (docs/path.md): every collective, from the native API and the
mpi4py adapter, traced or not, checked every call or not, is issued by CommState.issue,
waited for by Engine.wait and completed by Engine.complete, with its flight row; results
exact against MPI's own collectives on changing data, on two communicators issued in
opposite orders on alternate ranks."""
import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
import hpccoll.mpi

pytestmark = pytest.mark.mpi

# element counts: 1, a few, the largest persistent request (4 KiB of int32: staging
# copies), 16 KiB of int32 (node-shared memory where it runs in C) and 64 KiB
COUNTS = (1, 7, 1024, 4096, 16384)


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


def issue(comm, coll, x, root):
    if coll == "allreduce":
        return comm.allreduce(x)
    if coll == "reduce":
        return comm.reduce(x, root=root)
    if coll == "broadcast":
        return comm.broadcast(x.copy(), root=root)
    if coll == "allgather":
        return comm.allgather(x)
    if coll == "reduce_scatter":
        return comm.reduce_scatter(x)
    return comm.alltoall(x)


COLLECTIVES = ("allreduce", "reduce", "broadcast", "allgather", "reduce_scatter", "alltoall")


@pytest.mark.parametrize("options", [{}, {"trace": True}, {"check_mismatch": "every"},
                                     {"express": False}],
                         ids=["default", "traced", "checked", "queued"])
@pytest.mark.parametrize("count", COUNTS)
def test_every_collective_matches_mpi_on_changing_data(mpi_world, count, options):
    n, r = mpi_world.size, mpi_world.rank
    with hpccoll.init(timeout=60, **options) as ctx:
        a, b = ctx.world.dup(name="a"), ctx.world.dup(name="b")
        order = (a, b) if r % 2 == 0 else (b, a)
        for it in range(3):
            for coll in COLLECTIVES:
                per = count * (n if coll in ("reduce_scatter", "alltoall") else 1)
                x = ((np.arange(per) * (it + 3) + r * 7) % 101 - 50).astype(np.int32)
                root = (it + 1) % n
                works = [issue(c, coll, x, root) for c in order]
                want = reference(mpi_world, coll, x, n, root)
                for w in works:
                    got = w.wait()
                    if want is not None:
                        np.testing.assert_array_equal(got, want, err_msg=f"{coll} it {it}")
        a.free()
        b.free()


def _at_issue(work) -> bool:
    return work.t_start is not None and work.t_start == work.t_issue


@pytest.mark.parametrize("options", [{"trace": True}, {"check_mismatch": "every"}],
                         ids=["traced", "checked"])
def test_tracing_and_checking_add_steps_not_another_path(options):
    """trace=True records every collective, check_mismatch="every" checks every one, and
    both run the same path: collectives the MPI library runs still start at issue."""
    with hpccoll.init(timeout=60, **options) as ctx:
        x = np.ones(2, np.float32)
        works = [ctx.world.allreduce(x) for _ in range(8)]
        for w in works:
            np.testing.assert_array_equal(w.wait(), np.full(2, ctx.size, np.float32))
        assert any(_at_issue(w) for w in works)
        if options.get("trace"):
            rows = ctx.trace()
            assert [row["ident"] for row in rows][-8:] == [w.ident for w in works]
        elif ctx.size > 1:         # (one rank alone has nobody to disagree with)
            assert all(w.check is not None for w in works)


def test_the_adapters_blocking_calls_have_flight_rows():
    """mpi4py's blocking collectives through the adapter complete on the same path: each
    leaves its flight row, so a timeout report shows them."""
    comm = hpccoll.mpi.Comm(MPI.COMM_WORLD, timeout=60)
    try:
        x, y = np.ones(4, np.float64), np.empty(4, np.float64)
        comm.Allreduce(x, y, op=MPI.SUM)
        comm.Bcast(x, root=0)
        comm.Barrier()
        np.testing.assert_array_equal(y, np.full(4, comm.size))
        rows = comm.context._engine.flight.rows(0.0)
        assert [row["coll"] for row in rows][-3:] == ["allreduce", "broadcast", "barrier"]
        assert all(row["state"] == "done" for row in rows[-3:])
    finally:
        comm.context.close()


@pytest.mark.mpi(min_size=2)
def test_ranks_starting_at_issue_and_ranks_queueing_work_together(mpi_world):
    """express on some ranks and off on others: the same MPI calls in the same order on
    every rank (starting at issue changes who makes them, not which or when in order)."""
    r = mpi_world.rank
    with hpccoll.init(timeout=60, express=(r % 2 == 0)) as ctx:
        for count in COUNTS:
            x = (np.arange(count) % 13 + r).astype(np.int64)
            works = [ctx.world.allreduce(x) for _ in range(5)]
            want = reference(mpi_world, "allreduce", x, ctx.size, 0)
            for w in works:
                np.testing.assert_array_equal(w.wait(), want)
