#!/usr/bin/env python
"""hpccoll against the MPI library's own collectives on one node, in one run, interleaved
iteration by iteration (medians of the slowest rank), float32 sum:

    mpiexec -n 2 python scripts/bench_speed.py [--iters 20]
    mpiexec -n 2 python scripts/bench_speed.py --rss hpccoll|mpi   # peak RSS, 256 MiB allreduce

Rows: allreduce with ordinary NumPy buffers and with registered buffers (ctx.empty) at
8 B, 1 MiB, 16 MiB, 64 MiB; allgather and reduce_scatter with registered buffers at
16 MiB, and allgather in place (the input is this rank's slice of a registered output;
MPI's own with MPI_IN_PLACE).  Columns: time (us) and bus bandwidth (GB/s, nccl-tests factors) of each, and the
ratio MPI time / hpccoll time (> 1: hpccoll faster).  Every result is checked.
"""
from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import hpccoll  # noqa: E402
from hpccoll.timing import handoff_note, human_bytes  # noqa: E402
from hpccoll.transport.mpi import library_name  # noqa: E402

FACTOR = {"allreduce": lambda n: 2 * (n - 1) / n, "allgather": lambda n: (n - 1) / n,
          "reduce_scatter": lambda n: (n - 1) / n}


def case(ctx, mpi, coll, nbytes, registered):
    """(hpccoll fn, MPI fn, check fn, bytes for busbw) on integral float32 data;
    ``registered``: False, True, or "in place" (allgather only)."""
    n, r = ctx.size, ctx.rank
    count = max(1, nbytes // 4)
    alloc = ctx.empty if registered else (lambda k, dt: np.empty(k, dt))
    if coll == "allreduce":
        x, out = alloc(count, np.float32), alloc(count, np.float32)
        x[:] = (np.arange(count) % 7) + r
        ref = np.empty(count, np.float32)
        ours = lambda: ctx.world.allreduce(x, out).wait()
        theirs = lambda: mpi.Allreduce(x, ref)
        check = lambda: np.array_equal(out, ref)
        size = count * 4
    elif coll == "allgather" and registered == "in place":
        # each rank's block already sits in its slice of the output, on both sides
        per = max(1, count // n)
        out, ref = alloc(n * per, np.float32), np.empty(n * per, np.float32)
        out[r * per:(r + 1) * per] = ref[r * per:(r + 1) * per] = r
        mine = out[r * per:(r + 1) * per]
        from mpi4py import MPI
        ours = lambda: ctx.world.allgather(mine, out).wait()
        theirs = lambda: mpi.Allgather(MPI.IN_PLACE, ref)
        check = lambda: np.array_equal(out, ref)
        size = n * per * 4
    elif coll == "allgather":
        per = max(1, count // n)
        x, out = alloc(per, np.float32), alloc(n * per, np.float32)
        x[:] = r
        ref = np.empty(n * per, np.float32)
        ours = lambda: ctx.world.allgather(x, out).wait()
        theirs = lambda: mpi.Allgather(x, ref)
        check = lambda: np.array_equal(out, ref)
        size = n * per * 4
    else:
        per = max(1, count // n)
        x, out = alloc(n * per, np.float32), alloc(per, np.float32)
        x[:] = (np.arange(n * per) % 5) + r
        ref = np.empty(per, np.float32)
        ours = lambda: ctx.world.reduce_scatter(x, out).wait()
        theirs = lambda: mpi.Reduce_scatter_block(x, ref)
        check = lambda: np.array_equal(out, ref)
        size = n * per * 4
    return ours, theirs, check, size


def timed(mpi, fns, iters):
    from mpi4py import MPI
    times = [[] for _ in fns]
    for it in range(iters + 2):
        for j in (range(len(fns)) if it % 2 == 0 else reversed(range(len(fns)))):
            mpi.Barrier()
            t0 = time.perf_counter()
            fns[j]()
            dt = mpi.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            if it >= 2:
                times[j].append(dt)
    return [float(np.median(t)) for t in times]


def rss(mode: str) -> int:
    """Peak resident set of one 256 MiB allreduce (inputs and output included), MiB."""
    from mpi4py import MPI
    mpi = MPI.COMM_WORLD
    count = (256 << 20) // 4
    x = np.ones(count, np.float32)
    out = np.empty_like(x)
    out[:] = 0
    if mode == "hpccoll":
        with hpccoll.init() as ctx:
            ctx.world.allreduce(x, out).wait()
    else:
        mpi.Allreduce(x, out)
    assert out[0] == mpi.size
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    return mpi.allreduce(peak, op=MPI.MAX)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--rss", choices=("hpccoll", "mpi"))
    args = ap.parse_args()
    from mpi4py import MPI
    mpi = MPI.COMM_WORLD
    if args.rss:
        peak = rss(args.rss)
        if mpi.rank == 0:
            print(f"peak RSS, 256 MiB float32 allreduce, {args.rss}: {peak} MiB per rank (max)")
        return 0
    rows = []
    with hpccoll.init(timeout=300) as ctx:
        handoff = ctx.handoff_ns
        plan = [("allreduce", b, reg) for reg in (False, True) for b in (8, 1 << 20, 16 << 20, 64 << 20)]
        plan += [("allgather", 16 << 20, True), ("allgather", 16 << 20, "in place"),
                 ("reduce_scatter", 16 << 20, True)]
        for coll, nbytes, reg in plan:
            ours, theirs, check, size = case(ctx, mpi, coll, nbytes, reg)
            # latency-bound sizes are cheap and noisy: ten times the samples
            iters = (10 * args.iters if nbytes <= (64 << 10)
                     else args.iters if nbytes <= (16 << 20) else max(5, args.iters // 2))
            t_ours, t_mpi = timed(mpi, [ours, theirs], iters)
            ok = mpi.allreduce(bool(check()), op=MPI.LAND)
            rows.append((coll, nbytes, reg, t_ours, t_mpi, size, ok))
    if mpi.rank == 0:
        n = mpi.size
        print(f"hpccoll vs MPI, {n} ranks, {library_name()}, "
              f"float32 sum, interleaved, medians of the slowest rank{handoff_note(handoff)}")
        print(f"{'collective':<15}{'buffers':<11}{'size':>9}{'hpccoll us':>12}{'MPI us':>11}"
              f"{'busbw':>8}{'MPI busbw':>10}{'ratio':>7}  check")
        for coll, nbytes, reg, a, b, size, ok in rows:
            f = FACTOR[coll](n)
            kind = reg if isinstance(reg, str) else "registered" if reg else "ordinary"
            print(f"{coll:<15}{kind:<11}{human_bytes(nbytes):>9}"
                  f"{a * 1e6:>12.1f}{b * 1e6:>11.1f}{size / a / 1e9 * f:>8.2f}{size / b / 1e9 * f:>10.2f}"
                  f"{b / a:>7.2f}  {'ok' if ok else 'WRONG'}")
        print("ratio = MPI time / hpccoll time (> 1: hpccoll faster); busbw in GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
