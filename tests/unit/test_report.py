"""hpccoll-report on a real result file (hpccoll-bench under mpiexec, --compare mpi --trace):
comparison tables with the right ratios, PNG plots, a Chrome trace that loads and has one
slice per traced collective and one instant event per yield; baselines from another file."""
import json
import subprocess
import sys

import numpy as np
import pytest

from hpccoll import h5log
from hpccoll.bench.table import float_str
from hpccoll.report import main as report
from hpccoll.timeline import chrome_trace
from tests import launch


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "r.h5"
    proc = launch.run(2, ["-m", "hpccoll.bench", "allreduce", "-b", "4K", "-e", "1M", "-f", "16",
                          "-n", "3", "-w", "1", "--compare", "mpi", "--out", str(out), "--trace"],
                      timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def _table(text, placement):
    """{size: [fields...]} of the comparison table for one placement."""
    block = text.split(f"allreduce float sum, {placement}:")[1].split("# geometric")[0]
    lines = block.splitlines()[1:]        # the rest of the title line first
    return {int(l.split()[0]): l.split()[1:] for l in lines if l and not l.startswith("#")}


def test_comparison_table_ratios(result, capsys):
    assert report([str(result)]) == 0
    text = capsys.readouterr().out
    (run,) = h5log.read(result)
    assert f"run {run.name}: hpccoll-bench allreduce, 2 ranks" in text
    assert "[1] hpccoll/preemptive  (baseline [2])" in text
    rows = run.tables["allreduce"]
    for placement in ("out-of-place", "in-place"):
        table = _table(text, placement)
        mine = {r["size"]: r for r in rows if r["library"] == "hpccoll" and r["placement"] == placement}
        base = {r["size"]: r for r in rows if r["library"] == "mpi" and r["placement"] == placement}
        assert sorted(table) == sorted(mine) == [4096, 65536, 1048576]
        for size, fields in table.items():
            t, _, ratio, bt, _ = map(float, fields)
            assert t == float(float_str(mine[size]["time_us"], 9))
            assert bt == float(float_str(base[size]["time_us"], 9))
            assert ratio == float(float_str(base[size]["time_us"] / mine[size]["time_us"], 6))


def test_plots_are_written(result, tmp_path):
    import matplotlib.image as mpimg
    outdir = tmp_path / "plots"
    assert report([str(result), "--plot", str(outdir), "--quiet"]) == 0
    names = sorted(p.name for p in outdir.iterdir())
    assert names == ["allreduce_busbw.png", "allreduce_latency.png", "allreduce_ratio.png"]
    for name in names:
        img = mpimg.imread(outdir / name)
        assert img.shape[0] > 200 and img.shape[1] > 300 and float(np.std(img)) > 0.01


def test_chrome_trace_loads_and_has_the_expected_events(result, tmp_path):
    path = tmp_path / "t.json"
    assert report([str(result), "--chrome-trace", str(path), "--quiet"]) == 0
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    (run,) = h5log.read(result)
    traces = run.traces["allreduce"]
    slices = [e for e in events if e["ph"] == "X"]
    assert len(slices) == len(traces) == 2 * 3 * 2 * 5      # ranks x sizes x placements x (1+3+1)
    assert {e["name"] for e in slices} == {"allreduce"}
    assert all(e["ts"] >= 0 and e["dur"] >= 0 and e["args"]["phase"] in ("warmup", "timed", "check")
               for e in slices)
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    yields = [e for e in events if e["ph"] == "i"]
    assert len(yields) == sum(len(r["yield_times"]) for r in traces)
    assert all(e["name"] == "yield" and e["s"] == "t" for e in yields)
    # a rank runs one collective at a time in the benchmark: its slices do not overlap
    for pid in (0, 1):
        mine = sorted((e["ts"], e["ts"] + e["dur"]) for e in slices if e["pid"] == pid)
        assert all(a[1] <= b[0] + 1e-3 for a, b in zip(mine, mine[1:]))
    timed = tmp_path / "timed.json"
    assert report([str(result), "--chrome-trace", str(timed), "--phase", "timed", "--quiet"]) == 0
    assert sum(e["ph"] == "X" for e in json.loads(timed.read_text())["traceEvents"]) == 2 * 3 * 2 * 3


def test_baseline_from_another_file(result, tmp_path, capsys):
    (run,) = h5log.read(result)
    slower = tmp_path / "last_week.h5"
    with h5log.RunWriter(slower, "allreduce", {k: v for k, v in run.attrs.items()
                                               if k not in ("status", "error", "label", "end_time")}) as w:
        rows = [dict(r, time_us=2 * r["time_us"], median_us=2 * r["median_us"])
                for r in run.tables["allreduce"] if r["library"] == "hpccoll"]
        w.table("allreduce").append(rows)
    assert report([str(result), "--baseline", str(slower)]) == 0
    text = capsys.readouterr().out
    assert "[1] r: hpccoll/preemptive  (baseline [3])" in text
    assert "[3] last_week: hpccoll/preemptive\n" in text
    for placement in ("out-of-place", "in-place"):
        ratios = [float(f[2]) for f in _table(text, placement).values()]
        assert ratios == [2.0, 2.0, 2.0]
    assert report([str(result), "--baseline", str(slower), "--stat", "median"]) == 0
    assert [float(f[2]) for f in _table(capsys.readouterr().out, "in-place").values()] == [2.0] * 3


def test_errors_name_the_problem(result, tmp_path, capsys):
    assert report([str(tmp_path / "missing.h5")]) == 2
    assert "missing.h5: no such file" in capsys.readouterr().err
    assert report([str(result), "--baseline", "nccl"]) == 2
    assert "--baseline: expected a result file or a library" in capsys.readouterr().err
    plain = tmp_path / "plain.h5"
    with h5log.RunWriter(plain, "x", kind="bench") as w:
        w.table("allreduce").append(h5log.read(result)[0].tables["allreduce"][:2])
    assert report([str(plain), "--chrome-trace", str(tmp_path / "t.json"), "--quiet"]) == 2
    assert "no engine traces" in capsys.readouterr().err
    proc = subprocess.run([sys.executable, "-m", "hpccoll.report", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "--chrome-trace" in proc.stdout


def test_timeline_puts_overlapping_collectives_on_separate_tracks():
    recs = [
        {"rank": 0, "coll": "allreduce", "t_issue": 10.0, "t_start": 10.0, "t_end": 10.5, "yield_times": [10.1, 10.2]},
        {"rank": 0, "coll": "alltoall", "t_issue": 10.1, "t_start": 10.2, "t_end": 10.4, "yield_times": []},
        {"rank": 0, "coll": "barrier", "t_issue": 10.6, "t_start": 10.6, "t_end": 10.7},
        {"rank": 1, "coll": "allreduce", "t_issue": 10.0, "t_start": float("nan"), "t_end": float("nan")},
    ]
    doc = chrome_trace(recs)
    x = {e["name"]: e for e in doc["traceEvents"] if e["ph"] == "X"}
    assert set(x) == {"allreduce", "alltoall", "barrier"}           # unfinished ones are left out
    assert x["allreduce"]["tid"] != x["alltoall"]["tid"] and x["barrier"]["tid"] == 0
    assert x["allreduce"]["ts"] == 0 and x["allreduce"]["dur"] == pytest.approx(5e5)
    assert x["alltoall"]["args"]["queued_us"] == pytest.approx(1e5)
    assert [e["ts"] for e in doc["traceEvents"] if e["ph"] == "i"] == pytest.approx([1e5, 2e5])
    json.dumps(doc)    # serializable as is


def test_every_kind_of_run_reads(result, tmp_path, capsys):
    """One file with a benchmark run, a chaos job's run, a profile, a simulation and a kind
    hpccoll-report does not know: tables for the benchmark, each other run as its tool
    summarizes it, a listing for the unknown one."""
    import shutil

    from hpccoll.results import summary
    from hpccoll.tuning import layers, report as tuning_report
    path = tmp_path / "all.h5"
    shutil.copy(result, path)
    proc = launch.run(2, ["-m", "hpccoll.chaos", "abba", "--iters", "1", "--timeout", "5",
                          "--out", str(path)], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    prof = layers.model_profile(layers.Network(link_gbps=100))
    prof.save(str(path), {"nranks": 8})
    sim = tuning_report.run(("resnet50",), (10, 100))
    tuning_report.save(sim, str(path), {})
    h5log.write_record(path, "my.tool", "rank1", {"nranks": 2, "reason": "timeout"},
                       tables={"ring": [{"seq": 3, "coll": "allreduce", "state": "waiting"}]},
                       arrays={"peers": np.array([0, 1])})
    assert report([str(path)]) == 0
    text = capsys.readouterr().out
    assert "allreduce float sum, out-of-place:" in text             # the benchmark's table
    chaos_run = h5log.read(path)[1]
    assert "\n".join(summary(chaos_run.attrs, chaos_run.tables["outcomes"])) in text
    assert f"run {chaos_run.name}: hpccoll.chaos abba, 2 ranks" in text
    assert "\n".join(prof.table()) in text
    assert tuning_report.table(sim) in text
    assert "run 0004_rank1: my.tool rank1, 2 ranks" in text
    assert "tables/ring: 1 rows (seq, coll, state)" in text and "arrays/peers: int64 2" in text
    assert "reason=timeout" in text
    # a file without benchmark runs: the summaries, and a clear error for benchmark options
    solo = tmp_path / "profile.h5"
    prof.save(str(solo))
    assert report([str(solo)]) == 0
    assert "\n".join(prof.table()) in capsys.readouterr().out
    assert report([str(solo), "--plot", str(tmp_path / "p")]) == 2
    assert "--plot: no benchmark results in" in capsys.readouterr().err


def test_percentile_statistics(result, tmp_path, capsys):
    """--stat p10 / p90: the spread hpccoll-bench prints, also from files written before
    the benchmark stored it (then from every iteration's time)."""
    (run,) = h5log.read(result)
    rows = run.tables["allreduce"]
    older = tmp_path / "older.h5"
    with h5log.RunWriter(older, "allreduce", {k: v for k, v in run.attrs.items()
                                              if k not in ("status", "error", "label", "end_time")}) as w:
        w.table("allreduce").append([{k: v for k, v in r.items() if k not in ("p10_us", "p90_us")}
                                     for r in rows])
    for path in (result, older):
        for stat, q in (("p10", 10), ("p90", 90)):
            assert report([str(path), "--stat", stat]) == 0
            text = capsys.readouterr().out
            assert f"time ({stat} over iterations, us)" in text
            for placement in ("out-of-place", "in-place"):
                for size, fields in _table(text, placement).items():
                    (mine,) = [r for r in rows if (r["size"], r["library"], r["placement"]) ==
                               (size, "hpccoll", placement)]
                    want = np.percentile(mine["times_us"], q)
                    assert float(fields[0]) == float(float_str(want, 9))
