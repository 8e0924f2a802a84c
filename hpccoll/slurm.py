"""Slurm helpers for the job templates in slurm/.

    python -m hpccoll.slurm launcher [--want W]        which launcher starts the ranks (srun, mpiexec)
    srun ... python -m hpccoll.slurm check --ranks N   every rank: is this one MPI job of N ranks?
    python -m hpccoll.slurm stamp FILE.h5...           record the job's SLURM_* variables in FILE

``launcher`` resolves HPCCOLL_LAUNCHER=auto (the templates' default): srun, except for a
multi-node job whose MPI is an MPICH with its own PMI-1 client (the pip wheel), which then
runs under MPICH's hydra ``mpiexec`` (see LAUNCHERS).  ``check`` catches the launcher mistake that fails silently: ``srun --mpi=X`` with an MPI
that does not speak X starts N independent singletons (each rank 0 of 1), which then run
and "pass" on their own.  ``stamp`` adds the batch script's SLURM_* variables to result
files as root attributes named like the variables, without overwriting what the program
that wrote the file recorded already, so every result file says which job produced it.
"""
from __future__ import annotations

import argparse
import os
import sys

from . import launch

# srun --mpi=pmi2 takes a PMI-1 request in one read of at most this many bytes and fails
# the rest as a new, invalid request.  MPICH's own PMI-1 client cuts an address exchange
# into values of up to 1022 characters, so its requests reach ~1080 bytes: whenever the
# addresses of a multi-node job encode long (run-length coding of zeros makes it depend on
# the bytes), MPI_Init hangs until the job's time limit.  Hydra reads whole lines.
SRUN_PMI1_REQUEST = 1024


def slurm_env(environ=None) -> dict:
    """Every SLURM_* variable of ``environ`` (default: this process), sorted by name."""
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in sorted(environ) if k.startswith("SLURM_")}


def library_version() -> str:
    """The MPI library's version string, read without initializing MPI."""
    import mpi4py
    mpi4py.rc.initialize = mpi4py.rc.finalize = False
    from .transport.mpi import library_version
    return library_version()


def own_pmi1_client(library: str) -> bool:
    """An MPICH (not a derivative) built without an external PMI: it speaks PMI-1 through
    its own client, as the pip wheel does.  Builds for Slurm say --with-pmi=... or
    --with-pmix in their configure line and talk to srun in PMI-2 or PMIx framing."""
    if not library.lstrip().startswith("MPICH Version"):
        return False         # Open MPI, Intel MPI, MVAPICH, Cray MPICH: srun is theirs
    configure = next((line for line in library.splitlines() if "configure" in line), "")
    return not any(opt in configure for opt in ("--with-pmi", "--with-pmix", "--with-slurm"))


def hydra_mpiexec() -> bool:
    try:
        return launch.flavor() == "hydra"
    except RuntimeError:          # no mpiexec
        return False


HANGS = (f"this MPICH speaks PMI-1 through its own client, whose requests at MPI_Init of a "
         f"multi-node job outgrow the {SRUN_PMI1_REQUEST} bytes srun --mpi=pmi2 reads: the job "
         f"would hang at random")

# What HPCCOLL_LAUNCHER=auto starts the ranks with: the first row that holds (nodes in the
# job, the MPI has its own PMI-1 client, a hydra mpiexec is on PATH) wins.
LAUNCHERS = (
    ("mpiexec", lambda nodes, own_pmi1, hydra: nodes > 1 and own_pmi1 and hydra,
     f"{HANGS}; its hydra mpiexec starts the ranks instead"),
    ("srun", lambda nodes, own_pmi1, hydra: True, ""),
)


def pick_launcher(want: str, nodes: int, library: str, hydra: bool) -> tuple[str, str]:
    """(launcher, note) for HPCCOLL_LAUNCHER=``want`` on a job of ``nodes`` nodes; the
    note says why auto did not pick srun, or warns that an explicit srun may hang."""
    own = own_pmi1_client(library)
    if want == "auto":
        name, why = next((name, why) for name, holds, why in LAUNCHERS
                         if holds(nodes, own, hydra))
        return name, why and f"auto: {why}"
    if want == "srun" and nodes > 1 and own:
        return want, f"warning: {HANGS}; HPCCOLL_LAUNCHER=auto or mpiexec avoids it"
    return want, ""


def launcher(want: str, environ=None) -> int:
    environ = os.environ if environ is None else environ
    if want not in ("auto", "srun", "mpiexec"):
        print(f"hpccoll.slurm launcher: HPCCOLL_LAUNCHER must be auto, srun or mpiexec, not "
              f"'{want}'", file=sys.stderr)
        return 2
    nodes = int(environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES") or 1)
    name, why = pick_launcher(want, nodes, library_version(),
                              want == "auto" and hydra_mpiexec())
    print(name)
    if why:
        print(f"hpccoll.slurm launcher: {name} ({why})", file=sys.stderr)
    return 0


def check(ranks: int) -> int:
    from mpi4py import MPI
    from .transport.mpi import library_name
    world = MPI.COMM_WORLD
    if world.size == ranks:
        # every rank must be able to import the package it is about to run
        import hpccoll  # noqa: F401
        hosts = world.gather(MPI.Get_processor_name(), root=0)
        if world.rank == 0:
            lib = library_name()
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
    w = sub.add_parser("launcher", help="print the launcher that starts the ranks: srun or "
                                        "mpiexec (HPCCOLL_LAUNCHER=auto resolved for this job)")
    w.add_argument("--want", default="auto", help="auto (default), srun or mpiexec")
    c = sub.add_parser("check", help="run under the launcher: fail unless all ranks form one "
                                     "MPI job of --ranks ranks")
    c.add_argument("--ranks", type=int, required=True)
    s = sub.add_parser("stamp", help="record this job's SLURM_* variables in result files")
    s.add_argument("files", nargs="+")
    args = p.parse_args(argv)
    if args.cmd == "launcher":
        return launcher(args.want)
    if args.cmd == "check":
        return check(args.ranks)
    return 1 if stamp(args.files) else 0


if __name__ == "__main__":
    sys.exit(main())
