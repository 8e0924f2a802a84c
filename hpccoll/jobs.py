"""What the command-line tools do when one rank fails: agree on it with the others, or
abort the job (a rank's unexpected error must not leave the others waiting in a
collective).  The tools' side of errors; the library raises (hpccoll/errors.py)."""
from __future__ import annotations

import os
import sys
import time
import traceback
from typing import Optional

import numpy as np
from mpi4py import MPI

from .core.context import _OPEN
from .engine import flight
from .errors import HpcCollError, RankFailed

# abort_job's pause between a rank's message and the abort (the launcher forwards the
# message on its own time, and an abort may end it first)
FORWARD_SECONDS = 0.2


def agree(comm, error: Optional[BaseException], prog: str, timeout: float = 60.0) -> None:
    """Settle rank-local failures before the next collective of a tool.

    Every rank of the mpi4py communicator ``comm`` calls this at the same point, with the
    exception it met since the last agreement (None if none); ``comm`` must be one no
    other collective of the tool may be waiting on (a Dup made at the start).
    - No rank failed: returns on every rank.
    - Some ranks failed and every rank got here: raises the same RankFailed on every rank,
      naming the ranks and their errors, so that the ranks can close and exit alike.
    - A failed rank waits ``timeout`` seconds at most: a rank that did not arrive is
      waiting in a collective the failed rank skipped, and never will, so the failed rank
      aborts the job with its error (``abort_job``).  A rank without an error waits as
      long as it takes (a peer is either on its way or about to abort the job)."""
    failed = np.array([0 if error is None else 1], dtype=np.int32)
    count = np.zeros(1, dtype=np.int32)
    req = comm.Iallreduce(failed, count, op=MPI.SUM)
    deadline = time.monotonic() + timeout
    while not req.Test():
        if error is not None and time.monotonic() > deadline:
            sys.stderr.write(f"{prog}: rank {comm.Get_rank()}: the other ranks did not reach "
                             f"the agreement within {timeout:g} s (they wait in a collective "
                             f"this rank skipped after its error); aborting the job\n")
            abort_job(error, prog)
        time.sleep(0.001)
    if count[0] == 0:
        return
    # every rank is here: a blocking collective cannot hang now
    texts = comm.allgather(None if error is None else str(error) if isinstance(error, HpcCollError)
                           else f"{type(error).__name__}: {error}")
    raise RankFailed({r: t for r, t in enumerate(texts) if t is not None})


def abort_job(exc: BaseException, prog: str, wait: float = 0.0) -> int:
    """The command-line tools' last resort: one rank's unexpected error must not leave
    the others waiting in a collective.  Print it, naming the rank, and abort the MPI job
    (as mpi4py's runner does); ``wait`` seconds first (ranks other than 0, so that rank 0
    can move its result file into place), at least FORWARD_SECONDS.  Returns 1 where Abort
    returns at all."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    sys.stderr.write(f"{prog}: rank {MPI.COMM_WORLD.Get_rank()} failed:\n{text}")
    sys.stderr.flush()
    _dump_flight(exc)
    # (CI once saw a job aborted with none of this message on its stderr)
    time.sleep(max(wait, FORWARD_SECONDS))
    unlink_mpi_shm()
    MPI.COMM_WORLD.Abort(1)
    return 1


def _dump_flight(exc: BaseException) -> None:
    """dump_dir: before the job is aborted, each open context's flight record (this rank's
    own: the others may be stuck) goes to a file, as on a timeout or a mismatch."""
    try:
        for ctx in list(_OPEN):
            engine = ctx._engine
            if not engine.settings.dump_dir or engine.flight is None:
                continue
            if not engine.lock.acquire(timeout=1.0):    # a stuck engine: no snapshot
                continue
            try:
                flight.dump_own(engine, "abort", exc)
            finally:
                engine.lock.release()
    except Exception:      # noqa: BLE001 - the abort must happen whatever this meets
        pass


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
