"""Start real MPI jobs from tests and scripts: the right flags for the MPI at hand,
always under a timeout."""
from __future__ import annotations

import os
import subprocess
import sys

import hpccoll.launch


def mpiexec_args(n: int) -> list[str]:
    """mpiexec with what this MPI needs (hpccoll/launch.py: one source for the tools,
    the scripts and the tests)."""
    return hpccoll.launch.command(n)


def run(n: int, args: list[str], timeout: float, env: dict | None = None,
        file_limit: int | None = None) -> subprocess.CompletedProcess:
    """Run ``python args...`` on n ranks; the job is killed after ``timeout`` seconds
    (MPIEXEC_TIMEOUT for hydra, plus a hard subprocess timeout for any MPI).
    ``file_limit``: every process of the job may write files up to that many bytes
    (``ulimit -f``)."""
    if file_limit is not None and hpccoll.launch.flavor() == "intel":
        import pytest
        pytest.skip("Intel MPI 2021 kills its ranks (SIGKILL) at MPI_Init under any "
                    "ulimit -f, 1 GiB too, with or without hpccoll")
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env["MPIEXEC_TIMEOUT"] = str(int(timeout))
    cmd = mpiexec_args(n) + [sys.executable, *args]
    def limit():
        import resource
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))
    return subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout + 30,
                          preexec_fn=None if file_limit is None else limit)
