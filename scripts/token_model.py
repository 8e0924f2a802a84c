#!/usr/bin/env python
"""The launch order's cost model: the ordered policy's own state machine
(hpccoll/ordering/sequencer.py over tree.py) driven in a simulation, no MPI, beside the
token ring it replaced (hpccoll/ordering/ring.py), at up to 100,000 ranks and 1,000
communicators.

    python scripts/token_model.py                                # both shapes, both protocols
    python scripts/token_model.py --shape world --ranks 10000 --comms 100
    python scripts/token_model.py --protocol tree --ranks 100000 --comms 1000 --shape groups

Workload: one training step, every rank issues one collective on each communicator it
belongs to, all at once (a burst: one flush), in a rank-dependent order; then the step
is repeated.  Shapes: ``world``, every communicator spans all ranks (the Latin
workload); ``groups``, communicator j spans the 8 consecutive ranks from 8j mod n
(tensor-parallel groups, the first ones of the job); ``spread``, the same groups spread
evenly over the whole job (from rank j * (n // comms), rounded down to a node).  Ranks sit ``--per-node`` to a node (default 8), placed node
by node.

Every message takes one time unit (a hop); local work takes none.  Reported per step:
messages per collective, latency in hops until every member of a collective knows its
place (median and worst), and the bytes the busiest rank sends and receives.  The tree's
bytes are the pickled payloads the policy sends (pickle is its encoding); the ring's
come from the formula fitted to pickle that this model used before (``--check-size``
compares it with pickle at small n), because pickling a 10,000-rank token 20,000 times
a step takes longer than the rest of the simulation.  Two steps: the first negotiates
everything (the tree names each stream with its members, the ring each slot with its
member mask), the second repeats it: the steady state, where both have their caches.
"""
from __future__ import annotations

import argparse
import heapq
import pickle
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hpccoll.ordering import Sequencer, Tree  # noqa: E402
from hpccoll.ordering.ring import KIND_TOKEN, Token, TokenRing  # noqa: E402

GROUP = 8
PICKLE = pickle.HIGHEST_PROTOCOL      # what mpi4py's pickled sends use


def members_of(shape: str, j: int, n: int, comms: int) -> tuple:
    if shape == "world":
        return tuple(range(n))
    start = GROUP * j if shape == "groups" else j * (n // comms) // GROUP * GROUP
    return tuple(sorted({(start + i) % n for i in range(min(GROUP, n))}))


def workload(shape: str, n: int, comms: int):
    member_sets = [members_of(shape, j, n, comms) for j in range(comms)]
    mine = [[] for _ in range(n)]
    for j, m in enumerate(member_sets):
        for r in m:
            mine[r].append(j)
    return member_sets, mine


def summary(tally: dict, done_at: dict, comms: int) -> dict:
    lat = sorted(done_at.values())
    assert len(lat) == comms, (len(lat), comms)
    return {"collectives": comms, "messages": tally["messages"],
            "per_collective": tally["messages"] / comms, "busiest": max(tally["bytes"]),
            "median": statistics.median(lat), "worst": lat[-1]}


# -- the tree (the ordered policy's protocol) -------------------------------------------

def simulate_tree(n: int, comms: int, shape: str, per_node: int = 8, steps: int = 2,
                  seed: int = 0) -> list:
    """Figures of each step (summary()), the first one the full negotiation."""
    rng = random.Random(seed)
    tree = Tree([w // per_node for w in range(n)])
    seqs = [Sequencer(r, tree) for r in range(n)]
    member_sets, mine = workload(shape, n, comms)
    runs = [tree.members(m) for m in member_sets]
    sids = [(f"c{j}", None) for j in range(comms)]
    index_of = {sid: j for j, sid in enumerate(sids)}
    out = []
    for step in range(steps):
        tally = {"messages": 0, "bytes": [0] * n}
        # id(payload) -> (pickled size, payload): a batch goes on unchanged, so it is
        # pickled once; kept, so that no other payload takes its id meanwhile
        sizes: dict = {}
        known = [0] * comms               # members that learned this step's gseq
        done_at: dict = {}
        wave = []

        def send(src, msgs, wave):
            for dest, kind, payload in msgs:
                got = sizes.get(id(payload))
                if got is None:
                    got = sizes[id(payload)] = (len(pickle.dumps(payload, PICKLE)), payload)
                size = got[0]
                tally["messages"] += 1
                tally["bytes"][src] += size
                tally["bytes"][dest] += size
                wave.append((dest, src, kind, payload))

        def learn(learned, t):
            for _, sid, _ in learned:
                j = index_of[sid]
                known[j] += 1
                if known[j] == len(member_sets[j]):
                    done_at[j] = t

        for r in range(n):
            for j in rng.sample(mine[r], len(mine[r])):
                seqs[r].issue(sids[j], runs[j])
        for r in range(n):
            msgs, learned = seqs[r].flush()
            send(r, msgs, wave)
            learn(learned, 0)
        t = 0
        while wave:
            t += 1
            arriving, wave = wave, []
            got = {}
            for dest, src, kind, payload in arriving:
                msgs, learned = seqs[dest].on_message(src, kind, payload)
                send(dest, msgs, wave)
                learn(learned, t)
                got[dest] = None
            for r in got:             # what arrives at once is reported as one (a pass)
                msgs, learned = seqs[r].flush()
                send(r, msgs, wave)
                learn(learned, t)
        out.append(summary(tally, done_at, comms))
    return out


# -- the token ring (the protocol it replaced) ------------------------------------------

def mask_bytes(n: int) -> int:
    return n // 8 + 1                    # a member mask: an int of n bits


def token_bytes(tok: Token, n: int) -> int:
    """What the pickled token weighs (fitted to pickle; --check-size shows the error)."""
    return (117 + len(tok.entries) * (2 * mask_bytes(n) + 14) + len(tok.log) * 12
            + len(tok.slots) * (mask_bytes(n) + 16))


def message_bytes(kind: str, payload, n: int) -> int:
    return token_bytes(payload, n) if kind == KIND_TOKEN else 16


def simulate_ring(n: int, comms: int, shape: str, steps: int = 2, seed: int = 0,
                  check: bool = False) -> list:
    """Figures of each step (summary()); with ``check``, each also has the worst relative
    error of token_bytes against the pickled token so far (signed)."""
    rng = random.Random(seed)
    rings = [TokenRing(r, n) for r in range(n)]
    member_sets, mine = workload(shape, n, comms)
    masks = [sum(1 << r for r in m) for m in member_sets]
    queue: list = []                     # (time, order, dest, src, kind, payload)
    order = clock = 0
    worst = (0.0, 0.0)

    def send(src, msgs, t, tally):
        nonlocal order, worst
        for dest, kind, payload in msgs:
            size = message_bytes(kind, payload, n)
            if check and kind == KIND_TOKEN:
                real = len(pickle.dumps(payload, protocol=PICKLE))
                err = (size - real) / real
                worst = (min(worst[0], err), max(worst[1], err))
            tally["messages"] += 1
            tally["bytes"][src] += size
            tally["bytes"][dest] += size
            order += 1
            heapq.heappush(queue, (t + 1, order, dest, src, kind, payload))

    out = []
    for step in range(steps):
        start = clock
        tally = {"messages": 0, "bytes": [0] * n}
        learned_by: dict = {}            # communicator -> its members that know its gseq
        done_at: dict = {}

        def learn(rank, learned, t):
            for _, (uid, _ident) in learned:
                j = int(uid[1:])
                if rank in member_sets[j]:
                    got = learned_by.setdefault(j, set())
                    got.add(rank)
                    if len(got) == len(member_sets[j]):
                        done_at.setdefault(j, t - start)

        for r in range(n):
            for j in rng.sample(mine[r], len(mine[r])):
                rings[r].issue((f"c{j}", step), masks[j])
        for r in range(n):
            msgs, learned = rings[r].flush()
            send(r, msgs, clock, tally)
            learn(r, learned, clock)
        while queue:                     # until every collective is placed and the token rests
            clock, _, dest, src, kind, payload = heapq.heappop(queue)
            msgs, learned = rings[dest].on_message(src, kind, payload)
            send(dest, msgs, clock, tally)
            learn(dest, learned, clock)
        out.append(dict(summary(tally, done_at, comms), size_error=worst))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", default="100,1000,10000")
    p.add_argument("--comms", default="1,10,100")
    p.add_argument("--shape", choices=("world", "groups", "spread", "both"), default="both",
                   help="both: world and groups")
    p.add_argument("--protocol", choices=("tree", "ring", "both"), default="both")
    p.add_argument("--per-node", type=int, default=8, help="ranks per node (default 8)")
    p.add_argument("--check-size", action="store_true", help="compare the ring's byte "
                   "formula with pickle first")
    args = p.parse_args(argv)
    if args.check_size:
        errs = [e for n in (16, 64, 256)
                for e in simulate_ring(n, 12, "world", check=True)[-1]["size_error"]]
        print(f"ring: token size formula vs pickle (16-256 ranks): from {min(errs):+.0%} to "
              f"{max(errs):+.0%} (+: the formula says more)")
    shapes = ("world", "groups") if args.shape == "both" else (args.shape,)
    protocols = ("ring", "tree") if args.protocol == "both" else (args.protocol,)
    print(f"ranks per node: {args.per_node}")
    print("| shape | ranks | comms | protocol | step | messages / collective | latency, hops "
          "(median / worst) | busiest rank, bytes | simulated in |")
    print("|---|---|---|---|---|---|---|---|---|")
    for shape in shapes:
        for n in map(int, args.ranks.split(",")):
            for c in map(int, args.comms.split(",")):
                for proto in protocols:
                    t0 = time.perf_counter()
                    if proto == "ring":
                        first, again = simulate_ring(n, c, shape)
                    else:
                        first, again = simulate_tree(n, c, shape, args.per_node)
                    rows = [("first", first), ("again", again)]
                    took = time.perf_counter() - t0
                    for step, s in rows:
                        print(f"| {shape} | {n:,} | {c:,} | {proto} | {step} | "
                              f"{s['per_collective']:,.1f} | {s['median']:,.0f} / "
                              f"{s['worst']:,} | {s['busiest']:,} | {took:.1f} s |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
