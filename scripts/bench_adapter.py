#!/usr/bin/env python
"""The one-line adoption path against mpi4py itself: blocking ``Allreduce`` and ``Bcast``
(and ``Allgather``, ``Gather``, ``Scatter``) through ``hpccoll.mpi.Comm(MPI.COMM_WORLD)`` and through a duplicate
of ``MPI.COMM_WORLD``, on the same buffers, interleaved iteration by iteration, medians
of the slowest rank; then the lowercase object methods (``allreduce`` of a Python float,
``allgather`` of a small tuple, ...), timed as back-to-back loops of ``--loop`` calls,
the two sides' loops interleaved:

    mpiexec -n 2 python scripts/bench_adapter.py [--iters 200] [--sizes 8,1K,64K,1M,16M]
                                                 [--objects all|none|NAME,...] [--loop 50]

The ratio is mpi4py's time / the adapter's (> 1: the adapter is faster).  Every result is
checked against mpi4py's.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import hpccoll.mpi  # noqa: E402
from hpccoll.timing import handoff_note, human_bytes, parse_bytes, time_interleaved  # noqa: E402


def main() -> int:
    from mpi4py import MPI
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=200, help="iterations at 64 KiB and below "
                    "(larger sizes take fewer)")
    ap.add_argument("--sizes", default="8,1K,64K,1M,16M")
    ap.add_argument("--calls", default="Allreduce,Bcast,Allgather,Gather,Scatter",
                    help="buffer calls ('none': only the object rows)")
    ap.add_argument("--objects", default="all", help=f"object rows: all, none or some of "
                    f"{', '.join(OBJECT_ROWS)}")
    ap.add_argument("--loop", type=int, default=50, help="calls per timed loop (object rows)")
    args = ap.parse_args()
    world = MPI.COMM_WORLD
    mine = world.Dup()
    comm = hpccoll.mpi.Comm(MPI.COMM_WORLD)
    n, r = world.size, world.rank
    rows = []
    for name in ([] if args.calls == "none" else args.calls.split(",")):
        for nbytes in map(parse_bytes, args.sizes.split(",")):
            count = max(1, nbytes // 4)
            iters = args.iters if nbytes <= (64 << 10) else max(30, args.iters // (
                5 if nbytes <= (1 << 20) else 20))
            if name == "Allreduce":
                x = (np.arange(count) % 7 + r).astype(np.float32)
                a, b = np.empty_like(x), np.empty_like(x)
                ours, theirs = (lambda: comm.Allreduce(x, a)), (lambda: mine.Allreduce(x, b))
            elif name == "Bcast":
                a = np.full(count, r, np.float32)
                b = a.copy()
                ours, theirs = (lambda: comm.Bcast(a, root=0)), (lambda: mine.Bcast(b, root=0))
            elif name == "Gather":      # the size is the root's whole receive buffer
                per = max(1, count // n)
                x = np.full(per, r, np.float32)
                a, b = np.zeros(n * per, np.float32), np.zeros(n * per, np.float32)
                ours, theirs = (lambda: comm.Gather(x, a, root=0)), \
                    (lambda: mine.Gather(x, b, root=0))
            elif name == "Scatter":     # the size is the root's whole send buffer
                per = max(1, count // n)
                x = (np.arange(n * per) % 7).astype(np.float32)
                a, b = np.empty(per, np.float32), np.empty(per, np.float32)
                ours, theirs = (lambda: comm.Scatter(x, a, root=0)), \
                    (lambda: mine.Scatter(x, b, root=0))
            else:
                per = max(1, count // n)
                x = np.full(per, r, np.float32)
                a, b = np.empty(n * per, np.float32), np.empty(n * per, np.float32)
                ours, theirs = (lambda: comm.Allgather(x, a)), (lambda: mine.Allgather(x, b))
            t_ours, t_mpi = (float(np.median(t)) for t in
                             time_interleaved(world, [ours, theirs], iters, warmup=5))
            ok = world.allreduce(bool(np.array_equal(a, b)), op=MPI.LAND)
            rows.append((name, nbytes, t_ours, t_mpi, ok))
    names = (list(OBJECT_ROWS) if args.objects == "all" else
             [] if args.objects == "none" else
             # (commas inside a row's parentheses are its own: "allreduce(int, MPI.MAX)")
             [n.strip() for n in re.split(r",(?![^(]*\))", args.objects)])
    unknown = [n for n in names if n not in OBJECT_ROWS]
    if unknown:
        raise SystemExit(f"--objects: unknown row(s) {', '.join(map(repr, unknown))}; "
                         f"expected all, none or some of: {', '.join(OBJECT_ROWS)}")
    objects = [object_row(world, comm, mine, name, args.iters, args.loop) for name in names]
    handoff = comm.context.handoff_ns
    comm.context.close()
    mine.Free()
    if r == 0 and rows:
        print(f"hpccoll.mpi.Comm vs mpi4py, {n} ranks, float32, blocking calls, medians of the "
              f"slowest rank{handoff_note(handoff)}")
        print(f"{'call':<11}{'size':>9}{'adapter us':>12}{'mpi4py us':>11}{'ratio':>8}  check")
        for name, nbytes, a, b, ok in rows:
            print(f"{name:<11}{human_bytes(nbytes):>9}{a * 1e6:>12.1f}{b * 1e6:>11.1f}"
                  f"{b / a:>8.2f}  {'ok' if ok else 'WRONG'}")
        print("ratio = mpi4py time / adapter time (> 1: the adapter is faster)")
    if r == 0 and objects:
        print(f"\nlowercase object methods, {n} ranks, loops of {args.loop} calls back to "
              "back, medians of the slowest rank, per call")
        print(f"{'call':<34}{'adapter us':>12}{'mpi4py us':>11}{'ratio':>8}  check")
        for name, a, b, ok in objects:
            print(f"{name:<34}{a * 1e6:>12.1f}{b * 1e6:>11.1f}{b / a:>8.2f}  "
                  f"{'ok' if ok else 'WRONG'}")
    return 0


# name -> (method, argument of rank r): what real libraries send most (issue 34)
OBJECT_ROWS = {
    "allreduce(float)": ("allreduce", lambda r: 0.5 + r),
    "allreduce(int, MPI.MAX)": ("allreduce_max", lambda r: r),
    "allgather(tuple)": ("allgather", lambda r: (3, 4 + r)),
    "allgather(str)": ("allgather", lambda r: f"node{r:03d}"),
    "allgather(dict)": ("allgather", lambda r: {"rank": r, "shape": (3, 4)}),
    "bcast(dict)": ("bcast", lambda r: {"step": 7, "lr": 0.1}),
    "allreduce(1 KiB array)": ("allreduce", lambda r: np.full(128, r, np.float64)),
    "allgather(1 MiB array)": ("allgather", lambda r: np.full(1 << 17, r, np.float64)),
}


def object_row(world, comm, mine, name, iters, loop):
    """(name, adapter s, mpi4py s, results equal) of one lowercase call, per call."""
    from mpi4py import MPI
    method, make = OBJECT_ROWS[name]
    x = make(world.rank)
    if method == "allreduce_max":
        call = lambda c: c.allreduce(x, MPI.MAX)  # noqa: E731
    else:
        call = lambda c: getattr(c, method)(x)  # noqa: E731
    got, want = call(comm), call(mine)
    same = repr(got) == repr(want) and (not isinstance(want, np.ndarray)
                                        or np.array_equal(got, want))
    if isinstance(want, list) and want and isinstance(want[0], np.ndarray):
        same = all(np.array_equal(a, b) for a, b in zip(got, want))
    ok = world.allreduce(same, op=MPI.LAND)

    def looped(c):
        def run():
            for _ in range(loop):
                call(c)
        return run
    samples = max(10, iters // 10)
    t_ours, t_mpi = (float(np.median(t)) / loop for t in
                     time_interleaved(world, [looped(comm), looped(mine)], samples, warmup=2))
    return name, t_ours, t_mpi, ok


if __name__ == "__main__":
    sys.exit(main())
