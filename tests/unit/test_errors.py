"""errors.py: the command-line tools' abort leaves no MPICH segment behind in /dev/shm."""
import os
import re
import uuid
from pathlib import Path

import pytest

from hpccoll.jobs import unlink_mpi_shm
from tests import launch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "abort_rank.py"


def test_unlink_mpi_shm_removes_only_mapped_mpich_segments(tmp_path):
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm on this system")
    name = uuid.uuid4().hex
    mine = Path(f"/dev/shm/mpich_shm_test_{name}")
    other = Path(f"/dev/shm/hpccoll_test_{name}")
    unmapped = Path(f"/dev/shm/mpich_shm_unmapped_{name}")
    for p in (mine, other, unmapped):
        p.write_bytes(b"x")
    maps = tmp_path / "maps"
    maps.write_text(
        f"7f0000000000-7f0000001000 rw-s 00000000 00:1a 11 {mine}\n"
        f"7f0000001000-7f0000002000 rw-s 00000000 00:1a 12 {other}\n"
        f"7f0000002000-7f0000003000 rw-s 00000000 00:1a 13 /dev/shm/mpich_gone (deleted)\n"
        "7f0000003000-7f0000004000 rw-p 00000000 00:00 0 \n"
        "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]\n")
    try:
        assert unlink_mpi_shm(str(maps)) == [str(mine)]
        assert not mine.exists() and other.exists() and unmapped.exists()
    finally:
        for p in (mine, other, unmapped):
            p.unlink(missing_ok=True)


def test_unlink_mpi_shm_without_proc_maps(tmp_path):
    assert unlink_mpi_shm(str(tmp_path / "missing")) == []


def test_aborted_job_leaves_no_segment_in_dev_shm():
    """A real 2-rank job aborted by one rank: the segments MPICH had mapped are gone."""
    proc = launch.run(2, [str(SCRIPT)], timeout=60)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "abort_rank: rank 1 failed" in proc.stderr and "rank 1 gives up" in proc.stderr
    mapped = set(re.findall(r"^MAPPED (\S+)$", proc.stdout, re.M))
    if not mapped:
        pytest.skip("this MPI maps no /dev/shm/mpich_* segment (not MPICH's shared memory)")
    assert [p for p in mapped if os.path.exists(p)] == [], proc.stdout
