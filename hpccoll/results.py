"""HDF5 result files of the deadlock workloads (``python -m hpccoll.chaos ... --out F.h5``).

Schema ``hpccoll.chaos/1``, one file per run, written by rank 0:

- dataset ``/outcomes``: one row per (rank, policy), fields ``rank``, ``host``,
  ``policy``, ``outcome`` (complete | timeout | wrong | error), ``expected``, ``iters``
  (iterations completed), ``seconds``, ``yields``, ``tries``, ``switches``, ``parks``,
  ``n_wrong`` (wrong results seen), ``detail`` (first wrong result, or the watchdog's
  diagnosis line, or the error);
- root attributes: ``schema``, ``scenario``, ``ok`` (every policy behaved as expected on
  every rank: the job's exit status), ``command``, ``hpccoll_version``, ``mpi_library``,
  ``ranks``, ``hosts`` (one per rank), ``created`` (UTC, ISO 8601), the run's options
  (``iters``, ``bytes``, ``timeout``, ``max_active``, ``seed``, ``expect``), and every
  SLURM_* environment variable of rank 0 under its own name: the job step's under srun;
  under mpiexec in a Slurm job, those of the step that started MPI's proxy on the node
  (SLURM_NTASKS is then the number of nodes; ``ranks`` is always the MPI job's size);
- and the attributes every hpccoll result file has (h5log.environment_attrs, under the
  names docs/results.md gives them: ``git_revision``, ``settings`` and
  ``settings_sources``, ``environment``, versions, ``rank_hosts``...), except ``policy``,
  which is per row here.

The file appears complete or not at all: it is written under a temporary name in the
same directory and renamed.
"""
from __future__ import annotations

import os
import time

SCHEMA = "hpccoll.chaos/1"
FIELDS = ("rank", "host", "policy", "outcome", "expected", "iters", "seconds", "yields",
          "tries", "switches", "parks", "n_wrong", "detail")


def require_h5py(option: str = "--out") -> None:
    try:
        import h5py  # noqa: F401
    except ImportError as exc:
        raise SystemExit(f"{option} needs h5py, which is not installed here ({exc}): "
                         f"pip install h5py (it comes with `pip install -e .`)") from None


def _table(rows):
    import h5py
    import numpy as np
    text = h5py.string_dtype("utf-8")
    dtype = np.dtype([("rank", "i4"), ("host", text), ("policy", text), ("outcome", text),
                      ("expected", text), ("iters", "i8"), ("seconds", "f8"), ("yields", "i8"),
                      ("tries", "i8"), ("switches", "i8"), ("parks", "i8"), ("n_wrong", "i8"),
                      ("detail", text)])
    table = np.empty(len(rows), dtype=dtype)
    for i, row in enumerate(rows):
        table[i] = tuple(row[k] for k in FIELDS)
    return table


def write_chaos(path: str, world, scenario: str, args, ok: bool, rows: list[dict]) -> None:
    """Collective over ``world``: gather every rank's per-policy ``rows`` (dicts with
    FIELDS except rank and host) and write them with the run's attributes on rank 0."""
    from mpi4py import MPI
    from . import __version__, config, h5log
    from .slurm import slurm_env
    host = MPI.Get_processor_name()
    mine = [dict(row, rank=world.rank, host=host) for row in rows]
    # what every hpccoll result file records (git revision, knobs, versions, environment;
    # see docs/results.md), under the same names; the policy is per row here
    env = h5log.environment_attrs(world, settings=config.resolve(
        {"timeout": args.timeout, "max_active": args.max_active}))
    del env["policy"]
    gathered = world.gather((host, mine), root=0)
    if world.rank != 0:
        return
    import h5py
    hosts = [h for h, _ in gathered]
    attrs = {
        "schema": SCHEMA,
        "scenario": scenario,
        "ok": bool(ok),
        "command": getattr(args, "command", ""),
        "hpccoll_version": __version__,
        "mpi_library": MPI.Get_library_version().strip(),
        "ranks": world.size,
        "hosts": hosts,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "iters": args.iters, "bytes": args.bytes, "timeout": args.timeout,
        "max_active": args.max_active, "seed": args.seed, "expect": args.expect,
        **slurm_env(),
    }
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        f = h5py.File(tmp, "w")
        try:
            f.create_dataset("outcomes", data=_table([r for _, rs in gathered for r in rs]))
            h5log.write_attrs(f, env)
            for k, v in attrs.items():
                f.attrs[k] = v
        finally:
            f.close()
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
