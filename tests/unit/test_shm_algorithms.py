"""Shared-memory step machines (algorithms/shm.py) on the in-process step simulator:
peers read each other's staging slots or registered buffers in place, guarded by READY /
REDUCED / CONSUMED epochs.  Random interleavings expose any read of a slot before it is
filled or after it is reused; results are compared with NumPy, exactly (integers)."""
import numpy as np
import pytest

from hpccoll.algorithms import shm
from hpccoll.algorithms.primitives import RECV, SEND, WaitFlags, scratch_extent
from hpccoll.algorithms.spec import Spec
from tests import stepsim

SIZES = [2, 3, 4, 5]


def programs(fn, coll, n, count, chunk, slots=2, registered=False, inplace=False, avg=False,
             root=0):
    return stepsim.programs(fn, coll, n, count, chunk=chunk, slots=slots,
                            registered=registered, inplace=inplace, avg=avg, root=root)


def slot_arrays(n, slots, chunk, dtype):
    # garbage in the slots: a result that depends on stale slot data is wrong
    return [[np.full(chunk, 77, dtype) for _ in range(slots)] for _ in range(n)]


data = stepsim.data


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("registered", [False, True])
@pytest.mark.parametrize("op", ["sum", "max"])
def test_allreduce(n, registered, op):
    for count, chunk, slots, base in [(0, 4, 2, 0), (1, 4, 2, 5), (23, 4, 2, 3), (100, 7, 3, 11),
                                      (50, 5, 1, 0)]:
        for seed in range(3):
            xs = data(n, count, seed)
            progs = programs(shm.allreduce, "allreduce", n, count, chunk, slots, registered)
            bufs = [[x.copy(), np.full(count, 99, np.int64), None] for x in xs]
            stepsim.run(progs, bufs, op=op, seed=seed, slots=slot_arrays(n, slots, chunk, np.int64),
                        base=base)
            want = xs[0].copy()
            for x in xs[1:]:
                want = np.add(want, x) if op == "sum" else np.maximum(want, x)
            for r in range(n):
                np.testing.assert_array_equal(bufs[r][RECV], want, err_msg=f"rank {r} count {count}")
                np.testing.assert_array_equal(bufs[r][SEND], xs[r])   # input untouched


@pytest.mark.parametrize("n", SIZES)
def test_allreduce_registered_in_place_and_avg(n):
    count, chunk = 37, 8
    rng = np.random.default_rng(n)
    xs = [rng.standard_normal(count).astype(np.float32) for _ in range(n)]
    progs = programs(shm.allreduce, "allreduce", n, count, chunk, registered=True, inplace=True,
                     avg=True)
    bufs = []
    for x in xs:
        b = x.copy()
        bufs.append([b, b, None])
    stepsim.run(progs, bufs, slots=slot_arrays(n, 2, chunk, np.float32))
    np.testing.assert_allclose(bufs[0][RECV], np.mean(xs, axis=0), rtol=1e-5, atol=1e-6)
    for r in range(1, n):
        assert bufs[r][RECV].tobytes() == bufs[0][RECV].tobytes()   # the same bits everywhere


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("registered", [False, True])
def test_reduce_scatter(n, registered):
    for m, chunk in [(0, 8), (1, 8), (13, 8), (40, 3 * n)]:
        xs = data(n, n * m, seed=m)
        progs = programs(shm.reduce_scatter, "reduce_scatter", n, m, chunk, registered=registered)
        bufs = [[x.copy(), np.full(m, 99, np.int64), None] for x in xs]
        stepsim.run(progs, bufs, seed=m, slots=slot_arrays(n, 2, chunk, np.int64))
        want = np.sum(xs, axis=0)
        for r in range(n):
            np.testing.assert_array_equal(bufs[r][RECV], want[r * m:(r + 1) * m])


@pytest.mark.parametrize("n", SIZES)
def test_broadcast(n):
    """Every root, more chunks than slots, one slot: every rank ends with the root's data
    (the others' buffers start as garbage), the root's untouched."""
    for count, chunk, slots, base in [(0, 4, 2, 0), (1, 4, 2, 5), (23, 4, 2, 3),
                                      (100, 7, 3, 11), (50, 5, 1, 0)]:
        for root in range(n):
            xs = data(n, count, seed=count + root)
            progs = programs(shm.broadcast, "broadcast", n, count, chunk, slots, root=root)
            bufs = []
            for r, x in enumerate(xs):
                buf = x.copy() if r == root else np.full(count, 99, np.int64)
                bufs.append([buf, buf, None])
            stepsim.run(progs, bufs, seed=root, base=base,
                        slots=slot_arrays(n, slots, chunk, np.int64))
            for r in range(n):
                np.testing.assert_array_equal(bufs[r][RECV], xs[root],
                                              err_msg=f"rank {r} root {root} count {count}")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("op", ["sum", "max"])
def test_reduce(n, op):
    """Every root, the root in place or not (the others never), more chunks than slots:
    the root's result exact, every input untouched but the root's in place."""
    for count, chunk, slots, base in [(0, 4, 2, 0), (1, 4, 2, 5), (23, 4, 2, 3),
                                      (100, 7, 3, 11), (50, 5, 1, 0)]:
        for root in range(n):
            for inplace in (False, True):
                xs = data(n, count, seed=count + root)
                progs = [type("P", (), {"steps": tuple(shm.reduce(Spec(
                    "reduce", r, n, count, chunk=chunk, slots=slots, root=root,
                    inplace=inplace and r == root)))})() for r in range(n)]
                bufs = []
                for r, x in enumerate(xs):
                    mine = x.copy()
                    bufs.append([mine, mine if inplace and r == root
                                 else np.full(count, 99, np.int64), None])
                stepsim.run(progs, bufs, op=op, seed=root, base=base,
                            slots=slot_arrays(n, slots, chunk, np.int64))
                want = xs[0].copy()
                for x in xs[1:]:
                    want = np.add(want, x) if op == "sum" else np.maximum(want, x)
                np.testing.assert_array_equal(bufs[root][RECV], want,
                                              err_msg=f"root {root} count {count}")
                for r in range(n):
                    if not (inplace and r == root):
                        np.testing.assert_array_equal(bufs[r][SEND], xs[r])


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("registered", [False, True])
@pytest.mark.parametrize("inplace", [False, True])
def test_allgather(n, registered, inplace):
    for m, chunk in [(0, 4), (1, 4), (11, 4), (30, 16)]:
        xs = data(n, m, seed=m)
        progs = programs(shm.allgather, "allgather", n, m, chunk, registered=registered,
                         inplace=inplace)
        bufs = stepsim.allgather_buffers(xs, m, inplace)
        stepsim.run(progs, bufs, seed=m, slots=slot_arrays(n, 2, chunk, np.int64))
        for r in range(n):
            np.testing.assert_array_equal(bufs[r][RECV], np.concatenate(xs) if m else
                                          np.empty(0, np.int64))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("inplace", [False, True])
def test_alltoall(n, inplace):
    """Block q of rank r's input ends as block r of rank q's output, however the ranks
    interleave, with more chunks than slots; in place, the input is the output."""
    for m, chunk, slots in [(0, 8, 2), (1, 8, 2), (7, 8, 2), (13, 3 * n, 1), (30, 4 * n, 2)]:
        xs = data(n, n * m, seed=m + n)
        progs = programs(shm.alltoall, "alltoall", n, m, chunk, slots=slots, inplace=inplace)
        bufs = []
        for x in xs:
            if inplace:
                b = x.copy()
                bufs.append([b, b, None])
            else:
                bufs.append([x.copy(), np.full(n * m, 99, np.int64), None])
        stepsim.run(progs, bufs, seed=m, slots=slot_arrays(n, slots, chunk, np.int64))
        for r in range(n):
            want = np.concatenate([xs[q][r * m:(r + 1) * m] for q in range(n)]) if m else \
                np.empty(0, np.int64)
            np.testing.assert_array_equal(bufs[r][RECV], want, err_msg=f"rank {r} m {m}")
            if not inplace:
                np.testing.assert_array_equal(bufs[r][SEND], xs[r])   # input untouched


def test_slots_are_reused_only_after_every_peer_consumed():
    """More chunks than slots: each reuse waits for CONSUMED of the epoch it replaces."""
    prog = list(shm.allreduce(Spec("allreduce", 0, 3, 100, chunk=10, slots=2)))
    waits = [p for p in prog if isinstance(p, WaitFlags) and p.flag == 2]
    assert [w.epoch for w in waits] == [e - 2 for e in range(1, 11)]
    assert all(w.peers == (1, 2) for w in waits)


@pytest.mark.parametrize("nodes,per_node", [(2, 2), (3, 2), (2, 3)])
def test_hierarchical_allreduce(nodes, per_node):
    """Ranks r = node * per_node + local; shared memory within a node, MPI-style messages
    across nodes (the simulator matches them), for every chunk."""
    n = nodes * per_node
    count, chunk = 50, 12
    xs = data(n, count, seed=n)
    progs, bufs = [], []
    for r in range(n):
        node, loc = divmod(r, per_node)
        local = tuple(node * per_node + q for q in range(per_node))
        cross = tuple(k * per_node + loc for k in range(nodes))
        spec = Spec("allreduce", r, n, count, chunk=chunk, local=local, cross=cross)
        steps = tuple(shm.allreduce_hier(spec))
        progs.append(type("P", (), {"steps": steps})())
        bufs.append([xs[r].copy(), np.full(count, 99, np.int64),
                     np.empty(scratch_extent(steps), np.int64)])
    # slots are per node: rank r's (SLOT, q, e) means local rank q of r's node
    node_slots = [[[np.full(chunk, 77, np.int64) for _ in range(2)] for _ in range(per_node)]
                  for _ in range(nodes)]
    stepsim_run_by_node(progs, bufs, node_slots, per_node)
    want = np.sum(xs, axis=0)
    for r in range(n):
        np.testing.assert_array_equal(bufs[r][RECV], want)


def stepsim_run_by_node(progs, bufs, node_slots, per_node):
    """Run all ranks together (cross-node messages must match); flags and slots are per
    node, addressed by local index."""
    import random
    from collections import defaultdict, deque
    from hpccoll.algorithms.primitives import (Copy, Post, Reduce, ReduceN, Signal, Wait,
                                               WaitFlags)
    from hpccoll.transport.reduction import HostOps
    n = len(progs)
    rng = random.Random(0)
    pc = [0] * n
    flags = [[0, 0, 0] for _ in range(n)]
    inflight = [dict() for _ in range(n)]
    sendq, recvq, matched = defaultdict(deque), defaultdict(deque), []

    def node_of(r):
        return r // per_node

    def arr(r, reg):
        if isinstance(reg.buf, tuple):
            slots = node_slots[node_of(r)][reg.buf[1]]
            return slots[reg.buf[2] % len(slots)][reg.off:reg.off + reg.n]
        return bufs[r][reg.buf][reg.off:reg.off + reg.n]

    class Op:
        def __init__(self, r, reg):
            self.r, self.reg, self.done = r, reg, False

    for _ in range(1_000_000):
        if all(pc[r] >= len(progs[r].steps) for r in range(n)) and not matched:
            break
        moved = False
        if matched and rng.random() < 0.5:
            s_, d_ = matched.pop(rng.randrange(len(matched)))
            np.copyto(arr(d_.r, d_.reg), arr(s_.r, s_.reg))
            s_.done = d_.done = True
            continue
        for r in rng.sample(range(n), n):
            if pc[r] >= len(progs[r].steps):
                continue
            p = progs[r].steps[pc[r]]
            base = node_of(r) * per_node
            if isinstance(p, WaitFlags):
                if not all(flags[base + q][p.flag] >= p.epoch for q in p.peers):
                    continue
            elif isinstance(p, Wait):
                if not all(o.done for o in inflight[r][p.h]):
                    continue
                del inflight[r][p.h]
            elif isinstance(p, Signal):
                flags[r][p.flag] = p.epoch
            elif isinstance(p, Post):
                ops = []
                for peer, reg in p.recvs:
                    o = Op(r, reg)
                    ops.append(o)
                    (matched.append((sendq[(peer, r)].popleft(), o)) if sendq[(peer, r)]
                     else recvq[(peer, r)].append(o))
                for peer, reg in p.sends:
                    o = Op(r, reg)
                    ops.append(o)
                    (matched.append((o, recvq[(r, peer)].popleft())) if recvq[(r, peer)]
                     else sendq[(r, peer)].append(o))
                inflight[r][p.h] = ops
            elif isinstance(p, ReduceN):
                srcs = [arr(r, s) for s in p.srcs]
                dst = arr(r, p.dst)
                HostOps.reduce_n("sum", dst, srcs, p.divisor)
            elif isinstance(p, Reduce):
                HostOps.reduce("sum", arr(r, p.dst), arr(r, p.a), arr(r, p.b))
            elif isinstance(p, Copy):
                np.copyto(arr(r, p.dst), arr(r, p.src))
            pc[r] += 1
            moved = True
            break
        if not moved and not matched:
            raise AssertionError(f"deadlock: {pc}")
