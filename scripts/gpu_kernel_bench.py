#!/usr/bin/env python
"""Reduction kernel bandwidth on a GPU (step 3 of scripts/device_check.sh).

numba_kernels' sum of two inputs, for float32, float16 and int8, at each --sizes, with
blocks = 1, 2, 4, 8 x the GPU's SMs and the default rule (default_blocks), against
cupy.add on the same buffers.  --launches launches sit between one pair of CUDA events,
so Python's launch cost (10-15 us) is not counted against a kernel of tens of us; the
cost of one launch is reported on its own (a kernel over 1 element, host clock, median).
Bytes moved per call: 2 reads + 1 write.

Targets (issue 16), at the largest size: the best block count reaches 90% of cupy.add's
bandwidth for float32, 80% for float16 and int8.  Exit status 1 if one is missed or a
result is wrong.  --dry-run: Numba's CUDA simulator and NumPy, tiny sizes, no targets
(it checks this script's own logic, in CI).

    python scripts/gpu_kernel_bench.py [--sizes 64M,1G] [--launches 20]
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
from hpccoll.timing import human_bytes, parse_bytes  # noqa: E402

TARGETS = {"float32": 0.90, "float16": 0.80, "int8": 0.80}


class Device:
    """CuPy on a GPU; NumPy arrays through the simulator on --dry-run."""

    def __init__(self, dry: bool):
        self.dry = dry
        if dry:
            os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
            self.sms, self.name = 2, "Numba CUDA simulator"
            return
        import cupy
        props = cupy.cuda.runtime.getDeviceProperties(0)
        self.sms, self.name = props["multiProcessorCount"], props["name"].decode()

    def inputs(self, n, dtype):
        """Two inputs of small integers (exact in every dtype), made where they live."""
        xp = np
        if not self.dry:
            import cupy as xp
        i = xp.arange(n, dtype=xp.int64)
        a, b = ((i * 5 + 1) % 7 - 3).astype(dtype), ((i * 3 + 2) % 5 - 2).astype(dtype)
        return a, b, xp.empty(n, dtype)

    def elapsed_ms(self, fn, launches: int, reps: int) -> float:
        """Median over reps of (time of `launches` calls between two events) / launches."""
        if self.dry:
            ts = []
            for _ in range(reps):
                t0 = time.perf_counter()
                for _ in range(launches):
                    fn()
                ts.append((time.perf_counter() - t0) * 1e3 / launches)
            return statistics.median(ts)
        import cupy
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        fn()
        ts = []
        for _ in range(reps):
            start.record()
            for _ in range(launches):
                fn()
            end.record()
            end.synchronize()
            ts.append(cupy.cuda.get_elapsed_time(start, end) / launches)
        return statistics.median(ts)

    def add(self, a, b, out):
        if self.dry:
            return lambda: np.add(a, b, out=out)
        import cupy
        return lambda: cupy.add(a, b, out=out)

    def host(self, x):
        return x if self.dry else x.get()

    def numba(self, x):
        """What the kernels take: a view of a CuPy array, a simulator copy of a NumPy one."""
        from numba import cuda
        return cuda.to_device(x) if self.dry else cuda.as_cuda_array(x)


def launch_overhead_us(dev: Device, k, cuda) -> float:
    """One launch of the reduce kernel on 1 element, to completion, host clock (median)."""
    a, b, out = dev.inputs(1, np.float32)
    da, db, do = (dev.numba(x) for x in (a, b, out))
    ts = []
    for _ in range(50):
        t0 = time.perf_counter()
        k.reduce("sum", do, (da, db), blocks=1, threads_per_block=32)
        cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(ts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="64M,1G", help="bytes per input (64M,1G)")
    ap.add_argument("--dtypes", default="float32,float16,int8")
    ap.add_argument("--launches", type=int, default=20, help="launches per event pair")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    dev = Device(args.dry_run)
    sizes = [parse_bytes(s) for s in ("1K" if args.dry_run else args.sizes).split(",")]
    launches, reps = (2, 1) if args.dry_run else (args.launches, args.reps)
    tpb = 32 if args.dry_run else 256
    from numba import cuda
    from numba_kernels import cuda as k
    print(f"# {dev.name}: {dev.sms} SMs; {launches} launches per event pair, median of {reps}")
    print(f"# one launch of the reduce kernel, to completion: "
          f"{launch_overhead_us(dev, k, cuda):.1f} us (host clock)")
    ok = True
    for dtype in args.dtypes.split(","):
        dt = np.dtype(dtype)
        for nbytes in sizes:
            n = nbytes // dt.itemsize
            a, b, out = dev.inputs(n, dt)
            moved = 3 * n * dt.itemsize
            t_ref = dev.elapsed_ms(dev.add(a, b, out), launches, reps)
            want = dev.host(out).copy()
            bw_ref = moved / t_ref / 1e6
            print(f"\n## sum of 2 {dtype} inputs, {human_bytes(nbytes)} each: cupy.add "
                  f"{t_ref:.3f} ms, {bw_ref:.0f} GB/s")
            print(f"{'blocks':>14} {'ms':>9} {'GB/s':>8} {'vs cupy.add':>12}")
            da, db, do = (dev.numba(x) for x in (a, b, out))
            rows = [(f"{m} x SMs", m * dev.sms) for m in (1, 2, 4, 8)]
            rows.append(("default rule", k.default_blocks(n, tpb, 2 * dev.sms)))
            best = 0.0
            for label, blocks in rows:
                t = dev.elapsed_ms(lambda: k.reduce("sum", do, (da, db), blocks=blocks,
                                                    threads_per_block=tpb), launches, reps)
                cuda.synchronize()
                got = do.copy_to_host()
                right = np.array_equal(got, want)
                ok &= right
                bw = moved / t / 1e6
                best = max(best, bw)
                print(f"{label + ' ' + str(blocks):>14} {t:>9.3f} {bw:>8.0f} "
                      f"{bw / bw_ref:>12.2f}{'' if right else '  WRONG'}")
            if nbytes == sizes[-1] and not args.dry_run:
                target = TARGETS.get(dtype)
                met = target is None or best >= target * bw_ref
                ok &= met
                print(f"best {best:.0f} GB/s = {best / bw_ref:.0%} of cupy.add (target >= "
                      f"{target:.0%}): {'met' if met else 'MISSED'}")
    if args.dry_run:
        print("\ndry run: simulator timings, targets not checked")
    print(f"\nkernel bench: {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
