"""The calibration table (hpccoll/algorithms/calibration.py): lookup, its file, how the
algorithm table takes its pick, and ``hpccoll-tune calibrate`` as users run it (real
mpiexec at 2 ranks, a tiny grid)."""
import os
import subprocess
import sys

import pytest

from hpccoll import algorithms, h5log
from hpccoll.errors import ArgumentError
from hpccoll.algorithms.calibration import Calibration, default_path, load_setting
from tests import launch

LIB = "MPICH Version: 4.2"


def _cal(**extra):
    picks = {(2, 2, "allreduce", "host"): [(8, "mpi"), (1 << 20, "ring"), (16 << 20, "shm")],
             (4, 4, "allreduce", "host"): [(8, "doubling")]}
    picks.update(extra)
    times = {(2, 2, "allreduce", "host", 8, "mpi"): 8e-6,
             (2, 2, "allreduce", "host", 8, "ring"): 30e-6}
    return Calibration(picks, times, "measured", LIB)


def test_a_message_takes_the_pick_of_the_nearest_measured_size_on_a_log_scale():
    cal = _cal()
    assert cal.choose("allreduce", "host", 8, 2, 2) == "mpi"
    assert cal.choose("allreduce", "host", 1 << 10, 2, 2) == "mpi"      # 2^10: nearer 2^3
    assert cal.choose("allreduce", "host", 64 << 10, 2, 2) == "ring"    # 2^16: nearer 2^20
    assert cal.choose("allreduce", "host", 256 << 10, 2, 2) == "ring"
    assert cal.choose("allreduce", "host", 1 << 20, 2, 2) == "ring"
    assert cal.choose("allreduce", "host", 5 << 20, 2, 2) == "shm"
    assert cal.choose("allreduce", "host", 1 << 30, 2, 2) == "shm"      # beyond: the largest
    assert cal.choose("allreduce", "host", 0, 2, 2) == "mpi"
    # nothing measured for this shape, collective or buffers: the built-in table decides
    assert cal.choose("allreduce", "host", 8, 3, 3) == ""
    assert cal.choose("allreduce", "registered", 8, 2, 2) == ""
    assert cal.choose("reduce", "host", 8, 2, 2) == ""
    assert cal.choose("allreduce", "host", 8, 4, 4) == "doubling"
    assert cal.shapes() == [(2, 2), (4, 4)]
    assert not Calibration() and cal


def test_the_boundary_between_two_sizes_is_their_geometric_middle():
    cal = Calibration({(2, 2, "allreduce", "host"): [(1 << 10, "mpi"), (1 << 20, "ring")]})
    assert cal.choose("allreduce", "host", (1 << 15) - 1, 2, 2) == "mpi"
    assert cal.choose("allreduce", "host", (1 << 15) + 1, 2, 2) == "ring"


def test_the_table_prints_each_pick_with_every_candidate_time():
    cal = _cal()
    cal.times[(2, 2, "allreduce", "host", 1 << 20, "mpi")] = 300e-6
    cal.times[(2, 2, "allreduce", "host", 1 << 20, "ring")] = 250e-6
    lines = cal.table()
    assert lines[0].startswith("2 ranks, 2 per node: the pick at each size")
    assert lines[1].split() == ["collective", "buffers", "8", "B", "1", "MiB", "16", "MiB"]
    assert lines[2].split() == ["allreduce", "host", "mpi", "ring", "1.20x", "shm"]
    assert lines[3].startswith("4 ranks, 4 per node")
    assert "2 ranks (2 per node) allreduce      host             8 B: mpi 8.0, ring 30.0" in \
        cal.timings()


def test_save_and_load_round_trip_later_runs_win_other_libraries_are_skipped(tmp_path):
    path = str(tmp_path / "cal.h5")
    _cal().save(path)
    newer = Calibration({(2, 2, "allreduce", "host"): [(8, "doubling")]}, {}, "measured", LIB)
    newer.save(path)
    Calibration({(2, 2, "reduce", "host"): [(8, "binomial")]}, {}, "measured",
                "Open MPI v5").save(path)
    runs = h5log.read(path)
    assert [r.kind for r in runs] == ["tuning.calibration"] * 3
    assert runs[0].attrs["mpi_library"] == LIB
    got = Calibration.load(path, LIB)
    assert got.source == path
    assert got.choose("allreduce", "host", 1 << 20, 2, 2) == "doubling"   # the newer run
    assert got.choose("allreduce", "host", 8, 4, 4) == "doubling"         # kept from the first
    assert got.choose("reduce", "host", 8, 2, 2) == ""                    # another library
    assert got.times[(2, 2, "allreduce", "host", 8, "ring")] == pytest.approx(30e-6)
    assert Calibration.load(path).choose("reduce", "host", 8, 2, 2) == "binomial"
    state = got.state()
    again = Calibration.from_state(state)
    assert again.picks == got.picks and again.times == got.times


def test_the_setting_off_auto_and_a_path(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_path() == str(tmp_path / "cache" / "hpccoll" / "calibration.h5")
    cal, note = load_setting("auto", LIB)
    assert not cal and note.startswith("built-in (no ")
    assert load_setting("off", LIB)[1] == "off"
    _cal().save(default_path())
    cal, note = load_setting("auto", LIB)
    assert cal and note == default_path()
    cal, note = load_setting("auto", "another MPI")
    assert not cal and "holds no table measured with another MPI" in note
    with pytest.raises(ArgumentError, match="calibration: cannot read"):
        load_setting(str(tmp_path / "missing.h5"), LIB)
    notcal = tmp_path / "other.h5"
    with h5log.RunWriter(str(notcal), "x", {}, kind="bench") as run:
        run.array("a", [1])
    with pytest.raises(ArgumentError, match="holds no calibration .*bench"):
        load_setting(str(notcal), LIB)


def _choice(nbytes, prefer, shm="flat", native=True, registered=False, c_bytes=0):
    return algorithms.Choice(nbytes, 64 << 10, shm, 64 << 10, registered, 64 << 10, native,
                             prefer, c_bytes)


def test_the_algorithm_table_takes_a_pick_only_where_it_can_run():
    assert algorithms.select("allreduce", _choice(1 << 20, "")) == "shm"
    assert algorithms.select("allreduce", _choice(1 << 20, "ring")) == "ring"
    assert algorithms.select("allreduce", _choice(1 << 20, "mpi")) == "mpi"
    # MPI cannot run this dtype or op: the built-in choice
    assert algorithms.select("allreduce", _choice(8, "mpi", native=False)) == "doubling"
    # no node-shared memory here (another machine's table, or shm off)
    assert algorithms.select("allreduce", _choice(1 << 20, "shm", shm="")) == "ring"
    assert algorithms.select("allreduce", _choice(1 << 20, "hier")) == "shm"
    # a name that is not a candidate of this collective
    assert algorithms.select("reduce", _choice(8, "doubling")) == "mpi"
    assert algorithms.select("broadcast", _choice(8, "dissemination")) == "mpi"
    assert algorithms.candidates("allreduce", _choice(8, "")) == ["mpi", "shm", "doubling",
                                                                   "ring"]
    assert algorithms.candidates("allreduce", _choice(8, "", shm="", native=False)) == [
        "doubling", "ring"]
    assert algorithms.candidates("reduce_scatter", _choice(8, "")) == ["mpi", "shm", "ring"]


def test_the_built_in_table_follows_the_measurements():
    """MPI's own reduce and reduce_scatter up to mpi_coll_bytes, shared memory above
    (the ring without it); MPI's own allgather at every size except large registered
    buffers (docs/performance.md)."""
    assert algorithms.select("reduce", _choice(64 << 10, "")) == "mpi"
    assert algorithms.select("reduce", _choice(128 << 10, "")) == "shm"
    assert algorithms.select("reduce", _choice(128 << 10, "", registered=True)) == "shm"
    assert algorithms.select("reduce", _choice(128 << 10, "", shm="")) == "ring"
    assert algorithms.select("reduce", _choice(8 << 10, "", registered=True)) == "mpi"
    # broadcast: MPI's own wherever it runs, except shared memory run in C from above
    # shm_c_bytes to 128 KiB; shared memory for what MPI cannot run (float16)
    assert algorithms.select("broadcast", _choice(16 << 20, "")) == "mpi"
    assert algorithms.select("broadcast", _choice(1 << 20, "")) == "mpi"   # (not in C)
    for nbytes, algo in ((8 << 10, "mpi"), ((8 << 10) + 1, "shm"), (64 << 10, "shm"),
                         (128 << 10, "shm"), ((128 << 10) + 1, "mpi"), (16 << 20, "mpi")):
        assert algorithms.select("broadcast", _choice(nbytes, "", c_bytes=8 << 10)) == algo
    assert algorithms.select("broadcast",
                             _choice(64 << 10, "", shm="", c_bytes=8 << 10)) == "mpi"
    assert algorithms.select("broadcast", _choice(1 << 20, "", native=False)) == "shm"
    assert algorithms.select("broadcast", _choice(1 << 20, "", native=False, shm="")) == "chain"
    assert algorithms.select("broadcast", _choice(1 << 20, "shm")) == "shm"
    assert algorithms.select("reduce_scatter", _choice(64 << 10, "")) == "mpi"
    assert algorithms.select("reduce_scatter", _choice(1 << 20, "")) == "shm"
    assert algorithms.select("allgather", _choice(16 << 20, "")) == "mpi"
    assert algorithms.select("allgather", _choice(1 << 20, "", registered=True)) == "mpi"
    assert algorithms.select("allgather", _choice(4 << 20, "", registered=True)) == "shm"
    assert algorithms.select("allgather", _choice(4 << 20, "", native=False)) == "shm"
    # where shared memory runs in C: above shm_c_bytes up to 2 MiB, MPI's own above
    for nbytes, algo in ((8 << 10, "mpi"), (64 << 10, "shm"), (512 << 10, "shm"),
                         (2 << 20, "shm"), ((2 << 20) + 1, "mpi"), (8 << 20, "mpi")):
        assert algorithms.select("allgather", _choice(nbytes, "", c_bytes=8 << 10)) == algo


def test_calibrate_measures_saves_and_init_loads_it(tmp_path):
    out = tmp_path / "cal.h5"
    proc = launch.run(2, ["-m", "hpccoll", "tune", "calibrate", "--out", str(out),
                          "--sizes", "8,256K", "--collectives", "allreduce,reduce",
                          "--rounds", "2", "--round-ms", "0.2"], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"calibration appended to {out}" in proc.stdout
    cal = Calibration.load(str(out))
    assert cal.shapes() == [(2, 2)]
    for coll in ("allreduce", "reduce"):
        for nbytes in (8, 256 << 10):
            pick = cal.choose(coll, "host", nbytes, 2, 2)
            assert pick in [n for n, _, _ in algorithms.TABLE[coll]]
            timed = {a for (r, p, c, b, n, a) in cal.times if (c, b, n) == (coll, "host", nbytes)}
            assert pick in timed and "mpi" in timed and len(timed) >= 3
    # registered buffers are measured where they could take shared memory, and take the
    # ordinary buffers' pick elsewhere: every size has a pick (none is extrapolated)
    assert cal.picks[(2, 2, "allreduce", "registered")][1] == (8, 256 << 10)
    host = cal.choose("allreduce", "host", 8, 2, 2)
    # (single copy never takes registered buffers: they take the built-in choice then)
    assert cal.choose("allreduce", "registered", 8, 2, 2) == (host if host != "cma" else "mpi")
    assert cal.choose("allreduce", "registered", 256 << 10, 2, 2) != ""
    (run,) = h5log.read(out)
    assert run.kind == "tuning.calibration" and run.attrs["nranks"] == 2
    # config shows which candidate each size uses, from this file
    env = dict(os.environ, HPCCOLL_CALIBRATION=str(out))
    shown = subprocess.run([sys.executable, "-m", "hpccoll", "config"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert f"calibration: {out}" in shown.stdout
    assert "2 ranks, 2 per node:" in shown.stdout


def test_calibrate_rejects_bad_arguments_before_measuring(tmp_path):
    proc = launch.run(2, ["-m", "hpccoll", "tune", "calibrate", "--out",
                          str(tmp_path / "c.h5"), "--collectives", "allreduce,gather"],
                      timeout=60)
    assert proc.returncode == 2
    assert "--collectives: expected names from allreduce" in proc.stderr
    assert not (tmp_path / "c.h5").exists()


def test_a_calibration_past_the_file_size_limit_is_a_message_and_exit_1(tmp_path):
    """hpccoll-tune calibrate --out onto a file its record would take past ``ulimit -f``:
    one error line naming the limit and where the run is kept, exit status 1, no traceback
    or signal, the old file unchanged (issue 32, finding 7)."""
    import numpy as np
    out = tmp_path / "c.h5"
    h5log.write_record(out, "test", "pad", arrays={"pad": np.zeros((6 << 20) // 8)})
    before = out.read_bytes()
    proc = launch.run(2, ["-m", "hpccoll.tuning.cli", "calibrate", "--sizes", "8", "--rounds",
                          "1", "--round-ms", "1", "--collectives", "allreduce", "--buffers",
                          "host", "--out", str(out)],
                      timeout=120, file_limit=(len(before) // 1024 + 2) * 1024)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text
    assert "hpccoll-tune calibrate: error: the run 'calibration' could not be added" in proc.stderr
    assert "file-size limit" in proc.stderr and "the run is kept in" in proc.stderr
    for sign in ("Traceback", "BAD TERMINATION", "MPI_Abort", "core dumped"):
        assert sign not in text, text
    assert out.read_bytes() == before
