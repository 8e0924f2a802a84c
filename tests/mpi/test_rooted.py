"""gather, scatter, scan and exscan of the core API against MPI's own collectives on the
same inputs (exact for integers; floats within a tolerance derived from the number of
ranks), every contract dtype and every op hpccoll has, every root, in place and not, each
algorithm forced; and on two communicators issued in opposite orders, without deadlock."""
import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
from hpccoll.algorithms import TABLE, Choice, select
from hpccoll.base.ops import CONTRACT_DTYPES
from tests.mpi.conftest import POLICY
from tests.mpi.test_collectives import assert_close, make_input

pytestmark = pytest.mark.mpi

COUNTS = [0, 1, 7, 1000, 70_001]     # 1000 x 8 B > small_msg_bytes below: the pipelined ones
MPI_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX,
           "land": MPI.LAND, "lor": MPI.LOR, "lxor": MPI.LXOR, "band": MPI.BAND,
           "bor": MPI.BOR, "bxor": MPI.BXOR}
NP_OPS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
          "land": np.logical_and, "lor": np.logical_or, "lxor": np.logical_xor,
          "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}


def algos(coll):
    return [None] + [name for name, _, _ in TABLE[coll]]


def scan_ops(dtype):
    kind = np.dtype(dtype).kind
    return ["sum", "prod", "min", "max"] + (list(NP_OPS)[4:] if kind in "iu" else [])


@pytest.fixture(scope="module")
def ctx():
    with hpccoll.init(timeout=60, small_msg_bytes=4096, chunk_bytes=16384) as c:
        yield c


def forced(ctx, coll, algo):
    """A fresh communicator whose ``coll`` takes ``algo`` where it can run (None: the
    table's own choice)."""
    c = ctx.world.dup(name=f"{coll}-{algo}")
    if algo is not None:
        c._state.prefer = {coll: algo}
    return c


def check_algo(work, comm, algo, dtype):
    got = work.counters["algo"]
    if algo is None or comm.size == 1:
        return
    shm = comm._state.shm
    if algo == "mpi" and np.dtype(dtype) == np.float16:
        assert got != "mpi"         # MPI has no float16: hpccoll's own run it
    elif algo == "cma" and not (shm and len(shm["local"]) == comm.size and shm["area"].cma):
        assert got != "cma"         # (single copy needs every rank on one node, and CMA)
    elif algo == "shm" and not (shm and len(shm["local"]) == comm.size):
        assert got != "shm"         # (node-shared memory needs every rank on one node)
    elif algo == "cells":
        # one node, C built, a message a cell holds, or larger where the table's rows have
        # cells by reference (every rank may read the others' memory)
        st = comm._state
        nbytes, cell_bytes = work.plan.nbytes, st.ctx.settings.cell_bytes
        one_node = shm and len(shm["local"]) == comm.size and st.ctx.c_programs
        choice = Choice(nbytes, shm="flat", cma=bool(one_node and shm["area"].cma),
                        ranks=comm.size, cell_bytes=cell_bytes)
        # (cells lead every collective's candidates: the table picks them where they run)
        fits = one_node and select(work.plan.coll, choice) == "cells"
        assert (got == "cells") == bool(fits), (algo, got, nbytes)
    else:
        assert got == algo, (algo, got)


def roots(n):
    return sorted({0, n // 2, n - 1})


def raw(x):
    return x.view(np.uint8)


@pytest.mark.parametrize("algo", algos("gather"))
@pytest.mark.parametrize("dtype", CONTRACT_DTYPES)
def test_gather(ctx, mpi_world, algo, dtype):
    comm = forced(ctx, "gather", algo)
    n, r = comm.size, comm.rank
    for count in COUNTS:
        for root in roots(n):
            x = make_input(dtype, count, r, salt=root)
            want = np.empty(n * count, dtype) if r == root else None
            mpi_world.Gather(raw(x), None if want is None else raw(want), root=root)
            w = comm.gather(x, root=root)
            got = w.wait()
            check_algo(w, comm, algo, dtype)
            if r == root:
                np.testing.assert_array_equal(got, want, err_msg=f"count {count} root {root}")
            else:
                assert got is None
            # given recvbuf; in place (the same array, and sendbuf as block root)
            out = np.full(n * count, 3, dtype)
            assert comm.gather(x, out, root=root).wait() is out
            if r == root:
                np.testing.assert_array_equal(out, want)
                full = np.zeros(n * count, dtype)
                full[r * count:(r + 1) * count] = x
                comm.gather(full, full, root=root).wait()
                np.testing.assert_array_equal(full, want)
                full[:] = 0
                full[r * count:(r + 1) * count] = x
                comm.gather(full[r * count:(r + 1) * count], full, root=root).wait()
                np.testing.assert_array_equal(full, want)
            else:
                comm.gather(x, None, root=root).wait()
                comm.gather(x, root=root).wait()
    comm.free()


@pytest.mark.parametrize("algo", algos("scatter"))
@pytest.mark.parametrize("dtype", CONTRACT_DTYPES)
def test_scatter(ctx, mpi_world, algo, dtype):
    comm = forced(ctx, "scatter", algo)
    n, r = comm.size, comm.rank
    for count in COUNTS:
        for root in roots(n):
            whole = make_input(dtype, n * count, root, salt=7)   # the same on every rank
            want = np.empty(count, dtype)
            mpi_world.Scatter(raw(whole) if r == root else None, raw(want), root=root)
            w = comm.scatter(whole, root=root)      # recvbuf None: sized from sendbuf
            np.testing.assert_array_equal(w.wait(), want, err_msg=f"count {count} root {root}")
            check_algo(w, comm, algo, dtype)
            out = np.full(count, 3, dtype)
            send = whole if r == root else None     # sendbuf is the root's only
            assert comm.scatter(send, out, root=root).wait() is out
            np.testing.assert_array_equal(out, want)
            if r == root:       # in place: the same array, and recvbuf as block root
                buf = whole.copy()
                assert comm.scatter(buf, buf, root=root).wait() is buf
                np.testing.assert_array_equal(buf, whole)
                comm.scatter(buf, buf[r * count:(r + 1) * count], root=root).wait()
                np.testing.assert_array_equal(buf, whole)
            else:
                comm.scatter(None, out, root=root).wait()
                comm.scatter(None, out, root=root).wait()
                np.testing.assert_array_equal(out, want)
    comm.free()


def reference_scan(mpi_world, x, op, exclusive):
    """MPI's own Scan/Exscan; float16 (which MPI lacks) by Allgather + NumPy in rank
    order.  None for exscan's rank 0 (MPI leaves it undefined)."""
    r = mpi_world.rank
    if x.dtype == np.float16:
        allx = np.empty((mpi_world.size, x.size), x.dtype)
        mpi_world.Allgather(x, allx)
        if exclusive and r == 0:
            return None
        last = r - 1 if exclusive else r
        out = allx[0].astype(np.float32)
        for row in allx[1:last + 1]:
            NP_OPS[op](out, row.astype(np.float32), out=out)
        return out.astype(np.float16)
    out = np.empty_like(x)
    (mpi_world.Exscan if exclusive else mpi_world.Scan)(x, out, op=MPI_OPS[op])
    return None if exclusive and r == 0 else out


@pytest.mark.parametrize("coll", ["scan", "exscan"])
@pytest.mark.parametrize("algo", ["mpi", "doubling", "chain", None])
@pytest.mark.parametrize("dtype", CONTRACT_DTYPES)
def test_scan(ctx, mpi_world, coll, algo, dtype):
    comm = forced(ctx, coll, algo)
    n, r = comm.size, comm.rank
    run = comm.scan if coll == "scan" else comm.exscan
    for count in COUNTS:
        for op in scan_ops(dtype):
            x = make_input(dtype, count, r, salt=len(op))
            want = reference_scan(mpi_world, x, op, coll == "exscan")
            w = run(x, op=op)
            got = w.wait()
            what = f"{coll} {op} count {count} rank {r}"
            if want is None:            # exscan's rank 0: untouched (allocated: zeros)
                assert (got == 0).all(), what
            else:
                assert_close(got, want, dtype, n, what)
            if algo != "mpi" or op in ("sum", "prod", "min", "max"):
                check_algo(w, comm, algo, dtype)
            buf = x.copy()          # in place
            assert run(buf, buf, op=op).wait() is buf
            if want is None:
                np.testing.assert_array_equal(buf, x, err_msg=what)
            else:
                assert_close(buf, want, dtype, n, what)
            out = np.full(count, 3, dtype)
            run(x, out, op=op).wait()
            if want is None:
                assert (out == 3).all(), what
            else:
                assert_close(out, want, dtype, n, what)
    comm.free()


@pytest.mark.skipif(POLICY == "fifo", reason="fifo may deadlock on divergent orders "
                    "(the contract: the watchdog turns it into CollectiveTimeout)")
def test_keyed_and_divergent_orders(ctx, mpi_world):
    """Two communicators used in opposite orders on odd and even ranks, with MPI's own
    collectives and with hpccoll's (keyed: matched by key, never MPI's), and keyed calls
    on one communicator issued in opposite orders."""
    n, r = ctx.size, ctx.rank
    a, b = ctx.world.dup(name="a"), ctx.world.dup(name="b")
    for count in (5, 3000):
        x = make_input(np.int64, count, r)
        whole = make_input(np.int64, n * count, 0, salt=1)
        gathered = np.empty(n * count, np.int64)
        mpi_world.Allgather(x, gathered)
        scanned = np.empty_like(x)
        mpi_world.Scan(x, scanned)
        for rep in range(20):
            keyed = rep % 2 == 1
            kw = (lambda k: {"key": f"{k}{rep}"}) if keyed else (lambda k: {})
            issue = {"g": lambda: a.gather(x, root=rep % n, **kw("g")),
                     "e": lambda: a.exscan(x, op="max", **kw("e")),
                     "s": lambda: b.scan(x, **kw("s")),
                     "c": lambda: b.scatter(whole, root=(rep + 1) % n, **kw("c"))}
            # communicator a first on some ranks, b first on the others; keyed calls
            # also in opposite orders on one communicator
            order = "gesc" if (r + rep) % 2 else "scge"
            if keyed and (r + rep) % 2:
                order = "egcs"
            works = {k: issue[k]() for k in order}
            g, s, c, e = (works[k].wait() for k in "gsce")
            if r == rep % n:
                np.testing.assert_array_equal(g, gathered)
            np.testing.assert_array_equal(s, scanned)
            np.testing.assert_array_equal(c, whole[r * count:(r + 1) * count])
            if r > 0:
                np.testing.assert_array_equal(e, np.max(gathered.reshape(n, count)[:r], 0))
            if keyed and n > 1:
                assert all(w.counters["algo"] != "mpi" for w in works.values())
    a.free()
    b.free()


def test_trace_and_flight_rows(mpi_world):
    with hpccoll.init(timeout=60, trace=True) as c:
        comm = c.world
        x = np.arange(4, dtype=np.int32) + comm.rank
        comm.gather(x, root=0).wait()
        comm.scatter(np.zeros(4 * comm.size, np.int32), root=0).wait()
        comm.scan(x).wait()
        comm.exscan(x).wait()
        rows = c.trace()
        assert [row["coll"] for row in rows[-4:]] == ["gather", "scatter", "scan", "exscan"]


def test_mismatch_is_caught(mpi_world):
    """Ranks that disagree about a root or a count raise CollectiveMismatch everywhere."""
    if mpi_world.size < 2:
        pytest.skip("needs two ranks")
    with hpccoll.init(timeout=60, check_mismatch="every") as c:
        comm = c.world
        with pytest.raises(hpccoll.CollectiveMismatch):
            comm.gather(np.ones(2 + comm.rank, np.int64), root=0).wait()
    with hpccoll.init(timeout=60, check_mismatch="every") as c:
        comm = c.world
        with pytest.raises(hpccoll.CollectiveMismatch):
            comm.scan(np.ones(3, np.int64), op="sum" if comm.rank else "max").wait()


def test_bad_arguments_raise_before_anything_is_queued(ctx):
    comm = ctx.world
    n, r = comm.size, comm.rank
    x = np.ones(4, np.int64)
    with pytest.raises(hpccoll.ArgumentError, match="root"):
        comm.gather(x, root=n)
    with pytest.raises(hpccoll.ArgumentError, match="avg"):
        comm.scan(x.astype(np.float64), op="avg")
    with pytest.raises(hpccoll.ArgumentError, match="recvbuf"):
        comm.exscan(x, np.ones(5, np.int64))
    with pytest.raises(hpccoll.ArgumentError, match="recvbuf"):
        comm.scatter(None, None, root=(r + 1) % n if n > 1 else 0) if n > 1 else \
            comm.gather(x, np.ones(3, np.int64))
    if n > 1:       # (one rank divides anything)
        with pytest.raises(hpccoll.ArgumentError, match="sendbuf"):
            comm.scatter(np.ones(n * 4 + 1, np.int64), root=r)
    with pytest.raises(hpccoll.ArgumentTypeError, match="sendbuf"):
        comm.gather([1, 2, 3])
    # nothing was queued: the communicator is still in step with the other ranks
    np.testing.assert_array_equal(comm.scan(x).wait(), x * (r + 1))
