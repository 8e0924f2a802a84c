"""The MPI library's own collectives timed from C: the floor under every Python figure,
printed beside hpccoll's and mpi4py's by hpccoll-bench and the main job.

Two ways, the first that this MPI has:

- ``C (mpicc)``: floor.c, built once with the MPI's compiler wrapper (the MPICH and Open MPI
  wheels ship one) into hpccoll's cache folder, timed as hpccoll/timing.py times Python
  calls (a barrier before every call, the slowest rank's time, the median);
- ``IMB-MPI1``: Intel's MPI Benchmarks, which the Intel MPI wheel ships instead of a
  compiler wrapper: the slowest rank's mean over back-to-back calls (float32 sum for the
  reductions, bytes otherwise, roots taking turns).

Each at two thread levels (``LEVELS``): ``multiple``, as mpi4py initializes MPI and hpccoll
needs it, the floor under the Python figures; and ``single``, MPI_Init's, what a C program
gets (some MPIs lock in every call at ``multiple``: floor.c says how much).

Either runs as a job of its own with the same number of ranks, started by rank 0 of the
job that asks (``in_job``) while its other ranks wait without spinning, so that nothing
of Python runs beside it; on one node only (a job across nodes gets a note instead).  A
case is ``(collective, count, dtype, op, root)`` with the public contract's count
(elements of allreduce, reduce and broadcast; one rank's block of allgather,
reduce_scatter, alltoall, gather and scatter)."""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .. import launch
from ..algorithms.calibration import cache_dir

SOURCE = Path(__file__).with_name("floor.c")
COLLS = ("allreduce", "reduce", "broadcast", "allgather", "reduce_scatter", "alltoall",
         "gather", "scatter", "barrier")
DTYPES = ("int8", "uint8", "int32", "int64", "float32", "float64")
IMB_NAMES = {"allreduce": "Allreduce", "reduce": "Reduce", "broadcast": "Bcast",
             "allgather": "Allgather", "reduce_scatter": "Reduce_scatter_block",
             "alltoall": "Alltoall", "gather": "Gather", "scatter": "Scatter",
             "barrier": "Barrier"}
ITEMSIZE = {"int8": 1, "uint8": 1, "int32": 4, "int64": 8, "float32": 4, "float64": 8}


LEVELS = ("multiple", "single")


@dataclass
class Floor:
    """``times``: {thread level: {case: microseconds}}; ``source``: how they were measured
    ("" where they were not, ``note`` says why)."""
    source: str = ""
    times: dict = field(default_factory=dict)
    note: str = ""

    def get(self, case, level: str = "multiple") -> float:
        return self.times.get(level, {}).get(tuple(case), float("nan"))


def case(coll: str, count: int, dtype: str = "float32", op: str = "sum", root: int = 0):
    """One case, normalized: ops MPI cannot take from C (avg) as sum, rootless collectives
    at root 0, the barrier without a count."""
    op = "sum" if op in (None, "avg") or coll not in ("allreduce", "reduce",
                                                     "reduce_scatter") else op
    if coll not in ("reduce", "broadcast", "gather", "scatter"):
        root = 0
    return (coll, 0 if coll == "barrier" else int(count), str(dtype), op, int(root))


def _prefix_env(exe: str) -> dict:
    """A wheel's MPI programs find its libmpi in the prefix's lib folder (Intel's do not
    on their own)."""
    lib = Path(exe).resolve().parent.parent / "lib"
    env = launch.nested_environment()
    if any(lib.glob("libmpi.so*")):
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (str(lib), env.get("LD_LIBRARY_PATH", "")) if p)
    return env


def _unpinned():
    """The floor job's ranks get every core: rank 0 of an MPI job that starts it is often
    bound to one (Open MPI and Intel MPI bind by default)."""
    os.sched_setaffinity(0, range(os.cpu_count() or 1))


def build(timeout: float = 120.0) -> tuple:
    """(path of the floor program, "") built with this MPI's mpicc (cached by source and
    wrapper), or (None, why not)."""
    mpicc = launch.tool("mpicc")
    if not mpicc:
        return None, "no mpicc for this MPI"
    key = hashlib.sha256(SOURCE.read_bytes() + os.path.realpath(mpicc).encode()
                         + str(os.stat(mpicc).st_mtime_ns).encode()).hexdigest()[:16]
    exe = Path(cache_dir()) / "floor" / key / "floor"
    if exe.is_file():
        return str(exe), ""
    exe.parent.mkdir(parents=True, exist_ok=True)
    tmp = exe.with_name(f".floor-{os.getpid()}")
    try:
        out = subprocess.run([mpicc, "-O2", str(SOURCE), "-o", str(tmp)], capture_output=True,
                             text=True, timeout=timeout, env=_prefix_env(mpicc))
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"mpicc failed: {exc}"
    if out.returncode != 0:
        return None, f"mpicc failed: {' '.join((out.stderr or out.stdout).split())[-300:]}"
    os.replace(tmp, exe)        # (atomic: ranks of two jobs may build at once)
    return str(exe), ""


def _run(cmd: list, exe: str, timeout: float) -> tuple:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                             env=_prefix_env(exe), preexec_fn=_unpinned)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"{Path(exe).name} failed: {exc}"
    if out.returncode != 0:     # (one line: it lands in '#' comments of a table)
        return None, (f"{Path(exe).name} exited {out.returncode}: "
                      f"{' '.join((out.stderr or out.stdout).split())[-300:]}")
    return out.stdout, ""


def measure(nranks: int, cases, iters: int = 200, warmup: int = 20,
            timeout: float = 300.0) -> Floor:
    """Time ``cases`` in a job of ``nranks`` ranks of its own (not from inside an MPI
    job: ``in_job`` does that)."""
    cases = [tuple(c) for c in dict.fromkeys(tuple(c) for c in cases)]
    exe, why = build()
    if exe:
        specs = [":".join(str(x) for x in c) for c in cases if c[2] in DTYPES]
        out = Floor("C (mpicc)")
        for level in LEVELS:
            text, err = _run(launch.command(nranks) + [exe, level, str(iters), str(warmup),
                                                       *specs], exe, timeout)
            if text is None:
                return Floor(note=err)
            times = out.times[level] = {}
            for line in text.splitlines():
                f = line.split()
                if len(f) == 6:
                    times[(f[0], int(f[1]), f[2], f[3], int(f[4]))] = float(f[5])
        return out
    imb = launch.tool("IMB-MPI1")
    if imb:
        return _imb(imb, nranks, cases, iters, timeout)
    return Floor(note=f"{why}, and no IMB-MPI1")


def _imb(imb: str, nranks: int, cases, iters: int, timeout: float) -> Floor:
    """IMB-MPI1's t_max for the float32 sum cases (its reductions' only form)."""
    usable = [c for c in cases if c[2] == "float32" and c[3] == "sum"]
    sizes = sorted({_imb_bytes(c, nranks) for c in usable})
    if not usable:
        return Floor(note="IMB-MPI1 times float32 sums only")
    with tempfile.NamedTemporaryFile("w", suffix=".msglen", delete=False) as f:
        f.write("\n".join(str(s) for s in sizes) + "\n")
    out = Floor("IMB-MPI1")
    try:
        names = sorted({IMB_NAMES[c[0]] for c in usable})
        for level in LEVELS:
            text, err = _run(launch.command(nranks) + [
                imb, "-npmin", str(nranks), "-msglen", f.name, "-iter", str(iters),
                "-iter_policy", "off", "-time", str(int(timeout)), "-thread_level", level,
                *names], imb, timeout)
            if text is None:
                return Floor(note=err)
            table = _parse_imb(text)
            times = out.times[level] = {}
            for c in usable:
                t = table.get((IMB_NAMES[c[0]],
                               None if c[0] == "barrier" else _imb_bytes(c, nranks)))
                if t is not None:
                    times[c] = t
    finally:
        os.unlink(f.name)
    return out


def _imb_bytes(c, nranks: int) -> int:
    n = c[1] * ITEMSIZE[c[2]]
    return n * nranks if c[0] == "reduce_scatter" else n   # (IMB: the whole vector)


def _parse_imb(text: str) -> dict:
    """{(benchmark, bytes or None): t_max us} from IMB-MPI1's tables."""
    out, name = {}, None
    for line in text.splitlines():
        m = re.match(r"# Benchmarking (\S+)", line)
        if m:
            name = m.group(1)
            continue
        f = line.split()
        if name is None or not f or line.startswith("#"):
            continue
        try:
            nums = [float(x) for x in f]
        except ValueError:
            continue
        if len(nums) == 5:       # bytes, repetitions, t_min, t_max, t_avg
            out[(name, int(nums[0]))] = nums[3]
        elif len(nums) == 4:     # barrier: repetitions, t_min, t_max, t_avg
            out[(name, None)] = nums[2]
    return out


def in_job(mpi_comm, cases, iters: int = 200, warmup: int = 20,
           timeout: float = 300.0) -> Floor:
    """``measure`` from inside an MPI job (collective over the mpi4py communicator
    ``mpi_comm``): rank 0 starts the floor job with as many ranks, the others sleep on a
    nonblocking barrier meanwhile; every rank gets the same Floor."""
    from mpi4py import MPI
    node = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED)
    nodes = mpi_comm.allreduce(1 if node.Get_rank() == 0 else 0)
    node.Free()
    result = None
    if nodes > 1:
        # (its ranks would all start on rank 0's node: not the placement measured)
        result = Floor(note=f"the job spans {nodes} nodes; the floor is timed on one")
    elif mpi_comm.Get_rank() == 0:
        try:
            result = measure(mpi_comm.Get_size(), cases, iters, warmup, timeout)
        except Exception as exc:      # (a floor that cannot be measured is a note, not a failure)
            result = Floor(note=f"{type(exc).__name__}: {exc}")
    req = mpi_comm.Ibarrier()
    while not req.Test():
        time.sleep(0.01)
    return mpi_comm.bcast(result, root=0)


def main(argv=None) -> int:
    """python -m hpccoll.bench.floor N COLL:COUNT ... : print the floor of N ranks."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        print("usage: python -m hpccoll.bench.floor NRANKS COLL:COUNT[:DTYPE:OP:ROOT] ...",
              file=sys.stderr)
        return 2
    cases = []
    for spec in argv[1:]:
        f = spec.split(":")
        cases.append(case(f[0], int(f[1]) if len(f) > 1 else 0, *f[2:4],
                          *(int(x) for x in f[4:5])))
    fl = measure(int(argv[0]), cases)
    print(f"# the MPI's own, from C: {fl.source or 'not measured'} {fl.note}".rstrip())
    print("# coll count dtype op root  us (thread level " + ", ".join(LEVELS) + ")")
    for c in cases:
        print(*c, *(f"{fl.get(c, level):.3f}" for level in LEVELS))
    return 0 if fl.source else 1


if __name__ == "__main__":
    sys.exit(main())
