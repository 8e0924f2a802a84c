"""The adapter's examples in README.md and docs/mpi4py.md run as they are, on 1 and 3
ranks, under a timeout (docs are code: an example that drifts from the API fails here)."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import launch

ROOT = Path(__file__).parents[2]


def examples():
    out = []
    for doc in ("README.md", "docs/mpi4py.md"):
        blocks = re.findall(r"```python\n(.*?)```", (ROOT / doc).read_text(), re.S)
        out += [(doc, b) for b in blocks if "hpccoll.mpi.Comm" in b]
    return out


def test_both_documents_have_an_example():
    assert sorted({doc for doc, _ in examples()}) == ["README.md", "docs/mpi4py.md"]


@pytest.mark.parametrize("doc,code", examples(), ids=lambda v: v if v.endswith(".md") else "")
@pytest.mark.parametrize("n", [1, 3])
def test_example_runs(tmp_path, doc, code, n):
    script = tmp_path / "example.py"
    script.write_text(code)
    proc = launch.run(n, [str(script)], timeout=120, env={"HPCCOLL_TIMEOUT": "60"})
    assert proc.returncode == 0, f"{doc} on {n} ranks:\n{proc.stdout}\n{proc.stderr}"
    if "comm.stats" in code:
        assert "{'native': 2, 'forwarded': 0} {'native': 0, 'forwarded': 1}" in proc.stdout


def test_coverage_table_is_current():
    """docs/mpi4py.md's coverage tables are what ``python -m hpccoll.mpi --coverage``
    generates from the adapter classes (rewrite them with ``--update-docs``)."""
    doc = (ROOT / "docs" / "mpi4py.md").read_text()
    [shown] = re.findall(r"<!-- coverage: begin [^\n]*-->\n(.*?)<!-- coverage: end -->", doc, re.S)
    proc = subprocess.run([sys.executable, "-m", "hpccoll.mpi", "--coverage"], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert shown == proc.stdout, ("docs/mpi4py.md's coverage table is stale: run "
                                  "python -m hpccoll.mpi --update-docs docs/mpi4py.md")
