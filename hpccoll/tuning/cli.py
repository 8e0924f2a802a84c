"""``hpccoll-tune``: calibrate the algorithm choice, profile this machine, plan a
workload, simulate the methods.

    mpiexec -n 2 hpccoll-tune calibrate [--out FILE] [--ranks 2,4] [--sizes 8,64K,1M]
    mpiexec -n 2 hpccoll-tune profile --out results/profile.h5 [--blocks 1,2|default]
    hpccoll-tune plan --profile results/profile.h5 --model resnet50
    hpccoll-tune simulate [--models resnet50,vgg16] [--gbps 10,50,100] [--out F.h5] [--png F.png]
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback

from .. import h5log
from ..errors import ArgumentError, HpcCollError, RankFailed
from ..timing import parse_bytes


def _ints(text: str, what: str) -> list:
    try:
        return [parse_bytes(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ArgumentError(f"{what}: expected comma-separated numbers, got {text!r}") from None


def _measuring(prog: str, out: str, timeout, body, finish) -> int:
    """The shape of every measuring command, on every rank: check ``out`` on rank 0 before
    measuring, run ``body(world, held)`` (it puts its context in ``held["ctx"]`` as soon
    as it has one, and returns the arguments of ``finish``), settle rank-local errors
    together, close the context, then ``finish(...)`` on rank 0."""
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    try:
        sync = world.Dup()          # the agreement's own: no other collective can wait on it
        held, error, result = {}, None, None
        try:
            problem = world.bcast(h5log.append_problem(out) if world.rank == 0 else None, root=0)
            if problem:                     # known before measuring, on every rank
                raise ArgumentError(f"--out: {problem}")
            result = body(world, held)
        except Exception as exc:
            error = exc
            if not isinstance(exc, HpcCollError):
                traceback.print_exc()
        # a rank-local error must not leave the others in a collective: settle it together
        # (or abort the job, when the others are stuck in one this rank skipped)
        try:
            from ..jobs import agree    # (MPI is running by now)
            agree(sync, error, prog, timeout=timeout or 60.0)
        except RankFailed as exc:
            if held.get("ctx") is not None:
                held["ctx"].close()          # every rank is here
            if world.rank == 0:
                print(f"{prog}: {exc}", file=sys.stderr)
            return 2
        finally:
            sync.Free()
        held["ctx"].close()
        if world.rank == 0:
            try:
                finish(*result)
            except h5log.WriteFailed as exc:  # its message says why and where the data is
                print(f"{prog}: error: {exc}", file=sys.stderr, flush=True)
                return 1
        return 0
    except BaseException as exc:
        from ..jobs import abort_job
        return abort_job(exc, prog)


def cmd_profile(args) -> int:
    import hpccoll
    from .profiler import measure
    from .store import environment

    def body(world, held):
        ctx = held["ctx"] = hpccoll.init(timeout=args.timeout)
        blocks = world.bcast(_blocks(args, ctx), root=0)   # cpu_count may differ by node
        env = environment(world, settings=ctx.settings, device=args.device)
        prof = measure(ctx, _ints(args.sizes, "--sizes"), blocks, repeats=args.repeats,
                       kernel_size=args.kernel_size, rounds=args.rounds, device=args.device,
                       contend_bytes=parse_bytes(args.contend_bytes))
        return prof, env

    def finish(prof, env):
        path = prof.save(args.out, env)
        print("\n".join(prof.table()))
        print(f"profile written to {path}")

    return _measuring("hpccoll-tune profile", args.out, args.timeout, body, finish)


def cmd_calibrate(args) -> int:
    import hpccoll
    from ..algorithms.calibration import default_path
    from ..core import calibrate
    from .store import environment
    out = args.out or default_path()

    def body(world, held):
        sizes = _ints(args.sizes, "--sizes")
        colls = _names(args.collectives, calibrate.COLLECTIVES, "--collectives")
        kinds = _names(args.buffers, ("host", "registered"), "--buffers")
        ranks = (sorted({1 << k for k in range(1, world.size.bit_length())} | {world.size})
                 if args.ranks == "pow2" else _ints(args.ranks, "--ranks") or [world.size])
        if args.rounds < 1 or args.round_ms <= 0:
            raise ArgumentError("--rounds: expected >= 1; --round-ms: expected > 0")
        # the table measures hpccoll's candidates, not a table loaded before
        ctx = held["ctx"] = hpccoll.init(timeout=args.timeout, calibration="off")
        env = environment(world, settings=ctx.settings)
        cal = calibrate.measure(ctx, sizes, colls, kinds, ranks, args.rounds,
                                args.round_ms / 1e3, log=print if args.verbose else None)
        return cal, env

    def finish(cal, env):
        path = cal.save(out, env)
        print("\n".join((cal.timings() if args.verbose else []) + cal.table()))
        how = "by default" if path == default_path() else f"with HPCCOLL_CALIBRATION={path}"
        print(f"calibration appended to {path}; hpccoll.init loads it {how}")

    return _measuring("hpccoll-tune calibrate", out, args.timeout, body, finish)


def _names(text: str, allowed, what: str) -> list:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise ArgumentError(f"{what}: expected names from {', '.join(allowed)}, got {text!r}")
    return names


def _blocks(args, ctx) -> list:
    from .profiler import blocks_supported
    if args.blocks == "default":
        return [0]
    if args.blocks != "auto":
        return _ints(args.blocks, "--blocks")
    if not blocks_supported(ctx.world):
        raise HpcCollError(
            "blocks: this hpccoll build's allreduce has no blocks= keyword (builds before "
            "numba_kernels); pass --blocks default to profile the library's own allocation")
    # the library's own choice (0) competes too: on the host it is NumPy's single thread
    top = args.max_blocks or (os.cpu_count() or 1)
    return [0] + [1 << k for k in range(top.bit_length()) if (1 << k) <= top]


def cmd_plan(args) -> int:
    from . import baselines, layers
    from .planner import plan
    from .profile import Profile
    from .simulate import simulate
    prof = Profile.load(args.profile)
    work = layers.workload(args.model)
    res = plan(work, prof, grid=args.grid)
    print(f"{args.model}: {work.n} tensors, {int(work.nbytes.sum())} bytes; profile "
          f"{args.profile} (comm {prof.sources['comm_time']}, slowdown {prof.sources['slowdown']})")
    print(f"planned: {len(res.plan.ends)} buckets, backward {res.time * 1e3:.3f} ms (model), "
          f"largest DP front {res.max_front}")
    print("  " + res.plan.describe(work))
    for name, p in baselines.plans(work, prof).items():
        print(f"{name:>12}: {simulate(work, p, prof).time * 1e3:10.3f} ms, {len(p.ends)} buckets")
    return 0


def cmd_simulate(args) -> int:
    from dataclasses import replace
    from . import layers, report
    from .store import environment
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in models if m not in layers.ARCHITECTURES]
    if bad:
        print(f"hpccoll-tune simulate: --models: unknown {bad}; choose from "
              f"{', '.join(layers.ARCHITECTURES)}", file=sys.stderr)
        return 2
    speeds = [float(x) for x in args.gbps.split(",") if x.strip()]
    if not speeds or min(speeds) <= 0:
        print("hpccoll-tune simulate: --gbps: expected positive speeds", file=sys.stderr)
        return 2
    net = replace(layers.Network(), nodes=args.nodes, block_gbps=args.block_gbps)
    dev = replace(layers.Device(), flops=args.tflops * 1e12)
    problem = args.out and h5log.append_problem(args.out)
    if problem:
        print(f"hpccoll-tune simulate: --out: {problem}", file=sys.stderr)
        return 2
    res = report.run(models, speeds, net, dev)
    print(report.table(res))
    if args.out:
        try:
            path = report.save(res, args.out, environment())
        except h5log.WriteFailed as exc:
            print(f"hpccoll-tune simulate: error: {exc}", file=sys.stderr)
            return 1
        print(f"results written to {path}")
    if args.png:
        report.plot(res, args.png)
        print(f"plot written to {args.png}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hpccoll-tune", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    q = sub.add_parser("calibrate", help="time every algorithm of every collective per size "
                                         "and save the fastest (mpiexec)")
    q.add_argument("--out", default="", help="calibration file the table is appended to "
                   "(default: the file hpccoll.init loads, ~/.cache/hpccoll/calibration.h5)")
    q.add_argument("--sizes", default="8,1K,16K,64K,256K,1M,4M,16M",
                   help="message sizes in bytes (the whole result of a rank)")
    q.add_argument("--collectives", default=",".join(
        ("allreduce", "reduce", "broadcast", "allgather", "reduce_scatter", "alltoall")))
    q.add_argument("--buffers", default="host,registered",
                   help="host (ordinary arrays), registered (ctx.empty)")
    q.add_argument("--ranks", default="",
                   help="communicator sizes to measure, e.g. 2,4 (the first ranks of the job); "
                        "'pow2': every power of two and the job's size; default: the job's size")
    q.add_argument("--rounds", type=int, default=5, help="rounds per candidate (median)")
    q.add_argument("--round-ms", type=float, default=2.0, help="least time of one round")
    q.add_argument("--timeout", type=float, default=60.0, help="watchdog timeout (s)")
    q.add_argument("-v", "--verbose", action="store_true", help="print each size as measured")
    q.set_defaults(fn=cmd_calibrate)
    q = sub.add_parser("profile", help="measure T(bytes, blocks) and compute slowdown (mpiexec)")
    q.add_argument("--out", default="results/profile.h5",
                   help="HDF5 result file the profile is appended to (plan reads the newest)")
    q.add_argument("--sizes", default="4K,64K,1M,4M,16M", help="allreduce sizes in bytes")
    q.add_argument("--blocks", default="auto",
                   help="block counts, comma-separated, 0 = the library's own choice (no "
                        "blocks=); 'auto': 0 and powers of two up to the core count; "
                        "'default': 0 only")
    q.add_argument("--max-blocks", type=int, default=None, help="largest block count for auto")
    q.add_argument("--repeats", type=int, default=10, help="timed repeats per size and block count")
    q.add_argument("--rounds", type=int, default=5, help="contention rounds per block count")
    q.add_argument("--kernel-size", type=int, default=256, help="n of the n x n matmul kernel")
    q.add_argument("--contend-bytes", default="16M", help="allreduce size run under the kernel")
    q.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    q.add_argument("--timeout", type=float, default=60.0, help="watchdog timeout (s)")
    q.set_defaults(fn=cmd_profile)
    q = sub.add_parser("plan", help="plan a model's buckets and blocks from a profile")
    q.add_argument("--profile", required=True, help="HDF5 profile (measured or model)")
    q.add_argument("--model", default="resnet50", help="resnet50, vgg16, bert_base, gpt2_small")
    q.add_argument("--grid", type=float, default=0.0, help="DP time grid in s (0: exact)")
    q.set_defaults(fn=cmd_plan)
    q = sub.add_parser("simulate", help="every method on the model tables and network speeds")
    q.add_argument("--models", default="resnet50,vgg16,bert_base,gpt2_small")
    q.add_argument("--gbps", default="10,25,50,100,200,400", help="network speeds in Gb/s")
    q.add_argument("--nodes", type=int, default=8, help="data-parallel ranks (one per node)")
    q.add_argument("--block-gbps", type=float, default=25.0, help="most one block moves (Gb/s)")
    q.add_argument("--tflops", type=float, default=12.0, help="device backward speed (TFLOP/s)")
    q.add_argument("--out", default="results/simulate.h5",
                   help="HDF5 result file the run is appended to ('' for none)")
    q.add_argument("--png", default="results/simulate.png", help="plot file ('' for none)")
    q.set_defaults(fn=cmd_simulate)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except HpcCollError as exc:     # bad input: one line, naming the argument
        print(f"hpccoll-tune {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
