"""The previous protocol (the token ring, hpccoll/ordering/ring.py, scripts/token_model.py's
baseline): its properties, checked directly on many random executions of
n TokenRing state machines with random message delays (FIFO per channel, like MPI)
and random issue orders:

- consistency: every rank that learns a collective's gseq learns the same one;
- every collective issued by all its members gets a gseq, on every member;
- a gseq is assigned only after every member issued the collective;
- the ordered launch logs of any two ranks, restricted to their common
  collectives, are in the same order (no two ranks can launch in opposite orders);
- the token comes to rest when there is nothing to do.
"""
import random
from collections import defaultdict, deque

import pytest

from hpccoll.ordering.ring import KIND_TOKEN, TokenRing


def simulate(n, comms, per_rank_orders, seed, max_steps=200_000):
    rng = random.Random(seed)
    rings = [TokenRing(r, n) for r in range(n)]
    chans = defaultdict(deque)
    issued_at = {}          # (cid, rank) -> step
    assigned = {}           # cid -> gseq (first seen), checked for consistency
    assigned_step = {}
    learned = defaultdict(list)   # rank -> [(gseq, cid)]
    todo = [deque(o) for o in per_rank_orders]

    def deliver(src, msgs, step):
        for dest, kind, payload in msgs:
            chans[(src, dest)].append((kind, payload))

    def learn(r, items, step):
        for g, cid in items:
            if cid in assigned:
                assert assigned[cid] == g, f"rank {r} learned gseq {g} for {cid}, others {assigned[cid]}"
            else:
                assigned[cid] = g
                assigned_step[cid] = step
            learned[r].append((g, cid))

    for step in range(max_steps):
        choices = [("issue", r) for r in range(n) if todo[r]]
        choices += [("flush", r) for r in range(n) if rings[r].unannounced]
        choices += [("msg", k) for k, q in chans.items() if q]
        if not choices:
            break
        kind, x = rng.choice(choices)
        if kind == "issue":
            cid = todo[x].popleft()
            issued_at[(cid, x)] = step
            rings[x].issue(cid, comms[cid[0]])
        elif kind == "flush":
            msgs, items = rings[x].flush()
            deliver(x, msgs, step)
            learn(x, items, step)
        else:
            src, dest = x
            k, payload = chans[x].popleft()
            msgs, items = rings[dest].on_message(src, k, payload)
            deliver(dest, msgs, step)
            learn(dest, items, step)
    return rings, assigned, assigned_step, issued_at, learned, chans


def random_workload(n, ncomms, per_comm, rng):
    comms = {}
    for c in range(ncomms):
        k = rng.randint(2, n) if n > 1 else 1
        members = rng.sample(range(n), k)
        comms[f"c{c}"] = sum(1 << m for m in members)
    orders = [[] for _ in range(n)]
    for uid, mask in comms.items():
        for seq in range(per_comm):
            for r in range(n):
                if mask >> r & 1:
                    orders[r].append((uid, seq))
    for r in range(n):
        # keep MPI semantics per communicator (seq order), interleave communicators randomly
        by_comm = defaultdict(deque)
        for cid in orders[r]:
            by_comm[cid[0]].append(cid)
        out = []
        while any(by_comm.values()):
            c = rng.choice([k for k, v in by_comm.items() if v])
            out.append(by_comm[c].popleft())
        orders[r] = out
    return comms, orders


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_properties_on_random_executions(n):
    for seed in range(40):
        rng = random.Random(seed * 100 + n)
        comms, orders = random_workload(n, rng.randint(1, 4), rng.randint(1, 6), rng)
        rings, assigned, assigned_step, issued_at, learned, chans = simulate(n, comms, orders, seed)
        all_cids = {cid for o in orders for cid in o}
        # every collective got a gseq, and every member learned it
        assert set(assigned) == all_cids
        for r in range(n):
            mine = {cid for cid in orders[r]}
            assert mine <= {cid for _, cid in learned[r]}, f"rank {r} missing assignments"
        # gseq only once all members had issued it
        for cid, step in assigned_step.items():
            for r in range(n):
                if comms[cid[0]] >> r & 1:
                    assert issued_at[(cid, r)] <= step
        # gseqs are unique
        assert len(set(assigned.values())) == len(assigned)
        # launch orders agree on common collectives
        launch = {r: [cid for _, cid in sorted(learned[r]) if cid in set(orders[r])] for r in range(n)}
        for a in range(n):
            for b in range(a + 1, n):
                common = set(launch[a]) & set(launch[b])
                assert [c for c in launch[a] if c in common] == [c for c in launch[b] if c in common]
        # at the end the token rests at exactly one rank, and nothing is in flight
        holders = [r for r in range(n) if rings[r].token is not None]
        assert len(holders) == 1 and rings[holders[0]].resting
        assert not any(q for q in chans.values())


def test_one_round_orders_a_burst():
    """A burst issued everywhere before the token arrives is ordered in one round."""
    n = 4
    comms = {"a": 0b1111, "b": 0b1111}
    orders = [[("a", i) for i in range(4)] + [("b", i) for i in range(4)] for _ in range(n)]
    rings = [TokenRing(r, n) for r in range(n)]
    for r in range(1, n):
        for cid in orders[r]:
            rings[r].issue(cid, comms[cid[0]])
    for cid in orders[0]:
        rings[0].issue(cid, comms[cid[0]])
    msgs, learned = rings[0].flush()
    # rank 0 held the resting token: the flush sent it on; follow it round the ring
    hops, ordered_at, known_at = 0, None, None
    while msgs and hops <= 4 * n:
        nxt = []
        for dest, kind, payload in msgs:
            m, l = rings[dest].on_message(0, kind, payload)
            nxt += m
            if kind == KIND_TOKEN:
                hops += 1
        msgs = [x for x in nxt if x[1] == KIND_TOKEN]
        if ordered_at is None and any(r.seen_gseq == 7 for r in rings):
            ordered_at = hops
        if known_at is None and all(r.seen_gseq == 7 for r in rings):
            known_at = hops
    assert ordered_at <= n           # all 8 ordered within one round
    assert known_at <= 2 * n - 1     # and known everywhere before the second round ends
    assert rings[0].token is not None or any(r.resting for r in rings)


def test_wake_reaches_the_resting_holder():
    n = 3
    rings = [TokenRing(r, n) for r in range(n)]
    rings[2].issue(("w", 0), 0b111)
    assert rings[2].flush() == ([(0, "wake", 2)], [])
    # a second issue before the token came does not wake again
    rings[2].issue(("w", 1), 0b111)
    assert rings[2].flush() == ([], [])
