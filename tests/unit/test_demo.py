"""python -m hpccoll.demo under real mpiexec: a short run passes its checks, and a rank that
fails alone aborts the job at once instead of leaving the others in a collective."""
import time
from pathlib import Path

from tests import launch

FAULT = str(Path(__file__).parents[1] / "scripts" / "tool_fault.py")
SHORT = ["--sizes", "8,4K", "--iters", "2", "--colls", "allreduce,broadcast",
         "--chaos-iters", "0"]


def test_short_run_passes_its_checks():
    """... and prints the MPI's own time from C beside every row, at both thread levels."""
    proc = launch.run(2, ["-m", "hpccoll.demo", *SHORT], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 cases, all checks passed" in proc.stdout
    rows = [ln.split() for ln in proc.stdout.splitlines()
            if ln.startswith(("allreduce", "broadcast"))]
    assert len(rows) == 4, proc.stdout
    for row in rows:          # collective, size (2 fields), hpccoll, MPI, ratio, C mt, C, ok
        assert float(row[6]) > 0 and float(row[7]) > 0, row
    assert "C (mpicc)" in proc.stdout or "IMB-MPI1" in proc.stdout


def test_a_rank_failing_alone_aborts_the_job_at_once():
    """Issue 18, finding 8 (a): the failing rank used to close() its context first, which
    waits (close_timeout, 60 s) for ranks that sit in a collective with it."""
    t0 = time.monotonic()
    proc = launch.run(2, [FAULT, "demo", "1", *SHORT], timeout=120)
    assert proc.returncode != 0
    assert time.monotonic() - t0 < 30, "the other rank was left waiting"
    assert "hpccoll.demo: rank 1 failed" in proc.stderr and "injected fault" in proc.stderr
