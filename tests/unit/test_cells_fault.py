"""Cells when a rank stops or dies mid-collective (tests/scripts/cells_fault.py): never a
hang.  A stopped rank: every other rank raises CollectiveTimeout within the timeout, its
report naming the rank the cells wait for.  A killed rank: the launcher ends the job."""
import re
import time
from pathlib import Path

import pytest

from hpccoll.engine import code
from tests import launch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "cells_fault.py"


def need_cells():
    if code._native is None:
        pytest.skip("no C module here (engine/_native.c): cells do not run")


@pytest.mark.parametrize("how", ["", "ref"])
def test_a_stopped_rank_is_named_by_every_other_within_the_timeout(how):
    """(ref: the others are writers by reference, waiting for the stopped rank to read)"""
    need_cells()
    t0 = time.monotonic()
    proc = launch.run(3, [str(SCRIPT), "stop"] + ([how] if how else []), timeout=60)
    out = proc.stdout
    for r in range(3):
        assert f"rank {r}: algo cells" in out, out + proc.stderr
    for r in (0, 2):
        m = re.search(rf"rank {r}: CollectiveTimeout after ([\d.]+) s, naming rank 1", out)
        assert m and float(m.group(1)) < 15, out + proc.stderr
    assert time.monotonic() - t0 < 40


@pytest.mark.parametrize("how", ["", "ref"])
def test_a_killed_rank_ends_the_job(how):
    need_cells()
    t0 = time.monotonic()
    proc = launch.run(3, [str(SCRIPT), "kill"] + ([how] if how else []), timeout=60)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "no error" not in proc.stdout
    assert time.monotonic() - t0 < 40
