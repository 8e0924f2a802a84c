"""``hpccoll-tune profile`` as users run it: real mpiexec at 2 ranks, a tiny grid."""
import inspect

import h5py
import numpy as np

import hpccoll
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
    with h5py.File(out) as f:
        assert f.attrs["ranks"] == 2
        assert "MPICH" in f.attrs["mpi_library"] or "Open MPI" in f.attrs["mpi_library"]
        assert f["samples/comm_time"].shape == (2, len(prof.blocks), 3)
        assert f["samples/compute_alone_median_per_rank"].shape == (2,)
        assert "hpccoll_version" in f.attrs and "time_utc" in f.attrs


def test_block_counts_without_the_blocks_api_are_a_clear_error(tmp_path):
    if BLOCKS_API:
        import pytest
        pytest.skip("this build's allreduce takes blocks=")
    proc = launch.run(2, ["-m", "hpccoll.tuning.cli", "profile", "--out", str(tmp_path / "p.h5"),
                          "--sizes", "4K", "--blocks", "1,2", "--repeats", "1"], timeout=60)
    assert proc.returncode == 2
    assert "blocks=" in proc.stderr and "--blocks default" in proc.stderr
    assert not (tmp_path / "p.h5").exists()
