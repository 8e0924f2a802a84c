"""The measurement scripts behind docs/performance.md still run and report (few
iterations: these are smoke tests of the tools, never timing assertions)."""
from pathlib import Path

from tests import launch
from tests.unit.test_code import need_native

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


def test_floor_handoff_reports_the_handoff_the_staged_copy_and_every_row():
    need_native()        # the ping-pong is the C module's (engine/_native.c: handoff)
    proc = launch.run(2, [str(SCRIPTS / "floor_handoff.py"), "--rounds", "2000", "--calls",
                          "50", "--slot-bytes", "8192"], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for line in ("a cache-line handoff takes", "a staged handoff of 8192 bytes",
                 "allreduce 8 B", "broadcast 8 B", "barrier"):
        assert line in proc.stdout, proc.stdout


def test_bench_candidates_checks_every_row():
    proc = launch.run(2, [str(SCRIPTS / "bench_candidates.py"), "--iters", "1", "--sizes",
                          "1K,256K", "--collectives",
                          "allreduce,allgather,alltoall,reduce_scatter,broadcast,reduce"],
                      timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line for line in proc.stdout.splitlines() if not line.startswith("#")]
    assert len(rows) == 12, proc.stdout
    assert all(line.endswith(" ok") for line in rows), proc.stdout
    assert "cma(cma)" in proc.stdout and "shm(shm)" in proc.stdout


def test_bench_load_reports_every_load_and_leaves_no_burner():
    """scripts/bench_load.py starts its own jobs (mpiexec) and burners: one job per load
    here, and the burner it started is gone when it returns."""
    import re
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, str(SCRIPTS / "bench_load.py"), "--jobs", "1",
                           "--iters", "1", "--loads", "0,1", "--limit", "120"],
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.split()[:1] in (["0"], ["1"])]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        (load, kind, size) for load in ("0", "1") for kind, size in
        (("ordinary", "1"), ("ordinary", "16"), ("registered", "1"), ("registered", "16"))]
    assert all(r[-1] == "ok" for r in rows), proc.stdout
    assert proc.stdout.count("background while these jobs ran") == 2
    assert "issue 32's target with one burner" in proc.stdout
    pids = [int(p) for line in re.findall(r"burners \(ended\) ([\d ]+)", proc.stdout)
            for p in line.split()]
    assert len(pids) == 1, proc.stdout                 # one job with one burner
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids), "a burner was left running"
