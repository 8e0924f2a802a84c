"""Inputs mpi4py accepts, on the native API (issue 32, findings 2 and 6): a read-only buffer
at a broadcast's root (the root only reads it), NumPy subclasses read by their data
(np.matrix, masked arrays), on both executors of shared-memory programs; results exact
against MPI's own collectives on the same inputs."""
import numpy as np
import pytest
from mpi4py import MPI

import hpccoll

pytestmark = [pytest.mark.mpi,
              pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")]  # (np.matrix)

SIZES = (1, 2048, 16384, 32768, 262144)     # 4 B .. 1 MiB of float32


@pytest.fixture(params=[True, False], ids=["c", "python"], scope="module")
def ctx(request):
    c = hpccoll.init(timeout=60, shm_in_c=request.param)
    yield c
    c.close()


@pytest.mark.parametrize("n", SIZES)
def test_a_read_only_root_buffer_broadcasts(ctx, mpi_world, n):
    r = ctx.rank
    for root in {0, ctx.size - 1}:
        x = ((np.arange(n) * 3 + root) % 1000).astype(np.float32)
        want = x.copy() if r == root else np.zeros(n, np.float32)
        mpi_world.Bcast(want, root=root)
        if r == root:
            x.flags.writeable = False
            got = ctx.world.broadcast(x, root=root).wait()
            assert got is x and not x.flags.writeable
        else:
            got = ctx.world.broadcast(np.zeros(n, np.float32), root=root).wait()
        np.testing.assert_array_equal(got, want)
    # the communicator is fine afterwards
    np.testing.assert_array_equal(ctx.world.allreduce(np.ones(2)).wait(), np.full(2, ctx.size))


@pytest.mark.parametrize("n", (8, 4096, 65536))
def test_numpy_subclasses_are_read_by_their_data(ctx, mpi_world, n):
    r, size = ctx.rank, ctx.size
    base = (np.arange(size * n) % 97 + r).astype(np.int64)
    m = np.matrix(base.reshape(size, n))
    want = np.empty_like(base)
    mpi_world.Allreduce(base, want)
    np.testing.assert_array_equal(ctx.world.allreduce(m).wait(), want)
    mpi_world.Alltoall(base, want)
    np.testing.assert_array_equal(ctx.world.alltoall(m).wait(), want)
    part = np.empty(n, np.int64)
    mpi_world.Reduce_scatter_block(base, part)
    np.testing.assert_array_equal(ctx.world.reduce_scatter(m).wait(), part)
    masked = np.ma.masked_array(base, mask=base % 2 == 0)
    mpi_world.Allreduce(base, want)
    out = np.ma.masked_array(np.zeros_like(base), mask=np.zeros(base.size, bool))
    got = ctx.world.allreduce(masked, out).wait()
    assert got is out
    np.testing.assert_array_equal(out.data, want)       # the data, its mask untouched
    assert not out.mask.any()
