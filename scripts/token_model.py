#!/usr/bin/env python
"""The token protocol's cost model: hpccoll/ordering.py's pure state machine driven in a
simulation, no MPI, at 10^2 to 10^4 ranks and 1 to 1,000 communicators.

    python scripts/token_model.py                       # the table in docs/ordering.md
    python scripts/token_model.py --ranks 100,1000 --comms 1,10 --shape groups

Workload: one training step, every rank issues one collective on each communicator it
belongs to, all at once (a burst: one flush), in a rank-dependent order; then the step
is repeated, and the figures are those of the second step (slots cached, as in steady
state).  Shapes: ``world``, every communicator spans all ranks (the Latin workload);
``groups``, communicator j spans the 8 ring-adjacent ranks from 8j mod n (tensor-parallel
groups).

Every message takes one time unit (a hop); local work takes none.  Reported per step:
collectives ordered; messages per collective (token passes, rest announcements to every
rank, wake-ups); latency in hops until every member of a collective knows its place
(median and worst); token passes; and the bytes the busiest rank sends and receives, from
the size of what travels (a member mask is n bits; the formula is checked against pickle,
the encoding the ordered policy sends, at small n: ``--check-size``).
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
from hpccoll.ordering import KIND_TOKEN, Token, TokenRing  # noqa: E402

GROUP = 8


def mask_bytes(n: int) -> int:
    return n // 8 + 1                    # a member mask: an int of n bits


def token_bytes(tok: Token, n: int) -> int:
    """What the pickled token weighs (fitted to pickle; --check-size shows the error)."""
    return (117 + len(tok.entries) * (2 * mask_bytes(n) + 14) + len(tok.log) * 12
            + len(tok.slots) * (mask_bytes(n) + 16))


def message_bytes(kind: str, payload, n: int) -> int:
    return token_bytes(payload, n) if kind == KIND_TOKEN else 16


def members_of(shape: str, j: int, n: int) -> tuple:
    if shape == "world":
        return tuple(range(n))
    return tuple(sorted({(GROUP * j + i) % n for i in range(min(GROUP, n))}))


def simulate(n: int, comms: int, shape: str, steps: int = 2, seed: int = 0,
             check: bool = False) -> dict:
    """The figures of the last of ``steps`` steps; with ``check``, also the worst relative
    error of token_bytes against the pickled token over the whole run (signed)."""
    rng = random.Random(seed)
    rings = [TokenRing(r, n) for r in range(n)]
    member_sets = [members_of(shape, j, n) for j in range(comms)]
    masks = [sum(1 << r for r in m) for m in member_sets]
    mine = [[] for _ in range(n)]
    for j, m in enumerate(member_sets):
        for r in m:
            mine[r].append(j)
    queue: list = []                     # (time, order, dest, src, kind, payload)
    order = clock = 0
    worst = (0.0, 0.0)

    def send(src, msgs, t, tally):
        nonlocal order, worst
        for dest, kind, payload in msgs:
            size = message_bytes(kind, payload, n)
            if check and kind == KIND_TOKEN:
                real = len(pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL))
                err = (size - real) / real
                worst = (min(worst[0], err), max(worst[1], err))
            tally["messages"] += 1
            tally["token_passes"] += kind == KIND_TOKEN
            tally["bytes"][src] += size
            tally["bytes"][dest] += size
            order += 1
            heapq.heappush(queue, (t + 1, order, dest, src, kind, payload))

    for step in range(steps):
        start = clock
        tally = {"messages": 0, "token_passes": 0, "bytes": [0] * n}
        learned_by: dict = {}            # communicator -> its members that know its gseq
        done_at: dict = {}               # communicator -> when the last of them learned it

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
        assert len(done_at) == comms, (n, comms, shape, len(done_at))
    return {"collectives": comms, "messages": tally["messages"],
            "token_passes": tally["token_passes"], "busiest": max(tally["bytes"]),
            "latency": sorted(done_at.values()), "size_error": worst}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", default="100,1000,10000")
    p.add_argument("--comms", default="1,10,100,1000")
    p.add_argument("--shape", choices=("world", "groups", "both"), default="both")
    p.add_argument("--check-size", action="store_true", help="compare the byte formula "
                   "with pickle first")
    args = p.parse_args(argv)
    if args.check_size:
        errs = [e for n in (16, 64, 256) for e in simulate(n, 12, "world", check=True)["size_error"]]
        print(f"token size formula vs pickle (16-256 ranks): from {min(errs):+.0%} to "
              f"{max(errs):+.0%} (+: the formula says more)")
    shapes = ("world", "groups") if args.shape == "both" else (args.shape,)
    print("| shape | ranks | comms | collectives | messages / collective | latency, hops "
          "(median / worst) | token passes | busiest rank, bytes | simulated in |")
    print("|---|---|---|---|---|---|---|---|---|")
    for shape in shapes:
        for n in map(int, args.ranks.split(",")):
            for c in map(int, args.comms.split(",")):
                t0 = time.perf_counter()
                s = simulate(n, c, shape)
                lat = s["latency"]
                print(f"| {shape} | {n} | {c} | {s['collectives']} | "
                      f"{s['messages'] / s['collectives']:.1f} | "
                      f"{statistics.median(lat):.0f} / {lat[-1]} | {s['token_passes']} | "
                      f"{s['busiest']:,} | {time.perf_counter() - t0:.1f} s |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
