"""Start real MPI jobs from tests and scripts: the right flags for the MPI at hand,
always under a timeout."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from functools import lru_cache


@lru_cache(maxsize=1)
def flavor() -> str:
    exe = shutil.which("mpiexec")
    if not exe:
        raise RuntimeError("mpiexec not found: install the project with its 'mpich' extra "
                           "(pip install -e .[test,mpich]) or load your site's MPI module")
    out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    if "HYDRA" in out:
        return "hydra"
    if "Open MPI" in out or "OpenRTE" in out:
        return "openmpi"
    return "other"


def mpiexec_args(n: int) -> list[str]:
    extra = {"hydra": [], "openmpi": ["--oversubscribe"], "other": []}[flavor()]
    return ["mpiexec", "-n", str(n), *extra]


def run(n: int, args: list[str], timeout: float, env: dict | None = None,
        file_limit: int | None = None) -> subprocess.CompletedProcess:
    """Run ``python args...`` on n ranks; the job is killed after ``timeout`` seconds
    (MPIEXEC_TIMEOUT for hydra, plus a hard subprocess timeout for any MPI).
    ``file_limit``: every process of the job may write files up to that many bytes
    (``ulimit -f``)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env["MPIEXEC_TIMEOUT"] = str(int(timeout))
    cmd = mpiexec_args(n) + [sys.executable, *args]
    def limit():
        import resource
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))
    return subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout + 30,
                          preexec_fn=None if file_limit is None else limit)
