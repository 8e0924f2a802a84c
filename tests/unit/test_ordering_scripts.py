"""scripts/bench_ordering.py, behind docs/ordering.md's real runs, still runs and reports
(few iterations: a smoke test of the tool, never a timing assertion)."""
import re
from pathlib import Path

import pytest

from tests import launch

SCRIPT = Path(__file__).parents[2] / "scripts" / "bench_ordering.py"


@pytest.mark.parametrize("workload", ["abba", "latin", "groups"])
def test_bench_ordering_reports_the_negotiation(workload):
    proc = launch.run(2, [str(SCRIPT), "--iters", "20", "--workload", workload], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    m = re.search(r"2 ranks, \w+: admission to gseq (\d+) us .* ([\d.]+) messages per "
                  r"collective, every result right", proc.stdout)
    assert m, proc.stdout
    # two ranks: the child's report and the root's batch, one each per burst
    assert 0 < float(m.group(2)) <= 2, proc.stdout
