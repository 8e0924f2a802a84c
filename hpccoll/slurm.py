"""Slurm helpers for the job templates in slurm/.

    srun ... python -m hpccoll.slurm check --ranks N   every rank: is this one MPI job of N ranks?
    python -m hpccoll.slurm stamp FILE.h5...           record the job's SLURM_* variables in FILE

``check`` catches the launcher mistake that fails silently: ``srun --mpi=X`` with an MPI
that does not speak X starts N independent singletons (each rank 0 of 1), which then run
and "pass" on their own.  ``stamp`` adds the batch script's SLURM_* variables to result
files as root attributes named like the variables, without overwriting what the program
that wrote the file recorded already, so every result file says which job produced it.
"""
from __future__ import annotations

import argparse
import os
import sys


def slurm_env(environ=None) -> dict:
    """Every SLURM_* variable of ``environ`` (default: this process), sorted by name."""
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in sorted(environ) if k.startswith("SLURM_")}


def check(ranks: int) -> int:
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    if world.size == ranks:
        # every rank must be able to import the package it is about to run
        import hpccoll  # noqa: F401
        hosts = world.gather(MPI.Get_processor_name(), root=0)
        if world.rank == 0:
            lib = MPI.Get_library_version().splitlines()[0].strip()
            print(f"hpccoll.slurm check: {ranks} ranks in one MPI job on "
                  f"{len(set(hosts))} host(s) ({lib})", flush=True)
        return 0
    # Singletons all report rank 0; let the one with SLURM_PROCID 0 speak for them.
    if os.environ.get("SLURM_PROCID", "0") == "0":
        print(f"hpccoll.slurm check: FAILED: this job expected one MPI job of {ranks} ranks, "
              f"but MPI_COMM_WORLD has {world.size} rank(s).\n"
              f"  The launcher and the MPI library do not talk to each other: with srun, set "
              f"HPCCOLL_SRUN_MPI to a plugin your MPI supports (srun --mpi=list; pmi2 for the "
              f"pip mpich wheel and most MPICH builds, pmix for Open MPI 5), or set "
              f"HPCCOLL_LAUNCHER=mpiexec to start the ranks with your MPI's own mpiexec "
              f"inside the allocation.", file=sys.stderr, flush=True)
    return 1


def stamp(paths, environ=None) -> int:
    """Add the SLURM_* variables to each existing HDF5 file as root attributes that it
    does not have yet; returns how many files were missing."""
    from . import h5log
    env = slurm_env(environ)
    missing = 0
    for path in paths:
        if not os.path.exists(path):
            print(f"hpccoll.slurm stamp: {path}: no such file (the job wrote no results)",
                  file=sys.stderr)
            missing += 1
            continue
        h5log.update_file_attrs(path, env)     # crash-safe, under the file's lock
    return missing


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m hpccoll.slurm", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="run under the launcher: fail unless all ranks form one "
                                     "MPI job of --ranks ranks")
    c.add_argument("--ranks", type=int, required=True)
    s = sub.add_parser("stamp", help="record this job's SLURM_* variables in result files")
    s.add_argument("files", nargs="+")
    args = p.parse_args(argv)
    if args.cmd == "check":
        return check(args.ranks)
    return 1 if stamp(args.files) else 0


if __name__ == "__main__":
    sys.exit(main())
