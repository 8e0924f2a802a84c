"""The ordered policy's protocol (hpccoll/ordering/sequencer.py over tree.py) driven as
pure state machines through random executions, up to 64 simulated ranks: random node
layouts, random communicators (member sets of any size and shape, keyed streams), random
issue orders that keep each stream's order, synchronization points (a rank waits for an
earlier collective before it issues more), random message delays (in order per pair of
ranks and tag, as MPI delivers), and execution slots.  Checked:

- total: every issued collective gets exactly one gseq, and the gseqs are 0..N-1;
- consistent: every member learns the same gseq for it;
- placed only once every member issued it;
- launched in order: every rank learns its gseqs in increasing order;
- deadlock-free: every rank runs its program to the end, launching in gseq order with one,
  two or unbounded slots (a collective runs once all its members launched it);
- quiet: nothing in flight at the end, nothing left to report.
"""
import random
from collections import defaultdict, deque

import pytest

from hpccoll.ordering import KIND_DOWN, KIND_UP, Members, Sequencer, Tree, pack, runs_of, unpack


# -- the harness ----------------------------------------------------------------------------

class Checked(Sequencer):
    """A sequencer whose root records what it places, with each stream's watermark."""
    placed: list

    def _place(self, risen):
        self.placed.extend((st.sid, st.sent, st.watermark()) for st in risen)
        return super()._place(risen)


def random_layout(n, rng):
    """node_of for n ranks: block, cyclic or random placement, 1 to 8 ranks per node."""
    p = rng.randint(1, 8)
    kind = rng.choice(["block", "cyclic", "random"])
    if kind == "block":
        return [w // p for w in range(n)]
    nodes = max(1, -(-n // p))
    if kind == "cyclic":
        return [w % nodes for w in range(n)]
    return [rng.randrange(nodes) for _ in range(n)]


def random_comms(n, rng, ncomms):
    """{name: sorted members}: worlds, consecutive groups, strided groups, random sets, and
    now and then a single rank."""
    comms = {}
    for c in range(ncomms):
        kind = rng.choice(["world", "block", "stride", "random", "random", "solo"])
        if kind == "world" or n == 1:
            members = list(range(n))
        elif kind == "block":
            k = rng.randint(2, n)
            s = rng.randrange(n - k + 1)
            members = list(range(s, s + k))
        elif kind == "stride":
            step = rng.randint(1, max(1, n // 2))
            members = list(range(rng.randrange(step), n, step))
        elif kind == "solo":
            members = [rng.randrange(n)]
        else:
            members = sorted(rng.sample(range(n), rng.randint(2, n)))
        comms[f"c{c}"] = members
    return comms


def random_programs(n, comms, rng, phases, per_phase, keyed=True, sync=0.3):
    """Each rank's program: [("issue", cid) | ("wait", cid)], cid = (sid, index), sid =
    (comm, key).  Phase by phase: every rank issues its phase's collectives in its own
    order (each stream's order kept), then may wait for any of its collectives issued so
    far: a wait never depends on a later phase, so the program itself cannot deadlock."""
    programs = [[] for _ in range(n)]
    count = defaultdict(int)                      # sid -> collectives so far
    for _ in range(phases):
        phase = []                                # this phase's cids, in stream order
        for name, members in comms.items():
            for _ in range(rng.randint(0, per_phase)):
                key = rng.choice([None, None, "k0", "k1"]) if keyed else None
                sid = (name, key)
                phase.append((sid, count[sid]))
                count[sid] += 1
        for r in range(n):
            mine = [cid for cid in phase if r in comms[cid[0][0]]]
            by_sid = defaultdict(deque)
            for cid in mine:
                by_sid[cid[0]].append(cid)
            while by_sid:
                sid = rng.choice(sorted(by_sid, key=repr))
                programs[r].append(("issue", by_sid[sid].popleft()))
                if not by_sid[sid]:
                    del by_sid[sid]
            issued = [op[1] for op in programs[r] if op[0] == "issue"]
            if issued and rng.random() < sync:
                programs[r].append(("wait", rng.choice(issued)))
    return programs


def run(n, node_of, comms, programs, seed, slots=1, max_steps=500_000, flush_p=0.3):
    """One random execution; returns what happened, after checking the properties that
    hold at every step (learned in increasing gseq, placed only after every member
    issued).  ``slots``: collectives a rank runs at once (None: unbounded)."""
    rng = random.Random(seed)
    tree = Tree(node_of)
    runs = {name: tree.members(m) for name, m in comms.items()}
    seqs = [Checked(r, tree) for r in range(n)]
    for s in seqs:
        s.placed = []
    chans = defaultdict(deque)                    # (src, dest, kind) -> payloads, in order
    pc = [0] * n
    issued = defaultdict(int)                     # sid -> on how many members issued, by index
    issued_by = defaultdict(set)                  # cid -> ranks that issued it
    gseq_of = {}                                  # cid -> gseq
    learned = [[] for _ in range(n)]              # rank -> [(gseq, cid)]
    queue = [deque() for _ in range(n)]           # learned, not launched
    running = [set() for _ in range(n)]
    launched = defaultdict(set)                   # cid -> members that launched it
    done = set()
    messages = 0

    def send(src, msgs):
        nonlocal messages
        for dest, kind, payload in msgs:
            assert dest in tree.children[src] or dest == tree.parent[src], (src, dest)
            chans[(src, dest, kind)].append(payload)
            messages += 1

    def learn(r, items):
        for g, sid, index in items:
            cid = (sid, index)
            assert r in comms[sid[0]], f"rank {r} learned {cid}, not its own"
            assert r in issued_by[cid], f"rank {r} learned {cid} before issuing it"
            if learned[r]:
                assert g > learned[r][-1][0], f"rank {r}: gseq {g} after {learned[r][-1][0]}"
            first = gseq_of.setdefault(cid, g)
            assert first == g, f"rank {r}: {cid} is {g}, elsewhere {first}"
            learned[r].append((g, cid))
            queue[r].append(cid)

    def check_placed():
        for sid, lo, hi in seqs[0].placed:
            for index in range(lo, hi):
                who = issued_by[(sid, index)]
                assert who == set(comms[sid[0]]), f"{(sid, index)} placed, issued only by {who}"
        seqs[0].placed.clear()

    for step in range(max_steps):
        acts = []
        for r in range(n):
            if pc[r] < len(programs[r]):
                op, cid = programs[r][pc[r]]
                if op == "issue" or cid in done:
                    acts.append(("prog", r))
            if seqs[r].pending:
                acts.append(("flush", r))
            if queue[r] and (slots is None or len(running[r]) < slots):
                acts.append(("launch", r))
        acts += [("msg", k) for k, q in chans.items() if q]
        if not acts:
            break
        # flushes are rarer than issues, so that bursts form
        weights = [flush_p if a[0] == "flush" else 1.0 for a in acts]
        act, x = rng.choices(acts, weights)[0]
        if act == "prog":
            op, cid = programs[x][pc[x]]
            pc[x] += 1
            if op == "issue":
                issued_by[cid].add(x)
                seqs[x].issue(cid[0], runs[cid[0][0]])
        elif act == "flush":
            msgs, items = seqs[x].flush()
            send(x, msgs)
            learn(x, items)
        elif act == "launch":
            cid = queue[x].popleft()
            running[x].add(cid)
            launched[cid].add(x)
            if launched[cid] == set(comms[cid[0][0]]):
                done.add(cid)                     # every member runs it: it completes
                for m in launched[cid]:
                    running[m].discard(cid)
        else:
            src, dest, kind = x
            payload = chans[x].popleft()
            msgs, items = seqs[dest].on_message(src, kind, payload)
            send(dest, msgs)
            learn(dest, items)
        check_placed()
    else:
        raise AssertionError(f"no end after {max_steps} steps")
    return dict(seqs=seqs, chans=chans, pc=pc, learned=learned, gseq_of=gseq_of,
                done=done, issued_by=issued_by, messages=messages)


def check_end(n, comms, programs, out):
    all_cids = {cid for prog in programs for op, cid in prog if op == "issue"}
    stuck = [r for r in range(n) if out["pc"][r] < len(programs[r])]
    waiting = [programs[r][out["pc"][r]] for r in stuck[:4]]
    assert not stuck, f"deadlock: ranks {stuck} cannot go on ({waiting})"
    # total: one gseq each, 0..N-1
    assert set(out["gseq_of"]) == all_cids
    assert sorted(out["gseq_of"].values()) == list(range(len(all_cids)))
    # every member learned every one of its collectives, and all completed
    for r in range(n):
        mine = {cid for op, cid in programs[r] if op == "issue"}
        assert {cid for _, cid in out["learned"][r]} == mine, f"rank {r}"
    assert out["done"] == all_cids
    # quiet: nothing in flight, nothing unreported
    assert not any(out["chans"].values())
    assert not any(s.pending for s in out["seqs"])


# -- random executions ----------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 12, 16])
def test_random_executions_small(n):
    for seed in range(60):
        rng = random.Random(seed * 1000 + n)
        node_of = random_layout(n, rng)
        comms = random_comms(n, rng, rng.randint(1, 6))
        programs = random_programs(n, comms, rng, phases=rng.randint(1, 5), per_phase=3)
        slots = rng.choice([1, 1, 2, None])
        out = run(n, node_of, comms, programs, seed, slots=slots,
                  flush_p=rng.choice([0.05, 0.3, 1.0]))
        check_end(n, comms, programs, out)


@pytest.mark.parametrize("n", [24, 33, 48, 64])
def test_random_executions_up_to_64_ranks(n):
    for seed in range(8):
        rng = random.Random(seed * 1000 + n)
        node_of = random_layout(n, rng)
        comms = random_comms(n, rng, rng.randint(4, 10))
        programs = random_programs(n, comms, rng, phases=3, per_phase=3)
        out = run(n, node_of, comms, programs, seed, slots=rng.choice([1, 2]))
        check_end(n, comms, programs, out)


def test_divergent_orders_with_one_slot_at_64_ranks():
    """DFCCL's Latin square at 64 ranks, placed 8 to a node: 64 communicators of every
    rank, each rank issuing them in its own row's order, one slot, two steps."""
    n = 64
    rng = random.Random(7)
    comms = {f"L{i}": list(range(n)) for i in range(n)}
    rows = list(range(n))
    rng.shuffle(rows)
    programs = [[("issue", ((f"L{(rows[r] + j) % n}", None), step)) for step in range(2)
                 for j in range(n)] for r in range(n)]
    out = run(n, [w // 8 for w in range(n)], comms, programs, seed=1, slots=1)
    check_end(n, comms, programs, out)


# -- the protocol's shape -------------------------------------------------------------------

def burst(n, per_node, comms, steps=2, order_seed=0):
    """Every rank issues one collective on each of its communicators, then flushes, all
    at once; messages take one time unit.  Per step: messages, the latest time any member
    learned a gseq (latency in hops), and every payload sent."""
    tree = Tree([w // per_node for w in range(n)])
    seqs = [Sequencer(r, tree) for r in range(n)]
    runs = {name: tree.members(m) for name, m in comms.items()}
    rng = random.Random(order_seed)
    figures = []
    for step in range(steps):
        sent, latest, t = [], 0, 0
        wave = []
        for r in range(n):
            mine = [c for c, m in comms.items() if r in m]
            for c in rng.sample(mine, len(mine)):
                seqs[r].issue((c, None), runs[c])
        for r in range(n):
            msgs, learned = seqs[r].flush()
            wave += [(r, *m) for m in msgs]
        while wave:
            t += 1
            nxt = []
            got = {}
            for src, dest, kind, payload in wave:
                sent.append((src, dest, kind, payload))
                msgs, learned = seqs[dest].on_message(src, kind, payload)
                if learned:
                    latest = t
                nxt += [(dest, *m) for m in msgs]
                got[dest] = None
            for r in got:                         # what arrived at once is reported as one
                msgs, learned = seqs[r].flush()
                if learned:
                    latest = t
                nxt += [(r, *m) for m in msgs]
            wave = nxt
        figures.append(dict(messages=len(sent), latency=latest, sent=sent))
    return tree, figures, seqs


def test_a_world_burst_takes_twice_the_depth_and_one_message_per_edge_each_way():
    n, p = 64, 8
    comms = {f"w{i}": list(range(n)) for i in range(10)}
    tree, figures, _ = burst(n, p, comms)
    assert tree.depth == 6                         # log2(8 nodes) + log2(8 per node)
    for f in figures:
        assert f["latency"] == 2 * tree.depth
        assert f["messages"] == 2 * (n - 1)       # one report up, one batch down per edge
    # the first step names the streams (with their members), the repeat does not: a
    # report and a batch are then each one bit vector over the slots
    first = figures[0]["sent"]
    assert all(len(p[0]) == 10 for _, _, k, p in first if k == KIND_UP)
    again = figures[1]["sent"]
    for _, _, kind, payload in again:
        if kind == KIND_UP:
            named, packed = payload
            assert named == () and packed == (0, (1 << 10) - 1)
        else:
            gseq, new_slots, packed = payload
            assert new_slots == () and packed == (0, (1 << 10) - 1) and gseq == 10


def test_groups_are_ordered_through_the_root_within_twice_the_depth():
    """Tensor-parallel groups (8 consecutive ranks, one node each): a group's batch goes
    down only into subtrees holding its members."""
    n = 64
    comms = {f"g{j}": list(range(8 * j, 8 * j + 8)) for j in range(8)}
    tree, figures, seqs = burst(n, 8, comms)
    slot_comm = {s: st.sid[0] for s, st in seqs[0].by_slot.items()}
    for f in figures:
        assert f["latency"] <= 2 * tree.depth
        # an edge carries one more report and batch for each group that completes at a
        # later time below it (nodes 2 and 3 reach rank 16 a hop apart)
        assert f["messages"] <= 2.5 * (n - 1)
        for src, dest, kind, payload in f["sent"]:
            if kind == KIND_DOWN:
                inside = range(tree.pos[dest], tree.end[dest])
                assert any(set(comms[slot_comm[s]]) & set(inside) for s, _ in unpack(payload[2]))


def test_an_idle_rank_sends_nothing():
    tree = Tree([0] * 4)
    seqs = [Sequencer(r, tree) for r in range(4)]
    assert all(s.flush() == ([], []) for s in seqs)


def test_a_change_is_negotiated_by_name_and_then_cached():
    """A stream first seen in the second step travels by name with its members; the
    streams seen before keep their slots."""
    n = 8
    tree = Tree([0] * n)
    seqs = [Sequencer(r, tree) for r in range(n)]
    everyone = tree.members(range(n))

    def step(sids):
        msgs = []
        for r in range(n):
            for sid in sids:
                seqs[r].issue(sid, everyone)
            msgs += [(r, *m) for m in seqs[r].flush()[0]]
        sent = []
        while msgs:
            src, dest, kind, payload = msgs.pop(0)
            sent.append((kind, payload))
            msgs += [(dest, *m) for m in seqs[dest].on_message(src, kind, payload)[0]]
            msgs += [(dest, *m) for m in seqs[dest].flush()[0]]
        return sent

    step([("a", None), ("b", None)])
    sent = step([("a", None), ("b", None), ("c", None)])
    ups = [p for k, p in sent if k == KIND_UP]
    assert all([sid for sid, _, _ in named] == [("c", None)] for named, _ in ups)
    assert all(packed == (0, 0b11) for _, packed in ups)
    downs = [p for k, p in sent if k == KIND_DOWN]
    assert all(p[1] == ((2, ("c", None)),) for p in downs)


# -- the pieces -----------------------------------------------------------------------------

def test_tree_positions_are_ranks_under_block_placement_and_subtrees_are_ranges():
    tree = Tree([w // 4 for w in range(32)])
    assert tree.pos == list(range(32))
    for w in range(32):
        below = set()
        todo = [w]
        while todo:
            x = todo.pop()
            below.add(tree.pos[x])
            todo += tree.children[x]
        assert below == set(range(tree.pos[w], tree.end[w]))
    # node-local first: a rank's parent is on its node, unless it leads its node
    for w in range(1, 32):
        if w % 4:
            assert tree.parent[w] // 4 == w // 4
        else:
            assert tree.parent[w] % 4 == 0


def test_members_hits_agrees_with_the_set():
    rng = random.Random(3)
    for _ in range(300):
        n = rng.randint(1, 80)
        members = sorted(rng.sample(range(n), rng.randint(1, n)))
        m = Members(runs_of(members))
        assert m.count == len(members)
        for _ in range(20):
            lo = rng.randrange(n)
            hi = rng.randint(lo + 1, n)
            assert m.hits(lo, hi) == any(lo <= x < hi for x in members), (members, lo, hi)
    assert runs_of(list(range(0, 64, 8))) == ((0, 57, 8),)
    assert runs_of(list(range(100))) == ((0, 100, 1),)


@pytest.mark.parametrize("advances", [
    {}, {3: 1}, {0: 1, 1: 1, 9: 1}, {5: 2, 6: 1}, {0: 300}, {0: 1, 5000: 1}, {7: 1, 8: 4, 9: 1}])
def test_pack_round_trips_in_slot_order(advances):
    got = list(unpack(pack(advances)))
    assert got == sorted(advances.items())


def test_pack_picks_a_bit_vector_in_steady_state():
    lo, bits = pack({s: 1 for s in range(100)})
    assert lo == 0 and bits == (1 << 100) - 1
    assert isinstance(pack({s: 2 for s in range(100)})[1], bytes)
    assert isinstance(pack({0: 1, 10_000: 1})[1], tuple)
