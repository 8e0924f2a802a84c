"""The adapter's object rows of scripts/bench_adapter.py and the OSU runner
scripts/osu_adapter.py still run and check their results (few iterations: smoke tests
of the tools, never timing assertions)."""
from pathlib import Path

from tests import launch

SCRIPTS = Path(__file__).parents[2] / "scripts"


def test_bench_adapter_object_rows_check_every_result():
    proc = launch.run(2, [str(SCRIPTS / "bench_adapter.py"), "--calls", "none", "--iters", "10",
                          "--loop", "2"], timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.split()[:1]
            and line.split()[0].startswith(("allreduce(", "allgather(", "bcast("))]
    assert len(rows) == 8, proc.stdout
    assert all(line.endswith(" ok") for line in rows), proc.stdout


def test_osu_adapter_runs_the_allreduce_demo_both_ways():
    """osu_allreduce (ours, in the demos' style) needs no fetched sdist."""
    proc = launch.run(2, [str(SCRIPTS / "osu_adapter.py"), "--only", "allreduce", "--loop", "3",
                          "--skip", "1", "--max", "64"], timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("allreduce")]
    assert [r[1] + r[2] for r in rows] == ["4B", "8B", "16B", "32B", "64B"], proc.stdout
    assert "native, 0 forwarded" in proc.stdout, proc.stdout
