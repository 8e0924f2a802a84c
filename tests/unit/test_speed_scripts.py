"""The measurement scripts behind docs/performance.md still run and report (few
iterations: these are smoke tests of the tools, never timing assertions)."""
from pathlib import Path

from tests import launch

SCRIPTS = Path(__file__).parents[2] / "scripts"


def test_latency_breakdown_reports_every_path():
    proc = launch.run(2, [str(SCRIPTS / "latency_breakdown.py"), "20"], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for line in ("general path (express=False):", "express path, check_mismatch=True:",
                 "express path, check_mismatch=False:", "MPI Allreduce"):
        assert line in proc.stdout, proc.stdout


def test_shm_copy_costs_checks_its_result():
    proc = launch.run(2, [str(SCRIPTS / "shm_copy_costs.py"), "5"], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "total of the four steps" in proc.stdout
