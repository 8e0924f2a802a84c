"""The measurement scripts behind docs/performance.md still run and report (few
iterations: these are smoke tests of the tools, never timing assertions)."""
from pathlib import Path

from tests import launch

SCRIPTS = Path(__file__).parents[2] / "scripts"


def test_latency_breakdown_reports_every_path():
    proc = launch.run(2, [str(SCRIPTS / "latency_breakdown.py"), "20"], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for line in ("default (deferred check)", "check_mismatch=every", "check_mismatch=off",
                 "express=False (queued)", "MPI Allreduce", "MPI Iallreduce + Test"):
        assert line in proc.stdout, proc.stdout


def test_shm_copy_costs_checks_its_result():
    proc = launch.run(2, [str(SCRIPTS / "shm_copy_costs.py"), "5"], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "total of the four steps" in proc.stdout


def test_bench_speed_checks_every_row():
    proc = launch.run(2, [str(SCRIPTS / "bench_speed.py"), "--iters", "1"], timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line for line in proc.stdout.splitlines()
            if line.split()[:1] in (["allreduce"], ["allgather"], ["reduce_scatter"])]
    assert len(rows) == 11, proc.stdout
    assert all(line.endswith(" ok") for line in rows), proc.stdout
    assert any(line.startswith("allgather") and "in place" in line for line in rows)


def test_bench_divergent_checks_every_row():
    proc = launch.run(2, [str(SCRIPTS / "bench_divergent.py"), "--iters", "1", "--sizes",
                          "8,256K", "--policies", "preemptive,ordered"], timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line for line in proc.stdout.splitlines()
            if line.split()[:1] in (["latin"], ["abba"], ["mixed"])]
    assert len(rows) == 6, proc.stdout
    assert all(line.endswith(" ok") for line in rows), proc.stdout


def test_floor_small_checks_every_row():
    proc = launch.run(2, [str(SCRIPTS / "floor_small.py"), "200"], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for line in ("MPI Iallreduce + Waitall", "MPI persistent Start + Test", "stripped hpccoll",
                 "hpccoll "):
        assert line in proc.stdout, proc.stdout


def test_bench_candidates_checks_every_row():
    proc = launch.run(2, [str(SCRIPTS / "bench_candidates.py"), "--iters", "1", "--sizes",
                          "1K,256K", "--collectives",
                          "allreduce,allgather,alltoall,reduce_scatter,broadcast"], timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line for line in proc.stdout.splitlines() if not line.startswith("#")]
    assert len(rows) == 10, proc.stdout
    assert all(line.endswith(" ok") for line in rows), proc.stdout
    assert "cma(cma)" in proc.stdout and "shm(shm)" in proc.stdout
