#!/usr/bin/env python
"""hpccoll against MPI's own allreduce with CPU-bound processes beside the job: the rows
of scripts/bench_speed.py that issue 32 sets targets for (float32 allreduce of 1 MiB and
16 MiB, ordinary and registered buffers, against MPI's own on the same data in the same
job, interleaved, medians of the slowest rank), rerun as several jobs with 0, 1 and 2
burners (a process spinning in a loop) started beside each job:

    python scripts/bench_load.py [--jobs 5] [--iters 20] [--loads 0,1,2] [--np 2]

Not under mpiexec: it starts the jobs (mpiexec -n NP, MPIEXEC_TIMEOUT set) and the
burners itself, and kills every burner when its job ends (each also ends by itself
after the job's time limit).  Per load and row it prints the median over jobs of the
ratio MPI time / hpccoll time (> 1: hpccoll faster), the worst job's ratio, every job's
ratio, and the medians of the times; and the background: CPU time on the machine that
was neither the jobs' nor the burners' (other users of a shared machine), in CPUs.
Every result is checked; exit status 1 if any job failed or any result was wrong.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROWS = [(1 << 20, False), (16 << 20, False), (1 << 20, True), (16 << 20, True)]
TARGET = (0.8, 0.5)        # issue 32, one burner: median over jobs >= 0.8x, no job < 0.5x


def job(iters: int) -> int:
    """One job, under mpiexec: bench_speed's rows, one "ROW" line each on rank 0."""
    sys.path.insert(0, str(HERE))
    import bench_speed          # noqa: E402  (the same cases and timing as that script)
    import hpccoll
    from mpi4py import MPI
    mpi = MPI.COMM_WORLD
    out = []
    with hpccoll.init(timeout=120) as ctx:
        for nbytes, registered in ROWS:
            ours, theirs, check, _ = bench_speed.case(ctx, mpi, "allreduce", nbytes, registered)
            t_ours, t_mpi = bench_speed.timed(mpi, [ours, theirs], iters)
            ok = mpi.allreduce(bool(check()), op=MPI.LAND)
            out.append(f"ROW {nbytes} {int(registered)} {t_ours:.9f} {t_mpi:.9f} {int(ok)}")
    if mpi.rank == 0:
        print("\n".join(out), flush=True)
    return 0


BURN = "import time\nend = time.time() + {limit}\nwhile time.time() < end:\n    pass\n"


def _busy_seconds() -> float:
    """Busy CPU seconds of the whole machine so far (/proc/stat)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]] + [0] * 8
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / os.sysconf("SC_CLK_TCK")


def _children_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_job(np_: int, iters: int, burners: int, limit: float, pids: list):
    """One job with ``burners`` CPU-bound processes beside it (their pids appended to
    ``pids``): ({(nbytes, registered): (t_ours, t_mpi, ok)} or None if the job failed,
    its output, background CPUs)."""
    env = dict(os.environ, MPIEXEC_TIMEOUT=str(int(limit)))
    cmd = ["mpiexec", "-n", str(np_), sys.executable, str(Path(__file__).resolve()), "--job",
           "--iters", str(iters)]
    busy0, kids0, t0 = _busy_seconds(), _children_seconds(), time.monotonic()
    procs = []
    try:
        for _ in range(burners):
            procs.append(subprocess.Popen([sys.executable, "-c", BURN.format(limit=limit + 30)]))
            pids.append(procs[-1].pid)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=limit + 30)
            text, code = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            text, code = f"timed out after {exc.timeout:g} s", -1
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
    wall = time.monotonic() - t0
    background = max(0.0, (_busy_seconds() - busy0) - (_children_seconds() - kids0)) / wall
    rows = {}
    for ln in text.splitlines():
        if ln.startswith("ROW "):
            _, nbytes, reg, a, b, ok = ln.split()
            rows[(int(nbytes), bool(int(reg)))] = (float(a), float(b), ok == "1")
    if code != 0 or len(rows) != len(ROWS):
        return None, text, background
    return rows, text, background


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=5, help="jobs per load (default 5)")
    ap.add_argument("--iters", type=int, default=20, help="timed iterations per row and job (default 20)")
    ap.add_argument("--loads", default="0,1,2", help="burners beside the job, comma-separated (default 0,1,2)")
    ap.add_argument("--np", type=int, default=2, help="ranks per job (default 2)")
    ap.add_argument("--limit", type=float, default=300, help="seconds a job may take (default 300)")
    ap.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.job:
        return job(args.iters)
    loads = [int(x) for x in args.loads.split(",")]
    results, failed = {}, False
    print(f"hpccoll vs MPI's own allreduce beside CPU-bound processes: {args.np} ranks on "
          f"{os.cpu_count()} CPUs, {args.jobs} jobs per load, {args.iters} iterations per row",
          flush=True)
    for burners in loads:
        for j in range(args.jobs):
            pids = []
            rows, text, background = run_job(args.np, args.iters, burners, args.limit, pids)
            if rows is None:
                failed = True
                print(f"# job {j + 1} with {burners} burner(s) FAILED:\n{text[-2000:]}", flush=True)
                continue
            failed |= not all(ok for _, _, ok in rows.values())
            results.setdefault(burners, []).append((rows, background))
            print(f"# {burners} burner(s), job {j + 1}: " + ", ".join(
                f"{_name(k)} {b / a:.2f}" for k, (a, b, _) in rows.items())
                + f"; background {background:.2f} CPUs"
                + (f"; burners (ended) {' '.join(map(str, pids))}" if pids else ""), flush=True)
    print("ratio = MPI time / hpccoll time per job (> 1: hpccoll faster); times: medians "
          "over jobs of each job's median (us)")
    print(f"{'burners':>7}  {'buffers':<10}{'size':>7}{'median':>8}{'worst':>7}"
          f"{'hpccoll us':>12}{'MPI us':>9}  jobs' ratios (in job order)    check")
    for burners, jobs in results.items():
        for key in ROWS:
            per = [rows[key] for rows, _ in jobs]
            ratios = [b / a for a, b, _ in per]
            ok = all(c for _, _, c in per)
            print(f"{burners:>7}  {_name(key):<17}{statistics.median(ratios):>8.2f}"
                  f"{min(ratios):>7.2f}{statistics.median(a for a, _, _ in per) * 1e6:>12.0f}"
                  f"{statistics.median(b for _, b, _ in per) * 1e6:>9.0f}  "
                  f"{' '.join(f'{r:.2f}' for r in ratios):<30} {'ok' if ok else 'WRONG'}")
        bg = [b for _, b in jobs]
        print(f"{'':>7}  background while these jobs ran: {statistics.median(bg):.2f} CPUs "
              f"(median), {max(bg):.2f} (most)")
    if 1 in results:
        met = sum(statistics.median(b / a for a, b, _ in (rows[k] for rows, _ in results[1]))
                  >= TARGET[0] and min(b / a for a, b, _ in (rows[k] for rows, _ in results[1]))
                  >= TARGET[1] for k in ROWS)
        print(f"issue 32's target with one burner (median >= {TARGET[0]}x, no job below "
              f"{TARGET[1]}x): met by {met} of {len(ROWS)} rows")
    return 1 if failed else 0


def _name(key) -> str:
    nbytes, registered = key
    return f"{'registered' if registered else 'ordinary':<10}{nbytes >> 20:>4} MiB"


if __name__ == "__main__":
    sys.exit(main())
