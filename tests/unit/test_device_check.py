"""scripts/device_check.sh, the one script a lent GPU machine runs (issue 16), proven here
without a GPU: its --dry-run takes every step through Numba's CUDA simulator, and its
failures (something missing, a step that fails) end in the right exit status."""
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "scripts" / "device_check.sh"
STEPS = ("1-preflight", "2-gpu-tests", "3-kernel-bench", "4-collectives-2ranks",
         "4-collectives-4ranks", "5-staging-bench", "6-ipc-probe")


def run(tmp_path, env=None, timeout=300):
    out = tmp_path / "logs"
    full = dict(os.environ, OUT=str(out), **(env or {}))
    full.pop("HPCCOLL_TEST_REAL_GPU", None)
    proc = subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True,
                          timeout=timeout, env=full, cwd=tmp_path)
    return proc, out


def test_dry_run_takes_every_step(tmp_path):
    proc, out = run(tmp_path)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    assert "device check: every step passed (dry run)" in proc.stdout, text
    assert sorted(p.stem for p in out.glob("*.log")) == sorted(STEPS), text
    assert "preflight: everything the checks need is here" in (out / "1-preflight.log").read_text()
    assert "kernel bench: ok" in (out / "3-kernel-bench.log").read_text()
    for n in (2, 4):
        assert f"on {n} ranks sharing one simulated GPU: 0 wrong" in \
            (out / f"4-collectives-{n}ranks.log").read_text()
    assert "same result" in (out / "5-staging-bench.log").read_text()


def test_a_missing_package_stops_at_the_preflight(tmp_path):
    fake = tmp_path / "shadow" / "h5py"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('h5py is not installed here')\n")
    proc, out = run(tmp_path, {"PYTHONPATH": str(tmp_path / "shadow")})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "STOPPED, the preflight says what is missing" in proc.stdout
    assert "h5py: the image's h5py" in proc.stdout + proc.stderr
    assert [p.stem for p in out.glob("*.log")] == ["1-preflight"]


def test_a_failing_step_fails_the_check_and_is_named(tmp_path):
    """An mpiexec that starts nothing: the MPI steps fail, the others still run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "mpiexec"
    stub.write_text("#!/bin/sh\necho 'stub mpiexec: no MPI job' >&2\nexit 3\n")
    stub.chmod(0o755)
    proc, out = run(tmp_path, {"PATH": f"{bin_dir}:{os.environ['PATH']}",
                               "HPCCOLL_MPIEXEC": str(stub)})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "device check: FAILED: 4-collectives-2ranks (exit 3) 4-collectives-4ranks " \
           "(exit 3) 5-staging-bench (exit 3) 6-ipc-probe (exit 3)" in proc.stdout, proc.stdout
    assert "kernel bench: ok" in (out / "3-kernel-bench.log").read_text()
