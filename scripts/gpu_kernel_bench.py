#!/usr/bin/env python
"""Kernel bandwidth on a real GPU: numba_kernels' sum-reduce of two float32 inputs for
block counts 1..max, against CuPy's own cupy.add on the same buffers and against the
device's peak memory bandwidth (from its clock and bus width).  Bytes moved per call:
2 reads + 1 write.  Medians of CUDA-event timings.

    python scripts/gpu_kernel_bench.py [--sizes 64M,1G] [--reps 20]
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hpccoll.timing import human_bytes, parse_bytes  # noqa: E402


def time_ms(fn, reps):
    import cupy
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    fn()
    ts = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        ts.append(cupy.cuda.get_elapsed_time(start, end))
    return float(np.median(ts))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="64M,1G")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    import cupy
    from numba import cuda
    from numba_kernels import cuda as k
    props = cupy.cuda.runtime.getDeviceProperties(0)
    peak = 2 * props["memoryClockRate"] * 1e3 * props["memoryBusWidth"] / 8 / 1e9
    sms = props["multiProcessorCount"]
    print(f"# {props['name'].decode()}: {sms} SMs, peak memory bandwidth {peak:.0f} GB/s "
          "(2 x memory clock x bus width)")
    stream = cuda.default_stream()
    for nbytes in (parse_bytes(s) for s in args.sizes.split(",")):
        n = nbytes // 4
        a = cupy.random.random(n, dtype=cupy.float32)
        b = cupy.random.random(n, dtype=cupy.float32)
        out = cupy.empty_like(a)
        moved = 3 * n * 4
        t_cupy = time_ms(lambda: cupy.add(a, b, out=out), args.reps)
        bw_cupy = moved / t_cupy / 1e6
        print(f"\n## sum of 2 float32 inputs, {human_bytes(nbytes)} each")
        print(f"cupy.add: {t_cupy:.3f} ms, {bw_cupy:.0f} GB/s ({bw_cupy / peak:.0%} of peak)")
        print(f"{'blocks':>7} {'ms':>9} {'GB/s':>8} {'vs cupy.add':>12} {'vs peak':>8}")
        da, db, do = (cuda.as_cuda_array(x) for x in (a, b, out))
        k.reduce("sum", do, (da, db), blocks=1, threads_per_block=256, stream=stream)  # compile
        best = 0.0
        blocks = 1
        while blocks <= 8 * sms:
            t = time_ms(lambda: k.reduce("sum", do, (da, db), blocks=blocks, threads_per_block=256,
                                         stream=stream), args.reps)
            bw = moved / t / 1e6
            best = max(best, bw)
            print(f"{blocks:>7} {t:>9.3f} {bw:>8.0f} {bw / bw_cupy:>12.2f} {bw / peak:>8.0%}")
            blocks *= 2
        cupy.testing.assert_allclose(out, a + b)
        print(f"best: {best:.0f} GB/s = {best / bw_cupy:.0%} of cupy.add (target >= 90% at 64 MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
