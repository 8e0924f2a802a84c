"""hpccoll-bench's command line: nccl-tests' flags with their meanings and defaults,
plus hpccoll's; everything that can be checked before MPI starts is checked here, and
every error names the flag and what it expects."""
from __future__ import annotations

import argparse

from . import cases

USAGE = """nccl-tests style benchmarks of hpccoll's collectives.

    mpiexec -n 4 hpccoll-bench allreduce -b 8 -e 64M -f 4 --compare mpi --out r.h5

Flags mean what they mean for nccl-tests' *_perf binaries (same defaults); the table has
nccl-tests' columns.  The library under test is hpccoll (or mpi: mpi4py's collectives on
the same buffers); --compare adds the other one, interleaved iteration by iteration in the
same run, with its time, busbw and the ratio baseline time / time (> 1: faster than the
baseline).  After the table, as '#' lines nccl-tests readers skip: the spread of every
measurement (p10, median, p90 over the iterations) and a WARNING where the machine looked
loaded (other processes busy on the job's CPUs) or the iterations were noisy (p90/p10
above 2), naming what was seen; both are kept in the result file.

Exit status: 0, 1 if any result was wrong or the results could not be saved (no space,
ulimit -f: the message says where they are, if anywhere), 2 for bad arguments; an
unexpected error aborts every rank (MPI_Abort) so that none is left waiting.  Result
files: docs/results.md.
"""
AVERAGES = "0=rank 0, 1=mean, 2=min, 3=max over ranks"
FLOOR_LINES = 100    # --floor auto: a longer sweep would take about as long again from C


class UsageError(Exception):
    """A bad argument found after MPI started; every rank raises it alike."""


class _Parser(argparse.ArgumentParser):
    """Prints (usage, errors, --help) on rank 0 only; every rank exits alike."""

    rank = 0

    def _print_message(self, message, file=None):
        if self.rank == 0:
            super()._print_message(message, file)


def _bytes(text: str) -> int:
    from ..timing import parse_bytes
    try:
        value = parse_bytes(text)
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(
            f"expected a byte count like 8, 64K, 32M or 1G, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a byte count >= 0, got {text!r}")
    return value


def _count(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value
    return parse


def parser(rank: int = 0) -> argparse.ArgumentParser:
    from ..config import SETTINGS
    policies = next(s.choices for s in SETTINGS if s.name == "policy")
    p = _Parser(prog="hpccoll-bench", description=USAGE,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.rank = rank
    p.add_argument("collective", nargs="?", metavar="COLLECTIVE",
                   help=f"one of {', '.join(cases.COLLECTIVES)} (or --coll)")
    p.add_argument("--coll", dest="coll_opt", metavar="COLLECTIVE", help="the collective, as a flag")
    g = p.add_argument_group("nccl-tests flags")
    g.add_argument("-b", "--minbytes", type=_bytes, default=_bytes("32M"), metavar="BYTES",
                   help="smallest size (default 32M)")
    g.add_argument("-e", "--maxbytes", type=_bytes, default=_bytes("32M"), metavar="BYTES",
                   help="largest size (default 32M)")
    g.add_argument("-i", "--stepbytes", type=_bytes, default=_bytes("1M"), metavar="BYTES",
                   help="increment between sizes when no -f (default 1M)")
    g.add_argument("-f", "--stepfactor", type=_count(1), default=1, metavar="N",
                   help="multiply the size by N each step (default: disabled, use -i)")
    g.add_argument("-n", "--iters", type=_count(1), default=20, metavar="N",
                   help="timed iterations per size (default 20)")
    g.add_argument("-w", "--warmup_iters", type=_count(0), default=5, metavar="N",
                   help="untimed iterations before them (default 5)")
    g.add_argument("-c", "--check", type=_count(0), default=1, metavar="N",
                   help="iterations whose results are checked (default 1; 0: no check)")
    g.add_argument("-o", "--op", default="sum", metavar="OP",
                   help=f"reduction: {'/'.join(cases.OPS)}/all (default sum)")
    g.add_argument("-d", "--datatype", default="float", metavar="TYPE",
                   help=f"{'/'.join(cases.TYPES)}/all (default float)")
    g.add_argument("-r", "--root", default="0", metavar="ROOT",
                   help="root of reduce and broadcast, or all (default 0)")
    g.add_argument("-a", "--average", type=int, choices=range(4), default=1, metavar="0-3",
                   help=f"how ranks' times combine: {AVERAGES} (default 1)")
    h = p.add_argument_group("hpccoll")
    h.add_argument("--library", choices=cases.LIBRARIES, default="hpccoll",
                   help="the library under test (default hpccoll; mpi: mpi4py's collectives)")
    h.add_argument("--compare", choices=cases.LIBRARIES, default=None,
                   help="a baseline library measured in the same run (ratio = its time / ours); "
                        "with --device gpu the mpi baseline needs a CUDA-aware MPI")
    h.add_argument("--policy", choices=policies, default=None,
                   help="hpccoll's scheduling policy (default: HPCCOLL_POLICY or preemptive)")
    h.add_argument("--set", dest="knobs", action="append", default=[], metavar="NAME=VALUE",
                   help="an hpccoll setting (see python -m hpccoll config), repeatable")
    h.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                   help="hpccoll watchdog: a collective without progress this long raises (default 300)")
    h.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                   help="where the buffers live (gpu: CuPy arrays on the rank's GPU)")
    h.add_argument("--progress", choices=("auto", "on", "off"), default="auto",
                   help="status line of the running measurement on rank 0 (auto: when stdout is a "
                        "terminal; MPICH's and Intel's mpiexec give ranks a pipe, Open MPI's a "
                        "terminal of its own whatever mpirun's output is: say on there)")
    h.add_argument("--out", metavar="FILE.h5",
                   help="write (append) the results to this HDF5 file (missing directories "
                        "are created)")
    h.add_argument("--trace", action="store_true",
                   help="also record hpccoll's engine trace of every collective into --out")
    h.add_argument("--floor", choices=("auto", "on", "off"), default="auto",
                   help="also time the MPI's own collective from C at every size, type, op and "
                        "root, in a job of its own before the sweep (hpccoll.bench.floor: the "
                        "MPI's mpicc, or IMB-MPI1); printed after the table (auto: where the "
                        f"table has at most {FLOOR_LINES} lines)")
    return p


def parse(argv, rank: int = 0) -> argparse.Namespace:
    """Parse and check everything that does not need MPI (SystemExit(2) on bad input)."""
    p = parser(rank)
    args = p.parse_args(argv)
    names = [n for n in (args.collective, args.coll_opt) if n]
    if not names:
        p.error(f"a collective is required: one of {', '.join(cases.COLLECTIVES)}")
    colls = {cases.canonical_collective(n) for n in names}
    if None in colls:
        bad = next(n for n in names if cases.canonical_collective(n) is None)
        p.error(f"collective: expected one of {', '.join(cases.COLLECTIVES)}, got {bad!r}")
    if len(colls) > 1:
        p.error(f"the positional collective and --coll differ ({names[0]} vs {names[1]})")
    args.coll = colls.pop()
    if args.minbytes > args.maxbytes:
        p.error(f"argument -b/--minbytes: {args.minbytes} is larger than -e/--maxbytes "
                f"({args.maxbytes})")
    if args.stepfactor > 1 and args.minbytes == 0:
        p.error("argument -b/--minbytes: must be > 0 with -f/--stepfactor (0 times N stays 0)")
    if args.stepfactor <= 1 and args.stepbytes == 0:
        p.error("argument -i/--stepbytes: must be > 0 when -f/--stepfactor is not set")
    # types
    if args.datatype.lower() == "all":
        args.types = [t for t in cases.TYPES if _type_ok(t)]
    else:
        t = cases.canonical_type(args.datatype)
        if t is None:
            p.error(f"argument -d/--datatype: expected one of {', '.join(cases.TYPES)} or all, "
                    f"got {args.datatype!r}")
        if not _type_ok(t):
            p.error(f"argument -d/--datatype: {t} needs the ml_dtypes package (pip install ml_dtypes)")
        args.types = [t]
    if "mpi" in (args.library, args.compare) and "bfloat16" in args.types:
        if args.datatype.lower() != "all":
            p.error("argument -d/--datatype: bfloat16 has no MPI datatype, so the mpi library "
                    "cannot run it; drop --library/--compare mpi or choose another type")
        args.types.remove("bfloat16")
    # ops
    if args.coll not in cases.REDUCING:
        args.ops = [None]
    elif args.op.lower() == "all":
        args.ops = list(cases.OPS)
    elif args.op.lower() in cases.OPS:
        args.ops = [args.op.lower()]
    else:
        p.error(f"argument -o/--op: expected one of {', '.join(cases.OPS)} or all, got {args.op!r}")
    if "avg" in args.ops and args.coll in cases.REDUCING:
        floats = [t for t in args.types if cases.TYPES[t].startswith(("float", "bfloat"))]
        if args.op.lower() == "avg" and len(floats) < len(args.types):
            p.error("argument -o/--op: avg needs a floating -d/--datatype (half, float, double, "
                    f"bfloat16), got {args.datatype}")
    # root
    if args.coll not in cases.ROOTED:
        args.roots = None
    elif args.root.lower() == "all":
        args.roots = "all"
    else:
        try:
            args.roots = [int(args.root)]
        except ValueError:
            p.error(f"argument -r/--root: expected a rank number or all, got {args.root!r}")
        if args.roots[0] < 0:
            p.error(f"argument -r/--root: expected a rank >= 0, got {args.roots[0]}")
    # libraries
    if args.compare == args.library:
        p.error(f"argument --compare: the baseline must differ from --library ({args.library})")
    args.libraries = (args.library,) + ((args.compare,) if args.compare else ())
    if args.trace and not args.out:
        p.error("argument --trace: traces go into the result file; add --out FILE.h5")
    if args.trace and "hpccoll" not in args.libraries:
        p.error("argument --trace: only hpccoll collectives have engine traces; "
                "use --library hpccoll or --compare hpccoll")
    args.overrides = _knobs(p, args.knobs)
    return args


def _type_ok(t: str) -> bool:
    try:
        cases.numpy_dtype(t)
        return True
    except ValueError:
        return False


def _knobs(p, items) -> dict:
    from ..config import SETTINGS
    by_name = {s.name: s for s in SETTINGS}
    out = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip().lower()
        if not sep or name not in by_name:
            p.error(f"argument --set: expected NAME=VALUE with NAME one of "
                    f"{', '.join(sorted(by_name))}, got {item!r}")
        if name in ("policy", "timeout", "trace"):
            p.error(f"argument --set: use --{name} for {name}")
        try:
            out[name] = by_name[name].from_text(text)
        except ValueError as exc:
            p.error(f"argument --set: {name}: {exc}")
    return out
