"""The planner's DP against exhaustive search, and the properties the issue names.

The chain of proof: (1) the closed form (model.advance) equals the independent event
simulation on random plans; (2) the DP's optimum equals the minimum over *every* plan
(every partition into contiguous buckets x every block count per bucket), evaluated
with the closed form, on many random instances of up to 8 tensors x 3 block counts,
and with the event simulation itself on the smaller ones.
"""
import itertools

import numpy as np
import pytest

from hpccoll.errors import ArgumentError
from hpccoll.tuning import Plan, Profile, Workload, evaluate, plan, simulate
from hpccoll.tuning.model import advance

SIZES = np.array([0, 1 << 12, 1 << 16, 1 << 20, 1 << 24])


def instance(rng, n, nb=3, contention=True, monotone=False):
    """Random tensors (some layers free, sizes over 4 decades) and a random profile:
    per block count an affine time plus a random wiggle, and a random slowdown."""
    nbytes = (10 ** rng.uniform(2, 7, n)).astype(np.int64)
    compute = rng.exponential(1e-3, n) * (rng.random(n) > 0.15)
    alpha = rng.uniform(1e-5, 1e-3, nb)
    beta = rng.uniform(1e8, 1e10, nb)
    if monotone:   # more blocks strictly faster at every size
        alpha, beta = np.sort(alpha)[::-1], np.sort(beta)
    ct = alpha[None, :] + SIZES[:, None] / beta[None, :]
    if not monotone:
        ct *= rng.uniform(0.8, 1.2, ct.shape)
    slow = 1 + rng.uniform(0, 1.5, nb) if contention else np.ones(nb)
    return Workload.of(nbytes, compute), Profile(SIZES, np.arange(1, nb + 1) * 2, ct, slow)


def exhaustive(work, prof, fusion=True):
    """min over all plans of the closed-form time, sharing prefixes (depth-first)."""
    n, P = work.n, work.ready
    total = float(P[-1])
    cum = np.concatenate(([0], np.cumsum(work.nbytes)))
    blocks = prof.block_list
    T = {(a, e, b): float(prof.time(cum[e] - cum[a], b))
         for a in range(n) for e in range(a + 1, n + 1) for b in blocks}
    slow = {b: prof.slowdown_of(b) for b in blocks}
    best = [np.inf]

    ready = [float(x) for x in P]

    def go(a, E, pi):
        if a == n:
            best[0] = min(best[0], E)
            return
        for e in (range(a + 1, n + 1) if fusion else (a + 1,)):
            r = ready[e - 1]
            for b in blocks:
                # the model's rules written out again (the same as model.advance)
                t = T[a, e, b]
                go(e, E + max(0.0, r - pi) + t, min(total, max(pi, r) + t / slow[b]))
    go(0, 0.0, 0.0)
    return best[0]


def all_plans(n, blocks):
    for cuts in itertools.product((0, 1), repeat=n - 1):
        ends = tuple(i + 1 for i, c in enumerate(cuts) if c) + (n,)
        for bl in itertools.product(blocks, repeat=len(ends)):
            yield Plan(ends, bl)


def close(a, b, rel=1e-9):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)


def test_closed_form_equals_event_simulation_on_random_plans():
    rng = np.random.default_rng(11)
    for _ in range(400):
        n = int(rng.integers(1, 12))
        work, prof = instance(rng, n)
        cuts = np.flatnonzero(rng.random(n - 1) < 0.4) + 1
        ends = tuple(int(c) for c in cuts) + (n,)
        p = Plan(ends, tuple(int(x) for x in rng.choice(prof.blocks, len(ends))))
        assert close(evaluate(work, p, prof), simulate(work, p, prof).time)


@pytest.mark.parametrize("n", range(1, 9))
def test_dp_equals_exhaustive_search(n):
    """Every instance of n tensors x 3 block counts: the DP's plan is optimal, and the
    DP's own value is that plan's simulated time."""
    rng = np.random.default_rng(1000 + n)
    count = 60 if n <= 6 else 25
    for _ in range(count):
        work, prof = instance(rng, n, contention=rng.random() < 0.9)
        res = plan(work, prof, polish=False)
        best = exhaustive(work, prof)
        assert close(res.time, best), (n, res.time, best, res.plan)
        assert close(res.dp_time, res.time)
        assert close(simulate(work, res.plan, prof).time, res.time)


def test_dp_equals_exhaustive_event_simulation_small():
    """Ground truth straight from the event simulator, no closed form involved."""
    rng = np.random.default_rng(5)
    for _ in range(25):
        n = int(rng.integers(1, 6))
        work, prof = instance(rng, n)
        best = min(simulate(work, p, prof).time for p in all_plans(n, prof.block_list))
        assert close(plan(work, prof).time, best)


def naive_plan_time(work, prof):
    """A DP that keeps only the earliest end time per stage (no compute state)."""
    n, P = work.n, work.ready
    total = float(P[-1])
    cum = np.concatenate(([0], np.cumsum(work.nbytes)))
    best = [(0.0, 0.0)] + [None] * n
    for e in range(1, n + 1):
        for a in range(e):
            for b in prof.block_list:
                E, pi = best[a]
                E2, pi2 = advance(E, pi, float(P[e - 1]), total,
                                  float(prof.time(cum[e] - cum[a], b)), prof.slowdown_of(b))
                if best[e] is None or E2 < best[e][0]:
                    best[e] = (float(E2), float(pi2))
    return best[n][0]


def test_the_exhaustive_check_catches_a_naive_dp():
    """The test above has teeth: a DP whose state forgets the compute progress misses
    the optimum on some of the same kind of instances."""
    rng = np.random.default_rng(3)
    for _ in range(300):
        work, prof = instance(rng, int(rng.integers(3, 7)))
        if naive_plan_time(work, prof) > exhaustive(work, prof) * (1 + 1e-9):
            return
    pytest.fail("the naive DP matched exhaustive search on every instance")


def test_without_contention_every_bucket_gets_the_most_blocks():
    rng = np.random.default_rng(7)
    for _ in range(60):
        work, prof = instance(rng, int(rng.integers(1, 9)), contention=False, monotone=True)
        res = plan(work, prof)
        top = max(prof.block_list)
        assert set(res.plan.blocks) == {top}, res.plan
        assert close(res.time, plan(work, prof, blocks=[top]).time)
        assert close(res.time, exhaustive(work, prof))


def test_fusion_off_is_the_per_tensor_choice():
    rng = np.random.default_rng(9)
    for _ in range(40):
        n = int(rng.integers(1, 7))
        work, prof = instance(rng, n)
        res = plan(work, prof, fusion=False, polish=False)
        assert res.plan.ends == tuple(range(1, n + 1))
        assert close(res.time, exhaustive(work, prof, fusion=False))
        per_tensor = min(evaluate(work, Plan(tuple(range(1, n + 1)), bl), prof)
                         for bl in itertools.product(prof.block_list, repeat=n))
        assert close(res.time, per_tensor)
        assert res.time >= plan(work, prof).time * (1 - 1e-12)   # fusion can only help


def test_grid_is_an_upper_bound_within_its_error_bound():
    rng = np.random.default_rng(13)
    for _ in range(40):
        n = int(rng.integers(2, 9))
        work, prof = instance(rng, n)
        exact = plan(work, prof, polish=False)
        grid = float(work.compute.sum()) / 50 + 1e-6
        res = plan(work, prof, grid=grid, polish=False)
        assert res.dp_time >= res.time * (1 - 1e-12)             # DP value bounds its plan
        assert res.time >= exact.time * (1 - 1e-12)
        assert res.dp_time <= exact.time + 2 * len(exact.plan.ends) * grid + 1e-12


def test_polish_never_costs_time():
    rng = np.random.default_rng(17)
    for _ in range(40):
        work, prof = instance(rng, int(rng.integers(1, 9)))
        a, b = plan(work, prof, polish=False), plan(work, prof)
        assert b.time <= a.time * (1 + 1e-11)
        assert all(x >= y for x, y in zip(b.plan.blocks, a.plan.blocks))


def test_bad_input_names_the_argument():
    rng = np.random.default_rng(0)
    work, prof = instance(rng, 3)
    with pytest.raises(ArgumentError, match="blocks"):
        plan(work, prof, blocks=[5])
    with pytest.raises(ArgumentError, match="grid"):
        plan(work, prof, grid=-1)
    with pytest.raises(ArgumentError, match="work"):
        plan([1, 2], prof)
    with pytest.raises(ArgumentError, match="compute"):
        Workload.of([1, 2], [0.1])
    with pytest.raises(ArgumentError, match="nbytes"):
        Workload.of([-1], [0.1])
    with pytest.raises(ArgumentError, match="plan"):
        evaluate(work, Plan((1, 2), (2, 2)), prof)
    with pytest.raises(ArgumentError, match="plan"):
        Plan((2, 1), (2, 2))
