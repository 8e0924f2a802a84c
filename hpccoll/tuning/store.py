"""HDF5 helpers of the tuning tools: open and always close, and attributes and the
environment in hpccoll.h5log's conventions (JSON for anything not a scalar), so that
h5log's readers understand the tuning files too."""
from __future__ import annotations

import contextlib
from pathlib import Path

from .. import h5log


@contextlib.contextmanager
def h5open(path: str, mode: str = "w"):
    """h5py.File that is flushed and closed even when the writer fails half-way."""
    import h5py
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    f = h5py.File(path, mode)
    try:
        yield f
    finally:
        try:
            f.flush()
        finally:
            f.close()


write_attrs = h5log.write_attrs    # one attribute encoding for every hpccoll HDF5 file
read_attrs = h5log.read_attrs


def environment(mpi_comm=None, **kw) -> dict:
    """hpccoll.h5log.environment_attrs: versions, MPI library, hosts and ranks (gathered
    over ``mpi_comm``, a collective call when given), time, git revision, SLURM_* and
    other scheduler/transport variables."""
    return h5log.environment_attrs(mpi_comm, **kw)
