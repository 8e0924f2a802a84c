"""Deadlock workloads under real mpiexec: preemptive and ordered complete with correct
results (checked inside the job against expectations computed from the ranks); fifo ends
in CollectiveTimeout on every rank within timeout + 2 s, with a report naming the cycle.
Each job runs all three policies in turn (--policy all) and exits 0 only if every policy
behaved as expected."""
import re

import pytest

from hpccoll.chaos import SCENARIOS, grid_dims, latin_square
from tests import launch

TIMEOUT = 3


def run_all(n, scenario, *extra, iters=4, timeout=TIMEOUT):
    proc = launch.run(n, ["-m", "hpccoll.chaos", scenario, "--policy", "all", "--iters",
                          str(iters), "--timeout", str(timeout), *extra], timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    rows = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"(preemptive|ordered|fifo)\s+(\S+)\s+(\d+)\s+([\d.]+)", line)
        if m:
            rows[m.group(1)] = (m.group(2), int(m.group(3)), float(m.group(4)))
    assert set(rows) == {"preemptive", "ordered", "fifo"}, proc.stdout
    return rows, proc.stdout


def check(rows, out, n, scenario, iters, timeout=TIMEOUT):
    for policy in ("preemptive", "ordered"):
        assert rows[policy][:2] == ("complete", iters), out
    if SCENARIOS[scenario].divergent(n):
        outcome, done, secs = rows["fifo"]
        assert outcome == "timeout", out
        assert secs < timeout + 2, out       # the slowest rank's time until the error
        assert "circular wait" in out
    else:
        assert rows["fifo"][0] == "complete", out


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_scenario_small_messages(n, scenario):
    rows, out = run_all(n, scenario)
    check(rows, out, n, scenario, 4)


@pytest.mark.parametrize("scenario", ["latin", "3d"])
def test_scenario_tiny_messages_take_the_express_path(scenario):
    """8 B per collective: under preemptive every allreduce and broadcast starts on the
    calling thread (hpccoll/express.py), in rank-divergent orders across communicators."""
    rows, out = run_all(4, scenario, "--bytes", "8", iters=4)
    check(rows, out, 4, scenario, 4)


@pytest.mark.parametrize("slots", ["1", "2", None])
@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_scenario_large_messages(n, scenario, slots):
    """1 MiB per collective: node-shared slots (a gate each communicator's collectives
    take in turn), chunks; with one or two execution slots waiting collectives yield
    between chunks, unbounded they all progress at once.  No bound may deadlock."""
    bound = () if slots is None else ("--max-active", slots)
    rows, out = run_all(n, scenario, "--bytes", "1M", *bound, iters=2)
    check(rows, out, n, scenario, 2)
    assert f"max_active {slots or 'unbounded'}," in out


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["latin", "3d"])
def test_eight_ranks(scenario):
    # 8 ranks on a 2-core CI machine: a rank can go without the CPU for a good part of a
    # second, and preemptive or ordered must not be declared deadlocked for that
    rows, out = run_all(8, scenario, iters=3, timeout=2 * TIMEOUT)
    check(rows, out, 8, scenario, 3, timeout=2 * TIMEOUT)


def test_latin_square_is_latin():
    for n in range(1, 9):
        for seed in range(5):
            sq = latin_square(n, seed)
            assert all(sorted(row) == list(range(n)) for row in sq)
            assert all(sorted(col) == list(range(n)) for col in zip(*sq))


def test_grid_dims():
    assert grid_dims(8) == (2, 2, 2)
    assert grid_dims(4) == (1, 2, 2)
    assert grid_dims(2) == (1, 1, 2)
    for n in range(1, 13):
        dp, tp, pp = grid_dims(n)
        assert dp * tp * pp == n


def test_a_rank_failing_alone_aborts_the_job_at_once():
    """Issue 18, finding 8 (a): an error on one rank only (not hpccoll's, so not raised
    alike) must not leave the others waiting: the job is aborted with it, long before the
    watchdog (30 s here) or close()'s wait would end the others' collectives."""
    import time
    from pathlib import Path
    fault = str(Path(__file__).parents[1] / "scripts" / "tool_fault.py")
    t0 = time.monotonic()
    proc = launch.run(2, [fault, "chaos", "1", "--iters", "3", "--timeout", "30"], timeout=120)
    assert proc.returncode != 0
    assert time.monotonic() - t0 < 20, "the other rank was left waiting"
    assert "hpccoll.chaos: rank 1 failed" in proc.stderr and "injected fault" in proc.stderr


def test_results_past_the_file_size_limit_are_a_message_and_exit_1(tmp_path):
    """--out onto a file the run's record would take past ``ulimit -f``: the table is
    printed, then one error line naming the limit and where the run is kept; exit status
    1, no traceback or signal; the old file unchanged (issue 32, finding 7)."""
    import numpy as np
    from hpccoll import h5log
    out = tmp_path / "r.h5"
    h5log.write_record(out, "test", "pad", arrays={"pad": np.zeros((6 << 20) // 8)})
    before = out.read_bytes()
    proc = launch.run(2, ["-m", "hpccoll.chaos", "abba", "--iters", "2", "--out", str(out)],
                      timeout=120, file_limit=(len(before) // 1024 + 2) * 1024)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text
    assert "OK: every policy behaved as expected" in proc.stdout
    assert "python -m hpccoll.chaos: error: the run 'abba' could not be added" in proc.stderr
    assert "file-size limit" in proc.stderr and "the run is kept in" in proc.stderr
    for sign in ("Traceback", "BAD TERMINATION", "MPI_Abort", "core dumped"):
        assert sign not in text, text
    assert out.read_bytes() == before
