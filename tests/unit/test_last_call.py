"""A mismatch in a program's last collective is reported on every rank before the
program ends, whatever it closed: the adapter's context that nothing closes, the native
API without close(), and a program that calls MPI.Finalize() itself (which exits 0, the
engine quiet before MPI finalizes).  After an unhandled exception on one rank, the
others do not wait for it at exit."""
from pathlib import Path

import pytest

from tests import launch

SCRIPT = str(Path(__file__).resolve().parents[1] / "scripts" / "last_call.py")
# close() would wait this long for a rank that never comes: longer than the job may run
ENV = {"HPCCOLL_CLOSE_TIMEOUT": "900", "HPCCOLL_TIMEOUT": "60"}


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("how", ["adapter", "native", "finalize"])
def test_the_last_mismatch_is_printed_on_every_rank(how, n):
    proc = launch.run(n, [SCRIPT, how], timeout=120, env=ENV)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for r in range(n):
        assert f"rank {r} done" in proc.stdout, out
        line = next((ln for ln in proc.stderr.splitlines()
                     if ln.startswith(f"hpccoll: rank {r}: ranks disagree about collective "
                                      f"#{1 if how != 'adapter' else 0} ")), None)
        assert line is not None, out
        assert "dtype: rank 0 has int32; rank" in line, line


@pytest.mark.parametrize("n", [2, 3])
def test_an_unhandled_exception_is_not_waited_for(n):
    proc = launch.run(n, [SCRIPT, "raises"], timeout=120, env=ENV)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "rank 1 gives up" in proc.stderr, out
    assert all(f"rank {r} done" in proc.stdout for r in range(n)), out
    assert "disagree" not in out, out
