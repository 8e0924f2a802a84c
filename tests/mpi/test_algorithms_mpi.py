"""Every point-to-point algorithm over real MPI, named and result-checked: the algorithm
table picks it (``work.counters["algo"]`` says so) and the result equals the MPI
library's own collective's.  Shared memory and MPI's own collectives are off here
(``shm=False``, ``mpi_coll_bytes=0``), small chunks make the pipelined ones move many;
the other tests cover shared memory (test_shm.py) and MPI's own (test_pipeline.py)."""
import numpy as np
import pytest
from mpi4py import MPI

import hpccoll

SMALL, LARGE = 5, 70_001          # elements: under and over small_msg_bytes below


@pytest.fixture(scope="module")
def p2p():
    with hpccoll.init(timeout=60, shm=False, mpi_coll_bytes=0, cell_bytes=0, small_msg_bytes=4096,
                      chunk_bytes=16384) as ctx:
        yield ctx.world


def ints(count, rank, salt=0):
    return ((np.arange(count) * 7 + rank * 3 + salt) % 11 - 5).astype(np.int64)


def expect_algo(work, comm, algo):
    assert comm.size == 1 or work.counters["algo"] == algo, work.counters["algo"]


@pytest.mark.parametrize("count,algo", [(SMALL, "doubling"), (LARGE, "ring")])
def test_allreduce(p2p, mpi_world, count, algo):
    x = ints(count, p2p.rank)
    want = np.empty_like(x)
    mpi_world.Allreduce(x, want)
    w = p2p.allreduce(x)
    np.testing.assert_array_equal(w.wait(), want)
    expect_algo(w, p2p, algo)
    y = x.astype(np.float64)
    w = p2p.allreduce(y, y, op="avg")                  # in place, divided first
    np.testing.assert_allclose(w.wait(), want / p2p.size)
    expect_algo(w, p2p, algo)


@pytest.mark.parametrize("count,algo", [(SMALL, "binomial"), (LARGE, "ring")])
def test_reduce(p2p, mpi_world, count, algo):
    for root in sorted({0, p2p.size - 1}):
        x = ints(count, p2p.rank, salt=root)
        want = np.empty_like(x)
        mpi_world.Allreduce(x, want, op=MPI.MAX)
        w = p2p.reduce(x, op="max", root=root)
        got = w.wait()
        if p2p.rank == root:
            np.testing.assert_array_equal(got, want)
        expect_algo(w, p2p, algo)


@pytest.mark.parametrize("count,algo", [(SMALL, "binomial"), (LARGE, "chain")])
def test_broadcast(p2p, mpi_world, count, algo):
    root = p2p.size - 1
    x = ints(count, p2p.rank)
    want = x.copy()
    mpi_world.Bcast(want, root=root)
    w = p2p.broadcast(x, root=root)
    assert w.wait() is x
    np.testing.assert_array_equal(x, want)
    expect_algo(w, p2p, algo)


@pytest.mark.parametrize("count,algo", [(SMALL, "bruck"), (LARGE, "ring")])
def test_allgather(p2p, mpi_world, count, algo):
    n, r = p2p.size, p2p.rank
    x = ints(count, r)
    want = np.empty(n * count, np.int64)
    mpi_world.Allgather(x, want)
    full = np.zeros(n * count, np.int64)
    full[r * count:(r + 1) * count] = x
    for w in (p2p.allgather(x), p2p.allgather(full, full)):
        np.testing.assert_array_equal(w.wait(), want)
        expect_algo(w, p2p, algo)


def test_reduce_scatter_ring(p2p, mpi_world):
    n = p2p.size
    x = ints(n * LARGE, p2p.rank)
    want = np.empty(LARGE, np.int64)
    mpi_world.Reduce_scatter_block(x, want)
    w = p2p.reduce_scatter(x)
    np.testing.assert_array_equal(w.wait(), want)
    expect_algo(w, p2p, "ring")


@pytest.mark.parametrize("count", [SMALL, LARGE])
def test_alltoall_pairwise(p2p, mpi_world, count):
    n = p2p.size
    x = ints(n * count, p2p.rank)
    want = np.empty_like(x)
    mpi_world.Alltoall(x, want)
    y = x.copy()
    for w in (p2p.alltoall(x), p2p.alltoall(y, y)):
        np.testing.assert_array_equal(w.wait(), want)
        expect_algo(w, p2p, "pairwise")


def test_barrier_dissemination(p2p):
    w = p2p.barrier()
    assert w.wait() is None
    expect_algo(w, p2p, "dissemination")


def test_one_node_takes_shared_memory(mpi_world):
    """With the defaults, ranks on one node move large messages through shared memory
    (what test_collectives.py's large counts exercise)."""
    with hpccoll.init(timeout=60) as ctx:
        x = ints(LARGE, ctx.rank).astype(np.float32)
        w = ctx.world.allreduce(x)
        want = np.empty_like(x)
        mpi_world.Allreduce(x, want)
        np.testing.assert_array_equal(w.wait(), want)
        node = mpi_world.Split_type(MPI.COMM_TYPE_SHARED)
        if node.size == mpi_world.size > 1:
            assert w.counters["algo"] == "shm"
        node.Free()
