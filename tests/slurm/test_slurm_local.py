"""scripts/slurm-local: its messages, and a whole start/stop cycle of a second, private
cluster (own directory, own ports), next to the one the template tests use."""
import os
import shutil
import subprocess

import pytest

from .cluster import SLURM_LOCAL, unavailable

BASH = shutil.which("bash")


def run(*args, env=None, timeout=120, prefix=()):
    return subprocess.run([*prefix, BASH, str(SLURM_LOCAL), *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_missing_slurm_says_how_to_install(tmp_path):
    bin_dir = tmp_path / "bin"            # a PATH with what the script needs before Slurm
    bin_dir.mkdir()
    for tool in ("dirname", "id"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    proc = run("start", env={"PATH": str(bin_dir), "HPCCOLL_SLURM_DIR": str(tmp_path / "c")})
    assert proc.returncode == 1
    assert "apt-get install -y slurm-wlm" in proc.stderr, proc.stderr


def test_refuses_to_start_without_root(tmp_path):
    if not shutil.which("slurmctld"):
        pytest.skip("needs slurm-wlm installed, to get past the installation check")
    prefix = ()
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("setpriv (util-linux) is needed to drop root")
        prefix = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
        if subprocess.run([*prefix, "test", "-r", str(SLURM_LOCAL)]).returncode != 0:
            pytest.skip(f"user nobody cannot read {SLURM_LOCAL}")
    proc = run("start", prefix=prefix, env=dict(os.environ, HPCCOLL_SLURM_DIR=str(tmp_path)))
    assert proc.returncode == 1
    assert "must run as root" in proc.stderr, proc.stderr


def test_status_of_a_cluster_that_does_not_run(tmp_path):
    proc = run("status", env=dict(os.environ, HPCCOLL_SLURM_DIR=str(tmp_path)))
    assert proc.returncode == 3 and "not running" in proc.stdout, proc


def test_usage():
    proc = run("restart")
    assert proc.returncode == 2 and "usage" in proc.stderr


@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_start_stop_cycle_is_idempotent_and_stops_only_its_daemons(tmp_path):
    if not shutil.which("slurmctld"):
        unavailable("slurm-wlm is not installed (apt-get install -y slurm-wlm)")
    if os.geteuid() != 0:
        unavailable("starting a Slurm cluster needs root")
    env = dict(os.environ, HPCCOLL_SLURM_DIR=str(tmp_path / "cluster"), HPCCOLL_SLURM_NODES="1")
    env.pop("SLURM_CONF", None)
    env.pop("HPCCOLL_SLURM_PORT", None)
    try:
        first = run("start", env=env)
        assert first.returncode == 0, first.stderr
        pids = [int(p.read_text()) for p in (tmp_path / "cluster").glob("*.pid")]
        assert len(pids) == 2 and all(os.path.exists(f"/proc/{p}") for p in pids)
        again = run("start", env=env)
        assert again.returncode == 0 and "already running" in again.stderr, again.stderr
        status = run("status", env=env)
        assert status.returncode == 0 and "idle" in status.stdout, status.stdout
        conf = tmp_path / "cluster" / "slurm.conf"
        job = subprocess.run(["srun", "-n", "2", "-t", "1", "hostname"], capture_output=True,
                             text=True, timeout=120, env=dict(env, SLURM_CONF=str(conf)))
        assert job.returncode == 0 and len(job.stdout.split()) == 2, str(job)
    finally:
        stop = run("stop", env=env)
    assert stop.returncode == 0 and stop.stderr.count("stopped") == 2, stop.stderr
    assert not any(os.path.exists(f"/proc/{p}") for p in pids)
    again = run("stop", env=env)
    assert again.returncode == 0 and "not running" in again.stderr
