"""Small HDF5 helpers for the tuning tools: open/close safely, write attributes, and
record the environment a result came from.  (hpccoll.h5log will take this over.)"""
from __future__ import annotations

import contextlib
import datetime
import os
import platform
import socket
import subprocess
from pathlib import Path

import numpy as np


@contextlib.contextmanager
def h5open(path: str, mode: str = "w"):
    """h5py.File that is flushed and closed even when the writer fails half-way."""
    import h5py
    parent = Path(path).parent
    parent.mkdir(parents=True, exist_ok=True)
    f = h5py.File(path, mode)
    try:
        yield f
    finally:
        try:
            f.flush()
        finally:
            f.close()


def _attr_value(v):
    if v is None:
        return "None"
    if isinstance(v, (bool, np.bool_)):
        return int(v)
    if isinstance(v, (list, tuple)):
        if all(isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)
               for x in v) and v:
            return np.asarray(v)
        return ", ".join(str(x) for x in v)
    if isinstance(v, dict):
        return repr(v)
    return v


def write_attrs(obj, values: dict) -> None:
    for k, v in values.items():
        obj.attrs[k] = _attr_value(v)


def _git_revision() -> str:
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except Exception:
        return "unknown"


def environment(mpi_comm=None) -> dict:
    """Where and when: versions, MPI library, hosts and ranks (gathered over ``mpi_comm``,
    a collective call when given), time, and every SLURM_* variable."""
    from .. import __version__
    env = {
        "hpccoll_version": __version__,
        "git_revision": _git_revision(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "cpu_count": os.cpu_count() or 0,
    }
    if mpi_comm is not None:
        from mpi4py import MPI
        env["mpi_library"] = MPI.Get_library_version().splitlines()[0].strip()
        env["ranks"] = mpi_comm.Get_size()
        hosts = mpi_comm.allgather(socket.gethostname())
        env["hosts"] = sorted(set(hosts))
        env["ranks_per_host"] = max(hosts.count(h) for h in set(hosts))
    for k, v in sorted(os.environ.items()):
        if k.startswith("SLURM_"):
            env[k] = v
    return env
