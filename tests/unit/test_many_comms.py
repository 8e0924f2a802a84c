"""Communicators cheap enough to hold a thousand and to make and free for as long as a
program lives (scripts/many_comms.py at 2 ranks; docs/sharp-bits.md has the cost table)."""
import re
from pathlib import Path

from tests import launch

SCRIPT = str(Path(__file__).parents[2] / "scripts" / "many_comms.py")


def test_a_thousand_live_communicators_each_used_by_a_collective():
    proc = launch.run(2, [SCRIPT, "--live", "1000"], timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 ranks: 1000 live communicators, each used by one 8 B allreduce (0 wrong)" \
        in proc.stdout, proc.stdout


def test_running_out_is_a_clear_error_past_a_thousand():
    """With the 2,048 contexts MPICH has (other MPIs have more: the script takes the rest
    first), hpccoll makes more than a thousand communicators, then a clear error."""
    proc = launch.run(2, [SCRIPT, "--contexts", "2048"], timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    live = int(re.search(r"2 ranks: (\d+) live communicators", proc.stdout)[1])
    assert live >= 1000, proc.stdout
    assert "the next dup(): ResourcesExhausted" in proc.stdout, proc.stdout
    assert "ran out of communicator contexts" in proc.stdout, proc.stdout


def test_dup_collective_free_cycles_leave_contexts_memory_and_dev_shm_flat():
    proc = launch.run(2, [SCRIPT, "--cycles", "3000"], timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = re.findall(r"^rank \d: 3000 dup/allreduce/free cycles .*$", proc.stdout, re.M)
    assert len(lines) == 2, proc.stdout
    for line in lines:
        assert "(0 wrong)" in line and line.endswith(": flat"), line
        counts = re.search(r"free MPI contexts (\d+) / (\d+) / (\d+)", line).groups()
        assert len(set(counts)) == 1, line
