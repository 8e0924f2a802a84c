#!/usr/bin/env python
"""What communicators cost, and whether a program can make and free them for ever.

    mpiexec -n 2 python scripts/many_comms.py               # live: dup() until MPI says no
    mpiexec -n 2 python scripts/many_comms.py --cycles 10000  # dup, one collective, free

live: keeps ``dup()``-ing the world, one 8 B allreduce through each new communicator (its
result checked), until --live of them are alive or the next one raises (the error is
printed: ResourcesExhausted when MPI runs out of communicator contexts).

cycles: ``dup()``, one allreduce (8 B, or --bytes, checked), ``free()``, --cycles times.
At a tenth, half and the end it reads this rank's free MPI communicator contexts (how many
duplicates of COMM_SELF MPI will still make), RSS, and the node-shared memory this process
maps from /dev/shm (its mappings and their resident bytes, from /proc/self/smaps: other
jobs' segments do not count): over the second half none of them may move by more than
--max-growth (contexts and mappings: not at all).

--contexts N: first take every communicator context MPI has but N (COMM_SELF duplicates,
held to the end), so that every MPI runs out where one with N contexts does: MPICH has
2,048, Intel MPI 32,768, Open MPI about 65,500.

Exit status 1 if a result was wrong or something grew.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import hpccoll  # noqa: E402
from hpccoll.timing import human_bytes, parse_bytes  # noqa: E402
from _procmem import rss, shm_mapped, shm_used  # noqa: E402  (scripts/, beside this file)


def take_contexts(MPI, most: int) -> list:
    """COMM_SELF duplicates (local: no other rank takes part) until MPI makes no more or
    ``most`` are made."""
    made = []
    try:
        while len(made) < most:
            made.append(MPI.COMM_SELF.Dup())
    except MPI.Exception:
        pass
    return made


def free_contexts(MPI, most: int = 4096) -> int:
    """How many more communicators MPI makes on this rank."""
    made = take_contexts(MPI, most)
    for c in made:
        c.Free()
    return len(made)


def hold_contexts(MPI, keep: int, most: int = 1 << 17) -> list:
    """COMM_SELF duplicates holding all of this rank's free communicator contexts but
    ``keep`` (every rank takes them in the same order, so the same ones stay free)."""
    made = take_contexts(MPI, most)
    held = max(0, len(made) - keep)
    for c in made[held:]:
        c.Free()
    return made[:held]


def one(ctx, comm, nbytes: int) -> bool:
    n = max(1, nbytes // 8)
    got = comm.allreduce(np.full(n, ctx.rank + 1, np.int64)).wait()
    return bool((got == ctx.size * (ctx.size + 1) // 2).all())


def live(ctx, args) -> int:
    comms, wrong, t0 = [], 0, time.perf_counter()
    error = None
    while len(comms) < args.live:
        try:
            comms.append(ctx.world.dup())
        except hpccoll.HpcCollError as exc:
            error = exc
            break
        wrong += not one(ctx, comms[-1], args.bytes)
    dt = time.perf_counter() - t0
    if ctx.rank == 0:
        maps, resident = shm_mapped()
        print(f"{ctx.size} ranks: {len(comms)} live communicators, each used by one "
              f"{human_bytes(args.bytes)} allreduce ({wrong} wrong), {dt:.1f} s; RSS "
              f"{human_bytes(rss())}, /dev/shm mapped {maps} files, {human_bytes(resident)} "
              f"resident (node-wide: {human_bytes(shm_used())} used)", flush=True)
        if error is not None:
            print(f"  the next dup(): {type(error).__name__}: {error}", flush=True)
    for c in comms:
        c.free()
    return 1 if wrong else 0


def cycles(ctx, args) -> int:
    MPI = ctx._MPI
    marks, wrong, t0 = {}, 0, time.perf_counter()
    at = {args.cycles // 10: "tenth", args.cycles // 2: "half", args.cycles: "end"}
    for i in range(1, args.cycles + 1):
        comm = ctx.world.dup()
        wrong += not one(ctx, comm, args.bytes)
        comm.free()
        if i in at:
            marks[at[i]] = (free_contexts(MPI), rss(), *shm_mapped())
    dt = time.perf_counter() - t0
    (c1, r1, m1, s1), (c2, r2, m2, s2), (c3, r3, m3, s3) = (marks["tenth"], marks["half"],
                                                            marks["end"])
    flat = (c3 == c2 and m3 == m2 and r3 - r2 <= args.max_growth
            and s3 - s2 <= args.max_growth)
    line = (f"rank {ctx.rank}: {args.cycles} dup/allreduce/free cycles in {dt:.1f} s "
            f"({wrong} wrong); free MPI contexts {c1} / {c2} / {c3}, RSS {human_bytes(r1)} / "
            f"{human_bytes(r2)} / {human_bytes(r3)}, /dev/shm mapped {m1} / {m2} / {m3} "
            f"files, {human_bytes(s1)} / {human_bytes(s2)} / {human_bytes(s3)} resident "
            f"(a tenth / half / end): {'flat' if flat else 'GREW'}")
    lines = ctx.world._state.mpi.gather(line, root=0)
    if ctx.rank == 0:
        print("\n".join(lines), flush=True)
    return 0 if flat and not wrong else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--live", type=int, default=100000, help="most live communicators")
    p.add_argument("--cycles", type=int, help="dup/collective/free cycles instead")
    p.add_argument("--bytes", type=parse_bytes, default=8, help="allreduce size (8)")
    p.add_argument("--max-growth", type=parse_bytes, default=parse_bytes("4M"),
                   help="most RSS or /dev/shm may grow over the second half (4M)")
    p.add_argument("--contexts", type=int,
                   help="leave MPI only this many free communicator contexts")
    args = p.parse_args(argv)
    if args.contexts is not None:
        from mpi4py import MPI
        held = hold_contexts(MPI, args.contexts)
    ctx = hpccoll.init()
    try:
        return cycles(ctx, args) if args.cycles else live(ctx, args)
    finally:
        ctx.close()
        if args.contexts is not None:
            for c in held:
                c.Free()


if __name__ == "__main__":
    sys.exit(main())
