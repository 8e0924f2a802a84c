"""Every candidate algorithm of a collective, forced one at a time, against MPI's own
blocking and nonblocking calls: the same send and receive buffers for all (MPI's copies
depend on where its buffers sit, docs/performance.md "Copies"), interleaved iteration by
iteration, medians of the slowest rank, float32 sum, microseconds; every candidate's
result is checked against MPI's own first ("ok" ends the row):

    mpiexec -n 2 python scripts/bench_candidates.py --collectives alltoall,allreduce --sizes 1M,16M

A candidate runs where it can (``cma`` where the ranks may read each other's memory,
``shm`` on one node, ``mpi`` where MPI has the collective); which one the built-in table or
a calibration picks is ``python -m hpccoll config``.  Sizes are the whole result of a rank
(as in ``hpccoll-tune calibrate``).
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from mpi4py import MPI

import hpccoll
from hpccoll.timing import human_bytes, parse_bytes

CANDIDATES = ("cma", "shm", "mpi")
TABLE = "table"     # no candidate forced: what the table (or a calibration) picks


def buffers(coll: str, nbytes: int, size: int, rank: int):
    """(send, recv): small integers that differ by rank and position (sums stay exact)."""
    per = max(1, nbytes // 4 // (size if coll in ("allgather", "alltoall", "reduce_scatter")
                                 else 1))
    send_n = {"alltoall": size * per, "reduce_scatter": size * per}.get(coll, per)
    recv_n = {"allgather": size * per, "alltoall": size * per}.get(coll, per)
    send = ((np.arange(send_n) + 3 * rank) % 7).astype(np.float32)
    return send, (send if coll == "broadcast" else np.empty(recv_n, np.float32))


def theirs(mcomm, coll: str, send, recv):
    """(blocking, nonblocking + Wait) of MPI's own on ``mcomm``."""
    if coll == "broadcast":
        return lambda: mcomm.Bcast(recv, 0), lambda: mcomm.Ibcast(recv, 0).Wait()
    if coll == "reduce":
        return (lambda: mcomm.Reduce(send, recv, root=0),
                lambda: mcomm.Ireduce(send, recv, root=0).Wait())
    name = {"allreduce": "Allreduce", "allgather": "Allgather", "alltoall": "Alltoall",
            "reduce_scatter": "Reduce_scatter_block"}[coll]
    block, nonblock = getattr(mcomm, name), getattr(mcomm, "I" + name[0].lower() + name[1:])
    return (lambda: block(send, recv)), (lambda: nonblock(send, recv).Wait())


def ours(comm, coll: str, send, recv):
    if coll == "broadcast":
        return lambda: comm.broadcast(recv, root=0).wait()
    if coll == "reduce":
        return lambda: comm.reduce(send, recv, root=0).wait()
    fn = getattr(comm, coll)
    return lambda: fn(send, recv).wait()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--collectives", default="allreduce,allgather,alltoall")
    ap.add_argument("--sizes", default="1M,16M")
    ap.add_argument("--iters", type=int, default=20, help="samples per size (median)")
    args = ap.parse_args(argv)
    colls = args.collectives.split(",")
    sizes = [parse_bytes(s) for s in args.sizes.split(",")]
    world = MPI.COMM_WORLD
    with hpccoll.init(timeout=120) as ctx:
        comms = {c: ctx.world.dup(name=c) for c in CANDIDATES + (TABLE,)}
        mcomm = world.Dup()
        if world.rank == 0:
            print(f"# {world.size} ranks; us per call, medians of the slowest rank; "
                  "(algorithm that ran)")
        wrong = False
        for coll in colls:
            for nbytes in sizes:
                ok = True
                send, recv = buffers(coll, nbytes, world.size, world.rank)
                block, nonblock = theirs(mcomm, coll, send, recv)
                original = send.copy()
                block()
                want = recv.copy()                  # MPI's result (reduce: the root's)
                fns = {"MPI blocking": block, "MPI nonblocking": nonblock}
                ran = {}
                for c, comm in comms.items():
                    comm._state.prefer = {} if c == TABLE else {coll: c}
                    comm._state.plans.clear()
                    fns[c] = ours(comm, coll, send, recv)
                    if coll == "broadcast" and world.rank:
                        recv[:] = -1
                    else:
                        recv[:] = -1 if recv is not send else original
                    fns[c]()        # plan, warm, checked; what ran (the table's choice
                    ok &= bool(np.array_equal(recv, want)        # where c cannot)
                               or coll == "reduce" and world.rank != 0)
                    ran[c] = ",".join(sorted({p.algo for k, p in comm._state.plans.items()
                                              if k[0] == coll}))
                ok = world.allreduce(ok, op=MPI.LAND)
                times = {k: [] for k in fns}
                for _ in range(args.iters):
                    for k, fn in fns.items():
                        world.Barrier()
                        t = time.perf_counter()
                        fn()
                        times[k].append(world.allreduce(time.perf_counter() - t, op=MPI.MAX))
                if world.rank == 0:
                    cells = [f"{k}{'(' + ran[k] + ')' if k in ran else ''} "
                             f"{np.median(v) * 1e6:.1f}" for k, v in times.items()]
                    print(f"{coll:<15}{human_bytes(nbytes):>8}  " + "  ".join(cells)
                          + ("  ok" if ok else "  WRONG"), flush=True)
                wrong |= not ok
        mcomm.Free()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
