"""HDF5 result logs: one small API that every hpccoll tool records results with.

    attrs = h5log.environment_attrs(comm, settings=ctx.settings)      # collective if comm
    with h5log.RunWriter("r.h5", "allreduce", attrs) as run:           # rank 0 only
        table = run.table("allreduce")
        table.append([{"size": 8, "time_us": 3.1, "times": np.array([...])}])
    for run in h5log.read("r.h5"):
        run.attrs["policy"], run.tables["allreduce"][0]["busbw"]

The schema (groups, attributes, columns) is documented in docs/results.md and versioned
by ``SCHEMA_VERSION``.  Crash safety: a run is written into a temporary file next to the
destination (a copy of it when appending) and renamed over it when the run ends, so the
file under the real name is always one that was closed properly.  A run that fails
with an exception is still renamed into place, with ``status = "failed"`` and the
error text; only a killed writer leaves nothing but the temporary file behind.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shlex
import shutil
import socket
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

import numpy as np

SCHEMA = "hpccoll-results"
SCHEMA_VERSION = 1
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
    from ._version import __version__
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
        from mpi4py import MPI
        import mpi4py
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
    fixed by the first rows appended (or by ``dtype``)."""

    def __init__(self, group, name: str, dtype: Optional[np.dtype] = None, attrs: Optional[dict] = None):
        self.group, self.name = group, name
        self.dataset = None
        self._attrs = dict(attrs or {})
        if dtype is not None:
            self._create(np.dtype(dtype))

    def _create(self, dtype: np.dtype) -> None:
        self.dataset = self.group.create_dataset(self.name, shape=(0,), maxshape=(None,),
                                                 dtype=dtype, chunks=True)
        write_attrs(self.dataset, self._attrs)

    def append(self, rows: Iterable[dict]) -> None:
        rows = list(rows)
        if not rows:
            return
        if self.dataset is None:
            self._create(table_dtype(rows[0]))
        recs = _to_records(rows, self.dataset.dtype)
        n = self.dataset.shape[0]
        self.dataset.resize((n + len(recs),))
        self.dataset[n:] = recs
        self.group.file.flush()

    def __len__(self) -> int:
        return 0 if self.dataset is None else self.dataset.shape[0]


# -- writing -----------------------------------------------------------------------------
def _check_schema(f, path) -> None:
    if f.attrs.get("schema", SCHEMA) != SCHEMA:
        raise ValueError(f"{path}: not an hpccoll result file (schema {f.attrs.get('schema')!r})")
    version = int(f.attrs.get("schema_version", SCHEMA_VERSION))
    if version > SCHEMA_VERSION:
        raise ValueError(f"{path}: written with result schema version {version}, newer than "
                         f"this hpccoll reads ({SCHEMA_VERSION}); upgrade hpccoll")


class RunWriter:
    """Write one run (a group under /runs) into ``path``, crash-safely.

    The run goes into a temporary file next to ``path`` (``.NAME.tmp-PID``, a copy of the
    existing file when ``append``); ``close()`` records the end time and status and
    renames it over ``path``.  Used as a context manager, an exception marks the run
    ``failed`` (with the error text) and the rows written so far are kept.
    Only one process may write a given file at a time."""

    def __init__(self, path, label: str, attrs: Optional[dict] = None, append: bool = True):
        h5py = _h5py()
        self.path = Path(path)
        if self.path.parent and not self.path.parent.exists():
            raise FileNotFoundError(f"{self.path}: directory {self.path.parent} does not exist")
        self.tmp_path = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        self._closed = False
        if append and self.path.exists():
            with h5py.File(self.path, "r") as old:
                _check_schema(old, self.path)
            shutil.copyfile(self.path, self.tmp_path)
            self.file = h5py.File(self.tmp_path, "a")
        else:
            self.file = h5py.File(self.tmp_path, "w")
        try:
            f = self.file
            f.attrs["schema"] = SCHEMA
            f.attrs["schema_version"] = SCHEMA_VERSION
            runs = f.require_group("runs")
            self.name = f"{len(runs):04d}_{label}"
            self.group = runs.create_group(self.name)
            write_attrs(self.group, dict(attrs or {}))
            write_attrs(self.group, {"schema_version": SCHEMA_VERSION, "status": "running",
                                    "error": "", "label": label})
            f.flush()
        except BaseException:
            self._discard()
            raise
        self._tables: dict[str, Table] = {}

    def table(self, name: str, dtype=None, kind: str = "tables", attrs: Optional[dict] = None) -> Table:
        """The table ``name`` of this run (created on first use); kind "tables" or "traces"."""
        key = f"{kind}/{name}"
        if key not in self._tables:
            self._tables[key] = Table(self.group.require_group(kind), name, dtype, attrs)
        return self._tables[key]

    def set_attrs(self, **attrs) -> None:
        write_attrs(self.group, attrs)
        self.file.flush()

    def close(self, status: str = "complete", error: str = "") -> Path:
        """Finish the run and move the file into place; returns the final path."""
        if self._closed:
            return self.path
        self._closed = True
        try:
            write_attrs(self.group, {"status": status, "error": error, "end_time": now_iso()})
            self.file.close()
        except BaseException:
            self._discard()
            raise
        os.replace(self.tmp_path, self.path)
        return self.path

    def _discard(self) -> None:
        self._closed = True
        try:
            self.file.close()
        except Exception:
            pass
        try:
            os.unlink(self.tmp_path)
        except OSError:
            pass

    def __enter__(self) -> "RunWriter":
        return self

    def __exit__(self, etype, exc, tb) -> None:
        if etype is None:
            self.close()
        else:
            status = "interrupted" if issubclass(etype, KeyboardInterrupt) else "failed"
            self.close(status, f"{etype.__name__}: {exc}")


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


@dataclass
class Run:
    file: str
    name: str
    attrs: dict
    tables: dict = field(default_factory=dict)   # name -> list of row dicts
    traces: dict = field(default_factory=dict)   # name -> list of row dicts

    @property
    def label(self) -> str:
        return self.attrs.get("label", self.name)


def read(path) -> list[Run]:
    """Every run in a result file, in the order they were written."""
    h5py = _h5py()
    runs = []
    with h5py.File(path, "r") as f:
        _check_schema(f, path)
        for name in sorted(f.get("runs", {})):
            g = f["runs"][name]
            run = Run(str(path), name, read_attrs(g))
            for kind in ("tables", "traces"):
                for tname, ds in g.get(kind, {}).items():
                    getattr(run, kind)[tname] = _rows(ds)
            runs.append(run)
    return runs
