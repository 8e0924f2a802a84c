#!/usr/bin/env python
"""The soak test: thousands of mixed collectives, every result checked, memory watched.

    mpiexec -n 4 python scripts/soak.py                         # 10,000 per policy, all three
    mpiexec -n 2 python scripts/soak.py --iters 300 --policy fifo

Every rank draws the same random program (one seed): each step issues a window of
collectives (allreduce, reduce, broadcast, allgather, reduce_scatter, alltoall, barrier)
on 4 communicators, with random sizes from 8 B to --max-bytes (log-uniform), dtypes and
ops, some keyed, some with a done-callback, then waits for them all and compares every
result with NumPy's, exactly (integers, and floats that hold small integers).  The same
order on every rank, so that fifo runs it too.  RSS and the resident node-shared memory
this rank maps from /dev/shm (MPI's segments and hpccoll's areas, mapped and unlinked; other
jobs' do not count) are read at a tenth, half and the end of
the run: over the second half (scratch pools at their sizes, the plan cache at its
bound, MPI's lazily made per-communicator segments made) neither may grow by more than
--max-growth; the growth from the first tenth is printed too.

One line per policy; exit status 1 if anything was wrong, lost or grew.
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
from _procmem import rss, shm_mapped  # noqa: E402  (scripts/, beside this file)


def shm_used() -> int:
    """The node-shared memory this rank holds: resident bytes of its /dev/shm mappings."""
    return shm_mapped()[1]

COLLS = ("allreduce", "reduce", "broadcast", "allgather", "reduce_scatter", "alltoall",
         "barrier")
DTYPES = (np.int32, np.int64, np.float32, np.float64)
OPS = ("sum", "max", "min")


def data(n: int, dtype, rank: int, salt: int) -> np.ndarray:
    """Small integers (exact in every dtype, sums of a few ranks too)."""
    return ((np.arange(n, dtype=np.int64) * 3 + rank * 7 + salt) % 13 - 6).astype(dtype)


def expected(coll, op, n, dtype, size, rank, root, salt):
    inputs = [data(n * (size if coll in ("reduce_scatter", "alltoall") else 1), dtype, r, salt)
              for r in range(size)]
    if coll in ("allreduce", "reduce", "reduce_scatter"):
        fn = {"sum": np.add, "max": np.maximum, "min": np.minimum}[op]
        out = inputs[0].copy()
        for x in inputs[1:]:
            out = fn(out, x).astype(dtype)
        if coll == "reduce_scatter":
            return out[rank * n:(rank + 1) * n]
        return out if coll == "allreduce" or rank == root else None
    if coll == "broadcast":
        return inputs[root]
    if coll == "allgather":
        return np.concatenate(inputs)
    if coll == "alltoall":
        return np.concatenate([inputs[r][rank * n:(rank + 1) * n] for r in range(size)])
    return None


def issue(comm, coll, op, n, dtype, root, key, salt):
    size, rank = comm.size, comm.rank
    if coll == "barrier":
        return comm.barrier(key=key), None
    if coll == "broadcast":
        buf = data(n, dtype, rank, salt) if rank == root else np.zeros(n, dtype)
        return comm.broadcast(buf, root=root, key=key), buf
    x = data(n * (size if coll in ("reduce_scatter", "alltoall") else 1), dtype, rank, salt)
    if coll == "allreduce":
        return comm.allreduce(x, op=op, key=key), None
    if coll == "reduce":
        return comm.reduce(x, op=op, root=root, key=key), None
    if coll == "allgather":
        return comm.allgather(x, key=key), None
    if coll == "reduce_scatter":
        return comm.reduce_scatter(x, op=op, key=key), None
    return comm.alltoall(x, key=key), None


def soak(policy: str, args) -> tuple:
    ctx = hpccoll.init(policy=policy, timeout=args.timeout)
    comms = [ctx.world.dup(name=f"c{i}") for i in range(4)]
    size, rank = ctx.size, ctx.rank
    rng = np.random.default_rng(args.seed)       # the same program on every rank
    hi = np.log2(max(8, args.max_bytes))
    wrong = done = 0
    called = [0]
    want_calls = 0
    warm = max(1, args.iters // 10)
    marks: dict = {}            # when -> (RSS, /dev/shm)
    t0 = time.monotonic()
    step = 0
    while done < args.iters:
        window = []
        for _ in range(min(args.window, args.iters - done)):
            comm = comms[int(rng.integers(len(comms)))]
            coll = COLLS[int(rng.integers(len(COLLS)))]
            dtype = DTYPES[int(rng.integers(len(DTYPES)))]
            op = OPS[int(rng.integers(len(OPS)))]
            nbytes = int(2 ** rng.uniform(3, hi))
            per = size if coll in ("allgather", "reduce_scatter", "alltoall") else 1
            n = max(1, nbytes // (np.dtype(dtype).itemsize * per))
            root = int(rng.integers(size))
            key = f"k{step}" if rng.random() < 0.2 else None
            callback = rng.random() < 0.2
            w, buf = issue(comm, coll, op, n, dtype, root, key, step)
            if callback:
                want_calls += 1
                w.add_done_callback(lambda _w: called.__setitem__(0, called[0] + 1))
            window.append((w, buf, coll, op, n, dtype, root, step))
            step += 1
            done += 1
        for w, buf, coll, op, n, dtype, root, salt in window:
            got = w.wait()
            want = expected(coll, op, n, dtype, size, rank, root, salt)
            if salt == args.corrupt and want is not None:
                want = want.copy()
                want.flat[0] += 1      # the check must see it (tests/unit/test_soak.py)
            if coll == "broadcast":
                got = buf
            if want is not None and not np.array_equal(got, want):
                wrong += 1
                if wrong <= 3:
                    print(f"soak {policy}: rank {rank}: wrong {coll} {np.dtype(dtype)} x{n} "
                          f"op {op} root {root} (step {salt})", file=sys.stderr, flush=True)
        del window
        for when, at in (("tenth", warm), ("half", args.iters // 2)):
            if when not in marks and done >= at:
                marks[when] = (rss(), shm_used())
        if args.verbose and done % warm < len(COLLS) and rank == 0:
            plans = sum(len(c._state.plans) for c in comms)
            pooled = sum(c._state.pool.allocated for c in comms)
            print(f"  {done}: RSS {human_bytes(rss())}, /dev/shm {human_bytes(shm_used())}, "
                  f"plans {plans}, scratch pools {human_bytes(pooled)}", flush=True)
    seconds = time.monotonic() - t0
    end = (rss(), shm_used())
    grew = tuple(end[i] - marks[w][i] for w in ("tenth", "half") for i in (0, 1))
    for c in comms:
        c.free()
    ctx.close()
    return (wrong, called[0], want_calls) + grew + (seconds,)


def _signed(n: int) -> str:
    return ("+" if n >= 0 else "-") + human_bytes(abs(n))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=10_000, help="collectives per policy")
    ap.add_argument("--policy", default="all", choices=("all", "preemptive", "ordered", "fifo"))
    ap.add_argument("--max-bytes", type=parse_bytes, default=4 << 20)
    ap.add_argument("--window", type=int, default=8, help="collectives issued before waiting")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--corrupt", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("-v", "--verbose", action="store_true", help="memory every tenth")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--max-growth", type=parse_bytes, default=32 << 20,
                    help="most RSS or /dev/shm may grow over the second half")
    args = ap.parse_args(argv)
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    policies = ("preemptive", "ordered", "fifo") if args.policy == "all" else (args.policy,)
    ok = True
    for policy in policies:
        rows = world.gather(soak(policy, args), root=0)
        if world.rank == 0:
            bad = sum(r[0] for r in rows)
            lost = sum(r[2] - r[1] for r in rows)
            # (rank, growth from a tenth, growth over the second half), the most of any rank
            top = [max(r[k] for r in rows) for k in (3, 4, 5, 6)]
            good = not bad and not lost and max(top[2], top[3]) <= args.max_growth
            ok = ok and good
            print(f"soak {policy}: {args.iters} collectives x {world.size} ranks in "
                  f"{max(r[7] for r in rows):.1f} s; wrong {bad}; callbacks "
                  f"{sum(r[1] for r in rows)}/{sum(r[2] for r in rows)}; second half: RSS "
                  f"{_signed(top[2])}, /dev/shm {_signed(top[3])} (at most "
                  f"{human_bytes(args.max_growth)}; from a tenth: RSS {_signed(top[0])}, "
                  f"/dev/shm {_signed(top[1])}): {'ok' if good else 'FAILED'}", flush=True)
    ok = world.bcast(ok, root=0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
