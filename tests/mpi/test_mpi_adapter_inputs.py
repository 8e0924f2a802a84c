"""hpccoll.mpi.Comm on inputs mpi4py accepts beyond plain arrays: objects that carry
__cuda_array_interface__ themselves.  Each call against mpi4py's own on the same inputs,
with node-shared-memory programs run by the C executor and by the Python one (shm_in_c)."""
import numpy as np
import pytest
from mpi4py import MPI

import hpccoll.mpi
from tests.devarrays import InstanceCAI, RaisingCAI
from tests.mpi.conftest import POLICY
from tests.mpi.twins import data, twin

pytestmark = pytest.mark.mpi

COUNTS = [5, 3000]   # entries per block: 40 B, 24 KiB (shared memory)


@pytest.fixture(scope="module", params=[True, False], ids=["shm_in_c", "shm_in_python"])
def ad(request):
    """An adapter whose shared-memory programs run in C (where built) or in Python."""
    comm = hpccoll.mpi.Comm(MPI.COMM_WORLD, policy=POLICY, timeout=60, shm_in_c=request.param)
    yield comm
    comm.context.close()


def test_instance_level_cuda_array_interface_is_forwarded(world, ad):
    """An object that carries __cuda_array_interface__ itself (mpi4py's GPU-like test
    arrays) is a device buffer to mpi4py, which runs it; the adapter forwards it (it used
    to raise TypeError: the interface was looked for on the type only)."""
    n, r = world.size, world.rank
    for c in COUNTS:
        x = data("int64", c, r)
        xs = data("int64", n * c, r, salt=1)

        def out(k):
            return InstanceCAI(np.zeros(k, "int64"))
        for method, build in [
            ("Allreduce", lambda: ([InstanceCAI(x), y := out(c)], [y.arr])),
            ("Allreduce", lambda: ([MPI.IN_PLACE, b := InstanceCAI(x.copy())], [b.arr])),
            ("Allreduce", lambda: ([[InstanceCAI(x), MPI.INT64_T], [y := out(c), MPI.INT64_T],
                                    MPI.MAX], [y.arr])),
            ("Iallreduce", lambda: ([InstanceCAI(x), y := out(c)], [y.arr])),
            ("Bcast", lambda: ([b := InstanceCAI(x.copy()), n - 1], [b.arr])),
            ("Allgather", lambda: ([InstanceCAI(x), y := out(n * c)], [y.arr])),
            ("Alltoall", lambda: ([InstanceCAI(xs), y := out(n * c)], [y.arr])),
            ("Reduce_scatter_block", lambda: ([InstanceCAI(xs), y := out(c)], [y.arr])),
            ("Allgatherv", lambda: ([InstanceCAI(x), [y := out(n * c), [c] * n]], [y.arr])),
        ]:
            twin(world, ad, method, build, native=False)


def test_a_raising_cuda_array_interface_is_not_read(world, ad):
    """A property that raises (torch, for a tensor that requires grad) is mpi4py's to
    judge: both raise the same error, on every rank, before anything is sent."""
    x = RaisingCAI(np.zeros(4))
    with pytest.raises(Exception) as theirs:
        world.Allreduce(x, np.zeros(4))
    with pytest.raises(Exception) as mine:
        ad.Allreduce(x, np.zeros(4))
    assert type(mine.value) is type(theirs.value)
    assert str(mine.value) == str(theirs.value)
    # and the adapter still works
    twin(world, ad, "Allreduce", lambda: ([np.ones(3), y := np.zeros(3)], [y]))
