"""hpccoll-report: compare, plot and export hpccoll result files (HDF5).

    hpccoll-report r.h5                          # tables: every series vs the mpi baseline
    hpccoll-report chaos.h5 profile.h5           # any kind of run: its summary
    hpccoll-report today.h5 --baseline last.h5   # this run vs an earlier one
    hpccoll-report r.h5 --plot out/              # busbw, latency and ratio plots (PNG)
    hpccoll-report r.h5 --chrome-trace t.json    # engine traces for Perfetto / chrome://tracing

A series is one library (and policy) of one benchmark run.  Each series is compared with
its baseline: by default the mpi series of the same run (files written with --compare
mpi), else the first series read; --baseline LIB[/POLICY] or FILE[:LIB[/POLICY]] picks
another.  Runs of other kinds (chaos, tuning.profile, tuning.simulate, ...) are printed
after the benchmark tables, each as its tool summarizes it.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Optional

from .data import STATS, ReportError, baselines, load, read_runs


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hpccoll-report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", metavar="FILE.h5",
                   help="result files (hpccoll-bench, chaos, hpccoll-tune ... --out)")
    p.add_argument("--baseline", metavar="SPEC",
                   help="what ratios compare with: mpi, hpccoll, hpccoll/POLICY, or FILE[:LIB[/POLICY]]")
    p.add_argument("--stat", choices=sorted(STATS), default="mean",
                   help="statistic over the iterations used for time and bandwidth (default mean, as "
                        "nccl-tests; p10 and p90 show the spread hpccoll-bench prints)")
    p.add_argument("--coll", metavar="COLLECTIVE", help="only this collective")
    p.add_argument("--plot", metavar="DIR", help="write PNG plots into DIR (created if missing)")
    p.add_argument("--chrome-trace", metavar="FILE.json",
                   help="write the engine traces (hpccoll-bench --trace) as Chrome trace-event JSON")
    p.add_argument("--phase", choices=("all", "warmup", "timed", "check"), default="all",
                   help="with --chrome-trace: only collectives of this benchmark phase")
    p.add_argument("--quiet", action="store_true", help="no tables or summaries")
    return p


def export_trace(series, path: str, phase: str = "all", coll: Optional[str] = None) -> int:
    """Write every traced run's collectives into one Chrome trace file; returns the number
    of collective slices written."""
    from ..timeline import chrome_trace, first_time
    runs, seen = [], set()
    for s in series:
        if id(s.run) not in seen:
            seen.add(id(s.run))
            runs.append((s.run, s.run_label))
    events, pid_base, n = [], 0, 0
    records = []
    for run, label in runs:
        recs = [r for name, rows in run.traces.items() if coll in (None, name) for r in rows
                if phase == "all" or r.get("phase") == phase]
        if recs:
            records.append((label, recs))
    if not records:
        names = ", ".join(sorted({r.file for r, _ in runs}))
        raise ReportError(f"--chrome-trace: no engine traces in {names} (record them with "
                          "hpccoll-bench --trace --out FILE.h5)")
    t0 = min(first_time(recs) for _, recs in records)   # one time axis for every run
    other = {}
    for label, recs in records:
        doc = chrome_trace(recs, label if len(records) > 1 else "", pid_base, t0)
        events += doc["traceEvents"]
        other = doc["otherData"]
        n += sum(1 for e in doc["traceEvents"] if e["ph"] == "X")
        pid_base += 1 + max(int(r["rank"]) for r in recs)
    with open(path, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}, f)
    return n


def run(args) -> int:
    loaded = [(path, read_runs(path)) for path in args.files]
    series = load(args.files, loaded)
    others = [r for _, runs in loaded for r in runs if r.kind != "bench"]
    if args.coll:
        from ..bench.cases import canonical_collective
        coll = canonical_collective(args.coll)
        if coll is None:
            raise ReportError(f"--coll: unknown collective {args.coll!r}")
        for s in series:
            s.rows = [r for r in s.rows if r["coll"] == coll]
        series, others = [s for s in series if s.rows], []
        args.coll = coll
    if not series and not others:
        raise ReportError(f"no {'benchmark ' if args.coll else ''}results in {', '.join(args.files)}"
                          + (f" for {args.coll}" if args.coll else ""))
    if series:
        bench_tables(series, args)
    else:
        wanted = [o for o, v in (("--baseline", args.baseline), ("--plot", args.plot),
                                 ("--chrome-trace", args.chrome_trace)) if v]
        if wanted:
            raise ReportError(f"{', '.join(wanted)}: no benchmark results in {', '.join(args.files)}")
    if not args.quiet:
        from .kinds import summarize
        for run in others:
            print("#\n" + "\n".join(summarize(run)), flush=True)
    return 0


def bench_tables(series, args) -> None:
    series, baseline_of = baselines(series, args.baseline, args.files)
    if not args.quiet:
        from .tables import compare
        print("\n".join(compare(series, baseline_of, args.stat)), flush=True)
    if args.plot:
        from .plots import draw
        for path in draw(series, baseline_of, args.plot, args.stat):
            print(f"# wrote {path}")
    if args.chrome_trace:
        n = export_trace(series, args.chrome_trace, args.phase, args.coll)
        print(f"# wrote {args.chrome_trace}: {n} collectives (open it in ui.perfetto.dev "
              "or chrome://tracing)")


def main(argv: Optional[list] = None) -> int:
    args = parser().parse_args(argv)
    try:
        return run(args)
    except ReportError as exc:
        print(f"hpccoll-report: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:      # hpccoll-report r.h5 | head
        sys.stderr.close()
        return 0
