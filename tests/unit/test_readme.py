"""The README's examples run as written, so that they cannot go stale: its first Python
block (hpccoll's own API, at 4 ranks as the README says to run it) with checks of its
results appended, and the mpi4py block (it checks itself), each under real mpiexec."""
import re
from pathlib import Path

from tests import launch

README = Path(__file__).parents[2] / "README.md"


def python_blocks() -> list:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), re.S | re.M)


def run_block(tmp_path, code: str, n: int):
    script = tmp_path / "readme_example.py"
    # one write per rank: mpiexec interleaves the ranks' output write by write
    script.write_text(code + "\nimport sys\nfrom mpi4py import MPI\n"
                      "sys.stdout.write(f'README OK {MPI.COMM_WORLD.rank}\\n')\n")
    proc = launch.run(n, [str(script)], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = sorted(int(r) for r in re.findall(r"README OK (\d+)", proc.stdout))
    assert ranks == list(range(n)), proc.stdout + proc.stderr
    return proc


def test_main_example(tmp_path):
    code = python_blocks()[0]
    assert "hpccoll.init" in code, "the README's first Python block is no longer the main example"
    checks = """
assert total.dtype == np.float32 and np.array_equal(total, np.ones(1 << 20, np.float32))
assert np.array_equal(gathered, np.tile(np.arange(4.0), tp.size)), gathered
assert tp.size == 2 and world.size == 4
"""
    run_block(tmp_path, code + checks, 4)


def test_mpi4py_example(tmp_path):
    [code] = [b for b in python_blocks() if "hpccoll.mpi.Comm(" in b]
    assert "assert" in code                    # it checks its own results
    run_block(tmp_path, code, 2)
