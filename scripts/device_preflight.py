#!/usr/bin/env python
"""Step 1 of scripts/device_check.sh: what this machine has, before anything runs.

Prints the versions of Python and every package the checks import, the MPI library and
its mpiexec, the GPU (nvidia-smi, CuPy's view of the device) and whether the MPI library
is CUDA-aware; exits 2, naming each missing piece and how to bring it, if anything the
later steps need is absent.  --dry-run (no GPU: Numba's CUDA simulator) asks for
everything but CuPy and the GPU.
"""
from __future__ import annotations

import argparse
import importlib
import os
import shutil
import subprocess
import sys

NEEDED = (   # module, what brings it when missing
    ("numpy", "the image's numpy"),
    ("mpi4py", "the image's mpi4py"),
    ("h5py", "the image's h5py"),
    ("numba", "the image's numba"),
    ("pytest", "the image's pytest"),
    ("pytest_timeout", "a carried pytest-timeout wheel (scripts/device_wheels.sh)"),
    ("hpccoll", "this checkout on PYTHONPATH (device_check.sh sets it)"),
    ("numba_kernels", "this checkout on PYTHONPATH (device_check.sh sets it)"),
)
ON_DEVICE = (
    ("cupy", "the image's cupy-cuda13x"),
    ("numba.cuda", "the image's numba-cuda"),
)


def version(mod) -> str:
    v = getattr(mod, "__version__", None)
    if v is None:
        try:
            from importlib.metadata import version as dist_version
            v = dist_version(mod.__name__.split(".")[0].replace("_", "-"))
        except Exception:
            v = "?"
    return str(v)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    missing = []
    print(f"python {sys.version.split()[0]} at {sys.executable}")
    for name, fix in NEEDED + (() if args.dry_run else ON_DEVICE):
        try:
            mod = importlib.import_module(name)
            print(f"  {name:<15} {version(mod)}")
        except Exception as exc:           # ImportError, or a broken install
            print(f"  {name:<15} MISSING ({type(exc).__name__}: {exc})")
            missing.append(f"{name}: {fix}")
    mpiexec = shutil.which("mpiexec")
    print(f"mpiexec: {mpiexec or 'MISSING'}")
    if not mpiexec:
        missing.append("mpiexec: a carried mpich wheel (scripts/device_wheels.sh)")
    try:
        # (a singleton MPI job: the CUDA query needs MPI initialised)
        from hpccoll.transport.mpi import library_name
        lib = library_name()
        print(f"MPI library: {lib}")
    except Exception as exc:
        print(f"MPI library: MISSING ({type(exc).__name__}: {exc})")
        missing.append("an MPI library for mpi4py: a carried mpich wheel "
                       "(scripts/device_wheels.sh)")
    if args.dry_run:
        os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
        print("dry run: no GPU asked for (Numba's CUDA simulator stands in)")
    else:
        smi = shutil.which("nvidia-smi")
        if smi:
            out = subprocess.run([smi, "--query-gpu=name,memory.total,driver_version",
                                  "--format=csv,noheader"], capture_output=True, text=True,
                                 timeout=30)
            print(f"nvidia-smi: {out.stdout.strip() or out.stderr.strip()}")
        else:
            print("nvidia-smi: not found")
        try:
            import cupy
            n = cupy.cuda.runtime.getDeviceCount()
            props = cupy.cuda.runtime.getDeviceProperties(0)
            print(f"GPU 0 of {n}: {props['name'].decode()}, {props['multiProcessorCount']} SMs, "
                  f"{props['totalGlobalMem'] / 2**30:.0f} GiB, CUDA runtime "
                  f"{cupy.cuda.runtime.runtimeGetVersion()}")
        except Exception as exc:
            print(f"GPU: NONE VISIBLE ({type(exc).__name__}: {exc})")
            missing.append("a GPU CuPy can see")
    try:
        from hpccoll.transport.staging import mpi_cuda_aware
        print(f"CUDA-aware MPI (MPIX_Query_cuda_support): {mpi_cuda_aware()}")
    except Exception as exc:
        print(f"CUDA-aware MPI: unknown ({type(exc).__name__}: {exc})")
    if missing:
        print("PREFLIGHT FAILED, missing:\n  " + "\n  ".join(missing), file=sys.stderr)
        return 2
    print("preflight: everything the checks need is here")
    return 0


if __name__ == "__main__":
    sys.exit(main())
