# Sourced by scripts/run and scripts/test: activate the project's virtual environment,
# creating it (with the test extras and the embedded MPICH wheel) when it is missing.
#   HPCCOLL_VENV=path   use another venv (created there if missing)
#   HPCCOLL_SITE_MPI=1  do not install the mpich wheel: mpi4py uses the site's MPI
#                       (load your MPI module first; see docs/slurm.md)
HPCCOLL_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HPCCOLL_VENV="${HPCCOLL_VENV:-$HPCCOLL_ROOT/.venv}"
if [ ! -x "$HPCCOLL_VENV/bin/python" ]; then
    echo "hpccoll: creating $HPCCOLL_VENV and installing the project (one time)..." >&2
    "${PYTHON:-python3}" -m venv "$HPCCOLL_VENV"
    extras="test,mpich"
    [ -n "${HPCCOLL_SITE_MPI:-}" ] && extras="test"
    "$HPCCOLL_VENV/bin/python" -m pip install -q --upgrade pip
    "$HPCCOLL_VENV/bin/python" -m pip install -q -e "$HPCCOLL_ROOT[$extras]"
fi
# shellcheck disable=SC1091
source "$HPCCOLL_VENV/bin/activate"
