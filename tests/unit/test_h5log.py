"""HDF5 result logs: the schema round-trips, runs append as groups, a failing run keeps
its rows, the environment attributes are there, and a killed writer never leaves a
corrupt file under the real name."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpccoll import h5log
from hpccoll.config import resolve

WRITER = str(Path(__file__).parents[1] / "scripts" / "h5_writer.py")
ROOT = str(Path(__file__).parents[2])


def _rows(k):
    return [{"coll": "allreduce", "size": 8 << i, "inplace": bool(i % 2), "time_us": 1.5 * i,
             "wrong": -1, "times_us": np.arange(3.0) + i, "yield_times": [0.5] * i}
            for i in range(k)]


def test_schema_round_trip(tmp_path):
    path = tmp_path / "r.h5"
    attrs = {"command_line": "hpccoll-bench allreduce", "nranks": 4, "ratio": 0.5,
             "flag": True, "hostnames": ["a", "b"], "ranks_per_host": {"a": 2, "b": 2},
             "nothing": None}
    with h5log.RunWriter(path, "allreduce", attrs) as run:
        run.table("allreduce").append(_rows(3))
        run.table("allreduce").append(_rows(2))
        run.table("allreduce", kind="traces").append([{"rank": 1, "t_start": 2.0, "yield_times": [1.0, 1.5]}])
    assert not list(tmp_path.glob(".r.h5.tmp-*")), "the temporary file must be renamed away"
    (r,) = h5log.read(path)
    for k, v in attrs.items():
        assert r.attrs[k] == v, k
    assert r.attrs["status"] == "complete" and r.attrs["error"] == "" and r.attrs["end_time"]
    rows = r.tables["allreduce"]
    assert len(rows) == 5
    want = _rows(3) + _rows(2)
    for got, exp in zip(rows, want):
        assert got["coll"] == exp["coll"] and got["size"] == exp["size"]
        assert got["inplace"] == exp["inplace"] and got["time_us"] == exp["time_us"]
        assert np.array_equal(got["times_us"], exp["times_us"])
        assert list(got["yield_times"]) == exp["yield_times"]
    assert list(r.traces["allreduce"][0]["yield_times"]) == [1.0, 1.5]
    with h5py.File(path) as f:
        assert f.attrs["schema"] == "hpccoll-results" and f.attrs["schema_version"] == h5log.SCHEMA_VERSION
        assert f["runs"][r.name]["tables"]["allreduce"].dtype.names[:2] == ("coll", "size")


def test_runs_append_as_groups(tmp_path):
    path = tmp_path / "r.h5"
    for label in ("first", "second"):
        with h5log.RunWriter(path, label, {"tool": label}) as run:
            run.table("t").append(_rows(1))
    runs = h5log.read(path)
    assert [r.label for r in runs] == ["first", "second"]
    assert [r.name for r in runs] == ["0000_first", "0001_second"]
    with h5log.RunWriter(path, "fresh", append=False) as run:
        run.table("t").append(_rows(1))
    assert [r.label for r in h5log.read(path)] == ["fresh"]


def test_a_failing_run_keeps_its_rows_and_says_why(tmp_path):
    path = tmp_path / "r.h5"
    with pytest.raises(RuntimeError):
        with h5log.RunWriter(path, "x") as run:
            run.table("t").append(_rows(2))
            raise RuntimeError("rank 3 lost")
    (r,) = h5log.read(path)
    assert r.attrs["status"] == "failed" and "rank 3 lost" in r.attrs["error"]
    assert len(r.tables["t"]) == 2


def test_bad_rows_and_files_are_named(tmp_path):
    with h5log.RunWriter(tmp_path / "r.h5", "x") as run:
        t = run.table("t")
        t.append(_rows(1))
        with pytest.raises(ValueError, match="missing"):
            t.append([{"coll": "x"}])
        with pytest.raises(TypeError, match="column 'a'"):
            run.table("u").append([{"a": None}])
    newer = tmp_path / "new.h5"
    with h5py.File(newer, "w") as f:
        f.attrs["schema"] = "hpccoll-results"
        f.attrs["schema_version"] = h5log.SCHEMA_VERSION + 1
    with pytest.raises(ValueError, match="newer"):
        h5log.read(newer)
    with pytest.raises(ValueError, match="newer"):
        h5log.RunWriter(newer, "x")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        h5log.RunWriter(tmp_path / "no" / "r.h5", "x")


def test_environment_attrs(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("HPCCOLL_CHUNK_BYTES", "2M")
    monkeypatch.setenv("UNRELATED_SECRET", "x")
    a = h5log.environment_attrs(argv=["hpccoll-bench", "allreduce", "-b", "8"],
                                settings=resolve({"policy": "fifo"}))
    assert a["command_line"] == "hpccoll-bench allreduce -b 8"
    assert a["environment"]["SLURM_JOB_ID"] == "4242" and a["environment"]["SLURM_NTASKS"] == "8"
    assert "UNRELATED_SECRET" not in a["environment"]
    assert a["policy"] == "fifo" and a["settings"]["chunk_bytes"] == 2 << 20
    assert a["settings_sources"]["chunk_bytes"] == "environment"
    assert a["nranks"] == 1 and a["ranks_per_host"] == {a["hostnames"][0]: 1}
    for key in ("hpccoll_version", "git_revision", "python_version", "start_time", "h5py_version"):
        assert key in a


def _kill_writer(out: Path) -> Path:
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen([sys.executable, WRITER, str(out)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        first = proc.stdout.readline()
        assert first.startswith("TMP"), first
        proc.send_signal(signal.SIGKILL)     # mid-run: rows are being appended
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    return Path(first.split()[1])


def test_killed_writer_leaves_no_file(tmp_path):
    out = tmp_path / "r.h5"
    tmp = _kill_writer(out)
    assert not out.exists(), "a killed writer must not leave a file under the final name"
    assert tmp.exists()      # what was flushed stays aside for inspection


def test_killed_writer_leaves_the_previous_file_complete(tmp_path):
    out = tmp_path / "r.h5"
    with h5log.RunWriter(out, "earlier") as run:
        run.table("t").append(_rows(4))
    before = out.read_bytes()
    _kill_writer(out)
    assert out.read_bytes() == before
    (r,) = h5log.read(out)
    assert r.label == "earlier" and r.attrs["status"] == "complete" and len(r.tables["t"]) == 4
