"""Submit jobs to a running Slurm cluster from tests: find it, submit with sbatch --wait
under a time limit, read the job's record.  Tests that need the cluster skip when there is
none, or fail when HPCCOLL_REQUIRE_SLURM=1 (CI sets it, so that its Slurm tests cannot be
skipped unnoticed)."""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SLURM_LOCAL = ROOT / "scripts" / "slurm-local"


def unavailable(reason: str):
    """Skip, or fail where Slurm is required."""
    if os.environ.get("HPCCOLL_REQUIRE_SLURM") == "1":
        pytest.fail(f"HPCCOLL_REQUIRE_SLURM=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def conf_path() -> str:
    """SLURM_CONF if set, else the configuration of scripts/slurm-local's cluster."""
    if os.environ.get("SLURM_CONF"):
        return os.environ["SLURM_CONF"]
    d = os.environ.get("HPCCOLL_SLURM_DIR") or str(ROOT / ".slurm")
    return os.path.join(d, "slurm.conf")


def find_cluster() -> str:
    """SLURM_CONF of a running cluster, or skip (fail if required) saying how to get one."""
    if not shutil.which("sbatch"):
        unavailable("Slurm is not installed (Debian: apt-get install -y slurm-wlm; "
                    "then scripts/slurm-local start)")
    conf = conf_path()
    if not os.path.exists(conf):
        unavailable(f"no Slurm cluster: {conf} does not exist (start one with "
                    f"scripts/slurm-local start, as root, or set SLURM_CONF)")
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=20,
                              env=dict(os.environ, SLURM_CONF=conf))
        up = ping.returncode == 0 and "UP" in ping.stdout
    except subprocess.TimeoutExpired:
        up, ping = False, None
    if not up:
        unavailable(f"the Slurm controller of {conf} does not answer (scripts/slurm-local "
                    f"status; start it with scripts/slurm-local start)")
    return conf


def job_env(conf: str, **settings) -> dict:
    """This environment minus any HPCCOLL_* and SLURM_* settings that would change what a
    template does, plus the cluster, the venv running the tests, and ``settings``."""
    import sys
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HPCCOLL_", "SLURM_"))}
    env.update(SLURM_CONF=conf, HPCCOLL_ENV=sys.prefix)
    env.update({k: str(v) for k, v in settings.items()})
    return env


def nodes(conf: str) -> int:
    proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True,
                          timeout=30, env=dict(os.environ, SLURM_CONF=conf))
    return len(set(proc.stdout.split()))


def need_nodes(conf: str, n: int = 2) -> None:
    """Skip where the cluster has fewer than ``n`` nodes."""
    if nodes(conf) < n:
        pytest.skip(f"this cluster has fewer than {n} nodes (HPCCOLL_SLURM_NODES={n} "
                    "scripts/slurm-local start)")


@dataclass
class Job:
    id: str
    returncode: int          # sbatch --wait's: the job's exit code
    info: dict               # scontrol show job, key -> value
    out: str                 # the job's stdout and stderr files
    err: str
    dir: Path                # where it was submitted from (SLURM_SUBMIT_DIR)

    @property
    def state(self) -> str:
        return self.info.get("JobState", "?")

    def results(self) -> list[Path]:
        return sorted((self.dir / "results").glob(f"{self.id}-*.h5"))

    def __str__(self):
        return (f"job {self.id}: sbatch exit {self.returncode}, state {self.state}, exit code "
                f"{self.info.get('ExitCode')}\n--- stdout\n{self.out[-6000:]}\n"
                f"--- stderr\n{self.err[-6000:]}")


def show_job(job_id: str, env: dict) -> dict:
    proc = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True,
                          text=True, timeout=30, env=env)
    info = {}
    for token in proc.stdout.split():
        key, _, value = token.partition("=")
        info.setdefault(key, value)
    return info


def submit(template: str, workdir: Path, env: dict, *sbatch_args: str, minutes: int = 5,
           timeout: float = 420) -> Job:
    """``sbatch --wait`` a template of slurm/ from ``workdir`` with a time limit of
    ``minutes``; the job is cancelled if sbatch has not returned after ``timeout`` s."""
    cmd = ["sbatch", "--wait", "--parsable", f"--time={minutes}", *sbatch_args,
           str(ROOT / "slurm" / template)]
    try:
        proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        job_id = out.strip().split(";")[0]
        if job_id:
            subprocess.run(["scancel", job_id], env=env, timeout=30)
        pytest.fail(f"sbatch --wait {template} did not return within {timeout} s "
                    f"(job {job_id or '?'} cancelled)")
    job_id = proc.stdout.strip().split(";")[0]
    assert job_id.isdigit(), f"sbatch failed: {proc.stdout}{proc.stderr}"
    info = show_job(job_id, env)
    name = info.get("JobName", "")
    read = lambda p: p.read_text() if p.exists() else ""
    return Job(job_id, proc.returncode, info, read(workdir / f"{name}-{job_id}.out"),
               read(workdir / f"{name}-{job_id}.err"), workdir)
