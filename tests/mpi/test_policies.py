"""The deadlock-free policies in-process: divergent orders complete, keyed collectives
match in any order with a single execution slot, the ordered policy's launch logs agree
across ranks, and preemption counts what it does."""
import random

import numpy as np
import pytest

import hpccoll
from hpccoll.chaos import interleave

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("policy", ["preemptive", "ordered"])
def test_divergent_order_completes_with_one_slot(policy):
    with hpccoll.init(policy=policy, max_active=1, timeout=30) as ctx:
        comms = [ctx.world.dup(name=f"c{i}") for i in range(3)]
        order = comms[ctx.rank % 3:] + comms[:ctx.rank % 3]
        works = [(c, c.allreduce(np.full(1000, comms.index(c) + 1, np.int64))) for c in order]
        for c, w in works:
            np.testing.assert_array_equal(w.wait(), np.full(1000, (comms.index(c) + 1) * ctx.size))


def _rotated_allreduces(ctx, count, ncomms=3):
    comms = [ctx.world.dup(name=f"c{i}") for i in range(ncomms)]
    order = comms[ctx.rank % ncomms:] + comms[:ctx.rank % ncomms]
    works = [(c, c.allreduce(np.full(count, comms.index(c) + 1, np.int64))) for c in order]
    for c, w in works:
        np.testing.assert_array_equal(w.wait(), np.full(count, (comms.index(c) + 1) * ctx.size))


@pytest.mark.parametrize("slots", [1, 2, None])
@pytest.mark.parametrize("policy", ["preemptive", "ordered"])
def test_divergent_order_completes_with_any_slot_bound(policy, slots):
    """hpccoll's own algorithms (not MPI's), node-shared slots from 64 KiB on: with one,
    two or unbounded execution slots, rotated orders over three communicators complete."""
    with hpccoll.init(policy=policy, max_active=slots, timeout=30, mpi_coll_bytes=0,
                      cell_bytes=0) as ctx:
        for count in (100, 20_000):
            _rotated_allreduces(ctx, count)


@pytest.mark.parametrize("slots", [1, None])
@pytest.mark.parametrize("count", [2, 3000, 20_000])   # persistent MPI, MPI's own, node-shared
@pytest.mark.parametrize("policy", ["preemptive", "ordered"])
def test_many_in_flight_wait_parked_out_of_the_walk(policy, slots, count):
    """A hundred collectives per communicator issued before any wait, on two
    communicators in opposite orders: every result exact, and what a pass looks at (the
    preemptive walk, the ordered policy's unordered tasks) never holds more than one
    not-started collective per communicator (the others wait parked until their
    predecessor started, so a pass does not scan everything issued)."""
    from collections import Counter
    with hpccoll.init(policy=policy, max_active=slots, timeout=60) as ctx:
        comms = [ctx.world.dup(name=f"m{i}") for i in range(2)]
        order = comms if ctx.rank % 2 == 0 else comms[::-1]
        policy = ctx._engine.policy
        looked_at = policy.queue if policy.name == "preemptive" else policy.loose
        most = []
        real = policy.step

        def step(engine):
            waiting = Counter(t.comm for t in list(looked_at) if t.t_start is None)
            most.append(max(waiting.values(), default=0))
            return real(engine)
        policy.step = step
        works = []
        for i in range(100):
            for c in order:
                k = comms.index(c)
                works.append((i + k, c.allreduce(np.full(count, i + k, np.int64))))
        for v, w in works:
            np.testing.assert_array_equal(w.wait(), np.full(count, v * ctx.size))
        assert max(most, default=0) <= 1


@pytest.mark.mpi(min_size=2)
def test_ordered_takes_the_token_only_for_what_holds_a_bounded_resource():
    """MPI's own collectives, and hpccoll's with no slot bound, cannot be part of a
    circular wait: the ordered policy launches them without a token round.  With one
    slot, hpccoll's own take the token."""
    with hpccoll.init(policy="ordered", timeout=30) as ctx:
        _rotated_allreduces(ctx, 1)                      # MPI's own
        _rotated_allreduces(ctx, 20_000)                 # node-shared slots, no bound
        ring = ctx._engine.policy.ring
        assert ring is None or ring.hops == 0
    with hpccoll.init(policy="ordered", max_active=1, timeout=30, mpi_coll_bytes=0,
                      cell_bytes=0) as ctx:
        _rotated_allreduces(ctx, 1)
        assert ctx._engine.policy.ring.hops > 0


@pytest.mark.parametrize("policy", ["preemptive", "ordered"])
def test_keyed_any_order_single_slot(policy):
    with hpccoll.init(policy=policy, max_active=1, timeout=30) as ctx:
        rng = random.Random(ctx.rank)
        keys = [f"grad{i}" for i in range(6)]
        order = keys[:]
        rng.shuffle(order)
        works = {k: ctx.world.allreduce(np.full(17, keys.index(k), np.int32), key=k) for k in order}
        for k in keys:
            np.testing.assert_array_equal(works[k].wait(), np.full(17, keys.index(k) * ctx.size))


@pytest.mark.mpi(min_size=2)
def test_preemption_counters(mpi_world):
    """AB/BA with one slot: some rank's collective must yield (a rank whose peers issued in
    its own order may get through without), and counters add up."""
    # mpi_coll_bytes=0: collectives the MPI library runs itself take no slot (and never
    # yield); hpccoll's own algorithms do
    with hpccoll.init(policy="preemptive", max_active=1, timeout=30, mpi_coll_bytes=0,
                      cell_bytes=0) as ctx:
        a, b = ctx.world.dup(), ctx.world.dup()
        first, second = (a, b) if ctx.rank % 2 == 0 else (b, a)
        w1, w2 = first.allreduce(np.ones(8)), second.allreduce(np.ones(8))
        w1.wait(), w2.wait()
        k1, k2 = w1.counters, w2.counters
        assert k1["tries"] >= 1 and k2["tries"] >= 1
        assert mpi_world.allreduce(k1["yields"] + k2["yields"]) >= 1
        assert k1["tries"] == k1["yields"] + 1      # every try but the last one yielded
        assert k1["queued_s"] is not None and k1["running_s"] is not None
        assert ctx.stats()["switches"] >= 2


def test_ordered_launch_logs_agree(mpi_world):
    """Random interleavings over several communicators (MPI order kept per communicator):
    every rank's launch log, restricted to the collectives two ranks share, is in the same
    order, and the global sequence numbers agree.  hpccoll's own algorithms (not MPI's)
    and one slot: every collective of a multi-rank communicator takes the token."""
    with hpccoll.init(policy="ordered", max_active=1, timeout=60, mpi_coll_bytes=0,
                      cell_bytes=0) as ctx:
        n, r = ctx.size, ctx.rank
        comms = [ctx.world.dup(name="all0"), ctx.world.dup(name="all1"),
                 ctx.world.split(r % 2, name=f"half{r % 2}")]
        if n >= 3:
            comms.append(ctx.world.split(0 if r < n - 1 else None, name="most"))
        comms = [c for c in comms if c is not None]
        # (dup and split ran a barrier each under the timeout: not part of this count)
        start = len(ctx._engine.policy.launch_log)
        rng = random.Random(1234 + r)
        works = [(c, i, c.allreduce(np.full(3, i + 1, np.int64))) for _, c, i in
                 interleave([(c.name, c, i) for c in comms for i in range(5)], rng)]
        for c, i, w in works:
            np.testing.assert_array_equal(w.wait(), np.full(3, (i + 1) * c.size))
        log = [(g, cid) for g, cid in list(ctx._engine.policy.launch_log)[start:]
               if g is not None]
        assert len(log) == sum(1 for c, _, _ in works if c.size > 1)
    logs = mpi_world.allgather(log)
    gseq_of = {}
    for rank_log in logs:
        for g, cid in rank_log:
            assert gseq_of.setdefault(cid, g) == g          # one gseq per collective
        gs = [g for g, _ in rank_log]
        assert gs == sorted(gs)                             # launched in gseq order
    for a in range(n):
        for b in range(a + 1, n):
            common = {cid for _, cid in logs[a]} & {cid for _, cid in logs[b]}
            assert [c for _, c in logs[a] if c in common] == [c for _, c in logs[b] if c in common]


def test_idle_daemon_parks_and_wakes():
    """With nothing to do the daemon parks; a submission wakes it."""
    import time
    with hpccoll.init(policy="preemptive", timeout=30, inline_bytes=0) as ctx:
        time.sleep(0.1)
        assert ctx.stats()["parks"] >= 1
        w = ctx.world.allreduce(np.ones(4))
        w.add_done_callback(lambda _: None)     # nobody waits: the daemon must run it
        deadline = time.monotonic() + 10
        while not w._done and time.monotonic() < deadline:
            time.sleep(0.001)
        assert w._done
        assert w.wait().tolist() == [float(ctx.size)] * 4


def test_trace_records_every_collective():
    import time
    with hpccoll.init(policy="preemptive", trace=True, timeout=30) as ctx:
        before = time.time()
        works = [ctx.world.allreduce(np.ones(5)) for _ in range(3)] + [ctx.world.barrier()]
        for w in works:
            w.wait()
        records = ctx.trace(clear=True)
        # in completion order, which MPI decides
        assert sorted(r["coll"] for r in records) == ["allreduce"] * 3 + ["barrier"]
        for r in records:
            assert before - 1 <= r["t_issue"] <= r["t_start"] <= r["t_end"] <= time.time() + 1
            assert r["state"] == "done" and r["rank"] == ctx.rank
            assert len(r["yield_times"]) == r["yields"]
        assert ctx.trace() == []
    with hpccoll.init() as ctx:
        with pytest.raises(hpccoll.HpcCollError, match="tracing is off"):
            ctx.trace()


def test_oversubscribed_node_yields_instead_of_spinning(mpi_world):
    """Where the node's ranks outnumber the CPUs they may run on (4 ranks on this 2-core
    CI machine), waiters do not spin but hand the CPU over (yield_polls), then sleep,
    unless those settings are set."""
    import os
    from mpi4py import MPI
    from hpccoll.engine.progress import YIELDING
    node = mpi_world.Split_type(MPI.COMM_TYPE_SHARED)
    cpus = node.allgather(frozenset(os.sched_getaffinity(0)))
    expected = node.Get_size() > len(frozenset().union(*cpus))
    node.Free()
    with hpccoll.init(timeout=60) as ctx:
        assert ctx.oversubscribed == expected
        assert ctx.settings.spin_polls == (0 if expected else 32)
        assert ctx.settings.yield_polls == (YIELDING[2] if expected else 0)
        for name in ("spin_polls", "yield_polls"):
            assert ctx.settings.sources[name] == ("oversubscribed node" if expected
                                                  else "default")
        np.testing.assert_array_equal(ctx.world.allreduce(np.ones(3)).wait(), np.full(3, ctx.size))
    with hpccoll.init(timeout=60, spin_polls=5, yield_polls=7) as ctx:
        assert ctx.settings.yield_polls == 7 and ctx.settings.sources["yield_polls"] == "argument"
        assert ctx.settings.spin_polls == 5 and ctx.settings.sources["spin_polls"] == "argument"


def test_waiters_yield_before_they_sleep_and_the_daemon_never_yields(monkeypatch):
    """progress.backoff: spin_polls fruitless polls free, then yield_polls yields of the
    CPU, then sleeps growing from 1 us, for a thread in wait() (which spins the whole of
    its first spin_us, or all of a wait on a collective MPI runs, and never sleeps more
    than an eighth of what it waited so far);
    the daemon (which passes its wake-up event) goes straight from spinning to sleeping."""
    from types import SimpleNamespace
    from hpccoll.engine import progress as en
    calls = []
    monkeypatch.setattr(en, "_YIELD", lambda: calls.append("yield"))
    monkeypatch.setattr(en.time, "sleep", lambda d: calls.append(("sleep", round(d * 1e6))))
    monkeypatch.setattr(en, "sleep", lambda engine, event, d: calls.append(("wake",
                                                                            round(d * 1e6))))
    # (the engine's own spin_polls, yield_polls, spin_us: they follow the machine's load)
    fake = SimpleNamespace(spin_polls=2, yield_polls=3, spin_us=50.0,
                           settings=SimpleNamespace(poll_sleep_us=4.0),
                           policy=SimpleNamespace(hot=False))
    for idle in range(1, 9):
        en.backoff(fake, idle, waited=49e-6)
    assert calls == []                       # within spin_us
    for idle in range(1, 9):
        en.backoff(fake, idle, waited=1.0)
    assert calls == ["yield"] * 3 + [("sleep", 2), ("sleep", 4), ("sleep", 4)]
    calls.clear()
    en.backoff(fake, 8, waited=24e-6 + 50e-6)
    assert calls == [("sleep", 4)]
    calls.clear()
    en.backoff(fake, 8, waited=1.0, mpi=True)
    assert calls == []                       # a collective MPI runs: spin the whole wait
    fake.spin_us = 0.0
    en.backoff(fake, 8, waited=16e-6)
    assert calls == [("sleep", 2)]          # an eighth of what it waited
    calls.clear()
    en.backoff(fake, 8, waited=16e-6, mpi=True)
    assert calls == [("sleep", 2)]          # ...unless the node is oversubscribed
    calls.clear()
    calls.clear()
    for idle in range(1, 5):
        en.backoff(fake, idle, event=object())
    assert calls == [("wake", 2), ("wake", 4)]


def test_a_waiter_polls_the_started_programs_alone_and_passes_now_and_then():
    """With nothing waiting to start, a waiter's poll is a poll of the started
    collectives alone (the policy's ``started_only``), not a whole pass; every
    CTL_EVERY-th poll is still a whole pass (the control plane moves), and the results
    are exact.  Rank 1 arrives late each round, so the others wait on two node-shared
    programs started at issue."""
    import time
    with hpccoll.init(timeout=60, mpi_coll_bytes=0, cell_bytes=0) as ctx:
        comms = [ctx.world.dup(name=f"s{i}") for i in range(2)]
        policy = ctx._engine.policy
        alone, steps = [], []
        only, step = policy.started_only, policy.step

        def started_only():
            polled = only()
            if polled is not None:
                alone.append(len(polled))
            return polled
        policy.started_only = started_only
        policy.step = lambda engine: steps.append(1) or step(engine)
        for k in range(5):
            if ctx.rank == 1:
                time.sleep(0.02)
            works = [c.allreduce(np.full(20_000, i + k, np.int64)) for i, c in enumerate(comms)]
            for i, w in enumerate(works):
                np.testing.assert_array_equal(w.wait(), np.full(20_000, (i + k) * ctx.size))
        if ctx.size > 1 and ctx.rank != 1:
            assert alone and steps, (len(alone), len(steps))
            assert max(alone) == 2
