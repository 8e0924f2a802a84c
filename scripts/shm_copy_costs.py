#!/usr/bin/env python
"""What the memory operations of a 1 MiB shared-memory allreduce cost on this machine
(run under mpiexec -n 2), outside hpccoll: the four steps of the two-rank algorithm
(copy the peer's half of my input into my slot; reduce my half reading the peer's slot;
copy my reduced half out; copy the peer's reduced half out), with the slots alternating
as in hpccoll, next to the same copy on private memory.  Medians, microseconds.

Steps that write lines the other core read a moment ago, or read lines it just wrote,
pay for moving cache lines between the cores; that, not Python, is what bounds
hpccoll's (and MPI's) 1 MiB allreduce here."""
import sys
import time

import numpy as np
from mpi4py import MPI


def main(iters: int = 300, nbytes: int = 1 << 20) -> int:
    w = MPI.COMM_WORLD
    if w.size != 2:
        print("run with mpiexec -n 2", file=sys.stderr)
        return 2
    r, peer = w.rank, 1 - w.rank
    slot_bytes = 4 << 20
    win = MPI.Win.Allocate_shared(2 * slot_bytes, 1, comm=w)
    win.Lock_all(MPI.MODE_NOCHECK)
    segs = [np.frombuffer(win.Shared_query(q)[0], dtype=np.uint8, count=2 * slot_bytes)
            for q in range(2)]

    def slot(q, i):
        return segs[q][i * slot_bytes:(i + 1) * slot_bytes].view(np.float32)

    n = nbytes // 4
    h = n // 2
    mine, theirs = slice(r * h, (r + 1) * h), slice(peer * h, (peer + 1) * h)
    x = np.ones(n, np.float32)
    out = np.empty(n, np.float32)
    private = np.empty(n, np.float32)
    pc = time.perf_counter
    steps = []

    def sync():
        win.Sync()
        w.Barrier()
        win.Sync()

    for it in range(iters):
        s = it % 2
        sync()
        t0 = pc()
        np.copyto(slot(r, s)[theirs], x[theirs])
        t1 = pc()
        sync()
        t2 = pc()
        a, b = (x[mine], slot(peer, s)[mine]) if r == 0 else (slot(peer, s)[mine], x[mine])
        np.add(a, b, out=slot(r, s)[mine])
        t3 = pc()
        sync()
        t4 = pc()
        np.copyto(out[mine], slot(r, s)[mine])
        t5 = pc()
        np.copyto(out[theirs], slot(peer, s)[theirs])
        t6 = pc()
        sync()
        t7 = pc()
        np.copyto(private[theirs], x[theirs])
        t8 = pc()
        steps.append((t1 - t0, t3 - t2, t5 - t4, t6 - t5, t8 - t7))
    assert (out == 2).all()
    med = np.median(np.array(steps), axis=0) * 1e6
    if r == 0:
        names = ("copy my input into my slot (half)", "reduce my half from the peer's slot",
                 "copy my reduced half out", "copy the peer's reduced half out",
                 "the first copy, private to private")
        print(f"1 MiB float32 allreduce data movement, 2 ranks, medians of {iters} (us)")
        for name, v in zip(names, med):
            print(f"  {name:<40}{v:>8.1f}")
        print(f"  {'total of the four steps':<40}{med[:4].sum():>8.1f}")
    win.Unlock_all()
    win.Free()
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 300))
