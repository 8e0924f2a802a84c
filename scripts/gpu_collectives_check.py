#!/usr/bin/env python
"""Collectives on device arrays, every rank on the same GPU (steps 4-6 of
scripts/device_check.sh).  Run under mpiexec.

Default: every collective (allreduce, reduce, broadcast, allgather, reduce_scatter,
alltoall) on CuPy arrays of float32, float16, int8 and int64, with sum, max and avg (avg
on floats; on integers it must be refused), at 0, 1, 1000, 2^20+3 and 2^24 elements per
rank (the block collectives round down to a multiple of the ranks).  Each rank writes
its input on a non-default stream and issues the collective under that stream (CUDA
array interface v3: hpccoll must wait for it).  Every result is compared with the host
MPI library's own collective on the same values (NumPy for float16, which MPI has no type
for), exactly: the values are small integers, scaled by the number of ranks for avg.

Which path each size took is printed too: "host" (up to device_host_bytes, one copy to
host, MPI's own collective, one copy back) or hpccoll's algorithm on the device.

--staging-bench: a 64 MiB float32 allreduce through hpccoll against the naive path
(device-to-host copy, MPI.Allreduce on the host, host-to-device copy), interleaved,
medians; target (issue 16): hpccoll >= 1.5x the naive path.  Then 4 KiB and 64 KiB, which
take the host path, against the same naive path: reported, no target.
--ipc-probe: can two ranks on one device map each other's memory (CUDA IPC)?  Reported,
not required.
--dry-run: Numba's CUDA simulator arrays instead of CuPy, sizes 0, 1 and 1000, no target.
Exit status 1 on any wrong result or missed target.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIZES = (0, 1, 1000, (1 << 20) + 3, 1 << 24)
DTYPES = ("float32", "float16", "int8", "int64")
OPS = ("sum", "max", "avg")
REDUCING = ("allreduce", "reduce", "reduce_scatter")
MOVING = ("broadcast", "allgather", "alltoall")


def values(n: int, rank: int, size: int, dtype: str) -> np.ndarray:
    x = (np.arange(n, dtype=np.int64) * 7 + rank * 3) % 17 - 8
    if np.dtype(dtype).kind == "f":
        x = x * size                  # avg divides each contribution by size: exactly
    return x.astype(dtype)


class Arrays:
    """CuPy arrays written on a non-default stream, or the simulator's (--dry-run)."""

    def __init__(self, dry: bool):
        self.dry = dry
        if dry:
            from numba import cuda
            self.cuda = cuda
        else:
            import cupy
            self.cupy = cupy
            self.stream = cupy.cuda.Stream(non_blocking=True)

    def to_device(self, host: np.ndarray):
        if self.dry:
            return self.cuda.to_device(host)
        with self.stream:
            return self.cupy.asarray(host)       # queued on self.stream, not yet done

    def issue(self, fn):
        """Call fn (which issues a collective) with the writes' stream current."""
        if self.dry:
            return fn()
        with self.stream:
            return fn()

    def host(self, dev) -> np.ndarray:
        if self.dry:
            return dev.copy_to_host()
        return self.cupy.asnumpy(dev)


def reference(MPI, world, coll, x, op, root=0):
    """The host MPI library's result (NumPy's for float16)."""
    size = world.size
    f16 = x.dtype == np.float16
    y = x.astype(np.float32) if f16 else x
    mop = MPI.MAX if op == "max" else MPI.SUM
    if coll == "allreduce":
        out = np.empty_like(y)
        world.Allreduce(y, out, op=mop)
    elif coll == "reduce":
        out = np.zeros_like(y)              # untouched off the root
        world.Reduce(y, out, op=mop, root=root)
    elif coll == "reduce_scatter":
        out = np.empty(y.size // size, y.dtype)
        world.Reduce_scatter_block(y, out, op=mop)
    elif coll == "broadcast":
        out = y.copy()
        world.Bcast(out, root=root)
    elif coll == "allgather":
        out = np.empty(y.size * size, y.dtype)
        world.Allgather(y, out)
    else:
        out = np.empty_like(y)
        world.Alltoall(y, out)
    if op == "avg":
        out = out / size
    return out.astype(x.dtype)


def check_all(ctx, arrays, sizes, MPI, world, paths: dict) -> int:
    """Every case against MPI's own; ``paths`` gets the path each (size, collective) took."""
    w = ctx.world
    wrong = 0
    for dtype in DTYPES:
        for n in sizes:
            for coll in REDUCING + MOVING:
                for op in (OPS if coll in REDUCING else (None,)):
                    count = n - n % w.size if coll in ("reduce_scatter", "alltoall") else n
                    x = values(count, w.rank, w.size, dtype)
                    if op == "avg" and np.dtype(dtype).kind != "f":
                        try:
                            w.allreduce(arrays.to_device(x), op="avg")
                            wrong += 1
                            print(f"rank {w.rank}: avg on {dtype} was not refused", flush=True)
                        except Exception:
                            pass
                        continue
                    dev = arrays.to_device(x)
                    args = {"op": op} if op else {}
                    work = arrays.issue(lambda: getattr(w, coll)(dev, **args))
                    paths.setdefault((dtype, n), {})[f"{coll} {op}" if op else coll] = (
                        "host" if work.plan.detour is not None else work.plan.algo)
                    got = work.wait()
                    want = reference(MPI, world, coll, x, op)
                    if coll == "reduce" and w.rank != 0:
                        continue
                    got = arrays.host(dev if coll == "broadcast" else got)
                    if got.shape != want.shape or not np.array_equal(got, want):
                        wrong += 1
                        print(f"rank {w.rank}: WRONG {coll} {dtype} {op or ''} n={count}",
                              flush=True)
    return wrong


def staging_bench(ctx, arrays, MPI, world, nbytes: int, iters: int) -> tuple:
    """(hpccoll ms, naive ms), medians, interleaved."""
    n = nbytes // 4
    x = arrays.to_device(values(n, ctx.rank, ctx.size, "float32"))
    host_in, host_out = np.empty(n, np.float32), np.empty(n, np.float32)
    out = None
    mine, naive = [], []
    for i in range(iters + 1):
        world.Barrier()
        t0 = time.perf_counter()
        got = ctx.world.allreduce(x).wait()
        t1 = time.perf_counter()
        world.Barrier()
        t2 = time.perf_counter()
        host_in[:] = arrays.host(x)
        world.Allreduce(host_in, host_out)
        out = arrays.to_device(host_out)
        if not arrays.dry:
            arrays.stream.synchronize()
        t3 = time.perf_counter()
        if i:                                   # the first of each is a warm-up
            mine.append(world.allreduce(t1 - t0, op=MPI.MAX))
            naive.append(world.allreduce(t3 - t2, op=MPI.MAX))
    same = np.array_equal(arrays.host(got), arrays.host(out))
    return statistics.median(mine) * 1e3, statistics.median(naive) * 1e3, same


def ipc_probe(world) -> str:
    import cupy
    if world.size < 2:
        return "needs 2 ranks"
    if world.rank == 0:
        a = cupy.arange(1024, dtype=cupy.int32)
        handle = cupy.cuda.runtime.ipcGetMemHandle(a.data.ptr)
        world.send(bytes(handle), dest=1)
        return world.recv(source=1)
    if world.rank == 1:
        try:
            ptr = cupy.cuda.runtime.ipcOpenMemHandle(world.recv(source=0))
            mem = cupy.cuda.UnownedMemory(ptr, 1024 * 4, None)
            b = cupy.ndarray(1024, cupy.int32, cupy.cuda.MemoryPointer(mem, 0))
            ok = bool((b == cupy.arange(1024, dtype=cupy.int32)).all())
            cupy.cuda.runtime.ipcCloseMemHandle(ptr)
            verdict = "works" if ok else "maps, but reads wrong values"
        except Exception as exc:
            verdict = f"does not work here ({type(exc).__name__}: {exc})"
        world.send(verdict, dest=0)
        return verdict
    return ""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--staging-bench", action="store_true")
    p.add_argument("--ipc-probe", action="store_true")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--iters", type=int, default=10)
    args = p.parse_args(argv)
    if args.dry_run:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    import hpccoll
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    arrays = Arrays(args.dry_run)
    if args.ipc_probe:
        if args.dry_run:
            verdict = "not probed (dry run)"
        else:
            verdict = ipc_probe(world)
        if world.rank == 0:
            print(f"CUDA IPC between two ranks on one device: {verdict}")
        return 0
    ok = True
    with hpccoll.init(timeout=120, **({"threads_per_block": 4} if args.dry_run else {})) as ctx:
        if args.staging_bench:
            nbytes = 64 << 10 if args.dry_run else 64 << 20
            mine, naive, same = staging_bench(ctx, arrays, MPI, world, nbytes,
                                              2 if args.dry_run else args.iters)
            ratio = naive / mine
            met = args.dry_run or ratio >= 1.5
            ok = same and met
            if ctx.rank == 0:
                print(f"allreduce of {nbytes >> 20 or nbytes} {'MiB' if nbytes >> 20 else 'B'} "
                      f"float32 on one GPU, {ctx.size} ranks: hpccoll {mine:.2f} ms, naive "
                      f"(D2H, MPI.Allreduce, H2D) {naive:.2f} ms, ratio {ratio:.2f} (target >= "
                      f"1.5{', not checked: dry run' if args.dry_run else ''}): "
                      f"{'same result' if same else 'RESULTS DIFFER'}, "
                      f"{'met' if met else 'MISSED'}", flush=True)
            for small in (4 << 10, 64 << 10):       # the host path: reported only
                mine, naive, same = staging_bench(ctx, arrays, MPI, world, small,
                                                  2 if args.dry_run else 10 * args.iters)
                ok = ok and same
                if ctx.rank == 0:
                    print(f"allreduce of {small >> 10} KiB float32 (through the host): "
                          f"hpccoll {mine * 1e3:.1f} us, naive {naive * 1e3:.1f} us, ratio "
                          f"{naive / mine:.2f} (reported, no target): "
                          f"{'same result' if same else 'RESULTS DIFFER'}", flush=True)
        else:
            sizes = SIZES[:3] if args.dry_run else SIZES
            t0 = time.perf_counter()
            paths: dict = {}
            wrong = world.allreduce(check_all(ctx, arrays, sizes, MPI, world, paths))
            ok = wrong == 0
            if ctx.rank == 0:
                print(f"every collective x {len(DTYPES)} dtypes x sum/max/avg x sizes "
                      f"{', '.join(map(str, sizes))} on {ctx.size} ranks sharing one "
                      f"{'simulated ' if args.dry_run else ''}GPU: {wrong} wrong "
                      f"({time.perf_counter() - t0:.1f} s)", flush=True)
                for (dtype, n), by_coll in paths.items():
                    print(f"  {dtype} x {n}: " + ", ".join(
                        f"{c} {p}" for c, p in by_coll.items()), flush=True)
    ok = world.allreduce(ok, op=MPI.LAND)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
