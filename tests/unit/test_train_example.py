"""examples/train_dp.py at 2 ranks, small: it trains, keeps the ranks identical, and
writes its per-step times; once with a profile measured in the run, once with a saved
(model) profile whose plan has several buckets."""
import re
from pathlib import Path

import h5py
import numpy as np

from hpccoll.tuning import layers
from tests import launch

EXAMPLE = str(Path(__file__).parents[2] / "examples" / "train_dp.py")
SMALL = ["--steps", "30", "--hidden", "128,128", "--warmup", "4", "--profile-repeats", "2"]


def run_example(tmp_path, extra):
    out = tmp_path / "train.h5"
    proc = launch.run(2, [EXAMPLE, *SMALL, "--out", str(out), *extra], timeout=240,
                      env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = proc.stdout
    assert "parameters identical on all ranks after 30/30 steps" in text
    first, last = map(float, re.search(r"loss ([\d.]+) -> ([\d.]+)", text).groups())
    assert last < 0.5 * first
    assert float(re.search(r"test accuracy ([\d.]+)", text).group(1)) > 0.8
    assert "ratio planned/ddp" in text
    with h5py.File(out) as f:
        steps = f["steps"]
        assert steps["t_backward"].shape == (30,) and np.all(steps["t_backward"][()] > 0)
        assert np.all(steps["t_comm"][()] > 0)
        assert steps["params_identical"][()].all()
        assert set(steps["method"][()]) == {0.0, 1.0}
        assert f.attrs["nranks"] == 2 and 0 < f.attrs["ratio_planned_over_ddp"] < 100
        assert f["workload/compute"].attrs["source"] == "measured"
    return text


def test_training_with_a_profile_measured_in_the_run(tmp_path):
    text = run_example(tmp_path, [])
    assert "profile: comm measured, slowdown measured" in text


def test_training_with_a_saved_profile_and_several_buckets(tmp_path):
    # a fast network makes fusing pointless, so early buckets pay; block counts 1 and 2,
    # which a 2-core CI machine can run (host arrays: blocks = Numba CPU threads)
    prof = layers.model_profile(layers.Network(link_gbps=400, step_latency=1e-7, blocks=(1, 2)))
    path = str(tmp_path / "model_profile.h5")
    prof.save(path)
    text = run_example(tmp_path, ["--profile", path])
    assert "profile: comm model, slowdown model" in text
    planned = re.search(r"planned: (.*);", text).group(1)
    assert planned.count("[") > 1, planned          # more than one bucket
