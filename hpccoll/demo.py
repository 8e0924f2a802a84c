"""The main job, in two parts:

1. every collective on host arrays, each checked against the MPI library's own
   collective on the same inputs and timed against it in the same run;
2. the 3d deadlock workload (data x tensor x pipeline groups, rank-divergent issue
   orders, synchronization points) under each policy: preemptive and ordered complete
   with checked results, fifo ends in a short CollectiveTimeout report.

    mpiexec -n 4 python -m hpccoll.demo [--sizes 8,64K,1M] [--iters 100] [--chaos-iters 10]

Prints a one-screen summary on rank 0 and exits nonzero if anything was not as expected.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import hpccoll
from .bench import floor
from .transport.mpi import library_name
from .timing import handoff_note, human_bytes, parse_bytes, time_interleaved

COLLS = ("allreduce", "reduce", "broadcast", "allgather", "reduce_scatter", "alltoall", "barrier")


def _case(ctx, comm, mpi, coll: str, nbytes: int):
    """(hpccoll call, MPI call, check) for one collective on float32 inputs of ~nbytes."""
    n, r = comm.size, comm.rank
    count = max(1, nbytes // 4)
    rng = np.random.default_rng(r + 17 * count)
    per = max(1, count // n)          # per-block count for the *-scatter/gather/all collectives
    if coll in ("allreduce", "reduce"):
        x = rng.integers(-8, 8, count).astype(np.float32)   # integral values: exact sums
        out, ref = np.empty_like(x), np.empty_like(x)
        if coll == "allreduce":
            ours = lambda: comm.allreduce(x, out).wait()
            theirs = lambda: mpi.Allreduce(x, ref)
        else:
            ours = lambda: comm.reduce(x, out, root=0).wait()
            theirs = lambda: mpi.Reduce(x, ref, root=0)
        check = lambda: r != 0 and coll == "reduce" or np.array_equal(out, ref)
    elif coll == "broadcast":
        x = rng.integers(-8, 8, count).astype(np.float32)
        a, b = x.copy(), x.copy()
        ours = lambda: comm.broadcast(a, root=n - 1).wait()
        theirs = lambda: mpi.Bcast(b, root=n - 1)
        check = lambda: np.array_equal(a, b)
    elif coll == "allgather":
        x = rng.integers(-8, 8, per).astype(np.float32)
        out, ref = np.empty(n * per, np.float32), np.empty(n * per, np.float32)
        ours = lambda: comm.allgather(x, out).wait()
        theirs = lambda: mpi.Allgather(x, ref)
        check = lambda: np.array_equal(out, ref)
    elif coll == "reduce_scatter":
        x = rng.integers(-8, 8, n * per).astype(np.float32)
        out, ref = np.empty(per, np.float32), np.empty(per, np.float32)
        ours = lambda: comm.reduce_scatter(x, out).wait()
        theirs = lambda: mpi.Reduce_scatter_block(x, ref)
        check = lambda: np.array_equal(out, ref)
    elif coll == "alltoall":
        x = rng.integers(-8, 8, n * per).astype(np.float32)
        out, ref = np.empty_like(x), np.empty_like(x)
        ours = lambda: comm.alltoall(x, out).wait()
        theirs = lambda: mpi.Alltoall(x, ref)
        check = lambda: np.array_equal(out, ref)
    else:
        ours = lambda: comm.barrier().wait()
        theirs = lambda: mpi.Barrier()
        check = lambda: True
    return ours, theirs, check


def floor_case(coll: str, nbytes: int, n: int):
    """The floor.case of ``_case``'s collective: the same counts and roots."""
    count = max(1, nbytes // 4)
    per = max(1, count // n)
    blocks = coll in ("allgather", "reduce_scatter", "alltoall")
    return floor.case(coll, per if blocks else count, "float32", "sum",
                      n - 1 if coll == "broadcast" else 0)


def run(args) -> int:
    from mpi4py import MPI
    mpi = MPI.COMM_WORLD
    t_start = time.perf_counter()
    failures = 0
    rows = []
    # the MPI's own from C first, in a job of its own while these ranks sleep
    cases = {(c, b): floor_case(c, b, mpi.size) for c in args.colls
             for b in ([0] if c == "barrier" else args.sizes)}
    c_floor = (floor.in_job(mpi, list(cases.values()), iters=args.iters,
                            warmup=max(2, args.iters // 10)) if args.floor else None)
    # no ``with``: an error may be this rank's alone, and close() would wait for ranks in a
    # collective with this one; main() aborts the job instead
    ctx = hpccoll.init(policy=args.policy, timeout=args.timeout)
    comm = ctx.world
    for coll in args.colls:
        sizes = [0] if coll == "barrier" else args.sizes
        for nbytes in sizes:
            ours, theirs, check = _case(ctx, comm, mpi, coll, nbytes)
            t_ours, t_mpi = time_interleaved(mpi, [ours, theirs], args.iters,
                                            warmup=max(2, args.iters // 10))
            ok = bool(check())
            all_ok = mpi.allreduce(ok, op=MPI.LAND)
            failures += not all_ok
            rows.append((coll, nbytes, np.median(t_ours), np.median(t_mpi),
                         [c_floor.get(cases[coll, nbytes], level) * 1e-6 if c_floor
                          else float("nan") for level in floor.LEVELS], all_ok))
    policy, handoff = ctx.policy, ctx.handoff_ns
    ctx.close()
    if mpi.rank == 0:
        lib = library_name()
        print(f"hpccoll {hpccoll.__version__}: {mpi.size} ranks, {lib}, policy {policy}, "
              f"host arrays (float32), {args.iters} iterations, medians of the slowest rank"
              + handoff_note(handoff))
        print(f"{'collective':<15}{'size':>10}{'hpccoll (us)':>14}{'MPI (us)':>11}{'ratio':>8}"
              f"{'C mt (us)':>11}{'C (us)':>9}  check vs MPI")
        for coll, nbytes, a, b, (cm, cs), ok in rows:
            size = "-" if coll == "barrier" else human_bytes(nbytes)
            print(f"{coll:<15}{size:>10}{a * 1e6:>14.1f}{b * 1e6:>11.1f}{b / a:>8.2f}"
                  f"{cm * 1e6:>11.1f}{cs * 1e6:>9.1f}  {'ok' if ok else 'WRONG'}")
        print("ratio = MPI time / hpccoll time (> 1: hpccoll faster); MPI: mpi4py's blocking "
              "call; C mt, C: the same MPI collective called from C, after "
              "MPI_Init_thread(MULTIPLE) as mpi4py and hpccoll initialize it, and after "
              "MPI_Init: " + (f"{c_floor.source}" if c_floor and c_floor.source else
                               f"not measured ({c_floor.note if c_floor else '--no-floor'})"))
        verdict = "all checks passed" if not failures else f"{failures} check(s) FAILED"
        print(f"{len(rows)} cases, {verdict}, {time.perf_counter() - t_start:.1f} s\n", flush=True)
    ok = True
    if args.chaos_iters:
        from . import chaos
        cargs = chaos.parser().parse_args(["3d", "--iters", str(args.chaos_iters), "--timeout",
                                           str(args.chaos_timeout)])
        ok = chaos.run_scenario("3d", chaos.POLICIES, cargs, mpi)
    return 1 if failures or not ok else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m hpccoll.demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="8,64K,1M",
                   help="message sizes in bytes (K/M/G suffixes), comma-separated")
    p.add_argument("--iters", type=int, default=100,
                   help="timed iterations per case (medians: ten are too few to say much)")
    p.add_argument("--colls", default=",".join(COLLS), help="collectives, comma-separated")
    p.add_argument("--policy", default=None,
                   help="scheduling policy of part 1 (default: HPCCOLL_POLICY or preemptive)")
    p.add_argument("--timeout", type=float, default=60.0, help="watchdog timeout in seconds")
    p.add_argument("--chaos-iters", type=int, default=10,
                   help="iterations of the 3d deadlock workload per policy (0: skip it)")
    p.add_argument("--chaos-timeout", type=float, default=3.0,
                   help="watchdog timeout of the deadlock workload (fifo ends after it)")
    p.add_argument("--no-floor", dest="floor", action="store_false",
                   help="do not time the MPI's own collectives from C (hpccoll.bench.floor)")
    args = p.parse_args(argv)
    args.sizes = [parse_bytes(s) for s in args.sizes.split(",") if s]
    args.colls = [c.strip() for c in args.colls.split(",") if c.strip()]
    bad = [c for c in args.colls if c not in COLLS]
    if bad:
        p.error(f"--colls: unknown collective(s) {bad}; choose from {', '.join(COLLS)}")
    try:
        return run(args)
    except BaseException as exc:
        from .jobs import abort_job   # (the job's end: MPI only then)
        return abort_job(exc, "hpccoll.demo")


if __name__ == "__main__":
    sys.exit(main())
