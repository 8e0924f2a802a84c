"""The single-copy step machines (algorithms/cma.py) under the step simulator: exact
results however the ranks interleave, inputs untouched, and no rank reads a peer's
buffer before the peer published it or after the peer's program returned it
(tests/stepsim.py asserts both)."""
import numpy as np
import pytest

from hpccoll.algorithms import cma
from hpccoll.algorithms.primitives import PEER, RECV, SEND, Publish, Signal, WaitFlags
from hpccoll.algorithms.spec import Spec
from tests import stepsim

SIZES = [2, 3, 4, 5]
SEEDS = range(6)


programs, data = stepsim.programs, stepsim.data


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("inplace", [False, True])
def test_allgather(n, inplace):
    for m in (0, 1, 11):
        for seed in SEEDS:
            xs = data(n, m, seed=m + seed)
            progs = programs(cma.allgather, "allgather", n, m, inplace=inplace)
            bufs = stepsim.allgather_buffers(xs, m, inplace)
            stepsim.run(progs, bufs, seed=seed, base=3 * seed)
            for r in range(n):
                np.testing.assert_array_equal(bufs[r][RECV], np.concatenate(xs),
                                              err_msg=f"rank {r} m {m} seed {seed}")
                if not inplace:
                    np.testing.assert_array_equal(bufs[r][SEND], xs[r])


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("inplace", [False, True])
def test_alltoall(n, inplace):
    """In place, each rank reads its peers' copies in their scratch while they overwrite
    their own buffers (garbage in the scratch to start with)."""
    for m in (0, 1, 7):
        for seed in SEEDS:
            xs = data(n, n * m, seed=m + n + seed)
            progs = programs(cma.alltoall, "alltoall", n, m, inplace=inplace)
            bufs = []
            for x in xs:
                if inplace:
                    b = x.copy()
                    bufs.append([b, b, np.full(n * m, 77, np.int64)])
                else:
                    bufs.append([x.copy(), np.full(n * m, 99, np.int64), None])
            stepsim.run(progs, bufs, seed=seed)
            for r in range(n):
                want = np.concatenate([xs[q][r * m:(r + 1) * m] for q in range(n)])
                np.testing.assert_array_equal(bufs[r][RECV], want, err_msg=f"rank {r} m {m}")
                if not inplace:
                    np.testing.assert_array_equal(bufs[r][SEND], xs[r])


@pytest.mark.parametrize("n", SIZES)
def test_broadcast(n):
    for count in (0, 1, 23):
        for root in range(n):
            for seed in SEEDS[:3]:
                xs = data(n, count, seed=count + root + seed)
                progs = programs(cma.broadcast, "broadcast", n, count, root=root)
                bufs = []
                for r, x in enumerate(xs):
                    buf = x.copy() if r == root else np.full(count, 99, np.int64)
                    bufs.append([buf, buf, None])
                stepsim.run(progs, bufs, seed=seed)
                for r in range(n):
                    np.testing.assert_array_equal(bufs[r][RECV], xs[root],
                                                  err_msg=f"rank {r} root {root}")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("inplace", [False, True])
def test_gather(n, inplace):
    """Every peer's block arrives whole, its head written by the peer and its tail read by
    the root, while both programs run (tests/stepsim.py asserts it), and no rank's input
    changes."""
    for m in (0, 1, 2, 11, 100):
        for root in range(n):
            for seed in SEEDS[:3]:
                xs = data(n, m, seed=m + root + seed)
                progs = programs(cma.gather, "gather", n, m, root=root, inplace=inplace)
                bufs = []
                for r, x in enumerate(xs):
                    if r != root:
                        bufs.append([x.copy(), None, None])
                    elif inplace:
                        out = np.full(n * m, 99, np.int64)
                        out[r * m:(r + 1) * m] = x
                        bufs.append([out[r * m:(r + 1) * m], out, None])
                    else:
                        bufs.append([x.copy(), np.full(n * m, 99, np.int64), None])
                stepsim.run(progs, bufs, seed=seed, base=2 * seed)
                np.testing.assert_array_equal(bufs[root][RECV], np.concatenate(xs),
                                              err_msg=f"root {root} m {m} seed {seed}")
                for r in range(n):
                    np.testing.assert_array_equal(bufs[r][SEND], xs[r])


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("inplace", [False, True])
def test_scatter(n, inplace):
    """Each reader's block arrives whole, its head read and its tail written by the root
    (while both programs run: tests/stepsim.py), and the root's input is untouched."""
    for m in (0, 1, 2, 11, 100):
        for root in range(n):
            for seed in SEEDS[:3]:
                whole = data(1, n * m, seed=m + root + seed)[0]
                progs = programs(cma.scatter, "scatter", n, m, root=root, inplace=inplace)
                bufs = []
                for r in range(n):
                    if r != root:
                        bufs.append([None, np.full(m, 99, np.int64), None])
                    elif inplace:
                        w = whole.copy()
                        bufs.append([w, w[r * m:(r + 1) * m], None])
                    else:
                        bufs.append([whole.copy(), np.full(m, 99, np.int64), None])
                stepsim.run(progs, bufs, seed=seed)
                for r in range(n):
                    np.testing.assert_array_equal(bufs[r][RECV], whole[r * m:(r + 1) * m],
                                                  err_msg=f"rank {r} root {root} m {m}")
                np.testing.assert_array_equal(bufs[root][SEND], whole)


@pytest.mark.parametrize("fn,coll", [(cma.gather, "gather"), (cma.scatter, "scatter")])
def test_gather_and_scatter_split_each_block_so_that_both_sides_end_together(fn, coll):
    """A peer moves the head of its block (a gather's writes it into the root's output, a
    scatter's reads it from the root's input), the root its own block (OWN_COPY of a
    kernel copy, none in place) and every peer's tail, one after another: the root's
    share shrinks as peers are added, and the two sides' work is within n elements; a
    block of more than two slots counts the root's copy dearer (it leaves the caches).
    The peer's move is between the root's READY and its own CONSUMED."""
    chunk = 1 << 16
    for m, own in ((chunk, cma.OWN_COPY[0][1]), (2 * chunk, cma.OWN_COPY[0][1]),
                   (2 * chunk + 1, cma.OWN_COPY[1][1]), (16 * chunk, cma.OWN_COPY[1][1])):
        for n, inplace in [(n, i) for n in (2, 3, 4, 8) for i in (False, True)]:
            steps = list(fn(Spec(coll, 1, n, m, root=0, inplace=inplace, chunk=chunk)))
            copies = [p for p in steps if type(p).__name__ == "Copy"]
            assert len(copies) == 1
            head = copies[0].src.n
            tail = m - head
            mine = 0 if inplace else own * m
            assert abs(head - (mine + (n - 1) * tail)) <= n, (m, n, inplace, head)
            peer_side = copies[0].dst if coll == "gather" else copies[0].src
            assert peer_side.buf[:2] == (PEER, 0)
            at = steps.index(copies[0])
            assert steps[at - 1] == WaitFlags(cma.READY, cma.E, (0,))
            assert steps[at + 1] == Signal(cma.CONSUMED, cma.E)
            root = [p for p in fn(Spec(coll, 0, n, m, root=0, inplace=inplace, chunk=chunk))
                    if type(p).__name__ == "Copy"]
            assert [p.src.n for p in root] == ([] if inplace else [m]) + [tail] * (n - 1)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("op", ["sum", "max"])
def test_allreduce(n, inplace, op):
    """Counts smaller than the rank count too (parts of 0 elements)."""
    for count, chunk in ((0, 4), (1, 4), (3, 4), (50, 7), (50, 1 << 18)):
        for seed in SEEDS:
            xs = data(n, count, seed=count + seed)
            progs = programs(cma.allreduce, "allreduce", n, count, chunk=chunk, inplace=inplace)
            bufs = []
            for x in xs:
                send = x.copy()
                recv = send if inplace else np.full(count, 99, np.int64)
                bufs.append([send, recv, np.full(n * count, 77, np.int64)])
            stepsim.run(progs, bufs, op=op, seed=seed, base=seed)
            want = xs[0].copy()
            for x in xs[1:]:
                want = np.add(want, x) if op == "sum" else np.maximum(want, x)
            for r in range(n):
                np.testing.assert_array_equal(bufs[r][RECV], want, err_msg=f"rank {r} {count}")
                if not inplace:
                    np.testing.assert_array_equal(bufs[r][SEND], xs[r])


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("inplace", [False, True])
def test_reduce_scatter(n, inplace):
    for m, chunk in ((0, 4), (1, 4), (9, 4), (9, 1 << 18)):
        for seed in SEEDS:
            xs = data(n, n * m, seed=m + seed)
            progs = programs(cma.reduce_scatter, "reduce_scatter", n, m, chunk=chunk,
                             inplace=inplace)
            bufs = []
            for r, x in enumerate(xs):
                send = x.copy()
                recv = send[r * m:(r + 1) * m] if inplace else np.full(m, 99, np.int64)
                bufs.append([send, recv, np.full(n * m, 77, np.int64)])
            stepsim.run(progs, bufs, seed=seed)
            total = np.sum(xs, axis=0)
            for r in range(n):
                np.testing.assert_array_equal(bufs[r][RECV], total[r * m:(r + 1) * m])


def test_avg_divides_once_by_the_rank_count():
    n, count = 3, 7
    xs = [np.arange(count, dtype=np.float64) * (r + 1) for r in range(n)]
    progs = programs(cma.allreduce, "allreduce", n, count, avg=True)
    bufs = [[x.copy(), np.zeros(count), np.zeros(n * count)] for x in xs]
    stepsim.run(progs, bufs, op="sum")
    for r in range(n):
        np.testing.assert_allclose(bufs[r][RECV], np.mean(xs, axis=0))


@pytest.mark.parametrize("fn,coll", [(cma.allgather, "allgather"), (cma.alltoall, "alltoall"),
                                     (cma.allreduce, "allreduce"),
                                     (cma.reduce_scatter, "reduce_scatter")])
def test_every_rank_publishes_first_and_waits_for_every_reader_last(fn, coll):
    """The buffer a rank publishes stays its caller's only after every peer consumed it."""
    n = 4
    for r in range(n):
        steps = list(fn(Spec(coll, r, n, 8)))
        assert isinstance(steps[0], Publish)
        assert steps[-1] == WaitFlags(cma.CONSUMED, cma.E, tuple(q for q in range(n) if q != r))


@pytest.mark.parametrize("n", [2, 3])
def test_every_rank_signals_both_counters_to_the_epoch(n):
    """A staged program after this one waits until every peer's CONSUMED (and, reading a
    slot, READY) reached the epochs before its own: every rank signals both, roots and
    in-place forms included (a broadcast root that never signalled CONSUMED hung the
    next staged collective on its communicator)."""
    for fn, coll in [(cma.allgather, "allgather"), (cma.alltoall, "alltoall"),
                     (cma.broadcast, "broadcast"), (cma.allreduce, "allreduce"),
                     (cma.reduce_scatter, "reduce_scatter"), (cma.gather, "gather"),
                     (cma.scatter, "scatter")]:
        for root in range(n):
            for inplace in (False, True):
                for r in range(n):
                    steps = list(fn(Spec(coll, r, n, 4, root=root, inplace=inplace)))
                    signalled = {(p.flag, p.epoch) for p in steps if type(p).__name__ == "Signal"}
                    assert {(cma.READY, cma.E), (cma.CONSUMED, cma.E)} <= signalled, (coll, r)
