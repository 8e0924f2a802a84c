"""``hpccoll-tune profile`` as users run it: real mpiexec at 2 ranks, a tiny grid."""
import inspect

import numpy as np

import hpccoll
from hpccoll import h5log
from hpccoll.tuning import Profile
from tests import launch

BLOCKS_API = "blocks" in inspect.signature(hpccoll.Communicator.allreduce).parameters


def test_profile_writes_measured_numbers_with_environment(tmp_path):
    out = tmp_path / "profile.h5"
    blocks = "1,2" if BLOCKS_API else "default"
    proc = launch.run(2, ["-m", "hpccoll.tuning.cli", "profile", "--out", str(out),
                          "--sizes", "4K,256K", "--blocks", blocks, "--repeats", "3",
                          "--rounds", "2", "--kernel-size", "64", "--contend-bytes", "4M"],
                      timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "profile written" in proc.stdout
    prof = Profile.load(str(out))
    assert prof.sources == {"comm_time": "measured", "slowdown": "measured"}
    assert prof.comm_time.shape == (2, len(prof.blocks))
    assert np.all(prof.comm_time > 0) and np.all(prof.slowdown > 0)
    (run,) = h5log.read(out)
    assert run.kind == "tuning.profile" and run.attrs["nranks"] == 2
    lib = run.attrs["mpi_library_version"]
    assert "MPICH" in lib or "Open MPI" in lib
    assert run.arrays["samples/comm_time"].shape == (2, len(prof.blocks), 3)
    assert run.arrays["samples/compute_alone_median_per_rank"].shape == (2,)
    assert run.arrays["samples/flight_and_work_per_rank"].shape == (2, len(prof.blocks), 2)
    assert "hpccoll_version" in run.attrs and "start_time" in run.attrs


def test_block_counts_without_the_blocks_api_are_a_clear_error():
    """A build whose allreduce has no blocks= (before the numba_kernels issue): explicit
    or automatic block counts stop with an error that says what to do instead."""
    import argparse
    import types

    import pytest

    from hpccoll.errors import HpcCollError
    from hpccoll.tuning.cli import _blocks
    from hpccoll.tuning.profiler import require_blocks

    class OldComm:
        def allreduce(self, sendbuf, recvbuf=None, op="sum", key=None):
            raise AssertionError("never called")
    ctx = types.SimpleNamespace(world=OldComm())
    with pytest.raises(HpcCollError, match="--blocks default"):
        require_blocks(ctx.world, [0, 1, 2])
    require_blocks(ctx.world, [0])                       # the library's own choice is fine
    with pytest.raises(HpcCollError, match="blocks="):
        _blocks(argparse.Namespace(blocks="auto", max_blocks=None), ctx)
    assert _blocks(argparse.Namespace(blocks="default", max_blocks=None), ctx) == [0]
