"""HDF5 result files: the schema round-trips (tables, arrays, kinds), runs append as
groups, a failing run keeps its rows, the environment attributes are there, a killed
writer never leaves a corrupt file under the real name, writers in separate processes
that overlap in time all land, and a run that cannot join its file is kept beside it."""
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
APPEND = str(Path(__file__).parents[1] / "scripts" / "h5_append.py")
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
        assert f["runs"][r.name].attrs["kind"] == "" and r.kind == ""
        assert f["runs"][r.name]["tables"]["allreduce"].dtype.names[:2] == ("coll", "size")


def test_strings_are_stored_as_c_strings(tmp_path):
    """Open MPI's library version ends in a NUL, which h5py refuses in a string: an
    attribute ends where C's string would."""
    out = tmp_path / "r.h5"
    with h5log.RunWriter(out, "x", {"mpi_library_version": "Open MPI v5.0.11, ...\0"}):
        pass
    (run,) = h5log.read(out)
    assert run.attrs["mpi_library_version"] == "Open MPI v5.0.11, ..."


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
    with pytest.raises(ValueError, match="label"):
        h5log.RunWriter(tmp_path / "r.h5", "a/b")
    with pytest.raises(TypeError, match="array 'o'"):
        with h5log.RunWriter(tmp_path / "r.h5", "x") as run:
            run.array("o", np.array([{}, 1], dtype=object))
    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["x"] = 1
    with pytest.raises(ValueError, match="not an hpccoll result file"):
        h5log.RunWriter(foreign, "x")
    with pytest.raises(ValueError, match="not an hpccoll result file"):
        h5log.read(foreign)


def test_missing_directories_are_created(tmp_path):
    path = tmp_path / "no" / "such" / "r.h5"
    h5log.write_record(path, "test", "x", tables={"t": _rows(1)})
    assert [r.label for r in h5log.read(path)] == ["x"]


def test_kinds_arrays_and_one_shot_records(tmp_path):
    path = tmp_path / "r.h5"
    m = np.arange(12.0).reshape(3, 4)
    w = h5log.write_record(path, "tuning.profile", "profile", {"nranks": 2},
                           tables={"t": _rows(2)},
                           arrays={"m": (m, {"units": "s"}), "deep/names": np.array(["a", "bc"])})
    assert w.final_path == path and w.name == "0000_profile"
    with h5log.RunWriter(path, "allreduce", {"tool": "hpccoll-bench", "kind": "bench"}) as run:
        run.table("allreduce").append(_rows(1))
    older = h5log.RunWriter(path, "old", {"tool": "hpccoll-bench"})   # no kind: as in version 1
    older.group.attrs.pop("kind")
    older.close()
    a, b, c = h5log.read(path)
    assert (a.kind, b.kind, c.kind) == ("tuning.profile", "bench", "bench")
    assert np.array_equal(a.arrays["m"], m) and a.array_attrs["m"] == {"units": "s"}
    assert list(a.arrays["deep/names"]) == ["a", "bc"]
    assert len(a.tables["t"]) == 2 and a.attrs["nranks"] == 2
    assert b.attrs["status"] == "complete" and not b.arrays


def _writer(out, label, rows):
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen([sys.executable, APPEND, str(out), label, str(rows)], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("OPEN"), line + proc.stderr.read()
    return proc


def _landed(proc):
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    _, path, name = out.split()
    return Path(path), name, err


def test_writers_that_overlap_in_time_all_land(tmp_path):
    """Finding 2 of issue 18: two jobs appending to one file while both run.  Each writer
    is a process of its own; all of them have their run open at once, then they finish
    (the later-opened first, then all at once) and every run is in the file."""
    out = tmp_path / "c.h5"
    h5log.write_record(out, "test", "before", tables={"t": _rows(1)})
    first, second = _writer(out, "allreduce", 3), _writer(out, "allgather", 5)
    second.stdin.write("close\n")
    second.stdin.flush()
    assert _landed(second)[:2] == (out, "0001_allgather")
    first.stdin.write("close\n")
    first.stdin.flush()
    assert _landed(first)[:2] == (out, "0002_allreduce")
    many = [_writer(out, f"w{k}", k + 1) for k in range(4)]
    for p in many:                  # released together: their merges contend for the lock
        p.stdin.write("close\n")
        p.stdin.flush()
    names = [_landed(p)[1] for p in many]
    runs = h5log.read(out)
    assert [r.name for r in runs][:3] == ["0000_before", "0001_allgather", "0002_allreduce"]
    assert sorted(r.name for r in runs[3:]) == sorted(names)
    assert sorted(r.name[5:] for r in runs[3:]) == ["w0", "w1", "w2", "w3"]
    for r in runs[1:]:
        assert r.attrs["writer"] == r.label and r.attrs["status"] == "complete"
        assert [row["writer"] for row in r.tables["t"]] == [r.label] * int(r.arrays["m"][0, 0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.h5"]   # no temporary, no lock


def test_a_run_that_cannot_take_the_lock_is_kept_in_a_file_of_its_own(tmp_path, capsys):
    out = tmp_path / "c.h5"
    h5log.write_record(out, "test", "before", tables={"t": _rows(1)})
    before = out.read_bytes()
    run = h5log.RunWriter(out, "late", lock_timeout=0.2)
    run.table("t").append(_rows(2))
    with h5log.locked(out):             # another writer that does not let go
        aside = run.close()
    assert aside != out and aside.parent == out.parent and aside.name.startswith("c-late-")
    assert out.read_bytes() == before
    (r,) = h5log.read(aside)
    assert r.name == "0000_late" and len(r.tables["t"]) == 2
    err = capsys.readouterr().err
    assert "held its lock" in err and f"nothing was written to {out}; the run 'late' is kept in {aside}" in err and str(aside) in err


def test_links_planted_beside_the_result_are_never_followed(tmp_path, capsys):
    """A shared results directory where another user planted symbolic links at the names
    a writer makes (the lock, the temporary and merged copies, the file kept aside),
    pointing into a directory of theirs: nothing is written through them, and every run
    still lands in the shared directory (before: the lock and the merged copy were made
    at the links' targets)."""
    shared, theirs = tmp_path / "shared", tmp_path / "theirs"
    shared.mkdir()
    theirs.mkdir()
    out = shared / "r.h5"
    h5log.write_record(out, "test", "first", tables={"t": _rows(1)})
    pid = os.getpid()
    for name in (f".r.h5.tmp-{pid}", f".r.h5.tmp-{pid}.1", f".r.h5.merge-{pid}",
                 f"r-late-{pid}.h5"):
        (shared / name).symlink_to(theirs / name)
    with h5log.RunWriter(out, "second") as run:            # merged through a new name
        run.table("t").append(_rows(2))
    assert h5log.update_file_attrs(out, {"stamp": "1"}) == ["stamp"]
    assert [r.label for r in h5log.read(out)] == ["first", "second"]
    (shared / ".r.h5.lock").symlink_to(theirs / "lock")
    run = h5log.RunWriter(out, "late", lock_timeout=0.2)
    run.table("t").append(_rows(2))
    aside = run.close()                                    # no lock: kept aside
    assert "is a symbolic link" in capsys.readouterr().err
    assert aside.parent == shared and not aside.is_symlink()
    assert [r.label for r in h5log.read(aside)] == ["late"]
    assert list(theirs.iterdir()) == []
    assert all((shared / n).is_symlink() for n in (f".r.h5.merge-{pid}", ".r.h5.lock"))


def test_stamping_attributes_keeps_what_is_there(tmp_path):
    out = tmp_path / "c.h5"
    h5log.write_record(out, "test", "x", tables={"t": _rows(1)})
    assert h5log.update_file_attrs(out, {"SLURM_JOB_ID": "7", "schema": "other"}) == ["SLURM_JOB_ID"]
    with h5py.File(out) as f:
        assert f.attrs["SLURM_JOB_ID"] == "7" and f.attrs["schema"] == "hpccoll-results"
    assert [r.label for r in h5log.read(out)] == ["x"]


def test_files_of_earlier_versions_read_as_one_run(tmp_path):
    chaos = tmp_path / "chaos.h5"
    with h5py.File(chaos, "w") as f:
        f.attrs["schema"] = "hpccoll.chaos/1"
        f.attrs["ok"] = True
        f["outcomes"] = np.array([(0, b"fifo")], dtype=[("rank", "i4"), ("policy", "S8")])
    (r,) = h5log.read(chaos)
    assert r.kind == "chaos" and r.attrs["ok"] and r.tables["outcomes"] == [{"rank": 0, "policy": "fifo"}]
    prof = tmp_path / "prof.h5"
    with h5py.File(prof, "w") as f:
        f.attrs["kind"] = "hpccoll.tuning.profile"
        f["sizes"] = np.array([8, 16])
        f["samples/x"] = np.ones(3)
        f["sizes"].attrs["units"] = "bytes"
    (r,) = h5log.read(prof)
    assert r.kind == "tuning.profile" and list(r.arrays["sizes"]) == [8, 16]
    assert r.array_attrs["sizes"] == {"units": "bytes"} and r.arrays["samples/x"].shape == (3,)
    with pytest.raises(ValueError, match="earlier hpccoll .* choose another file"):
        h5log.RunWriter(chaos, "x")          # appended to only in the current layout
    assert "earlier hpccoll" in h5log.append_problem(prof)
    assert h5log.append_problem(tmp_path / "new.h5") is None


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


def test_a_file_written_whole_lands_at_the_end_also_when_it_fails(tmp_path):
    """h5log.whole_file (examples/train_dp.py's file, through tuning.store.h5open)."""
    from hpccoll.tuning.store import h5open
    out = tmp_path / "sub" / "train.h5"
    with h5open(out) as f:
        f["steps/t"] = np.arange(3.0)
        assert not out.exists()                 # only once the block ends
    with pytest.raises(RuntimeError):
        with h5open(out) as f:
            f["steps/t"] = np.arange(2.0)
            with h5py.File(out) as old:         # meanwhile the earlier file is whole
                assert old["steps/t"].shape == (3,)
            raise RuntimeError("diverged")
    with h5py.File(out) as f:
        assert f["steps/t"].shape == (2,) and f.attrs["status"] == "failed"
        assert "diverged" in f.attrs["error"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["train.h5"]
    with pytest.raises(ValueError, match="mode"):
        h5open(out, "a")


def test_writing_examples_in_docs_run(tmp_path):
    """docs/results.md's examples of a tool's own record kind, as written, on 2 ranks:
    rank 0 writes its run, then every rank dumps a record into one file at once."""
    import re

    from tests import launch
    doc = (Path(ROOT) / "docs" / "results.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", doc, re.S | re.M)
    [own] = [b for b in blocks if "h5log.RunWriter(" in b]
    [dump] = [b for b in blocks if "h5log.write_record(" in b]
    script = tmp_path / "docs_example.py"
    script.write_text("\n".join([
        "import numpy as np", "import hpccoll", "from mpi4py import MPI", "from hpccoll import h5log",
        "ctx = hpccoll.init()", "rank = ctx.rank",
        f"path = {str(tmp_path / 'dump.h5')!r}",
        "rows = [{'seq': 3, 'coll': 'allreduce'}]", "array = np.arange(4.0)",
        own.replace('"tuning.h5"', repr(str(tmp_path / "tuning.h5"))),
        "MPI.COMM_WORLD.Barrier()", dump, "ctx.close()"]))
    proc = launch.run(2, [str(script)], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run,) = h5log.read(tmp_path / "tuning.h5")
    assert run.kind == "my-tool" and run.attrs["converged"] is True and run.attrs["nranks"] == 2
    assert run.tables["allocations"][0]["blocks"] == 4 and run.arrays["matrix"].shape == (4, 4)
    dumps = h5log.read(tmp_path / "dump.h5")
    assert sorted(r.label for r in dumps) == ["rank0", "rank1"]
    assert all(r.kind == "flight" and r.tables["collectives"] == [{"seq": 3, "coll": "allreduce"}]
               and r.attrs["reason"] == "CollectiveTimeout" for r in dumps)


# -- no space: a full file system, a quota, the file-size limit (issue 32, finding 7) -----
FILL = str(Path(__file__).parents[1] / "scripts" / "h5_fill.py")


def _fill(out: Path, rows: int, limit_kib=None, *extra, timeout=120):
    """h5_fill.py in a process whose file-size limit (ulimit -f) is ``limit_kib`` KiB."""
    import resource

    def limit():
        if limit_kib is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_kib * 1024, limit_kib * 1024))
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, FILL, str(out), str(rows), *extra], env=env,
                          capture_output=True, text=True, timeout=timeout, preexec_fn=limit)


def _earlier_runs(out: Path, nbytes: int) -> bytes:
    """Two runs already in ``out``, about ``nbytes`` in all; returns the file's bytes."""
    h5log.write_record(out, "test", "first", tables={"t": _rows(2)})
    h5log.write_record(out, "test", "second", arrays={"pad": np.random.default_rng(0).random(nbytes // 8)})
    return out.read_bytes()


def _intact(out: Path, before: bytes) -> None:
    assert out.read_bytes() == before
    runs = h5log.read(out)                       # h5py reads it, with every earlier run
    assert [r.name for r in runs] == ["0000_first", "0001_second"]
    assert all(r.attrs["status"] == "complete" for r in runs)


def test_a_run_past_the_file_size_limit_is_not_saved_and_says_so(tmp_path):
    """The run's own file reaches ulimit -f while rows are appended (a long --trace run):
    exit 1 (no signal, no crash in HDF5's exit handler), the message names the limit and
    says the run was not saved, the old file is intact and nothing is left beside it."""
    out = tmp_path / "r.h5"
    before = _earlier_runs(out, 64 << 10)
    proc = _fill(out, 1000, 1024)                # 4 MiB of rows under a 1 MiB limit
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert "reached this process's file-size limit of 1 MiB (ulimit -f 1024)" in proc.stderr
    assert f"{out} is unchanged and the run 'fill' was not saved" in proc.stderr
    assert "Traceback" not in proc.stderr and "KEPT None" in proc.stdout
    _intact(out, before)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.h5"]   # no temporary, no lock


def test_sigxfsz_does_not_kill_the_writer(tmp_path):
    """A process whose SIGXFSZ has its default action (core dump) is not killed by the
    write that passes the limit: it gets the same clear error."""
    out = tmp_path / "r.h5"
    proc = _fill(out, 1000, 1024, "--default-sigxfsz")
    assert proc.returncode == 1, (proc.returncode, proc.stderr)      # -25 if SIGXFSZ killed it
    assert "file-size limit of 1 MiB" in proc.stderr and f"{out} was not created" in proc.stderr
    assert not list(tmp_path.iterdir())


def test_a_run_that_fits_but_not_in_the_file_is_kept_beside_it(tmp_path):
    """The run is whole, but the copy of the file that lands it passes the limit: the old
    file is intact and the run is in a file of its own beside it, which the message names."""
    out = tmp_path / "r.h5"
    before = _earlier_runs(out, 900 << 10)
    limit = len(before) // 1024 + 40             # room for the copy, not for the run too
    proc = _fill(out, 30, limit)                 # a run of about 130 KiB
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    (kept,) = [p for p in tmp_path.iterdir() if p.name != "r.h5"]
    assert kept.name.startswith("r-fill-") and kept.suffix == ".h5"
    assert f"the run 'fill' could not be added to {out}: writing the new {out} reached this " \
           f"process's file-size limit" in proc.stderr
    assert f"{out} is unchanged; the run is kept in {kept}" in proc.stderr
    assert f"KEPT {kept}" in proc.stdout
    _intact(out, before)
    (run,) = h5log.read(kept)
    assert run.attrs["status"] == "complete" and [r["i"] for r in run.tables["t"]] == list(range(30))
    # without the limit the same run lands
    assert _fill(out, 30).returncode == 0
    assert [r.label for r in h5log.read(out)] == ["first", "second", "fill"]


class _Disk:
    """os.pwrite and os.ftruncate of this process on a disk with ``free`` bytes left."""

    def __init__(self, monkeypatch, free: int):
        self.free = free
        real_pwrite, real_ftruncate = os.pwrite, os.ftruncate

        def pwrite(fd, data, offset):
            if len(data) > self.free:
                raise OSError(28, os.strerror(28))
            self.free -= len(data)
            return real_pwrite(fd, data, offset)

        def ftruncate(fd, size):
            if size > os.fstat(fd).st_size + self.free:
                raise OSError(28, os.strerror(28))
            return real_ftruncate(fd, size)
        monkeypatch.setattr(os, "pwrite", pwrite)
        monkeypatch.setattr(os, "ftruncate", ftruncate)


def test_no_space_left_mid_run(tmp_path, monkeypatch):
    out = tmp_path / "r.h5"
    before = _earlier_runs(out, 4096)
    _Disk(monkeypatch, 200 << 10)
    run = h5log.RunWriter(out, "x")
    with pytest.raises(h5log.WriteFailed) as err:
        for i in range(1000):
            run.table("t").append([{"i": i, "data": np.ones(512)}])
    exc = err.value
    assert exc.errno == 28 and exc.kept is None and exc.path == out
    assert f"no space left on the file system of {tmp_path}" in str(exc)
    assert "was not saved" in str(exc) and str(run.tmp_path) in str(exc)
    with pytest.raises(h5log.WriteFailed):      # the writer is done; it says so again
        run.table("t").append([{"i": 0, "data": np.ones(512)}])
    with pytest.raises(h5log.WriteFailed):
        run.close()
    monkeypatch.undo()
    _intact(out, before)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.h5"]
    h5log.write_record(out, "test", "later", tables={"t": _rows(1)})   # HDF5 still healthy
    assert [r.label for r in h5log.read(out)][-1] == "later"


def test_no_space_to_land_keeps_the_run_beside(tmp_path, monkeypatch):
    out = tmp_path / "r.h5"
    before = _earlier_runs(out, 4096)
    run = h5log.RunWriter(out, "x")
    run.table("t").append(_rows(3))

    def full(src, dst):
        raise OSError(28, os.strerror(28), str(dst))
    monkeypatch.setattr(h5log, "_copy_new", full)
    with pytest.raises(h5log.WriteFailed) as err:
        run.close()
    kept = err.value.kept
    assert kept is not None and kept.parent == tmp_path and kept.name.startswith("r-x-")
    assert f"{out} is unchanged; the run is kept in {kept}" in str(err.value)
    monkeypatch.undo()
    _intact(out, before)
    (r,) = h5log.read(kept)
    assert r.attrs["status"] == "complete" and len(r.tables["t"]) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["r.h5", kept.name])


def test_whole_files_and_stamps_under_no_space(tmp_path, monkeypatch):
    out = tmp_path / "w.h5"
    h5log.write_record(out, "test", "x", tables={"t": _rows(1)})
    before = out.read_bytes()
    disk = _Disk(monkeypatch, 0)
    with pytest.raises(h5log.WriteFailed, match="is unchanged and the file was not saved"):
        with h5log.whole_file(out) as f:
            f["a"] = np.ones(1 << 16)
    disk.free = 1 << 40
    monkeypatch.setattr(h5log, "_copy_new", lambda a, b: (_ for _ in ()).throw(OSError(122, "quota")))
    with pytest.raises(h5log.WriteFailed, match="exceeded the disk quota.*attributes were not added"):
        h5log.update_file_attrs(out, {"SLURM_JOB_ID": "1"})
    monkeypatch.undo()
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["w.h5"]


def test_the_guard_keeps_hdf5_consistent_after_a_failed_write(tmp_path, monkeypatch):
    """What HDF5 wrote after the first failure reads back as written (pages in memory),
    so it can go on and close the file: the reason the guard exists."""
    disk = _Disk(monkeypatch, 64 << 10)
    f, io = h5log._h5_open(tmp_path / "g.h5", "x")
    data = {f"d{k}": np.arange(4096.0) + k for k in range(20)}
    for name, arr in data.items():
        f[name] = arr
    f.flush()
    assert io.error is not None and io.error.errno == 28 and disk.free < 64 << 10
    for name, arr in data.items():
        assert np.array_equal(f[name][()], arr)
    assert h5log._h5_close(f, io) is io.error
