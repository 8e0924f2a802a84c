"""scripts/token_model.py, the launch order's cost model (docs/ordering.md, "Cost at
scale"): small shapes, checked against what each protocol must do."""
import importlib.util
import math
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def model():
    path = Path(__file__).parents[2] / "scripts" / "token_model.py"
    spec = importlib.util.spec_from_file_location("token_model", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("shape", ["world", "groups"])
def test_the_ring_places_a_burst_within_two_rounds(model, shape):
    """The baseline: 2n hops, and its byte formula stays close to pickle."""
    for n, comms in ((2, 1), (8, 3), (24, 10)):
        s = model.simulate_ring(n, comms, shape, check=True)[-1]
        assert s["collectives"] == comms
        assert 1 <= s["worst"] <= 2 * n
        low, high = s["size_error"]
        assert -0.05 <= low <= high <= 0.5, (shape, n, comms, low, high)


def test_the_tree_places_a_world_burst_in_twice_its_depth(model):
    """Every communicator spans the world: 2 x depth hops, one report and one batch per
    edge, and the cached step moves fewer bytes than the first."""
    for n, per_node in ((2, 1), (16, 4), (100, 8), (256, 8)):
        first, again = model.simulate_tree(n, 10, "world", per_node)
        depth = model.Tree([w // per_node for w in range(n)]).depth
        assert depth <= math.ceil(math.log2(-(-n // per_node))) + math.ceil(math.log2(per_node))
        for s in (first, again):
            assert s["median"] == s["worst"] == 2 * depth
            assert s["messages"] == 2 * (n - 1)
        assert again["busiest"] < first["busiest"]


def test_the_tree_beats_the_ring_on_groups(model):
    """Groups of 8 at 512 ranks: far under the ring's latency, bytes and messages."""
    ring = model.simulate_ring(512, 64, "groups")[-1]
    first, again = model.simulate_tree(512, 64, "groups")
    assert again["worst"] <= 2 * 9 < ring["median"]
    assert again["busiest"] < ring["busiest"]
    assert again["per_collective"] < ring["per_collective"]
