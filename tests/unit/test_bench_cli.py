"""hpccoll-bench under real mpiexec: the table reads like nccl-tests output, every number in
it agrees with the HDF5 log, busbw factors hold per collective, wrong results fail the
exit status, bad arguments get one clear error, a failing rank aborts the job instead of
hanging it, and a killed run never corrupts the result file."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hpccoll.launch
from hpccoll import h5log
from hpccoll.bench import cases
from hpccoll.bench.table import float_str
from hpccoll.jobs import unlink_mpi_shm
from tests import launch, nccltests

FAULT = str(Path(__file__).parents[1] / "scripts" / "bench_fault.py")


def bench(n, *args, timeout=120):
    return launch.run(n, ["-m", "hpccoll.bench"] + [str(a) for a in args], timeout=timeout)


def printed(value, width):
    return float(float_str(value, width))


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


@pytest.fixture(scope="module")
def compare_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "r.h5"
    proc = bench(3, "allreduce", "-b", "1K", "-e", "256K", "-f", "4", "-n", "3", "-w", "1",
                 "--compare", "mpi", "--out", out, "--trace")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout, out


def test_table_parses_like_nccl_tests_and_matches_the_log(compare_run):
    text, out = compare_run
    t = nccltests.parse(text)
    sizes = [1024 * 4 ** k for k in range(5)]
    assert [r["size"] for r in t["rows"]] == sizes
    assert [r["count"] for r in t["rows"]] == [s // 4 for s in sizes]
    assert all(r["type"] == "float" and r["redop"] == "sum" and r["root"] == -1 for r in t["rows"])
    assert t["oob"] == (0, "OK")
    assert "# Collective test concluded: allreduce" in text
    # which candidate each size used: the built-in table at 3 ranks on one node (tests
    # run with calibration off); up to cell_bytes (8 KiB) cells, above shm_c_bytes (8 KiB)
    # shared memory, where C runs them
    from hpccoll.engine import code
    mid, small = ("shm", "cells") if code._native is not None else ("mpi", "mpi")
    assert (f"# hpccoll algorithm by size : 1 KiB {small}, 4 KiB {small}, 16 KiB {mid}, "
            f"64 KiB {mid}, 256 KiB shm (calibration: off)") in text
    (run,) = h5log.read(out)
    assert run.attrs["status"] == "complete" and run.attrs["nranks"] == 3
    assert run.attrs["libraries"] == ["hpccoll", "mpi"]
    rows = run.tables["allreduce"]
    assert len(rows) == len(sizes) * 4                 # 2 placements x 2 libraries
    busbw = []
    for line, k in [(r, k) for r in t["rows"] for k in range(2)]:
        place = ("oop", "ip")[k]
        mine, base = rows[t["rows"].index(line) * 4 + 2 * k], rows[t["rows"].index(line) * 4 + 2 * k + 1]
        assert (mine["library"], base["library"]) == ("hpccoll", "mpi")
        assert mine["placement"] == ("out-of-place", "in-place")[k] and mine["size"] == line["size"]
        # the printed numbers are the logged ones, rounded as nccl-tests rounds them
        assert line[f"{place}_time"] == printed(mine["time_us"], 7)
        assert line[f"{place}_base_time"] == printed(base["time_us"], 7)
        assert line[f"{place}_ratio"] == printed(base["time_us"] / mine["time_us"], 6)
        assert line[f"{place}_busbw"] == printed(mine["busbw"], 6)
        assert line[f"{place}_wrong"] == mine["wrong"] == base["wrong"] == 0
        # algbw = size / time; busbw = algbw * 2(n-1)/n, at full precision in the log
        assert rel(mine["algbw"], mine["size"] / 1e3 / mine["time_us"]) < 1e-9
        assert rel(mine["busbw"], mine["algbw"] * 4 / 3) < 1e-9
        assert rel(mine["time_us"], sum(mine["times_us"]) / 3) < 1e-9
        assert len(mine["rank_mean_us"]) == 3
        busbw.append(mine["busbw"])
    assert rel(t["avg_busbw"], sum(busbw) / len(busbw)) < 1e-4


def test_traces_cover_every_hpccoll_collective(compare_run):
    _, out = compare_run
    (run,) = h5log.read(out)
    tr = run.traces["allreduce"]
    rows = run.tables["allreduce"]
    # per rank and hpccoll row: 1 warmup + 3 timed + 1 checked collective
    per = {}
    for r in tr:
        per.setdefault((r["rank"], r["row"]), []).append(r["phase"])
        assert rows[r["row"]]["library"] == "hpccoll" and r["bytes"] == rows[r["row"]]["size"]
        assert r["t_issue"] <= r["t_start"] <= r["t_end"]
    assert len(per) == 3 * len(rows) // 2
    assert all(p == ["warmup", "timed", "timed", "timed", "check"] for p in per.values())


@pytest.mark.parametrize("coll", ["reduce", "broadcast", "allgather", "reducescatter", "alltoall"])
def test_every_collective_sizes_and_busbw_factor(coll, tmp_path):
    n = 3
    out = tmp_path / "r.h5"
    proc = bench(n, coll, "-b", "4K", "-e", "64K", "-f", "16", "-n", "2", "-w", "0",
                 "-r", "2", "-d", "int32", "--out", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    t = nccltests.parse(proc.stdout)
    per_rank = coll in cases.PER_RANK
    assert [r["size"] for r in t["rows"]] == [(s // 4 // n) * n * 4 if per_rank else s for s in (4096, 65536)]
    assert [r["count"] for r in t["rows"]] == [s // 4 // n if per_rank else s // 4 for s in (4096, 65536)]
    assert all(r["root"] == (2 if coll in cases.ROOTED else -1) for r in t["rows"])
    assert all(r["redop"] == ("sum" if coll in cases.REDUCING else "none") for r in t["rows"])
    assert t["oob"] == (0, "OK")
    factor = {"reduce": 1.0, "broadcast": 1.0}.get(coll, (n - 1) / n)
    (run,) = h5log.read(out)
    for row in run.tables[coll]:
        assert rel(row["busbw"], row["algbw"] * factor) < 1e-9
        assert row["wrong"] == 0 and row["dtype"] == "int32"
    for line in t["rows"]:
        for place in ("oop", "ip"):
            if line[f"{place}_algbw"] >= 0.1:      # printed with 2 decimals
                assert abs(line[f"{place}_busbw"] - line[f"{place}_algbw"] * factor) <= 0.011


def test_a_wrong_result_fails_the_run(tmp_path):
    out = tmp_path / "r.h5"
    proc = launch.run(2, [FAULT, "corrupt", "1", "allreduce", "-b", "64", "-e", "4K", "-f", "8",
                          "-n", "1", "-w", "0", "-c", "2", "--out", str(out)], timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    t = nccltests.parse(proc.stdout)
    # one element off on rank 1 in each of the 2 checked iterations, per size and placement
    assert all(r["oop_wrong"] == 2 and r["ip_wrong"] == 2 for r in t["rows"]), proc.stdout
    assert t["oob"] == (4 * len(t["rows"]), "FAILED")
    (run,) = h5log.read(out)
    assert run.attrs["status"] == "wrong-results"
    assert [r["wrong"] for r in run.tables["allreduce"]] == [2] * 2 * len(t["rows"])


@pytest.mark.parametrize("args, expect", [
    (["allreduce", "-o", "avg", "-d", "int32"], "-o/--op: avg needs a floating"),
    (["reduce", "-r", "5"], "-r/--root: expected a rank in [0, 2), got 5"),
    (["gather"], "collective: expected one of allreduce"),
    (["allreduce", "-b", "1X"], "-b/--minbytes: expected a byte count"),
    (["allreduce", "--device", "gpu", "-b", "8", "-e", "8"], "--device gpu: rank 0:"),
])
def test_bad_arguments_get_one_clear_error(args, expect):
    proc = bench(2, *args, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert expect in proc.stderr
    assert proc.stderr.count("error:") == 1, proc.stderr     # printed by rank 0 only


@pytest.mark.parametrize("rank", [0, 1])
def test_a_failing_rank_aborts_the_job_and_keeps_what_was_measured(rank, tmp_path):
    out = tmp_path / "r.h5"
    t0 = time.monotonic()
    proc = launch.run(2, [FAULT, "raise", str(rank), "allreduce", "-b", "8", "-e", "1M", "-f", "2",
                          "-n", "1", "-w", "0", "--out", str(out)], timeout=90)
    assert proc.returncode != 0
    assert time.monotonic() - t0 < 60, "the other rank must not be left waiting"
    assert f"rank {rank} failed" in proc.stderr and "injected fault" in proc.stderr
    if rank == 0:
        # rank 0 owns the file: the two sizes measured before the fault are kept
        (run,) = h5log.read(out)
        assert run.attrs["status"] == "failed" and "injected fault" in run.attrs["error"]
        assert [r["size"] for r in run.tables["allreduce"][::2]] == [8, 16]
    else:
        assert not out.exists() or h5log.read(out)[0].attrs["status"] == "failed"


def start_bench(*args, stderr=subprocess.DEVNULL, timeout=120):
    """hpccoll-bench at 2 ranks in the background, in a session of its own."""
    env = dict(os.environ, MPIEXEC_TIMEOUT=str(timeout))
    cmd = launch.mpiexec_args(2) + [sys.executable, "-m", "hpccoll.bench", *map(str, args)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env,
                            start_new_session=True)


def read_rows(proc, n: int) -> str:
    """Its output until n table rows are printed (they are measured and logged by then)."""
    text, rows = "", 0
    while rows < n:
        ln = proc.stdout.readline()
        assert ln, "the benchmark ended early"
        text += ln
        rows += not ln.startswith("#")
    return text


def kill_session(proc) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_killed_benchmark_leaves_the_previous_file_complete(tmp_path):
    out = tmp_path / "r.h5"
    with h5log.RunWriter(out, "earlier") as run:
        run.table("allreduce").append([{"size": 8, "time_us": 1.0}])
    before = out.read_bytes()
    proc = start_bench("allreduce", "-b", "8", "-e", "1G", "-i", "8", "-n", "1", "-w", "0",
                       "--out", out)
    try:
        read_rows(proc, 3)
        (tmp,) = tmp_path.glob(".r.h5.tmp-*")
        writer = int(tmp.name.rsplit("-", 1)[1])                     # rank 0
        unlink_mpi_shm(f"/proc/{writer}/maps")   # what MPICH would leave in /dev/shm
        os.kill(writer, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        kill_session(proc)
    assert out.read_bytes() == before
    (run,) = h5log.read(out)
    assert run.label == "earlier" and run.attrs["status"] == "complete"


def test_two_jobs_appending_to_one_file_both_land(tmp_path):
    """Finding 2 of issue 18: `hpccoll-bench allreduce ... --out c.h5 &`, then a second job
    appending an allgather to c.h5 while the first still runs.  Both runs must be in the
    file, under the names each job printed."""
    out = tmp_path / "c.h5"
    first = start_bench("allreduce", "-b", "8", "-e", "16M", "-f", "2", "-n", "40", "-w", "1",
                        "--out", out, stderr=subprocess.PIPE, timeout=150)
    try:
        head = read_rows(first, 1)             # its run is open
        second = bench(2, "allgather", "-b", "8", "-e", "1K", "-f", "4", "-n", "1", "-w", "0",
                       "--floor", "off", "--out", out)
        assert first.poll() is None, "the jobs must overlap for this test to show anything"
        rest, err = first.communicate(timeout=150)
    finally:
        kill_session(first)
    assert first.returncode == 0 and second.returncode == 0, err + second.stderr
    runs = h5log.read(out)
    assert sorted(r.label for r in runs) == ["allgather", "allreduce"]
    assert {r.name: r.attrs["status"] for r in runs} == {"0000_allgather": "complete",
                                                        "0001_allreduce": "complete"}
    assert f"Results written to {out} (run 0000_allgather)" in second.stdout
    assert f"Results written to {out} (run 0001_allreduce)" in head + rest
    assert len(runs[1].tables["allreduce"]) == 22 * 2       # 8 B..16 MiB, both placements


def test_every_column_and_attribute_is_documented(compare_run):
    _, out = compare_run
    doc = (Path(__file__).parents[2] / "docs" / "results.md").read_text()
    (run,) = h5log.read(out)
    names = (set(run.attrs) | set(run.tables["allreduce"][0]) | set(run.traces["allreduce"][0])
             | set(run.tables["floor"][0]))
    missing = sorted(n for n in names if f"`{n}`" not in doc)
    assert not missing, f"docs/results.md does not describe {missing}"


def test_the_mpis_own_from_c_stands_beside_the_table(compare_run):
    """--floor (auto: on for 5 lines): every line's collective timed from C through the
    same MPI at both thread levels, printed after the table and kept in the file."""
    text, out = compare_run
    (run,) = h5log.read(out)
    floor = run.tables["floor"]
    assert [r["size"] for r in floor] == [1024 * 4 ** k for k in range(5)]
    assert all(r["time_us"] > 0 and r["single_us"] > 0 for r in floor), floor
    assert run.attrs["floor_source"] in ("C (mpicc)", "IMB-MPI1") and not run.attrs["floor_note"]
    block = text[text.index("# The MPI's own collective called from C"):].splitlines()
    assert len([ln for ln in block[2:] if ln.startswith("#") and ln[1:].split()
                and ln[1:].split()[0].isdigit()]) == 5, text


def test_missing_directories_of_out_are_created_and_a_file_in_the_way_is_named(tmp_path):
    """docs/results.md: missing directories of --out are created, as chaos and the API do."""
    out = tmp_path / "new" / "sub" / "r.h5"
    proc = bench(2, "allreduce", "-b", "8", "-e", "8", "-n", "1", "-w", "0", "--out", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [r.label for r in h5log.read(out)] == ["allreduce"]
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    proc = bench(2, "allreduce", "-b", "8", "-e", "8", "-n", "1", "-w", "0", "--out",
                 blocked / "r.h5", timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("argument --out:") == 1, proc.stderr
    assert "is not a directory" in proc.stderr


# -- result files under a file-size limit (issue 32, finding 7) ---------------------------
# MPICH's UCX maps a 4.1 MiB file of its own at init: limits stay above that.
RESET_SIGXFSZ = ("import signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_DFL); "
                 "from hpccoll.bench.cli import main; sys.exit(main(sys.argv[1:]))")


def bench_limited(limit_kib: int, *args, sigxfsz_default=False, timeout=150):
    """hpccoll-bench at 2 ranks, every process under ``ulimit -f limit_kib``; with
    ``sigxfsz_default`` the ranks restore SIGXFSZ's default action (killing them).  No
    floor: its MPI job would meet the limit too (Open MPI's shared memory files)."""
    entry = ["-c", RESET_SIGXFSZ] if sigxfsz_default else ["-m", "hpccoll.bench"]
    return launch.run(2, [*entry, *map(str, args), "--floor", "off"], timeout,
                      file_limit=limit_kib * 1024)


def earlier_runs(out, pad_bytes: int) -> bytes:
    import numpy as np
    h5log.write_record(out, "bench", "allgather", {"tool": "hpccoll-bench"},
                       tables={"allgather": [{"size": 8, "time_us": 1.0}]})
    h5log.write_record(out, "test", "pad", arrays={"pad": np.random.default_rng(1).random(pad_bytes // 8)})
    return out.read_bytes()


def still_intact(out, before: bytes) -> None:
    assert out.read_bytes() == before
    runs = h5log.read(out)
    assert [r.name for r in runs] == ["0000_allgather", "0001_pad"]
    assert all(r.attrs["status"] == "complete" for r in runs)


def no_signal(proc) -> None:
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, (proc.returncode, text)
    for sign in ("BAD TERMINATION", "signal", "core dumped", "Traceback", "MPI_Abort"):
        assert sign not in text, text


def test_a_traced_run_past_the_file_size_limit(tmp_path):
    """The run's own file passes ulimit -f mid-run (--trace, many iterations): the
    benchmark says so at once, measures on (the whole table is printed), exits 1 on every
    rank without a signal, and the old file is intact; nothing is left beside it.  The
    ranks run with SIGXFSZ's default action, which would kill the writer with a core.
    (Open MPI sizes a file of 12-16 MiB for shared memory at MPI_Init: a limit below that
    kills it there, so the limit and the run are larger there.)"""
    out = tmp_path / "r.h5"
    before = earlier_runs(out, 64 << 10)
    mib = 24 if hpccoll.launch.flavor() == "openmpi" else 5
    proc = bench_limited(mib << 10, "allreduce", "-b", "8", "-e", "64K", "-f", "2", "-n",
                         200 * mib, "-w", "0", "--out", out, "--trace", sigxfsz_default=True)
    no_signal(proc)
    assert (f"reached this process's file-size limit of {mib} MiB (ulimit -f {mib << 10})"
            in proc.stderr)
    assert f"{out} is unchanged and the run 'allreduce' was not saved; the measurement goes " \
           "on" in proc.stderr
    assert proc.stderr.count("hpccoll-bench: error:") == 1, proc.stderr
    t = nccltests.parse(proc.stdout)
    assert len(t["rows"]) == 14 and t["oob"] == (0, "OK")
    assert f"# Results not written to {out}:" in proc.stdout
    still_intact(out, before)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.h5"]


def test_a_run_that_does_not_fit_in_the_file_is_kept_beside_it(tmp_path):
    """The run is complete but adding it to a file near the limit passes it: exit 1, no
    signal, the old file intact, and the run whole in the file the message names."""
    out = tmp_path / "r.h5"
    before = earlier_runs(out, 5 << 20)
    proc = bench_limited(len(before) // 1024 + 16, "allreduce", "-b", "8", "-e", "64K", "-f",
                         "4", "-n", "200", "-w", "0", "--out", out)
    no_signal(proc)
    kept = [p for p in tmp_path.iterdir() if p.name != "r.h5"]
    assert len(kept) == 1 and kept[0].name.startswith("r-allreduce-"), proc.stderr
    msg = (f"the run 'allreduce' could not be added to {out}: writing the new {out} reached "
           "this process's file-size limit")
    assert f"hpccoll-bench: error: {msg}" in proc.stderr and msg in proc.stdout
    assert f"{out} is unchanged; the run is kept in {kept[0]}" in proc.stderr
    still_intact(out, before)
    (run,) = h5log.read(kept[0])
    assert run.attrs["status"] == "complete" and run.attrs["tool"] == "hpccoll-bench"
    assert len(run.tables["allreduce"]) == 7 * 2          # 8 B..32 KiB, both placements
