"""Profiles (interpolation, HDF5, provenance), the model tables, and the simulator
table with its plot through the real ``hpccoll-tune simulate`` command."""
import subprocess
import sys

import h5py
import numpy as np
import pytest

from hpccoll import h5log
from hpccoll.errors import ArgumentError
from hpccoll.tuning import Profile, baselines, layers
from hpccoll.tuning import report


def test_interpolation_is_exact_for_latency_plus_bandwidth():
    sizes = np.array([1 << 10, 1 << 16, 1 << 22])
    prof = Profile(sizes, [1, 2], 1e-5 + sizes[:, None] / np.array([[1e9, 2e9]]), [1.0, 1.2])
    x = np.array([5000, 1 << 20, 1 << 26])                 # inside and beyond the grid
    assert np.allclose(prof.time(x, 2), 1e-5 + x / 2e9)
    assert prof.time(10, 1) == pytest.approx(prof.comm_time[0, 0])   # latency floor below
    assert prof.slowdown_of(2) == 1.2


def test_profile_round_trip_keeps_provenance(tmp_path):
    prof = layers.model_profile(layers.Network(link_gbps=50))
    path = str(tmp_path / "p.h5")
    prof.save(path, {"hpccoll_version": "x", "nranks": 8})
    back = Profile.load(path)
    assert np.array_equal(back.comm_time, prof.comm_time)
    assert back.sources == {"comm_time": "model", "slowdown": "model"}
    (run,) = h5log.read(path)
    assert run.kind == "tuning.profile" and run.array_attrs["comm_time"]["source"] == "model"
    assert run.attrs["nranks"] == 8
    assert "sms / (sms - b)" in run.attrs["profile.formula"]
    # appended like every run: load takes the newest profile of the file
    faster = layers.model_profile(layers.Network(link_gbps=400))
    h5log.write_record(path, "bench", "allreduce", {"tool": "x"})
    faster.save(path)
    assert np.array_equal(Profile.load(path).comm_time, faster.comm_time)
    assert [r.kind for r in h5log.read(path)] == ["tuning.profile", "bench", "tuning.profile"]


def test_profiles_of_earlier_versions_still_load(tmp_path):
    """Before one writer: the profile at the root of the file, sources per dataset."""
    prof = layers.model_profile(layers.Network(link_gbps=50))
    path = tmp_path / "old.h5"
    with h5py.File(path, "w") as f:
        f.attrs["kind"] = "hpccoll.tuning.profile"
        f.attrs["profile.formula"] = "x"
        for name in ("sizes", "blocks", "comm_time", "slowdown"):
            f[name] = getattr(prof, name)
        f["comm_time"].attrs["source"] = "model"
        f["slowdown"].attrs["source"] = "measured"
        f["samples/a"] = np.ones(2)
    back = Profile.load(str(path))
    assert np.array_equal(back.comm_time, prof.comm_time) and back.attrs == {"formula": "x"}
    assert back.sources == {"comm_time": "model", "slowdown": "measured"}
    assert list(back.samples) == ["a"]


def test_profile_rejects_bad_input(tmp_path):
    with pytest.raises(ArgumentError, match="comm_time"):
        Profile([1, 2], [1], [[1.0]], [1.0])
    with pytest.raises(ArgumentError, match="sizes"):
        Profile([2, 1], [1], [[1.0], [2.0]], [1.0])
    with pytest.raises(ArgumentError, match="slowdown"):
        Profile([1], [1], [[1.0]], [0.0])
    with pytest.raises(ArgumentError, match="sources"):
        Profile([1], [1], [[1.0]], [1.0], {"comm_time": "guessed", "slowdown": "model"})
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["x"] = 1
    with pytest.raises(ArgumentError, match="not an hpccoll profile"):
        Profile.load(str(other))
    with pytest.raises(ArgumentError, match="cannot open"):
        Profile.load(str(tmp_path / "missing.h5"))
    runs = tmp_path / "runs.h5"
    h5log.write_record(runs, "bench", "allreduce")
    with pytest.raises(ArgumentError, match="not an hpccoll profile .its runs: bench"):
        Profile.load(str(runs))


def test_measured_slowdown_below_one_counts_as_none():
    prof = Profile([1], [1, 2], [[1.0, 1.0]], [0.97, 1.1])
    assert prof.slowdown_of(1) == 1.0


@pytest.mark.parametrize("model", list(layers.ARCHITECTURES))
def test_tables_match_the_published_parameter_counts(model):
    assert layers.params(model) == layers.PUBLISHED_PARAMS[model]
    work = layers.workload(model)
    assert work.nbytes.sum() == 4 * layers.PUBLISHED_PARAMS[model]
    assert np.all(work.compute >= layers.Device().kernel_floor)


def test_ddp_buckets_close_at_the_cap():
    work = layers.workload("resnet50")
    ends = baselines.ddp_ends(work)
    starts = (0,) + ends[:-1]
    sizes = [int(work.nbytes[a:e].sum()) for a, e in zip(starts, ends)]
    assert all(s >= baselines.DDP_CAP for s in sizes[:-1])
    assert all(int(work.nbytes[a:e - 1].sum()) < baselines.DDP_CAP for a, e in zip(starts, ends))


def test_simulator_table_planned_never_worse_and_target_at_50_gbps():
    """All four models at every speed: the plan is never slower than a baseline (they
    are all plans the DP considers), and at 50 Gb/s it cuts (a) by >= 10% for >= 3 of 4."""
    res = report.run()
    t = res["backward"]
    planned = t[:, :, 0:1]
    assert np.all(planned <= t * (1 + 1e-9))
    j = res["speeds"].index(50)
    cuts = 1 - t[:, j, 0] / t[:, j, 1]
    assert np.sum(cuts >= 0.10) >= 3, cuts


def test_simulate_command_writes_table_h5_and_png(tmp_path):
    h5, png = tmp_path / "sim.h5", tmp_path / "sim.png"
    proc = subprocess.run([sys.executable, "-m", "hpccoll.tuning.cli", "simulate",
                           "--models", "resnet50,vgg16", "--gbps", "50,100",
                           "--out", str(h5), "--png", str(png)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "resnet50" in proc.stdout and "fusion_only" in proc.stdout
    (run,) = h5log.read(h5)
    assert run.kind == "tuning.simulate" and run.arrays["backward_time"].shape == (2, 2, 4)
    assert list(run.arrays["methods"]) == list(baselines.METHODS)
    assert "model" in run.attrs["source"] and "hpccoll_version" in run.attrs
    # the table reads back from the file as the command printed it
    assert report.table(report.from_run(run)) in proc.stdout
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


def test_simulate_command_rejects_unknown_model():
    proc = subprocess.run([sys.executable, "-m", "hpccoll.tuning.cli", "simulate",
                           "--models", "alexnet", "--out", "", "--png", ""],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--models" in proc.stderr


def test_plan_command_on_a_saved_profile(tmp_path):
    path = str(tmp_path / "p.h5")
    layers.model_profile(layers.Network(link_gbps=100)).save(path)
    proc = subprocess.run([sys.executable, "-m", "hpccoll.tuning.cli", "plan", "--profile", path,
                           "--model", "vgg16"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "planned:" in proc.stdout and "ddp" in proc.stdout


def test_the_docs_example_runs():
    """docs/tuning.md's first Python example, as written."""
    from pathlib import Path
    text = (Path(__file__).parents[2] / "docs" / "tuning.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "docs/tuning.md", "exec"), {})
