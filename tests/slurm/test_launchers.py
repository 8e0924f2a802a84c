"""What HPCCOLL_LAUNCHER=auto rests on (hpccoll.slurm.LAUNCHERS), shown on the running
cluster with a PMI-1 client of our own (pmi_probe.py) on two nodes: srun's pmi2 plugin
loses a PMI-1 request longer than 1024 bytes, which MPICH's own client sends at MPI_Init
of a multi-node job; MPICH's hydra takes it.  Should a Slurm release lift the limit, the
first test fails and auto can go back to srun."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .cluster import find_cluster, job_env, need_nodes

PROBE = str(Path(__file__).with_name("pmi_probe.py"))


@pytest.fixture(scope="module")
def conf():
    conf = find_cluster()
    need_nodes(conf)
    return conf


def run(conf, *command):
    return subprocess.run(command, capture_output=True, text=True, timeout=120,
                          env=job_env(conf))


@pytest.mark.slurm
@pytest.mark.timeout(300)
@pytest.mark.parametrize("length, whole", [(900, True), (1010, False)])
def test_srun_pmi2_loses_a_pmi1_request_over_1024_bytes(conf, length, whole):
    proc = run(conf, "srun", "--mpi=pmi2", "-t", "1", "-N", "2", "-n", "2", sys.executable,
               PROBE, str(length))
    out = proc.stdout + proc.stderr
    assert proc.stdout.count("came back whole") == (2 if whole else 0), out
    if not whole:
        assert proc.returncode != 0 and "not properly terminated" in proc.stderr, out


@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_hydra_takes_the_same_request(conf):
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent))
    assert mpiexec, "the venv's MPICH wheel brings mpiexec (hydra)"
    proc = run(conf, "salloc", "-t", "1", "-N", "2", "-n", "2", mpiexec, "-n", "2",
               "-ppn", "1", sys.executable, PROBE, "1010")
    assert proc.returncode == 0 and proc.stdout.count("came back whole") == 2, \
        proc.stdout + proc.stderr
