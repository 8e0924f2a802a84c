#!/usr/bin/env python
"""The floor under every small collective on one node: how long one cache line takes to
go from one core to another, measured by a flag ping-pong between two processes in
node-shared memory (engine/_native.c: handoff), and the 8 B collectives of hpccoll and of
the MPI library in multiples of it, back to back, in one run:

    mpiexec -n 2 python scripts/floor_handoff.py [--rounds 200000] [--calls 2000]
                                                 [--slot-bytes 65536]

A handoff is half a round trip.  A collective through cells costs at least one handoff
(every rank's input reaches every other), MPI's own shared-memory collectives about as
many; what either costs beyond that is software.  Medians of five batches, rank 0's
clock; ratio = MPI's time / hpccoll's.  Run it with a core per rank: the ping-pong spins
without yielding."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import hpccoll  # noqa: E402
from hpccoll.engine import code  # noqa: E402


def slot_handoff_us(node, nbytes: int, calls: int) -> tuple:
    """Median time (us) of one staged handoff of ``nbytes`` between local ranks 0 and 1,
    five runs of ``calls``: rank 0 waits until rank 1 has read the slot, copies its buffer
    into it and raises its flag; rank 1 waits for the flag, copies the slot out and
    raises its own.  Rank 0 rewrites lines rank 1's core read a call ago: what a staged
    shared-memory program pays per chunk, and on some hosts far more than two copies
    (docs/performance.md, "Cells").  Also returns one local copy of ``nbytes`` (us)."""
    from mpi4py import MPI
    page = 4096
    win = MPI.Win.Allocate_shared(nbytes + 3 * page if node.rank < 2 else 0, 1, comm=node)
    win.Lock_all()
    try:
        seg = [np.frombuffer(win.Shared_query(q)[0], np.uint8) for q in range(2)]

        def aligned(a, at):     # page-aligned views: no copy pays for its offsets
            off = -a.__array_interface__["data"][0] % page + at
            return a[off:]
        flags = [aligned(seg[q], 0)[:64].view(np.int64) for q in range(2)]
        slot = aligned(seg[0], page)[:nbytes]
        mine = aligned(np.empty(nbytes + page, np.uint8), 0)[:nbytes]
        mine[:] = node.rank + 1
        other = aligned(np.empty(nbytes + page, np.uint8), 0)[:nbytes]
        t0 = time.perf_counter()
        for _ in range(50):
            np.copyto(other, mine)
        local = (time.perf_counter() - t0) / 50 * 1e6
        got = []
        done = 0
        for _ in range(5):
            node.Barrier()
            if node.rank < 2:
                t0 = time.perf_counter()
                for _ in range(calls):
                    done += 1
                    if node.rank == 0:
                        while flags[1][0] < done - 1:
                            pass
                        win.Sync()
                        np.copyto(slot, mine)
                        win.Sync()
                        flags[0][0] = done
                    else:
                        while flags[0][0] < done:
                            pass
                        win.Sync()
                        np.copyto(mine, slot)
                        win.Sync()
                        flags[1][0] = done
                got.append((time.perf_counter() - t0) / calls * 1e6)
        node.Barrier()
        if node.rank == 1 and not (mine == 1).all():
            raise SystemExit("staged handoff: rank 1 did not receive rank 0's bytes")
        return (float(np.median(got)) if got else float("nan")), local
    finally:
        win.Unlock_all()
        win.Free()


def per_call(fn, calls: int, world) -> float:
    """Median over five batches of ``calls`` back-to-back calls (seconds per call)."""
    out = []
    for _ in range(5):
        world.Barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls)
    return float(np.median(out))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=200_000)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--slot-bytes", type=int, default=64 << 10,
                    help="the staged handoff's size (0: not measured)")
    args = ap.parse_args()
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    if code._native is None:
        print("no C module (hpccoll/engine/_native.c): nothing to measure", file=sys.stderr)
        return 1
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    if node.size < 2:
        print("run it with at least 2 ranks on one node", file=sys.stderr)
        return 1
    h = code.handoff_ns(node, args.rounds, runs=5, limit_ns=-1)
    slot = slot_handoff_us(node, args.slot_bytes, args.calls) if args.slot_bytes else None
    x = np.ones(2, np.float32)
    y = np.empty_like(x)
    rows = []
    with hpccoll.init(calibration="off") as ctx:
        c = ctx.world
        algo = {}
        g = np.empty(2 * world.size, np.float32)
        cases = [
            ("allreduce 8 B", lambda: c.allreduce(x, y), lambda: world.Allreduce(x, y)),
            ("broadcast 8 B", lambda: c.broadcast(y, root=0), lambda: world.Bcast(y, 0)),
            ("allgather 8 B/rank", lambda: c.allgather(x, g), lambda: world.Allgather(x, g)),
            ("barrier", c.barrier, world.Barrier),
        ]
        for name, issue, theirs in cases:
            w = issue()
            w.wait()
            algo[name] = w.counters["algo"]
            t_ours = per_call(lambda: issue().wait(), args.calls, world)
            t_mpi = per_call(theirs, args.calls, world)
            rows.append((name, t_ours, t_mpi))
    if world.rank == 0:
        print(f"{world.size} ranks on one node: a cache-line handoff takes {h:.0f} ns "
              f"(half a flag round trip, median of five runs of {args.rounds})")
        if slot is not None:
            print(f"a staged handoff of {args.slot_bytes} bytes (copy into a slot the peer "
                  f"read a call ago, flag, copy out) takes {slot[0]:.1f} us; one local "
                  f"copy of it {slot[1]:.1f} us")
        print(f"{'collective':<20}{'hpccoll (us)':>13}{'MPI (us)':>10}{'ratio':>7}"
              f"{'hpccoll / handoff':>19}{'MPI / handoff':>15}  hpccoll's algorithm")
        for name, t_ours, t_mpi in rows:
            print(f"{name:<20}{t_ours * 1e6:>13.2f}{t_mpi * 1e6:>10.2f}{t_mpi / t_ours:>7.2f}"
                  f"{t_ours * 1e9 / h:>19.1f}{t_mpi * 1e9 / h:>15.1f}  {algo[name]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
