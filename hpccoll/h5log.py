"""HDF5 result files: the one module every hpccoll tool writes and reads them with.

    attrs = h5log.environment_attrs(comm, settings=ctx.settings)       # collective if comm
    with h5log.RunWriter("r.h5", "allreduce", attrs, kind="bench") as run:   # one process
        run.table("allreduce").append([{"size": 8, "time_us": 3.1, "times": np.array([...])}])
        run.array("matrix", np.eye(3), {"units": "s"})
    for run in h5log.read("r.h5"):
        run.kind, run.attrs["policy"], run.tables["allreduce"][0]["busbw"], run.arrays["matrix"]

Every file is a sequence of runs (``/runs/NNNN_LABEL``), each a record of one ``kind``
(bench, chaos, tuning.profile, tuning.simulate, ...): attributes, growing tables,
n-dimensional arrays.  The schema is documented in docs/results.md and versioned by
``SCHEMA_VERSION``.

Crash safety: a run is written into a private temporary file next to the destination
and lands when it ends: under an exclusive lock on the destination, the file as it is
then is copied, the run added to the copy, and the copy renamed over the destination.
So the file under the real name is always one that was closed properly, and writers that
overlap in time (two jobs appending to one ``--out``, every rank dumping into one file)
all land, in the order they finished.  Where the lock cannot be had (a file system
without locks, or a holder that does not let go), the run is kept in a file of its own
and a message on stderr says where.  A run that fails with an exception still lands,
with ``status = "failed"`` and the error text; only a killed writer leaves nothing but
its temporary file behind.  No name of the writer's follows a symbolic link another
user planted beside the destination (the lock and temporary files are created without
following one, and renames replace a link itself).

No space (a full file system, a quota, the file-size limit of ``ulimit -f``): the
destination is left as it was and ``WriteFailed`` says why and where the run went: a
file of its own beside the destination when the run was complete and only adding it
failed, nowhere (the broken temporary file is removed) when the run's own file could not
be written.  HDF5 never sees the failed write (``_GuardedIO``), so it can always close
its file, and the process gets no SIGXFSZ.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import json
import os
import platform
import resource
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

import numpy as np

from ._version import __version__

SCHEMA = "hpccoll-results"
SCHEMA_VERSION = 2
# Environment variables worth keeping with a result: the scheduler's, ours, and the
# transport knobs of the common MPI/GPU stacks (they change performance, not semantics).
ENV_PREFIXES = ("SLURM_", "HPCCOLL_", "OMPI_MCA_", "MPIR_CVAR_", "I_MPI_", "UCX_", "FI_",
                "NCCL_", "PMI_SIZE", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")


def _h5py():
    try:
        import h5py
    except ImportError:  # pragma: no cover - h5py is an install requirement
        raise RuntimeError("h5py is needed for HDF5 result logs: pip install h5py") from None
    return h5py


# -- environment ------------------------------------------------------------------------
def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def git_revision(path: Optional[Path] = None) -> str:
    """``git describe --always --dirty`` of the checkout hpccoll runs from; "" if none."""
    where = Path(path) if path else Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "-C", str(where), "describe", "--always", "--dirty",
                              "--abbrev=40"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def environment_vars(environ: Optional[dict] = None) -> dict:
    environ = os.environ if environ is None else environ
    return {k: v for k, v in sorted(environ.items()) if k.startswith(ENV_PREFIXES)}


def environment_attrs(comm=None, argv: Optional[list] = None, settings=None,
                      device: str = "cpu", gpu_model: str = "") -> dict:
    """Everything needed to reproduce and compare a run, as a flat dict of attributes.

    Collective over the mpi4py communicator ``comm`` when one is given (it gathers every
    rank's host name); every rank gets the same dict.  ``settings``: hpccoll's resolved
    Settings (policy, knobs and where each came from)."""
    h5py = _h5py()
    argv = list(sys.argv if argv is None else argv)
    host = socket.gethostname()
    attrs: dict[str, Any] = {
        "command_line": " ".join(shlex.quote(a) for a in argv),
        "argv": argv,
        "cwd": os.getcwd(),
        "start_time": now_iso(),
        "hpccoll_version": __version__,
        "git_revision": "",
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "numpy_version": np.__version__,
        "h5py_version": h5py.__version__,
        "device": device,
        "gpu_model": gpu_model,
        "environment": environment_vars(),
    }
    hosts = [host]
    if comm is not None:
        # (a communicator is given: mpi4py is loaded; this module itself needs no MPI)
        MPI, mpi4py = sys.modules["mpi4py.MPI"], sys.modules["mpi4py"]
        hosts = comm.allgather(MPI.Get_processor_name())
        attrs["mpi_library_version"] = MPI.Get_library_version().strip()
        attrs["mpi_standard"] = "%d.%d" % MPI.Get_version()
        attrs["mpi4py_version"] = mpi4py.__version__
        rev = git_revision() if comm.Get_rank() == 0 else None
        attrs["git_revision"] = comm.bcast(rev, root=0)
    else:
        attrs["git_revision"] = git_revision()
    attrs["nranks"] = len(hosts)
    attrs["rank_hosts"] = hosts
    attrs["hostnames"] = sorted(set(hosts), key=hosts.index)
    attrs["ranks_per_host"] = dict(Counter(hosts))
    if settings is not None:
        attrs["policy"] = settings.policy
        attrs["settings"] = settings.as_dict()
        attrs["settings_sources"] = dict(settings.sources)
    return attrs


# -- attributes --------------------------------------------------------------------------
_NATIVE = (str, bool, int, float, np.integer, np.floating, np.bool_)


def write_attrs(obj, attrs: dict) -> None:
    """Scalars and strings are stored as they are; anything else (dicts, lists, None) as
    JSON text, with its name listed in the ``_json`` attribute so readers decode it."""
    encoded = set(json.loads(obj.attrs.get("_json", "[]")))
    for key, value in attrs.items():
        if isinstance(value, str):
            # HDF5 strings are C strings (h5py refuses a NUL): Open MPI's version text
            # ends in one
            value = value.split("\0", 1)[0]
        if isinstance(value, _NATIVE):
            obj.attrs[key] = value
            encoded.discard(key)
        else:
            obj.attrs[key] = json.dumps(value, default=_json_default)
            encoded.add(key)
    obj.attrs["_json"] = json.dumps(sorted(encoded))


def _json_default(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    return str(value)


def read_attrs(obj) -> dict:
    encoded = set(json.loads(obj.attrs.get("_json", "[]")))
    out = {}
    for key, value in obj.attrs.items():
        if key == "_json":
            continue
        if key in encoded:
            value = json.loads(value)
        elif isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, np.generic):
            value = value.item()
        out[key] = value
    return out


# -- tables ------------------------------------------------------------------------------
def _column_dtype(name: str, value: Any):
    """HDF5 column type for a Python value: str -> UTF-8 string, bool, int64, float64,
    a 1-D array -> a fixed-shape sub-array, a list -> a variable-length float64 array."""
    h5py = _h5py()
    if isinstance(value, (str, bytes)):
        return h5py.string_dtype()
    if isinstance(value, (bool, np.bool_)):
        return np.bool_
    if isinstance(value, (int, np.integer)):
        return np.int64
    if isinstance(value, (float, np.floating)):
        return np.float64
    if isinstance(value, np.ndarray):
        return (value.dtype, value.shape)
    if isinstance(value, (list, tuple)):
        return h5py.vlen_dtype(np.float64)
    if value is None:
        raise TypeError(f"table column {name!r}: None is not storable; use a sentinel (-1, nan, '')")
    raise TypeError(f"table column {name!r}: cannot store a {type(value).__name__}")


def table_dtype(row: dict) -> np.dtype:
    """The compound dtype of a table whose rows look like ``row``."""
    return np.dtype([(k, _column_dtype(k, v)) for k, v in row.items()])


def _to_records(rows: list, dtype: np.dtype) -> np.ndarray:
    out = np.zeros(len(rows), dtype=dtype)
    for i, row in enumerate(rows):
        missing = set(dtype.names) - set(row)
        extra = set(row) - set(dtype.names)
        if missing or extra:
            raise ValueError(f"table row {i}: columns differ from the table's "
                             f"(missing {sorted(missing)}, unexpected {sorted(extra)})")
        for k in dtype.names:
            v = row[k]
            if isinstance(v, (list, tuple)):
                v = np.asarray(v, dtype=np.float64)
            out[i][k] = v
    return out


class Table:
    """A growing compound dataset: one row per ``append``ed dict.  The columns are
    fixed by the first rows appended (or by ``dtype``).  ``owner``: the RunWriter whose
    file it is (it refuses rows once the file could not be written, and checks that each
    flush was written)."""

    def __init__(self, group, name: str, dtype: Optional[np.dtype] = None,
                 attrs: Optional[dict] = None, owner: Optional["RunWriter"] = None):
        self.group, self.name = group, name
        self.dataset = None
        self._attrs = dict(attrs or {})
        self.owner = owner
        if dtype is not None:
            self._create(np.dtype(dtype))

    def _create(self, dtype: np.dtype) -> None:
        self.dataset = self.group.create_dataset(self.name, shape=(0,), maxshape=(None,),
                                                 dtype=dtype, chunks=True)
        write_attrs(self.dataset, self._attrs)

    def append(self, rows: Iterable[dict]) -> None:
        rows = list(rows)
        if self.owner is not None:
            self.owner._usable()
        if not rows:
            return
        if self.dataset is None:
            self._create(table_dtype(rows[0]))
        recs = _to_records(rows, self.dataset.dtype)
        n = self.dataset.shape[0]
        self.dataset.resize((n + len(recs),))
        self.dataset[n:] = recs
        if self.owner is not None:
            self.owner._flush()
        else:
            self.group.file.flush()

    def __len__(self) -> int:
        return 0 if self.dataset is None else self.dataset.shape[0]


# -- writing when space runs out ---------------------------------------------------------
_SPACE = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


class WriteFailed(OSError):
    """A result file could not be written: no space left, a quota, the file-size limit
    (``ulimit -f``), an I/O error.  The destination ``path`` is as it was; ``kept`` is the
    file the run's data is in, or None where it was not saved.  ``str()`` is the whole
    message, for a tool to print as it is."""

    def __init__(self, err: int, message: str, path, kept: Optional[Path] = None):
        super().__init__(err, message)
        self.path, self.kept = Path(path), kept

    def __str__(self) -> str:
        return self.strerror


def _size_text(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n} B"


def _left(path) -> str:
    """What became of a destination nothing was written to."""
    return f"{path} is unchanged" if Path(path).exists() else f"{path} was not created"


def space_reason(exc: OSError, path, what: Optional[str] = None) -> str:
    """Why a write to ``path`` (described as ``what``) failed, in words that name the
    limit that was met."""
    path = Path(path)
    what = what or str(path)
    if exc.errno == errno.EFBIG:
        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if soft != resource.RLIM_INFINITY:
            return (f"writing {what} reached this process's file-size limit of "
                    f"{_size_text(soft)} (ulimit -f {soft // 1024})")
        return f"writing {what} reached the largest file its file system allows"
    if exc.errno == errno.ENOSPC:
        try:
            st = os.statvfs(path.parent)
            free = f", {_size_text(st.f_bavail * st.f_frsize)} free"
        except OSError:
            free = ""
        return f"writing {what}: no space left on the file system of {path.parent}{free}"
    if exc.errno == errno.EDQUOT:
        return f"writing {what} exceeded the disk quota"
    return f"writing {what} failed: {exc.strerror or exc}"


@contextlib.contextmanager
def _no_sigxfsz():
    """A write past the file-size limit raises SIGXFSZ, whose default action kills the
    process (with a core dump): with the signal ignored the write fails with EFBIG, which
    is handled.  CPython ignores it from the start; a program that embeds Python, or a
    library, may have restored the default.  Only the main thread may change a signal's
    action (flight records are written from the watchdog's thread): elsewhere the signal
    is held blocked around the write, and consumed before it is let through."""
    if signal.getsignal(signal.SIGXFSZ) == signal.SIG_IGN:
        yield
        return
    if threading.current_thread() is threading.main_thread():
        old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        try:
            yield
        finally:
            signal.signal(signal.SIGXFSZ, old)
        return
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGXFSZ})
    try:
        yield
    finally:
        if signal.SIGXFSZ in signal.sigpending():
            signal.sigtimedwait({signal.SIGXFSZ}, 0)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


class _GuardedIO:
    """The file object HDF5 writes hpccoll's files through (h5py's fileobj driver).

    HDF5 must never see a failed write: after one its caches are inconsistent, closing
    the file fails again, and the library's exit handler then crashes the process with a
    segmentation fault (HDF5 2.0 / h5py 3.16, a file past ``ulimit -f``).  So the first
    failure is recorded in ``error`` and reported to HDF5 as a success; that write and
    every later one go to pages in memory (read back from there), so HDF5 goes on seeing
    a consistent file and can close it.  The caller then checks ``error`` and throws the
    file away.  Before any failure this is a plain ``pwrite`` per HDF5 write, as HDF5's
    own driver does (nothing buffered here: a killed writer leaves what was flushed)."""

    PAGE = 1 << 16

    def __init__(self, path, flags: int):
        self.path = Path(path)
        self.fd = os.open(self.path, flags | os.O_CLOEXEC | _NOFOLLOW, 0o666)
        self.pos = 0
        self.error: Optional[OSError] = None
        self._pages: dict = {}      # page index -> bytearray: what was written since the error
        self._end = 0               # the file's length as HDF5 made it, since the error

    def _eof(self) -> int:
        return max(os.fstat(self.fd).st_size, self._end)

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else self.pos + offset if whence == 1 else self._eof() + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, buf) -> int:
        mv = memoryview(buf).cast("B")
        n = len(mv)
        data = os.pread(self.fd, n, self.pos)
        mv[:len(data)] = data
        mv[len(data):] = bytes(n - len(data))        # past the end reads as zeros, as in HDF5's driver
        for index in range(self.pos // self.PAGE, (self.pos + n - 1) // self.PAGE + 1) if n else ():
            page = self._pages.get(index)
            if page is not None:
                lo = max(self.pos, index * self.PAGE)
                hi = min(self.pos + n, (index + 1) * self.PAGE)
                mv[lo - self.pos:hi - self.pos] = page[lo - index * self.PAGE:hi - index * self.PAGE]
        self.pos += n
        return n

    def read(self, size: int = -1) -> bytes:
        buf = bytearray(max(0, self._eof() - self.pos) if size < 0 else size)
        self.readinto(buf)
        return bytes(buf)

    def write(self, data) -> int:
        mv = memoryview(data).cast("B")
        n, done = len(mv), 0
        if self.error is None:
            try:
                with _no_sigxfsz():
                    while done < n:
                        done += os.pwrite(self.fd, mv[done:], self.pos + done)
            except OSError as exc:
                self.error = exc
        if done < n:
            self._keep(mv[done:], self.pos + done)
        self.pos += n
        return n

    def _keep(self, mv, offset: int) -> None:
        self._end = max(self._end, offset + len(mv))
        while len(mv):
            index, at = divmod(offset, self.PAGE)
            page = self._pages.get(index)
            if page is None:
                page = bytearray(self.PAGE)
                disk = os.pread(self.fd, self.PAGE, index * self.PAGE)
                page[:len(disk)] = disk
                self._pages[index] = page
            k = min(len(mv), self.PAGE - at)
            page[at:at + k] = mv[:k]
            mv, offset = mv[k:], offset + k

    def truncate(self, size: Optional[int] = None) -> int:
        size = self.pos if size is None else size
        if self.error is None:
            try:
                with _no_sigxfsz():
                    os.ftruncate(self.fd, size)
            except OSError as exc:
                self.error = exc
        if self.error is not None:
            self._end = size
        return size

    def flush(self) -> None:
        pass          # nothing is buffered here

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _h5_open(path, mode: str):
    """(h5py.File, its _GuardedIO) for writing: mode "x" creates the file, "a" changes it."""
    flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if mode == "x" else 0)
    io = _GuardedIO(path, flags)
    try:
        return _h5py().File(io, "w" if mode == "x" else "r+"), io
    except BaseException:
        io.close()
        raise


def _h5_close(f, io: _GuardedIO) -> Optional[OSError]:
    """Close both; the write error met, if any (the file is then not to be used)."""
    try:
        f.close()
    finally:
        io.close()
    return io.error


@contextlib.contextmanager
def _h5_changed(path, mode: str = "a"):
    """An h5py.File that is written and closed in the block; OSError (the write's, with
    the file's name) if any write failed, after it was closed."""
    f, io = _h5_open(path, mode)
    try:
        yield f
    finally:
        error = _h5_close(f, io)
    if error is not None:
        raise OSError(error.errno, error.strerror, str(path))


# -- landing a file: the lock, the temporary names ----------------------------------------
LOCK_TIMEOUT = 60.0        # seconds to wait for another writer's merge to finish
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
# the lock, temporary and merged files are opened without following a link: in a shared
# directory (sticky /tmp, a group's results directory) another user may have planted one
# at their names
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class LockUnavailable(OSError):
    """The destination's lock could not be taken (unsupported, or held too long)."""


@contextlib.contextmanager
def locked(path, timeout: float = LOCK_TIMEOUT):
    """Hold the exclusive lock of result file ``path``: ``flock`` on the sidecar
    ``.NAME.lock``, which the holder removes when it lets go (so no lock files pile up;
    a waiter that got the lock of a removed sidecar tries again).  The kernel drops the
    lock of a killed holder.  Raises LockUnavailable after ``timeout`` seconds, or at
    once where the file system has no locks."""
    path = Path(path)
    lock = path.with_name(f".{path.name}.lock")
    deadline = time.monotonic() + timeout
    while True:
        try:
            # (a link planted in a shared directory must not place the lock elsewhere)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o666)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise LockUnavailable(f"{path}: its lock {lock.name} is a symbolic link "
                                      "(not followed)") from None
            raise
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise LockUnavailable(f"{path}: another writer held its lock "
                                              f"({lock.name}) for over {timeout:g} s") from None
                    time.sleep(0.005)
                except OSError as exc:
                    if exc.errno in _NO_LOCKS:
                        raise LockUnavailable(f"{path}: this file system does not lock "
                                              f"files ({exc.strerror})") from None
                    raise
            try:
                mine = os.fstat(fd)
                live = os.stat(lock)
                if (mine.st_dev, mine.st_ino) == (live.st_dev, live.st_ino):
                    break
            except FileNotFoundError:
                pass
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        yield
    finally:
        try:
            os.unlink(lock)
        except OSError:
            pass
        os.close(fd)


def _temp_name(path: Path, what: str) -> Path:
    """``.NAME.WHAT-PID`` beside ``path`` (tests and users find a killed writer's file by
    its pid); ``.NAME.WHAT-PID.K`` for further files of one process."""
    base = path.with_name(f".{path.name}.{what}-{os.getpid()}")
    if not os.path.lexists(base):      # (a dangling link is taken too)
        return base
    k = 1
    while os.path.lexists(path.with_name(f"{base.name}.{k}")):
        k += 1
    return path.with_name(f"{base.name}.{k}")


@contextlib.contextmanager
def whole_file(path, timeout: float = LOCK_TIMEOUT):
    """An h5py.File for a file written whole in a layout of its own (not runs): written
    under a temporary name and moved over ``path`` under its lock when the block ends,
    also when the block fails (then with root attributes ``status = failed`` and
    ``error``), so the file under the real name is always one that was closed properly.
    WriteFailed where it could not be written (``path`` is then unchanged)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_name(path, "tmp")
    f, io = _h5_open(tmp, "x")
    try:
        yield f
    except BaseException as exc:
        write_attrs(f, {"status": "failed", "error": f"{type(exc).__name__}: {exc}"})
        raise
    finally:
        error = _h5_close(f, io)
        if error is not None:
            _unlink(tmp)
            reason = space_reason(error, tmp, f"its temporary file {tmp} (removed)")
            raise WriteFailed(error.errno, f"{reason}; {_left(path)} and the file was not saved",
                              path)
        try:
            with locked(path, timeout):
                os.replace(tmp, path)
        except LockUnavailable as exc:
            _keep_aside(tmp, path, "", str(exc))


def update_file_attrs(path, attrs: dict, overwrite: bool = False,
                      timeout: float = LOCK_TIMEOUT) -> list:
    """Add root attributes to an existing result file, crash-safely and under its lock
    (a copy is changed and renamed over it); without ``overwrite`` existing names are
    kept.  For stamps added after a job (Slurm's variables).  Returns the names added;
    WriteFailed where the copy could not be written (the file is then unchanged)."""
    path = Path(path)
    with locked(path, timeout):
        tmp = _temp_name(path, "tmp")
        try:
            with _no_sigxfsz():
                _copy_new(path, tmp)
            with _h5_changed(tmp) as f:
                new = {k: v for k, v in attrs.items() if overwrite or k not in f.attrs}
                write_attrs(f, new)
            os.replace(tmp, path)
        except OSError as exc:
            _unlink(tmp)
            if exc.errno not in _SPACE:
                raise
            raise WriteFailed(exc.errno, f"{space_reason(exc, tmp, f'a copy of {path}')}; "
                              f"{path} is unchanged (its attributes were not added)",
                              path) from None
        except BaseException:
            _unlink(tmp)
            raise
    return sorted(new)


def _aside_name(path: Path, tag: str) -> Path:
    """``NAME-TAG-PID.h5`` beside ``path`` (``-K`` added where that is taken)."""
    stem, suffix = path.stem, path.suffix or ".h5"
    name = "-".join(x for x in (stem, tag, str(os.getpid())) if x)
    aside, k = path.with_name(name + suffix), 1
    while os.path.lexists(aside):
        aside, k = path.with_name(f"{name}-{k}{suffix}"), k + 1
    return aside


def _keep_aside(tmp: Path, path: Path, tag: str, reason: str, what: str = "file") -> Path:
    """Nothing may be lost: a finished file that cannot take the place meant for it (or
    join it) becomes ``NAME-TAG-PID.h5`` beside it, and stderr says so."""
    aside = _aside_name(path, tag)
    os.replace(tmp, aside)
    sys.stderr.write(f"hpccoll: {reason}\nhpccoll: nothing was written to {path}; the {what} "
                     f"is kept in {aside}\n")
    sys.stderr.flush()
    return aside


def _copy_new(src: Path, dst: Path) -> None:
    """Copy ``src`` into ``dst``, a new file: created exclusively, never through a link
    (shutil.copyfile writes through one planted at ``dst``)."""
    with open(src, "rb") as fin, \
            open(os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
                         | _NOFOLLOW, 0o666), "wb") as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)


def _unlink(path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


# -- writing -----------------------------------------------------------------------------
def _check_schema(f, path) -> None:
    schema = f.attrs.get("schema")
    if schema is None and (len(f) or len(f.attrs)):
        raise ValueError(f"{path}: not an hpccoll result file (no schema attribute)")
    if schema is not None and schema != SCHEMA:
        raise ValueError(f"{path}: not an hpccoll result file (schema {schema!r})")
    version = int(f.attrs.get("schema_version", SCHEMA_VERSION))
    if version > SCHEMA_VERSION:
        raise ValueError(f"{path}: written with result schema version {version}, newer than "
                         f"this hpccoll reads ({SCHEMA_VERSION}); upgrade hpccoll")


def append_problem(path) -> Optional[str]:
    """Why runs cannot be appended to ``path``, or None if they can.  Tools that write at
    the end of a long measurement check ``--out`` with it first."""
    try:
        _appendable(path)
    except (OSError, ValueError) as exc:
        return str(exc)
    return None


def _appendable(path) -> list:
    """The names of the runs in ``path``; ValueError (or OSError) unless runs can be
    appended to it: no file yet, or a result file of this schema."""
    path = Path(path)
    if not path.exists():
        if path.parent.exists() and not path.parent.is_dir():
            raise NotADirectoryError(f"{path}: {path.parent} is not a directory")
        return []
    with _h5py().File(path, "r") as f:
        if _legacy_kind(f) is not None:
            raise ValueError(f"{path}: written by an earlier hpccoll (one record, not runs); "
                             f"runs are not appended to it: choose another file or move it away")
        _check_schema(f, path)
        return list(f.get("runs", {}))


def _index(name: str) -> int:
    head = name.split("_", 1)[0]
    return int(head) if head.isdigit() else -1


def _next_name(names, label: str) -> str:
    return f"{max(map(_index, names), default=-1) + 1:04d}_{label}"


class RunWriter:
    """Write one run (a group under /runs) of record kind ``kind`` into ``path``.

    The run is written into a private temporary file beside ``path`` (``.NAME.tmp-PID``,
    flushed after every table row); ``close()`` records the end time and status and
    lands it (see the module's docstring): appended after the runs the file has by then,
    or, with ``append=False``, replacing the file.  Used as a context manager, an
    exception marks the run ``failed`` (with the error text) and the rows written so far
    are kept.  ``name`` is the run's group name (final after close), ``final_path`` where
    it landed: ``path``, or a file of its own when ``path`` could not be locked.

    Space: where the run's own file cannot be written (no space, ``ulimit -f``), the
    call that found it (an append, ``array``, ``set_attrs``, ``close``) raises WriteFailed,
    the temporary file is removed and the writer is done (``failure``; later calls raise
    it again); where the run was written but adding it to ``path`` failed, ``close()``
    raises WriteFailed with ``kept``: the run's file, moved beside ``path``."""

    def __init__(self, path, label: str, attrs: Optional[dict] = None, append: bool = True,
                 kind: Optional[str] = None, lock_timeout: float = LOCK_TIMEOUT):
        if not label or "/" in label:
            raise ValueError(f"label: expected a non-empty name without '/', got {label!r}")
        self.path = Path(path)
        self.label, self.append, self.lock_timeout = label, append, lock_timeout
        self.final_path: Optional[Path] = None
        self.failure: Optional[WriteFailed] = None
        attrs = dict(attrs or {})
        self.kind = kind if kind is not None else str(attrs.get("kind", ""))
        names = _appendable(self.path) if append else []   # fail now, not after the run
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp_path = _temp_name(self.path, "tmp")
        self._closed = False
        self._tables: dict[str, Table] = {}
        self.file, self._io = _h5_open(self.tmp_path, "x")
        try:
            f = self.file
            f.attrs["schema"] = SCHEMA
            f.attrs["schema_version"] = SCHEMA_VERSION
            self.name = _next_name(names, label)
            self.group = f.require_group("runs").create_group(self.name)
            write_attrs(self.group, attrs)
            write_attrs(self.group, {"schema_version": SCHEMA_VERSION, "kind": self.kind,
                                     "status": "running", "error": "", "label": label})
            self._flush()
        except WriteFailed:
            raise
        except BaseException:
            self._discard()
            raise

    def table(self, name: str, dtype=None, kind: str = "tables", attrs: Optional[dict] = None) -> Table:
        """The table ``name`` of this run (created on first use); kind "tables" or "traces"."""
        self._usable()
        key = f"{kind}/{name}"
        if key not in self._tables:
            self._tables[key] = Table(self.group.require_group(kind), name, dtype, attrs, owner=self)
        return self._tables[key]

    def array(self, name: str, data, attrs: Optional[dict] = None):
        """Store an n-dimensional array as ``arrays/NAME`` (``a/b`` nests groups); strings
        are stored as UTF-8.  Returns the h5py dataset."""
        h5py = _h5py()
        self._usable()
        arr = np.asarray(data)
        if arr.dtype.kind in "US":
            arr = np.array([x.decode() if isinstance(x, bytes) else str(x) for x in arr.ravel()],
                           dtype=h5py.string_dtype()).reshape(arr.shape)
        elif arr.dtype.kind == "O":
            raise TypeError(f"array {name!r}: cannot store Python objects; use numbers or strings")
        ds = self.group.require_group("arrays").create_dataset(name, data=arr)
        write_attrs(ds, dict(attrs or {}))
        self._flush()
        return ds

    def set_attrs(self, **attrs) -> None:
        self._usable()
        write_attrs(self.group, attrs)
        self._flush()

    def _usable(self) -> None:
        if self.failure is not None:
            raise self.failure
        if self._closed:
            raise ValueError(f"run {self.label!r} of {self.path}: the writer is closed")

    def _flush(self) -> None:
        """Make what was written durable, and check that it was written."""
        self.file.flush()
        if self._io.error is not None:
            self._fail(self._io.error)

    @property
    def _tmp_what(self) -> str:
        return f"the run's temporary file {self.tmp_path} (removed)"

    def _fail(self, error: OSError) -> None:
        """The run's file could not be written: throw it away (HDF5 can close it, see
        _GuardedIO) and raise WriteFailed from now on."""
        self._discard()
        self.failure = WriteFailed(
            error.errno, f"{space_reason(error, self.tmp_path, self._tmp_what)}; "
            f"{_left(self.path)} and the run {self.label!r} was not saved", self.path)
        raise self.failure

    def close(self, status: str = "complete", error: str = "") -> Path:
        """Finish the run and land it; returns the file it is in (WriteFailed: see the
        class)."""
        if self.failure is not None:
            raise self.failure
        if self._closed:
            return self.final_path or self.path
        self._closed = True
        try:
            write_attrs(self.group, {"status": status, "error": error, "end_time": now_iso()})
            failed = _h5_close(self.file, self._io)
        except BaseException:
            self._discard()
            raise
        if failed is not None:
            self._fail(failed)
        try:
            with locked(self.path, self.lock_timeout):
                self.final_path = self._land()
        except (LockUnavailable, ValueError) as exc:
            # nothing may be lost: a file the run cannot join keeps it beside
            self.final_path = self._keep_aside(str(exc))
        except OSError as exc:
            self._landing_failed(exc)
        return self.final_path

    def _land(self) -> Path:
        """Under the lock: append the run to the file as it is now (a copy, renamed over
        it), or make the temporary file the destination."""
        h5py = _h5py()
        if not (self.append and self.path.exists()):
            self._rename_run(_next_name([], self.label))
            os.replace(self.tmp_path, self.path)
            return self.path
        merged = _temp_name(self.path, "merge")
        try:
            with _no_sigxfsz():
                _copy_new(self.path, merged)
            with _h5_changed(merged) as dst, h5py.File(self.tmp_path, "r") as src:
                _check_schema(dst, self.path)
                runs = dst.require_group("runs")
                name = _next_name(runs, self.label)
                src.copy(src["runs"][self.name], runs, name=name)
                dst.attrs["schema"] = SCHEMA
                dst.attrs["schema_version"] = SCHEMA_VERSION
            os.replace(merged, self.path)
        except BaseException:
            _unlink(merged)
            raise
        self.name = name
        _unlink(self.tmp_path)
        return self.path

    def _landing_failed(self, exc: OSError) -> None:
        """The run is whole in its temporary file, but adding it to the destination
        failed (no space for the copy that lands it, say): the destination is unchanged;
        the run moves beside it under a name of its own (a rename needs no space) and
        WriteFailed says where."""
        self.final_path = kept = _aside_name(self.path, self.label)
        try:
            os.replace(self.tmp_path, kept)
        except OSError:
            self.final_path = kept = self.tmp_path
        what = (space_reason(exc, self.path, f"the new {self.path}") if exc.errno in _SPACE
                else f"adding it failed: {exc}")
        self.failure = WriteFailed(
            exc.errno or errno.EIO, f"the run {self.label!r} could not be added to "
            f"{self.path}: {what}; {_left(self.path)}; the run is kept in {kept}",
            self.path, kept)
        raise self.failure from exc

    def _rename_run(self, name: str) -> None:
        if name != self.name:
            with _h5_changed(self.tmp_path) as f:
                f["runs"].move(self.name, name)
            self.name = name

    def _keep_aside(self, reason: str) -> Path:
        self._rename_run(_next_name([], self.label))
        return _keep_aside(self.tmp_path, self.path, self.label, reason, f"run {self.label!r}")

    def _discard(self) -> None:
        self._closed = True
        try:
            _h5_close(self.file, self._io)
        except Exception:
            pass
        _unlink(self.tmp_path)

    def __enter__(self) -> "RunWriter":
        return self

    def __exit__(self, etype, exc, tb) -> None:
        if self.failure is not None:
            if etype is None:
                raise self.failure
            return                       # the error in flight goes on (WriteFailed or other)
        if etype is None:
            self.close()
        else:
            status = "interrupted" if issubclass(etype, KeyboardInterrupt) else "failed"
            self.close(status, f"{etype.__name__}: {exc}")


def write_record(path, kind: str, label: str, attrs: Optional[dict] = None,
                 tables: Optional[dict] = None, arrays: Optional[dict] = None,
                 append: bool = True, status: str = "complete") -> RunWriter:
    """One run written at once: ``tables`` {name: [row dicts]}, ``arrays`` {name: array
    or (array, attrs)}.  Returns the closed writer (``final_path``, ``name``)."""
    run = RunWriter(path, label, attrs, append=append, kind=kind)
    with run:
        for name, rows in (tables or {}).items():
            run.table(name).append(rows)
        for name, value in (arrays or {}).items():
            data, meta = value if isinstance(value, tuple) else (value, None)
            run.array(name, data, meta)
        run.close(status)
    return run


# -- reading -----------------------------------------------------------------------------
def _decode(value):
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _rows(dataset) -> list[dict]:
    data = dataset[()]
    names = data.dtype.names
    return [{k: _decode(rec[k]) for k in names} for rec in data]


def _array(dataset) -> np.ndarray:
    if _h5py().check_string_dtype(dataset.dtype) is not None:
        return np.asarray(dataset.asstr()[()], dtype=object)
    return dataset[()]


@dataclass
class Run:
    file: str
    name: str
    attrs: dict
    tables: dict = field(default_factory=dict)       # name -> list of row dicts
    traces: dict = field(default_factory=dict)       # name -> list of row dicts
    arrays: dict = field(default_factory=dict)       # path under arrays/ -> numpy array
    array_attrs: dict = field(default_factory=dict)  # path under arrays/ -> attributes

    @property
    def label(self) -> str:
        return self.attrs.get("label", self.name)

    @property
    def kind(self) -> str:
        """The record kind; runs written before kinds existed (schema version 1) are
        benchmark runs when hpccoll-bench wrote them."""
        return self.attrs.get("kind") or ("bench" if self.attrs.get("tool") == "hpccoll-bench" else "")


def _fill(run: Run, g, arrays_under: str = "arrays") -> Run:
    for kind in ("tables", "traces"):
        for tname, ds in g.get(kind, {}).items():
            getattr(run, kind)[tname] = _rows(ds)
    h5py = _h5py()

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            run.arrays[name] = _array(obj)
            run.array_attrs[name] = read_attrs(obj)
    if arrays_under in g:
        g[arrays_under].visititems(visit)
    return run


# Files of hpccoll versions before one writer: one record at the root of the file.
_LEGACY = {("schema", "hpccoll.chaos/1"): "chaos",
           ("kind", "hpccoll.tuning.profile"): "tuning.profile",
           ("kind", "hpccoll.tuning.simulate"): "tuning.simulate"}


def _legacy_kind(f) -> Optional[str]:
    return next((k for (a, v), k in _LEGACY.items() if f.attrs.get(a) == v), None)


def _legacy(f, path) -> Optional[Run]:
    kind = _legacy_kind(f)
    if kind is None:
        return None
    run = Run(str(path), f"0000_{kind}", dict(read_attrs(f), kind=kind, label=kind))
    h5py = _h5py()

    def visit(name, obj):
        if not isinstance(obj, h5py.Dataset):
            return
        if obj.dtype.names and "/" not in name:
            run.tables[name] = _rows(obj)
        else:
            run.arrays[name] = _array(obj)
            run.array_attrs[name] = read_attrs(obj)
    f.visititems(visit)
    return run


def read(path) -> list[Run]:
    """Every run in a result file, in the order they were written (a file of an earlier
    hpccoll's chaos or tuning tools reads as one run)."""
    h5py = _h5py()
    with h5py.File(path, "r") as f:
        old = _legacy(f, path)
        if old is not None:
            return [old]
        _check_schema(f, path)
        names = sorted(f.get("runs", {}), key=lambda n: (_index(n), n))
        return [_fill(Run(str(path), n, read_attrs(f["runs"][n])), f["runs"][n]) for n in names]
