"""Initialisation: MPI's thread level, and import hpccoll without MPI."""
import subprocess
import sys


def run_py(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_import_does_not_initialise_mpi():
    proc = run_py("import sys, hpccoll; print('mpi4py.MPI' in sys.modules)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_clear_error_when_mpi_lacks_thread_multiple():
    proc = run_py(
        "import mpi4py; mpi4py.rc.thread_level = 'funneled'\n"
        "from mpi4py import MPI\n"
        "import hpccoll\n"
        "try:\n"
        "    hpccoll.init()\n"
        "except hpccoll.HpcCollError as e:\n"
        "    print('ERROR', e)\n")
    assert proc.returncode == 0, proc.stderr
    assert "ERROR hpccoll needs MPI_THREAD_MULTIPLE" in proc.stdout
    assert "FUNNELED" in proc.stdout


def test_single_process_without_mpiexec():
    """A singleton MPI process (no launcher) works: scripts run under plain python."""
    proc = run_py("import numpy as np, hpccoll\n"
                  "with hpccoll.init() as ctx:\n"
                  "    print(ctx.world.allreduce(np.arange(3.0)).wait().tolist())")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[0.0, 1.0, 2.0]"
