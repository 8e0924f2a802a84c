"""The NCCL-style hang, turned into an error: two communicators used in opposite
orders on two ranks under fifo with timeout=3 must end in CollectiveTimeout on both
ranks, with a report naming the cycle, in under 10 s.  Real mpiexec, in a subprocess."""
import re
import time
from pathlib import Path

import pytest

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


def test_the_report_carries_every_ranks_flight_record_and_dump_dir_keeps_it(tmp_path):
    """The flight recorder: the timeout report shows each rank's last collectives and
    where each rank stands on each communicator; HPCCOLL_DUMP_DIR keeps it in a file that
    hpccoll-report reads."""
    import subprocess
    import sys
    proc = launch.run(2, [SCRIPT, "fifo", "2"], timeout=60,
                      env={"HPCCOLL_DUMP_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("timeout") == 2
    report = proc.stderr
    assert "Last collectives per rank (flight recorder, newest last):" in report
    assert "Where each rank stands, per communicator:" in report
    assert "Flight record of every rank that answered: " in report
    files = sorted(tmp_path.glob("hpccoll-flight-*.h5"))
    assert len(files) == 2          # each rank detected its own timeout
    shown = subprocess.run([sys.executable, "-m", "hpccoll", "report", str(files[0])],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "flight record: timeout detected on rank" in shown.stdout
    assert "rank 0, newest last:" in shown.stdout and "rank 1, newest last:" in shown.stdout
    assert "(pending)" in shown.stdout and "Where each rank stands" in shown.stdout


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


@pytest.mark.parametrize("what", ["init", "dup", "split"])
def test_a_rank_that_never_calls_init_dup_or_split_is_a_timeout_not_a_hang(what):
    """MPI's Comm_dup and Comm_split (and init's) block until every member calls them:
    with a timeout, the rank that waits raises CollectiveTimeout within it; dup and split
    name the rank that never came."""
    script = str(Path(__file__).parents[1] / "scripts" / "setup_stall.py")
    t0 = time.monotonic()
    proc = launch.run(2, [script, what, "2"], timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = results(proc.stdout)
    assert [l[:2] for l in lines] == [("0", "timeout"), ("1", "absent")], proc.stdout
    assert float(lines[0][2]) < 2 + 2, lines
    assert time.monotonic() - t0 < 30
    if what == "init":
        assert "not every rank of the communicator called init within the timeout" in proc.stderr
    else:
        assert f"{what}() of communicator 'world': not every member called it" in proc.stderr
        assert "not pending" in proc.stderr and "rank 1" in proc.stderr
