#!/usr/bin/env python
"""mpi4py's OSU benchmark demos as they are, through ``hpccoll.mpi.Comm`` and through plain
mpi4py, one table:

    python tests/mpi4py_suite.py fetch          # keeps the sdist's demo/osu_*.py, once
    mpiexec -n 2 python scripts/osu_adapter.py [--only allgather,bcast] [--loop 200]
                                               [--skip 20] [--max 1M]

Each demo's function runs twice, unchanged, its ``MPI.COMM_WORLD`` being first MPI's and
then an adapter over it (the demo reads ``MPI.COMM_WORLD`` from its module's ``MPI``,
which is handed a stand-in that differs from mpi4py's only there).  The collective
demos (allgather, alltoall, alltoallv, barrier, bcast, gather, scatter) and
scripts/osu_allreduce.py, written in their style, are run; the point-to-point ones
(latency, bw, bibw, multi_lat) have nothing for hpccoll to do.  The table gives rank 0's
latencies as each demo prints them, the ratio (mpi4py / adapter: > 1, the adapter is
faster) and, per demo, how many of the adapter's calls ran natively.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import hpccoll.mpi  # noqa: E402
from hpccoll.timing import human_bytes, parse_bytes  # noqa: E402

COLLECTIVES = ("allgather", "alltoall", "alltoallv", "barrier", "bcast", "gather", "scatter",
               "allreduce")


def demo_files() -> dict:
    """name -> path of each collective OSU demo (the sdist's, and our allreduce)."""
    import mpi4py
    demos = ROOT / ".mpi4py-suite" / f"mpi4py-{mpi4py.__version__}" / "demo"
    found = {p.stem[4:]: p for p in sorted(demos.glob("osu_*.py"))}
    found["allreduce"] = ROOT / "scripts" / "osu_allreduce.py"
    return {name: found[name] for name in COLLECTIVES if name in found}


class WorldIs(types.ModuleType):
    """mpi4py.MPI, except that COMM_WORLD is the communicator given."""

    def __init__(self, MPI, world):
        super().__init__("MPI")
        self._MPI, self.COMM_WORLD = MPI, world

    def __getattr__(self, name):
        return getattr(self._MPI, name)


def load(path: Path) -> types.ModuleType:
    module = types.ModuleType(f"osu_demo_{path.stem}")
    module.__file__ = str(path)
    exec(compile(path.read_text(), str(path), "exec"), module.__dict__)
    return module


def run(module, name: str, world, MPI, rank: int, kwargs: dict) -> dict:
    """{size: latency us} as the demo printed them on rank 0 ({} elsewhere)."""
    module.MPI = WorldIs(MPI, world)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            getattr(module, f"osu_{name}")(**kwargs)
        except SystemExit as exc:           # e.g. "requires at least two processes"
            if rank == 0 and exc.code:
                print(f"osu_{name}: {exc.code}", file=sys.stderr)
            return {}
    latencies = {}
    for line in out.getvalue().splitlines():
        fields = line.split()
        if len(fields) == 2 and not line.startswith("#"):
            latencies[int(fields[0])] = float(fields[1])
    return latencies


def main() -> int:
    from mpi4py import MPI
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(COLLECTIVES))
    ap.add_argument("--loop", type=int, default=200, help="iterations up to 8 KiB")
    ap.add_argument("--skip", type=int, default=20, help="warm-up iterations up to 8 KiB")
    ap.add_argument("--max", default="1M", help="largest message (MAX_MSG_SIZE)")
    args = ap.parse_args()
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    files = demo_files()
    names = [n for n in args.only.split(",") if n in files]
    missing = [n for n in args.only.split(",") if n not in files]
    if missing and rank == 0:
        print(f"no OSU demo for {', '.join(missing)}: run `python tests/mpi4py_suite.py "
              "fetch` first", file=sys.stderr)
    kwargs = {"skip": args.skip, "loop": args.loop, "skip_large": max(2, args.skip // 10),
              "loop_large": max(10, args.loop // 10), "MAX_MSG_SIZE": parse_bytes(args.max)}
    adapter = hpccoll.mpi.Comm(world, timeout=120)
    rows = []
    for name in names:
        module = load(files[name])
        before = {m: dict(c) for m, c in adapter.stats.items()}
        theirs = run(module, name, world, MPI, rank, kwargs)
        ours = run(module, name, adapter, MPI, rank, kwargs)
        calls = {m: {k: c[k] - before.get(m, {}).get(k, 0) for k in c}
                 for m, c in adapter.stats.items()}
        native = sum(c["native"] for c in calls.values())
        forwarded = sum(c["forwarded"] for c in calls.values())
        rows.append((name, theirs, ours, native, forwarded))
    adapter.context.close()
    if rank == 0:
        print(f"mpi4py's OSU demos, {world.Get_size()} ranks, rank 0's latency (us) through "
              "plain mpi4py and through hpccoll.mpi.Comm")
        print(f"{'benchmark':<11}{'size':>9}{'mpi4py':>10}{'adapter':>10}{'ratio':>8}")
        for name, theirs, ours, native, forwarded in rows:
            for size in theirs:
                a, b = ours.get(size), theirs[size]
                ratio = f"{b / a:8.2f}" if a else f"{'-':>8}"
                print(f"{name:<11}{human_bytes(size):>9}{b:>10.2f}"
                      f"{(a if a is not None else float('nan')):>10.2f}{ratio}")
            print(f"{'':<11}calls through the adapter: {native} native, {forwarded} forwarded "
                  "(the demo's Barriers included)")
        print("ratio = mpi4py / adapter (> 1: the adapter is faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
