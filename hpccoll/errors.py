"""Every error hpccoll raises derives from HpcCollError."""
from __future__ import annotations


class HpcCollError(Exception):
    """Base class of every error the library raises."""


class ArgumentError(HpcCollError, ValueError):
    """A bad argument value (wrong size, unknown op, root out of range, ...)."""


class ArgumentTypeError(HpcCollError, TypeError):
    """An argument of the wrong type (not an array, wrong dtype, ...)."""


class ContextClosed(HpcCollError):
    """The context was closed, or became unusable after a fatal error."""


class WaitTimeout(HpcCollError, TimeoutError):
    """``Work.wait(timeout)`` ran out; the collective is still pending and may complete later."""


class CollectiveTimeout(HpcCollError, TimeoutError):
    """A collective made no progress for ``timeout`` seconds.

    ``report`` lists, for every rank of the world, the collectives it has pending,
    their state, and the peers that never arrived.  The context is unusable afterwards.
    """

    def __init__(self, message: str, report: str = ""):
        super().__init__(message + ("\n" + report if report else ""))
        self.report = report


class CollectiveMismatch(HpcCollError):
    """Ranks disagree on the collective type, dtype, count, root or reduction op of one collective."""

    def __init__(self, message: str, ranks=(), fields=None):
        super().__init__(message)
        self.ranks = tuple(ranks)
        self.fields = dict(fields or {})


def abort_job(exc: BaseException, prog: str, wait: float = 0.0) -> int:
    """The command-line tools' last resort: one rank's unexpected error must not leave
    the others waiting in a collective.  Print it, naming the rank, and abort the MPI job
    (as mpi4py's runner does); ``wait`` seconds first (ranks other than 0, so that rank 0
    can move its result file into place).  Returns 1 where Abort returns at all."""
    import sys
    import time
    import traceback
    from mpi4py import MPI
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    sys.stderr.write(f"{prog}: rank {MPI.COMM_WORLD.Get_rank()} failed:\n{text}")
    sys.stderr.flush()
    if wait:
        time.sleep(wait)
    unlink_mpi_shm()
    MPI.COMM_WORLD.Abort(1)
    return 1


def unlink_mpi_shm(maps: str = "/proc/self/maps") -> list:
    """Remove the names of the MPICH shared-memory segments this process has mapped
    (/dev/shm/mpich_*), before an abort.  MPICH unlinks them only in MPI_Finalize, so
    every aborted job left its segment in /dev/shm: a container's 64 MiB /dev/shm fills
    after a few dozen aborted runs, and later jobs die with SIGBUS.  Every rank of the job
    mapped the segment in MPI_Init, so removing the name takes nothing from them (the
    memory lives until the last rank unmaps it).  Ranks on other nodes, which Abort kills
    without running this, keep theirs.  Returns the paths removed."""
    import os
    gone = []
    try:
        with open(maps) as f:       # address perms offset device inode [path]
            fields = [line.split(None, 5) for line in f]
    except OSError:
        return gone
    paths = {f[5].strip() for f in fields if len(f) == 6}
    for path in sorted(paths):
        if path.startswith("/dev/shm/mpich_") and not path.endswith(" (deleted)"):
            try:
                os.unlink(path)
                gone.append(path)
            except OSError:
                pass
    return gone
