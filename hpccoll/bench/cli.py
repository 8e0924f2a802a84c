"""hpccoll-bench: set up devices and hpccoll, print the nccl-tests table while the sweep
measures it, log every row, and turn any rank's failure into an abort of the world
(the flags are in args.py, the measuring in runner.py)."""
from __future__ import annotations

import math
import os
import sys
from typing import Optional

import numpy as np

from ..h5log import WriteFailed
from . import cases, floor
from .args import AVERAGES, FLOOR_LINES, UsageError, parse
from .load import SPREAD_BOUND, Probe, assess
from .table import float_str, footer, header, line, spread_block


# -- devices --------------------------------------------------------------------------------
def _setup_device(device: str, mpi):
    """(array module, synchronize function, GPU model) for --device, or UsageError on every
    rank if any rank lacks what it needs.  GPU results are never emulated on the host."""
    if device == "cpu":
        return np, (lambda: None), ""
    problem, model, xp = None, "", None
    try:
        import cupy as xp
        ndev = xp.cuda.runtime.getDeviceCount()
        if ndev < 1:
            raise RuntimeError("no CUDA device is visible")
        from mpi4py import MPI
        local = mpi.Split_type(MPI.COMM_TYPE_SHARED)
        dev = local.Get_rank() % ndev
        local.Free()
        xp.cuda.Device(dev).use()
        model = xp.cuda.runtime.getDeviceProperties(dev)["name"]
        model = model.decode() if isinstance(model, bytes) else str(model)
    except ImportError:
        problem = "CuPy is not installed (pip install 'hpccoll[gpu]' on a machine with a CUDA GPU)"
    except Exception as exc:   # CUDA runtime errors: no driver, no device
        problem = f"no usable CUDA GPU ({exc})"
    problems = mpi.allgather(problem)
    bad = [(r, m) for r, m in enumerate(problems) if m]
    if bad:
        raise UsageError(f"argument --device gpu: rank {bad[0][0]}: {bad[0][1]}")
    stream_sync = lambda: xp.cuda.get_current_stream().synchronize()
    return xp, stream_sync, model


# -- the run ----------------------------------------------------------------------------------
def _banner(args, plan, mpi, gpu_model) -> list[str]:
    from .._version import __version__
    from ..transport.mpi import library_name
    step = f"{args.stepfactor}(factor)" if args.stepfactor > 1 else f"{args.stepbytes}(bytes)"
    lib = library_name()
    under = args.library + (f" (policy {plan.policy})" if args.library == "hpccoll" else "")
    base = f", baseline: {args.compare}" if args.compare else ""
    lines = [f"# hpccoll-bench {__version__}: {under}{base}; MPI: {lib}",
             f"# Collective test starting: {args.coll}",
             f"# nThread 1 nGpus 1 minBytes {args.minbytes} maxBytes {args.maxbytes} step: {step} "
             f"warmup iters: {args.warmup_iters} iters: {args.iters} agg iters: 1 "
             f"validation: {args.check} graph: 0",
             f"# nRanks {mpi.Get_size()} device: {args.device} average: {args.average} "
             f"({AVERAGES.split(', ')[args.average]})",
             "#", "# Using devices"]
    import socket
    me = (socket.gethostname(), os.getpid(), gpu_model or "cpu")
    for r, (host, pid, dev) in enumerate(mpi.gather(me, root=0) or []):
        lines.append("#  Rank %2d Group %2d Pid %6d on %10s device %s" % (r, 0, pid, host, dev))
    return lines


def run(args, mpi) -> int:
    from ..config import resolve
    from .runner import Plan
    size = mpi.Get_size()
    if args.roots == "all":
        args.roots = list(range(size))
    elif args.roots and args.roots[0] >= size:
        raise UsageError(f"argument -r/--root: expected a rank in [0, {size}), got {args.roots[0]}")
    xp, sync, gpu_model = _setup_device(args.device, mpi)
    # the MPI's own from C first, in a job of its own while these ranks sleep
    c_floor = _floor(args, mpi, size) if args.device == "cpu" else None
    ctx = None
    if "hpccoll" in args.libraries:
        import hpccoll
        ctx = hpccoll.init(policy=args.policy, timeout=args.timeout, trace=args.trace,
                           **args.overrides)
    try:
        settings = ctx.settings if ctx else resolve(dict(args.overrides, policy=args.policy))
        plan = Plan(args.coll, cases.sizes(args.minbytes, args.maxbytes, args.stepbytes,
                                           args.stepfactor),
                    args.types, args.ops, args.roots or [-1], args.iters, args.warmup_iters,
                    args.check, args.average, args.libraries, settings.policy)
        writer = _open_writer(args, mpi, settings, plan, gpu_model)
        try:
            code = _sweep(args, plan, mpi, ctx, xp, sync, gpu_model, writer, c_floor)
        except BaseException as exc:
            if writer is not None and writer.failure is None:
                status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
                try:
                    path = writer.close(status, f"{type(exc).__name__}: {exc}")
                    print(f"# partial results ({status}) kept in {path}", file=sys.stderr, flush=True)
                except WriteFailed as lost:
                    print(f"hpccoll-bench: error: {lost}", file=sys.stderr, flush=True)
            raise
        saved = _close_writer(writer, code)
        # every rank exits alike: 1 also where rank 0 could not save the results
        code = mpi.bcast(code if saved else max(code, 1), root=0)
    except UsageError:
        if ctx is not None:
            ctx.close()          # every rank raised it alike: closing together is safe
        raise
    # Any other error skips close(): it is collective and would wait for ranks that may
    # be stuck in a collective; main() aborts the world instead.
    if ctx is not None:
        ctx.close()
    return code


def _close_writer(writer, code: int) -> bool:
    """Rank 0: land the run and say where it went; False where it could not be saved
    (WriteFailed: its message names the space problem and where the data is)."""
    if writer is None:
        return True
    if writer.failure is not None:     # stderr said so when it happened
        print(f"# Results not written to {writer.path}: {writer.failure}", flush=True)
        return False
    try:
        path = writer.close("complete" if code == 0 else "wrong-results")
    except WriteFailed as exc:
        print(f"hpccoll-bench: error: {exc}", file=sys.stderr, flush=True)
        print(f"# Results not written to {writer.path}: {exc}", flush=True)
        return False
    print(f"# Results written to {path} (run {writer.name})", flush=True)
    return True


def _open_writer(args, mpi, settings, plan, gpu_model):
    """Rank 0's RunWriter (None elsewhere or without --out).  Collective: every rank learns
    whether rank 0 could open the file."""
    if not args.out:
        return None
    from .. import h5log
    attrs = h5log.environment_attrs(mpi, settings=settings, device=args.device, gpu_model=gpu_model)
    writer, problem = None, None
    if mpi.Get_rank() == 0:
        attrs.update(tool="hpccoll-bench", collective=plan.coll, libraries=list(plan.libraries),
                     library=args.library, baseline=args.compare or "", minbytes=args.minbytes,
                     maxbytes=args.maxbytes, stepbytes=args.stepbytes, stepfactor=args.stepfactor,
                     iters=plan.iters, warmup_iters=plan.warmup, check=plan.check,
                     average=plan.average, types=plan.types, ops=[o or "none" for o in plan.ops],
                     roots=plan.roots, traced=bool(args.trace))
        try:
            writer = h5log.RunWriter(args.out, plan.coll, attrs, kind="bench")
        except (OSError, ValueError) as exc:
            problem = f"argument --out: cannot write {args.out}: {exc}"
    problem = mpi.bcast(problem, root=0)
    if problem:
        raise UsageError(problem)
    return writer


def _terminal(out) -> bool:
    """Whether ``out`` is a person's terminal.  Open MPI's launcher gives every rank a
    pseudo-terminal of its own, whatever its own output is (a pipe, a file): there a
    rank cannot tell."""
    return out.isatty() and "OMPI_COMM_WORLD_SIZE" not in os.environ


def _floor_case(coll: str, type_name: str, op, root: int, shape):
    """The floor.case of one table line: the contract's names and counts."""
    return floor.case("reduce_scatter" if coll == "reducescatter" else coll, shape.count,
                      cases.TYPES[type_name], op, max(root, 0))


def _floor(args, mpi, nranks: int):
    """Every line's floor.case timed from C (floor.in_job: collective); None for --floor
    off, or auto past FLOOR_LINES lines."""
    sizes = cases.sizes(args.minbytes, args.maxbytes, args.stepbytes, args.stepfactor)
    lines = len(sizes) * len(args.types) * len(args.ops) * len(args.roots or [-1])
    if args.floor == "off" or args.floor == "auto" and lines > FLOOR_LINES:
        return None
    want = [_floor_case(args.coll, t, o, r, cases.shape(args.coll, n, np.dtype(
                cases.TYPES[t]).itemsize, nranks))
            for n in sizes for t in args.types for o in args.ops for r in (args.roots or [-1])
            if cases.TYPES[t] in floor.DTYPES]
    return floor.in_job(mpi, want, iters=args.iters, warmup=args.warmup_iters)


def _floor_block(c_floor, lines: list, main_lib: str) -> list:
    """The C floor after the table, as '#' comments (nccl-tests readers skip them), and
    its rows for the result file."""
    if c_floor is None:
        return [], []
    if not c_floor.source:
        return ["#", f"# The MPI's own from C: not measured ({c_floor.note})"], []
    texts = ["#", f"# The MPI's own collective called from C ({c_floor.source}; the same MPI, "
                  f"ranks and sizes): the floor under Python; C mt after MPI_Init_thread("
                  f"MULTIPLE), as mpi4py and hpccoll initialize MPI, C after MPI_Init; the "
                  f"ratio of medians, out of place",
             "# %10s  %8s  %6s  %6s  %9s  %8s  %10s" % (
                 "size", "type", "redop", "root", "C mt (us)", "C (us)", f"{main_lib}/C mt")]
    rows = []
    for nbytes, type_name, op, root, case, time_us in lines:
        t, single = c_floor.get(case), c_floor.get(case, "single")
        texts.append("#%11d  %8s  %6s  %6d  %9s  %8s  %10s" % (
            nbytes, type_name, op, root, float_str(t, 9), float_str(single, 8),
            float_str(time_us / t, 10)))
        rows.append({"size": nbytes, "type": type_name, "redop": op, "root": root,
                     "time_us": t, "single_us": c_floor.get(case, "single"),
                     "source": c_floor.source})
    return texts, rows


def _sweep(args, plan, mpi, ctx, xp, sync, gpu_model, writer, c_floor=None) -> int:
    """Print the table while measuring it, log every row; the exit status (same on all ranks)."""
    from .runner import Progress, Sweep, trace_rows
    rank = mpi.Get_rank()
    out = sys.stdout
    baseline = args.compare
    say = (lambda text: (out.write(text + "\n"), out.flush())) if rank == 0 else (lambda text: None)
    for text in _banner(args, plan, mpi, gpu_model) + header(baseline):
        say(text)
    progress = Progress(rank == 0 and (args.progress == "on" or
                                       (args.progress == "auto" and _terminal(out))))
    sweep = Sweep(plan, mpi, ctx and ctx.world, ctx, xp, sync, progress)
    table = writer.table(plan.coll) if writer else None
    traces = writer.table(plan.coll, kind="traces") if writer and args.trace else None
    busbw, base_busbw, ratios, chosen, spreads, floors = [], [], [], {}, [], []
    wrong = {lib: 0 for lib in plan.libraries}
    L = len(plan.libraries)
    probe = Probe(mpi)
    probe.start()
    for ln in sweep.lines():
        if rank != 0:
            continue
        progress.clear()
        cols, extra = [], []
        for k in range(2):
            main_row = ln.rows[k * L]
            cols.append((main_row["time_us"], main_row["algbw"], main_row["busbw"],
                         main_row["wrong"] if plan.check else None))
            busbw.append(main_row["busbw"])
            for j, lib in enumerate(plan.libraries):
                wrong[lib] += max(0, ln.rows[k * L + j]["wrong"])
            if baseline:
                b = ln.rows[k * L + 1]
                ratio = b["time_us"] / main_row["time_us"]
                extra.append((b["time_us"], b["busbw"], ratio))
                base_busbw.append(b["busbw"])
                ratios.append(ratio)
        say(line(ln.shape.nbytes, ln.shape.count, ln.type_name, ln.op or "none", ln.root,
                 cols, extra))
        floors.append((ln.shape.nbytes, ln.type_name, ln.op or "none", ln.root,
                       _floor_case(plan.coll, ln.type_name, ln.op, ln.root, ln.shape),
                       ln.rows[0]["median_us"]))
        picked = "/".join(dict.fromkeys(a for a in ln.algos if a))
        if picked:
            chosen.setdefault(ln.shape.nbytes, picked)
        spreads.append((ln.shape.nbytes, ln.type_name, ln.op or "none", ln.root, ln.rows))
        if table is not None:
            try:
                first = len(table)
                table.append(ln.rows)
                if traces is not None:
                    for k in range(2):
                        row = first + k * L + plan.libraries.index("hpccoll")
                        traces.append(trace_rows(ln.traces[k], row, plan.warmup, plan.iters))
            except WriteFailed as exc:
                # the table printed is still a result: measure on, write no more
                print(f"hpccoll-bench: error: {exc}; the measurement goes on, its table is "
                      "on stdout only", file=sys.stderr, flush=True)
                table = traces = None
    hosts = probe.stop()
    progress.clear()
    if rank == 0:
        _spread_and_load(say, plan, spreads, hosts, writer)
        texts, rows = _floor_block(c_floor, floors, plan.libraries[0])
        for text in texts:
            say(text)
        if writer is not None and writer.failure is None and c_floor is not None:
            try:
                writer.set_attrs(floor_source=c_floor.source, floor_note=c_floor.note)
                if rows:
                    writer.table("floor").append(rows)
            except WriteFailed as exc:
                print(f"hpccoll-bench: error: {exc}", file=sys.stderr, flush=True)
    main_lib = plan.libraries[0]
    avg = float(np.mean(busbw)) if busbw else 0.0
    geo = float(math.exp(np.mean(np.log(ratios)))) if ratios else 0.0
    texts = footer(wrong[main_lib], avg, plan.coll, baseline,
                   float(np.mean(base_busbw)) if base_busbw else 0.0, geo)
    if chosen:    # which candidate each size used (out-of-place/in-place where they differ)
        from ..timing import human_bytes
        texts.insert(-2, "# hpccoll algorithm by size : " + ", ".join(
            f"{human_bytes(n)} {a}" for n, a in chosen.items())
            + f" (calibration: {ctx.calibration_note})")
    for text in texts:
        say(text)
    if baseline and wrong[baseline]:
        say(f"# Baseline {baseline} out of bounds values : {wrong[baseline]} FAILED")
    failed = mpi.bcast(sum(wrong.values()) if rank == 0 else None, root=0)
    return 1 if failed else 0


def _spread_and_load(say, plan, lines, hosts, writer) -> None:
    """Rank 0, after the table: the spread of every measurement, and a warning for
    every sign of a loaded machine (load.py), also kept in the result file."""
    from ..timing import human_bytes
    entries, spreads = [], []
    L = len(plan.libraries)
    for nbytes, type_name, op, root, line_rows in lines:
        for j, lib in enumerate(plan.libraries):
            rows = [line_rows[k * L + j] for k in range(2)]
            entries.append((nbytes, type_name, op, root, lib,
                            [(r["p10_us"], r["median_us"], r["p90_us"]) for r in rows]))
            for r in rows:
                what = f"{lib} {human_bytes(nbytes)} {r['placement']}"
                if len(plan.types) > 1 or len(plan.ops) > 1:
                    what += f" {type_name} {op}"
                spreads.append((what, r["p10_us"], r["p90_us"]))
    for text in spread_block(entries, plan.iters, SPREAD_BOUND):
        say(text)
    warnings = assess(hosts or [], spreads)
    for text in warnings:
        say(f"# WARNING: {text}")
    if writer is not None and writer.failure is None:
        try:
            writer.set_attrs(load=[h.as_dict() for h in hosts or []], load_warnings=warnings,
                             spread_bound=SPREAD_BOUND)
        except WriteFailed as exc:
            print(f"hpccoll-bench: error: {exc}", file=sys.stderr, flush=True)


def main(argv: Optional[list] = None) -> int:
    from ..core.context import mpi as _mpi
    MPI = _mpi()      # MPI_THREAD_MULTIPLE, as hpccoll needs; before parsing: errors print on rank 0
    mpi = MPI.COMM_WORLD
    rank = mpi.Get_rank()
    args = parse(sys.argv[1:] if argv is None else argv, rank)
    try:
        return run(args, mpi)
    except UsageError as exc:
        if rank == 0:
            print(f"hpccoll-bench: error: {exc}", file=sys.stderr, flush=True)
        return 2
    except BaseException as exc:
        # ranks other than 0 wait a moment, so that rank 0 (which usually fails alike)
        # can move its result file into place
        from ..jobs import abort_job   # (the job's end: MPI only then)
        return abort_job(exc, "hpccoll-bench", 2.0 if rank != 0 and args.out else 0.0)
