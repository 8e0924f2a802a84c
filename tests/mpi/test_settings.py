"""Settings at init (config.py, Context._agree), as a job sees them: a setting that
decides what the ranks exchange and differs between ranks, or a value out of range on one
rank only, raises the same ArgumentError on every rank, naming the variable, before
anything is made (init hung on the other ranks; a 0-byte /dev/shm file stayed behind)."""
import glob

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
from hpccoll import ArgumentError


def shm_files() -> set:
    return set(glob.glob("/dev/shm/hpccoll*"))


def init_fails_everywhere(monkeypatch, values_by_rank: dict, match: str) -> None:
    """Set each rank's own environment, then init: every rank raises, nothing is left,
    and an init with the defaults works afterwards."""
    rank = MPI.COMM_WORLD.Get_rank()
    before = shm_files()
    for name, value in values_by_rank.get(rank, {}).items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ArgumentError, match=match):
        hpccoll.init(timeout=30)
    monkeypatch.undo()
    MPI.COMM_WORLD.Barrier()
    assert shm_files() <= before
    with hpccoll.init(timeout=30) as ctx:
        np.testing.assert_array_equal(ctx.world.allreduce(np.ones(3, np.int64)).wait(),
                                      np.full(3, ctx.size))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("name,mine,theirs", [
    ("HPCCOLL_SHM", "0", "1"),
    ("HPCCOLL_NODE_SIZE", "1", "2"),
    ("HPCCOLL_CHUNK_BYTES", "65536", "1048576"),
])
def test_a_setting_that_must_agree_and_differs_raises_on_every_rank(monkeypatch, name,
                                                                      mine, theirs):
    n = MPI.COMM_WORLD.Get_size()
    init_fails_everywhere(monkeypatch, {0: {name: mine}, **{r: {name: theirs}
                                                             for r in range(1, n)}},
                          f"{name[8:].lower()}.*rank")


@pytest.mark.parametrize("name,value", [
    ("HPCCOLL_SHM_SLOT_BYTES", "1e30"),
    ("HPCCOLL_SHM_SLOTS", "1e13"),
    ("HPCCOLL_CHUNK_BYTES", "inf"),
    ("HPCCOLL_MISMATCH_EVERY", "1e18"),
    ("HPCCOLL_POLICY", "sideways"),
])
def test_a_value_out_of_range_on_one_rank_raises_on_every_rank(monkeypatch, name, value):
    init_fails_everywhere(monkeypatch, {0: {name: value}}, f"{name}: expected")
