"""scripts/soak.py as the slow tier runs it, shortened: every policy at 2 ranks, every
result checked, callbacks counted, memory watched (the full run: HPCCOLL_SLOW=1
scripts/test, 10,000 collectives per policy at 4 ranks)."""
import re
from pathlib import Path

from tests import launch

SOAK = str(Path(__file__).parents[2] / "scripts" / "soak.py")


def test_a_short_soak_under_every_policy_is_right_and_flat():
    proc = launch.run(2, [SOAK, "--iters", "240", "--max-bytes", "256K"], timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = re.findall(r"^soak (\w+): 240 collectives x 2 ranks .*$", proc.stdout, re.M)
    assert lines == ["preemptive", "ordered", "fifo"], proc.stdout
    for line in proc.stdout.splitlines():
        if line.startswith("soak "):
            assert "wrong 0;" in line and line.endswith(": ok"), line
            calls = re.search(r"callbacks (\d+)/(\d+)", line)
            assert calls[1] == calls[2] and int(calls[2]) > 0, line


def test_a_wrong_result_fails_the_soak():
    """The check can fail: one expectation corrupted on purpose ends in exit status 1."""
    proc = launch.run(2, [SOAK, "--iters", "16", "--policy", "preemptive", "--corrupt", "0"],
                      timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "wrong allreduce" in proc.stderr or "wrong " in proc.stderr
    assert re.search(r"soak preemptive: .*wrong [1-9].*FAILED", proc.stdout), proc.stdout
