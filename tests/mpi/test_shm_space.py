"""Node-shared memory where /dev/shm is small or fills up (issue 32, finding 5): a 4 MiB
tmpfs, as small containers have.  A communicator whose file the directory cannot hold
exchanges through MPI only, with a warning, on every rank alike; a file made while there
was room has its pages reserved, so a full file system later is no SIGBUS; registered
buffers that cannot fit raise ResourcesExhausted on every rank.  (The job died of a bus
error at the first 1 MiB allreduce.)  Needs root to mount the tmpfs (CI runs as root)."""
import os
import subprocess
import tempfile

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
from hpccoll import ResourcesExhausted

MIB = 1 << 20


@pytest.fixture(scope="module")
def small_tmpfs(mpi_world):
    """A 4 MiB tmpfs that every rank of this node sees (the tests run on one node)."""
    where, why = None, None
    if mpi_world.rank == 0:
        if os.geteuid() != 0:
            why = "mounting a small tmpfs needs root"
        else:
            where = tempfile.mkdtemp(prefix="hpccoll-small-shm-")
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", where],
                                  capture_output=True, text=True)
            if done.returncode:
                os.rmdir(where)
                where, why = None, f"mount -t tmpfs failed: {done.stderr.strip()}"
    where, why = mpi_world.bcast((where, why))
    if why:
        pytest.skip(why)
    yield where
    import gc
    gc.collect()
    with open("/proc/self/maps") as f:           # every context closed: nothing mapped
        left = [line for line in f if where in line]
    mpi_world.Barrier()
    if mpi_world.rank == 0:
        subprocess.run(["umount", "-l", where], check=True)
        os.rmdir(where)
    assert not left, left


def fill(where: str) -> None:
    """Take every free byte of the file system (rank 0; the others wait)."""
    if MPI.COMM_WORLD.rank == 0:
        with open(os.path.join(where, "filler"), "wb") as f:
            try:
                while True:
                    f.write(b"\1" * (64 << 10))
                    f.flush()
            except OSError:
                pass
    MPI.COMM_WORLD.Barrier()


def empty(where: str) -> None:
    MPI.COMM_WORLD.Barrier()
    if MPI.COMM_WORLD.rank == 0:
        os.unlink(os.path.join(where, "filler"))
    MPI.COMM_WORLD.Barrier()


def check_large_collectives(ctx):
    for n in (MIB // 4, 70_001):
        x = np.arange(n, dtype=np.float32) + ctx.rank
        want = ctx.size * np.arange(n, dtype=np.float32) + sum(range(ctx.size))
        np.testing.assert_array_equal(ctx.world.allreduce(x).wait(timeout=30), want)
        np.testing.assert_array_equal(ctx.world.allgather(x).wait(timeout=30),
                                      np.concatenate([x - ctx.rank + r for r in range(ctx.size)]))


@pytest.mark.mpi(min_size=2)
def test_a_file_that_does_not_fit_means_mpi_only_with_a_warning(small_tmpfs):
    """8 MiB per rank asked of a 4 MiB file system."""
    with pytest.warns(RuntimeWarning, match="no node-shared memory.*MPI only"):
        ctx = hpccoll.init(timeout=30, shm_dir=small_tmpfs, shm_slot_bytes=4 * MIB,
                           shm_slots=2)
    with ctx:
        assert ctx.world._state.shm is None
        check_large_collectives(ctx)
        assert os.listdir(small_tmpfs) == []


@pytest.mark.mpi(min_size=2)
def test_a_file_system_that_fills_after_init_is_no_signal(small_tmpfs):
    """Made while there was room, then the file system fills: its pages were reserved."""
    with hpccoll.init(timeout=30, shm_dir=small_tmpfs, shm_slot_bytes=128 << 10,
                      shm_slots=2) as ctx:
        assert ctx.world._state.shm is not None
        fill(small_tmpfs)
        try:
            check_large_collectives(ctx)
            with pytest.warns(RuntimeWarning, match="No space left"):
                d = ctx.world.dup()     # made now, it does not fit: MPI only, and right
            assert d._state.shm is None
            x = np.ones(MIB // 4, np.float32)
            np.testing.assert_array_equal(d.allreduce(x).wait(timeout=30), x * ctx.size)
            d.free()
        finally:
            empty(small_tmpfs)


@pytest.mark.mpi(min_size=2)
def test_registered_buffers_that_cannot_fit_raise_on_every_rank():
    """ctx.empty maps its window from /dev/shm: asked for more than it has free, every rank
    raises ResourcesExhausted, and the context goes on working."""
    free = os.statvfs("/dev/shm").f_bavail * os.statvfs("/dev/shm").f_frsize
    with hpccoll.init(timeout=30) as ctx:
        with pytest.raises(ResourcesExhausted, match="/dev/shm has .* bytes free"):
            ctx.empty(free // 2 + MIB, np.uint8)
        np.testing.assert_array_equal(ctx.world.allreduce(np.ones(3)).wait(), ctx.size)
