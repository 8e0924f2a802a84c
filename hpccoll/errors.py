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


class ResourcesExhausted(HpcCollError):
    """MPI ran out of what a new communicator needs (communicator contexts, node-shared
    memory).  Nothing of the communicator that failed to come up is left behind: free()
    communicators no longer used, then try again."""


def mpi_failure(what: str, exc: BaseException, live: int, MPI=None) -> HpcCollError:
    """The hpccoll error for an MPI error while ``what`` set a communicator up: what ran
    out (MPI's own line for it), how many hpccoll communicators are live on this rank, and
    what to do; any other MPI error, named, as an HpcCollError.  ``MPI``: mpi4py's module,
    to read what the MPI's error does not say (Open MPI's, out of contexts, is "internal
    error")."""
    text = str(exc)
    lines = [ln.split(":", 1)[-1].strip() for ln in text.splitlines() if ln.strip()]
    if "Too many communicators" in text or "contextid" in text.lower():
        resource = "communicator contexts"
        line = next((ln for ln in lines if "Too many communicators" in ln), lines[-1])
    elif (MPI is not None and getattr(exc, "Get_error_class", int)() == MPI.ERR_INTERN
          and MPI.Get_library_version().startswith("Open MPI")):
        resource = "communicator contexts"
        line = f"{lines[-1] if lines else text}: how Open MPI says so"
    elif any(w in text.lower() for w in ("memory", "shm", "mmap", "no space")):
        resource = "node-shared memory"
        line = lines[-1] if lines else text
    else:
        first = lines[-1] if lines else text
        return HpcCollError(f"{what}: MPI failed: {first}")
    return ResourcesExhausted(
        f"{what}: MPI ran out of {resource} ({line}); {live} hpccoll communicator(s) are "
        "live on this rank, each holding 2 MPI communicators and its node-shared slots: "
        "free() the ones no longer used (docs/sharp-bits.md)")


class CollectiveMismatch(HpcCollError):
    """Ranks disagree on the collective type, dtype, count, root or reduction op of one collective."""

    def __init__(self, message: str, ranks=(), fields=None, local: bool = False):
        super().__init__(message)
        self.ranks = tuple(ranks)
        self.fields = dict(fields or {})
        # found by this rank alone (a message longer than it expects): the other members
        # hear it from this rank and raise it too
        self.local = local


class RankFailed(HpcCollError):
    """Raised by ``agree`` on every rank alike: some ranks failed (``failures``: rank ->
    message, with the type for errors other than hpccoll's); the ranks may now exit
    together."""

    def __init__(self, failures: dict):
        self.failures = dict(failures)
        alike: dict = {}
        for r, m in sorted(self.failures.items()):
            alike.setdefault(m, []).append(str(r))
        super().__init__("; ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(rs)}: {m}"
                                   for m, rs in alike.items()))
