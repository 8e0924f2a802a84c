"""pytest under mpiexec, readable: ``mpiexec -n N python tests/run_mpi.py [pytest args]``.

Rank 0 prints pytest's normal output.  Other ranks write theirs to a log that is
printed only if that rank failed.  tests/mpi/conftest.py makes every rank agree on
each test's outcome, so a failure on any rank shows up on rank 0 with its text.
Exit code 5 (no tests collected) counts as success.
"""
import os
import sys
import tempfile

import pytest


def main() -> int:
    from mpi4py import MPI   # initialise MPI (thread level multiple) before pytest imports
    rank = MPI.COMM_WORLD.Get_rank()
    args = ["--with-mpi", "-p", "no:cacheprovider", "--timeout-method=thread", *sys.argv[1:]]
    if rank == 0:
        code = pytest.main(args)
    else:
        log = tempfile.NamedTemporaryFile("w+", prefix=f"pytest-rank{rank}-", suffix=".log",
                                          delete=False)
        fd = os.dup(1)
        os.dup2(log.fileno(), 1)
        try:
            code = pytest.main(args)
        finally:
            sys.stdout.flush()
            os.dup2(fd, 1)
        if code not in (0, 5):
            log.seek(0)
            sys.stderr.write(f"---- rank {rank} output ----\n{log.read()}")
        os.unlink(log.name)
    return 0 if code == 5 else int(code)


if __name__ == "__main__":
    sys.exit(main())
