"""HDF5 helpers around hpccoll.h5log for the tuning tools and examples/train_dp.py: the
environment attributes, the attribute encoding (JSON for anything not a scalar), and a
crash-safe file written whole."""
from __future__ import annotations

from .. import h5log


def h5open(path: str, mode: str = "w"):
    """A file written whole in a layout of its own (examples/train_dp.py's), crash-safely:
    hpccoll.h5log.whole_file.  Tools write runs with hpccoll.h5log.RunWriter instead."""
    if mode != "w":
        raise ValueError(f"mode: h5open writes a file whole ('w'), got {mode!r}")
    return h5log.whole_file(path)


write_attrs = h5log.write_attrs    # one attribute encoding for every hpccoll HDF5 file
read_attrs = h5log.read_attrs


def environment(mpi_comm=None, **kw) -> dict:
    """hpccoll.h5log.environment_attrs: versions, MPI library, hosts and ranks (gathered
    over ``mpi_comm``, a collective call when given), time, git revision, SLURM_* and
    other scheduler/transport variables."""
    return h5log.environment_attrs(mpi_comm, **kw)
