"""A real client through the adapter: mpipartition (PyPI), a particle partitioner that takes
an mpi4py communicator.  ``Partition(3, comm=hpccoll.mpi.Comm(MPI.COMM_WORLD))`` makes its
Cartesian communicator with ``Create_cart`` (an adapter), and ``distribute`` moves the
particles with ``bcast``, ``Alltoall``, ``Alltoallv`` and ``Reduce`` on it: every particle
must arrive at the rank whose subvolume holds it, none lost or doubled, and the calls must
run on hpccoll (``comm.stats``)."""
import numpy as np
import pytest
from mpi4py import MPI

import hpccoll.mpi
from hpccoll.mpi import _coverage as coverage
from tests.mpi.conftest import POLICY

mpipartition = pytest.importorskip("mpipartition")

pytestmark = pytest.mark.mpi

BOX = 10.0


def _shares(*comms) -> tuple:
    """(native calls, all collective calls, forwarded methods) over the adapters' stats."""
    native = total = 0
    forwarded = set()
    for comm in comms:
        for name, counts in comm.stats.items():
            if name not in coverage.COLLECTIVES:
                continue    # constructors, Free
            native += counts["native"]
            total += counts["native"] + counts["forwarded"]
            if counts["forwarded"]:
                forwarded.add(name)
    return native, total, forwarded


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("count", [0, 1, 1000, 60_000])
def test_mpipartition_distributes_through_the_adapter(count):
    world = MPI.COMM_WORLD
    n, r = world.size, world.rank
    comm = hpccoll.mpi.Comm(world, policy=POLICY, timeout=60)
    try:
        partition = mpipartition.Partition(3, comm=comm)
        cart = partition.comm
        assert isinstance(cart, hpccoll.mpi.Cartcomm) and cart.context is comm.context
        rng = np.random.default_rng(17 + r)
        mine = count + 13 * r if count else 0       # uneven, and none at all
        data = {"x": rng.uniform(0, BOX, mine), "y": rng.uniform(0, BOX, mine),
                "z": rng.uniform(0, BOX, mine).astype(np.float32),
                "id": np.arange(mine, dtype=np.int64) + (r << 40),
                "mass": rng.integers(0, 100, mine).astype(np.int32)}
        moved = mpipartition.distribute(partition, BOX, data, ["x", "y", "z"])

        # the same multiset of ids everywhere, each with its own data
        before = np.concatenate(world.allgather(data["id"]))
        after = np.concatenate(world.allgather(moved["id"]))
        np.testing.assert_array_equal(np.sort(after), np.sort(before))
        for key in data:
            assert moved[key].dtype == data[key].dtype and len(moved[key]) == len(moved["id"])
        everything = {k: np.concatenate(world.allgather(data[k])) for k in data}
        where = np.argsort(everything["id"])
        rows = where[np.searchsorted(everything["id"], moved["id"], sorter=where)]
        for key in data:
            np.testing.assert_array_equal(moved[key], everything[key][rows])
        # each particle on the rank that owns its position
        lo = np.array(partition.origin) * BOX
        hi = lo + np.array(partition.extent) * BOX
        for d, key in enumerate("xyz"):
            x = moved[key].astype(np.float64)
            top = partition.coordinates[d] == partition.decomposition[d] - 1
            assert ((x >= lo[d] - 1e-9) & ((x < hi[d]) | (top & (x <= BOX)))).all(), key

        native, total, forwarded = _shares(comm, cart)
        del partition, cart     # (Partition.__del__ frees the Cartesian adapter)
        share = world.allreduce(native) / max(1, world.allreduce(total))
        if r == 0:
            print(f"\nmpipartition distribute of {count}: {share:.1%} of the collective "
                  f"calls native on {n} ranks; forwarded: {sorted(forwarded) or 'none'}")
        # every collective it calls runs on hpccoll (the object methods too)
        assert not forwarded, forwarded
        assert share >= 0.95
    finally:
        comm.context.close()
