"""GradientBucketer under mpiexec: averages land in the gradient arrays whatever order
each rank marks them ready in, step after step."""
import os

import numpy as np
import pytest

from hpccoll.bucketer import GradientBucketer
from hpccoll.errors import ArgumentError, HpcCollError
from hpccoll.tuning import Plan

SHAPES = [(3, 5), (7,), (4, 4), (1,), (1000,), (2, 3, 4)]


def grads_for(rank, step):
    return [np.full(s, 10.0 * rank + step + i, dtype=np.float32) for i, s in enumerate(SHAPES)]


@pytest.mark.skipif(os.environ.get("HPCCOLL_TEST_POLICY") == "fifo",
                    reason="fifo deadlocks on rank-dependent orders by design (the chaos "
                           "tests assert that it ends in CollectiveTimeout)")
@pytest.mark.parametrize("ends", [(1, 2, 3, 4, 5, 6), (2, 5, 6), (6,)])
def test_averages_with_rank_dependent_ready_orders(comm, ends):
    rank, size = comm.rank, comm.size
    grads = grads_for(rank, 0)
    bk = GradientBucketer(comm, grads, Plan(ends, (1,) * len(ends)), name=f"g{len(ends)}")
    rng = np.random.default_rng(100 + rank)
    for step in range(3):
        for g, new in zip(grads, grads_for(rank, step)):
            g[...] = new
        for i in rng.permutation(len(grads)):       # each rank its own order
            bk.ready(int(i))
        stats = bk.finish(timeout=60)
        for i, g in enumerate(grads):
            expect = np.mean([10.0 * r + step + i for r in range(size)])
            assert g.shape == SHAPES[i]
            assert np.allclose(g, expect), (step, i, g.ravel()[:3], expect)
        assert all(d is not None and d >= t for d, t in zip(stats["done"], stats["issued"]))


def test_misuse_is_reported(comm):
    grads = grads_for(comm.rank, 0)
    bk = GradientBucketer(comm, grads, Plan((3, 6), (1, 1)))
    with pytest.raises(HpcCollError, match="never marked ready"):
        bk.finish()
    with pytest.raises(ArgumentError, match="i:"):
        bk.ready(6)
    with pytest.raises(ArgumentError, match="plan"):
        GradientBucketer(comm, grads, Plan((3, 5), (1, 1)))
    with pytest.raises(ArgumentError, match="grads\\[1\\]"):
        GradientBucketer(comm, [np.zeros(2, np.float32), np.zeros(2, np.float64)],
                         Plan((2,), (1,)))
    for i in range(6):
        bk.ready(i)
    with pytest.raises(ArgumentError, match="already marked"):
        bk.ready(0)
    bk.finish(timeout=60)


def test_blocks_applied_follows_the_api(comm):
    import inspect
    bk = GradientBucketer(comm, grads_for(comm.rank, 0), Plan((6,), (2,)))
    assert bk.blocks_applied == ("blocks" in inspect.signature(comm.allreduce).parameters)
