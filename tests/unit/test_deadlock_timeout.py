"""The NCCL-style hang, turned into an error: two communicators used in opposite
orders on two ranks under fifo with timeout=3 must end in CollectiveTimeout on both
ranks, with a report naming the cycle, in under 10 s.  Real mpiexec, in a subprocess."""
import re
import time
from pathlib import Path

from tests import launch

SCRIPT = str(Path(__file__).parents[1] / "scripts" / "abba.py")


def results(stdout: str) -> list:
    """The scripts' (rank, outcome, seconds) lines, by rank; found anywhere in the output,
    so that lines run together by mpiexec's forwarding are still read."""
    return sorted(re.findall(r"RESULT (\d+) (\w+) ([\d.]+)", stdout))


def test_fifo_abba_ends_in_timeout_on_every_rank():
    t0 = time.monotonic()
    proc = launch.run(2, [SCRIPT, "fifo", "3"], timeout=60)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = results(proc.stdout)
    assert [l[:2] for l in lines] == [("0", "timeout"), ("1", "timeout")], proc.stdout
    assert all(float(l[2]) < 3 + 2 for l in lines), lines   # within timeout + 2 s
    assert elapsed < 10, elapsed
    report = proc.stderr
    assert "circular wait" in report
    assert "rank 0 runs A#0 and waits for rank 1" in report or \
        "rank 1 runs B#0 and waits for rank 0" in report
    assert "queued behind" in report


def test_fifo_abba_large_messages_too():
    """Ring algorithm, chunked: the report still names the cycle."""
    proc = launch.run(2, [SCRIPT, "fifo", "2", "300000"], timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("timeout") == 2
    assert "circular wait" in proc.stderr


def test_fifo_abba_three_ranks_and_report_lists_every_rank():
    proc = launch.run(3, [SCRIPT, "fifo", "2"], timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("timeout") == 3
    for r in range(3):
        assert f"rank {r} (" in proc.stderr


def test_early_started_collective_a_rank_never_joins_times_out():
    """A tiny allreduce started on the calling thread is watched like every other
    collective: the report says who never arrived."""
    script = str(Path(__file__).parents[1] / "scripts" / "early_stall.py")
    proc = launch.run(2, [script, "2"], timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [l[:2] for l in results(proc.stdout)]
    assert lines == [("0", "timeout"), ("1", "absent")], proc.stdout
    assert "waiting on rank(s) 1" in proc.stderr
    assert "not on rank(s) 1" in proc.stderr
