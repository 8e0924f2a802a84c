#!/usr/bin/env python
"""Allreduce of CuPy arrays through hpccoll, every rank on the same GPU (device 0), checked
against NumPy on the host; prints the time per allreduce.  Run under mpiexec -n 2 or 4."""
import sys
import time

import numpy as np


def main() -> int:
    import cupy
    import hpccoll
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    ok = True
    with hpccoll.init(timeout=120) as ctx:
        for n in (1, 1000, 1 << 20, (1 << 24) + 3):
            x = cupy.arange(n, dtype=cupy.float32) % 13 + ctx.rank
            want = (np.arange(n, dtype=np.float32) % 13) * ctx.size + sum(range(ctx.size))
            ctx.world.allreduce(x).wait()
            world.Barrier()
            t0 = time.perf_counter()
            got = ctx.world.allreduce(x).wait()
            dt = world.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            good = bool(np.array_equal(cupy.asnumpy(got), want))
            ok &= world.allreduce(good, op=MPI.LAND)
            if ctx.rank == 0:
                print(f"allreduce cupy float32 x{n:<10} {dt * 1e3:9.3f} ms  "
                      f"{'ok' if good else 'WRONG'}  ({ctx.size} ranks, one GPU)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
