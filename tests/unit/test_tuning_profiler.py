"""``hpccoll-tune profile`` as users run it: real mpiexec at 2 ranks, a tiny grid; a
rank that fails alone does not leave the others waiting."""
import inspect
import time
from pathlib import Path

import numpy as np
import pytest

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
                          "--rounds", "2", "--kernel-size", "64", "--contend-bytes", "16M"],
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


FAULT = str(Path(__file__).parents[1] / "scripts" / "tool_fault.py")
TINY = ["--sizes", "4K", "--blocks", "default", "--repeats", "2", "--rounds", "1",
        "--kernel-size", "32", "--contend-bytes", "16M", "--timeout", "5"]


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_local_failure_reaches_the_other_ranks(rank, tmp_path):
    """Finding 8 of issue 18, (a): one rank fails alone.  Before its next collective the
    others are waiting in it: the job is aborted with the error, within the timeout."""
    t0 = time.monotonic()
    proc = launch.run(2, [FAULT, "profile-early", str(rank), "--out", str(tmp_path / "p.h5"),
                          *TINY], timeout=90, env={"HPCCOLL_DUMP_DIR": str(tmp_path / "d")})
    assert proc.returncode != 0
    assert time.monotonic() - t0 < 45, "the other rank must not be left waiting"
    assert f"rank {rank} failed" in proc.stderr and "injected fault" in proc.stderr
    assert "did not reach the agreement within 5 s" in proc.stderr
    assert not (tmp_path / "p.h5").exists()
    # the rank that aborts the job leaves its flight record (HPCCOLL_DUMP_DIR)
    (dump,) = (tmp_path / "d").glob(f"hpccoll-flight-*-rank{rank}-*.h5")
    (run,) = h5log.read(dump)
    assert run.kind == "flight" and run.attrs["reason"] == "abort"
    assert "RankFailed" in run.attrs["trigger"] or "injected fault" in run.attrs["trigger"]
    assert list(run.attrs["ranks_answered"]) == [rank]      # its own: the other is stuck


def test_a_failure_every_rank_reaches_is_one_clear_error(tmp_path):
    """A failure found where every rank meets again: all exit 2, one message naming it."""
    proc = launch.run(2, [FAULT, "profile-late", "1", "--out", str(tmp_path / "p.h5"), *TINY],
                      timeout=90)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("hpccoll-tune profile: rank 1: RuntimeError: injected fault on "
                             "rank 1") == 1, proc.stderr
    assert "Abort" not in proc.stderr and not (tmp_path / "p.h5").exists()


def test_work_done_credits_the_run_the_flight_ends_in():
    """work_done: whole runs, plus the middle of the bounds for the run the end falls in."""
    from hpccoll.tuning.profiler import work_done
    runs = [(0.0, 1.0), (1.0, 2.0), (2.0, 3.0)]
    assert work_done(2.0, runs, 1.0) == 2.0                    # ends between runs: exact
    assert work_done(2.5, runs, 1.0) == 2.5                    # full speed: both bounds 0.5
    # a run that stalled past the end (its thread got the CPU back later): at least 0,
    # at most the 0.5 s it ran before the end
    assert work_done(2.5, [(0.0, 1.0), (1.0, 2.0), (2.0, 9.0)], 1.0) == 2.25
    assert work_done(0.5, [(1.0, 2.0)], 1.0) == 0.0            # began after the end: none


def test_an_out_file_runs_cannot_join_is_refused_before_measuring(tmp_path):
    out = tmp_path / "p.h5"
    out.write_text("not HDF5")
    proc = launch.run(2, ["-m", "hpccoll.tuning.cli", "profile", "--out", str(out), *TINY],
                      timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("hpccoll-tune profile: ranks 0, 1: --out:") == 1, proc.stderr
    assert out.read_text() == "not HDF5"
