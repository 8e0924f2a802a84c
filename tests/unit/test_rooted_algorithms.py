"""The rooted and prefix step machines (gather, scatter, scan, exscan and the v-forms), at
1..8 ranks, every root, odd counts, several chunk sizes and pipeline depths, in place and
not, run by the in-process step simulator and compared with NumPy (exact: integers)."""
import numpy as np
import pytest

from hpccoll.algorithms import ROWS_WITHOUT_STEPS, TABLE, build
from hpccoll.algorithms.primitives import RECV, Post
from hpccoll.algorithms.spec import Spec
from tests import stepsim
from tests.unit.test_algorithms import COUNTS, NP_OPS, SHAPES, SIZES, inputs, layout

SEED_RUNS = 3   # interleavings per case (the simulator delivers at random moments)


def algos(coll):
    """Point-to-point and single-copy ones ("shm": test_shm_rooted below; "mpi" and
    "cells" have no step machine: tests/mpi)."""
    return [name for name, _, _ in TABLE[coll]
            if name not in ROWS_WITHOUT_STEPS and name != "shm"]


def roots(n):
    return sorted({0, n - 1, n // 2, 1 % n})


def _addr(a):
    return a.__array_interface__["data"][0]


def _inside(inner, outer):
    """inner as the same view of a copy of outer, or None where they do not overlap."""
    if not inner.size or not np.shares_memory(inner, outer):
        return None
    off = (_addr(inner) - _addr(outer)) // outer.itemsize
    return off if 0 <= off and off + inner.size <= outer.size else None


def run(progs, bufs, op="sum"):
    """stepsim.run on fresh copies of the buffers (views kept views), once per seed."""
    for seed in range(SEED_RUNS):
        copies = []
        for send, recv, scratch in bufs:
            if send is recv:
                c = recv.copy()
                copies.append([c, c, scratch.copy()])
            elif (off := _inside(send, recv)) is not None:
                c = recv.copy()
                copies.append([c[off:off + send.size], c, scratch.copy()])
            elif (off := _inside(recv, send)) is not None:
                c = send.copy()
                copies.append([c, c[off:off + recv.size], scratch.copy()])
            else:
                copies.append([send.copy(), recv.copy(), scratch.copy()])
        stepsim.run(progs, copies, op=op, seed=seed)
        yield copies


@pytest.mark.parametrize("algo", algos("gather"))
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("inplace", [False, True])
def test_gather(algo, n, inplace):
    for m in COUNTS:
        for root in roots(n):
            for chunk, depth in SHAPES:
                xs = inputs(n, m, seed=m + 3 * root + n)
                progs, bufs = [], []
                for r in range(n):
                    prog = build(Spec("gather", r, n, m, chunk=chunk, depth=depth, root=root,
                                      inplace=inplace and r == root), algo)
                    progs.append(prog)
                    recv = np.full(n * m if r == root else 0, 99, np.int64)
                    send = xs[r].copy()
                    if inplace and r == root:
                        recv[r * m:(r + 1) * m] = xs[r]
                        send = recv[r * m:(r + 1) * m]
                    bufs.append([send, recv, np.empty(prog.scratch, np.int64)])
                for out in run(progs, bufs):
                    np.testing.assert_array_equal(out[root][RECV], np.concatenate(xs),
                                                  err_msg=f"m {m} root {root} {chunk}/{depth}")


@pytest.mark.parametrize("algo", algos("scatter"))
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("inplace", [False, True])
def test_scatter(algo, n, inplace):
    for m in COUNTS:
        for root in roots(n):
            for chunk, depth in SHAPES:
                whole = inputs(1, n * m, seed=m + 5 * root + n)[0]
                progs, bufs = [], []
                for r in range(n):
                    prog = build(Spec("scatter", r, n, m, chunk=chunk, depth=depth, root=root,
                                      inplace=inplace and r == root), algo)
                    progs.append(prog)
                    send = whole.copy() if r == root else np.empty(0, np.int64)
                    recv = np.full(m, 99, np.int64)
                    if inplace and r == root:
                        recv = send[r * m:(r + 1) * m]
                    bufs.append([send, recv, np.empty(prog.scratch, np.int64)])
                for out in run(progs, bufs):
                    for r in range(n):
                        got = out[r][RECV]
                        np.testing.assert_array_equal(got, whole[r * m:(r + 1) * m],
                                                      err_msg=f"rank {r} m {m} root {root}")
                    if inplace:     # the root's input is left as it was
                        np.testing.assert_array_equal(out[root][0], whole)


def prefix(op, xs, exclusive):
    """Every rank's expected output: the fold of ranks 0..r (or 0..r-1), in rank order."""
    outs, acc = [], None
    for x in xs:
        outs.append(acc.copy() if exclusive and acc is not None else None)
        acc = x.copy() if acc is None else NP_OPS[op](acc, x)
        if not exclusive:
            outs[-1] = acc.copy()
    return outs


@pytest.mark.parametrize("coll", ["scan", "exscan"])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
@pytest.mark.parametrize("inplace", [False, True])
def test_scan(coll, n, op, inplace):
    for algo in algos(coll):
        for count in COUNTS:
            for chunk, depth in SHAPES:
                xs = inputs(n, count, seed=count * 31 + n)
                progs, bufs = [], []
                for r in range(n):
                    prog = build(Spec(coll, r, n, count, chunk=chunk, depth=depth,
                                      inplace=inplace), algo)
                    progs.append(prog)
                    recv = np.full(count, 99, np.int64)
                    if inplace:
                        recv[:] = xs[r]
                    bufs.append([recv if inplace else xs[r].copy(), recv,
                                 np.empty(prog.scratch, np.int64)])
                want = prefix(op, xs, coll == "exscan")
                for out in run(progs, bufs, op=op):
                    for r in range(n):
                        expect = want[r]
                        if expect is None:   # exscan's rank 0: its output is not written
                            expect = xs[0] if inplace else np.full(count, 99, np.int64)
                        np.testing.assert_array_equal(
                            out[r][RECV], expect,
                            err_msg=f"{algo} rank {r} count {count} {chunk}/{depth}")


def _projection(keep_left):
    def ufunc(a, b, out):
        np.copyto(out, a if keep_left else b)
    return ufunc


@pytest.mark.parametrize("coll", ["scan", "exscan"])
@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_scan_keeps_rank_order(monkeypatch, coll, n):
    """Associative but not commutative ops tell the order: "left" (a op b = a) folds to
    rank 0's input, "right" (a op b = b) to the last rank's."""
    from hpccoll.base import ops
    for name, left in (("left", True), ("right", False)):
        monkeypatch.setitem(ops.OPS, name, ops.OPS["sum"]._replace(name=name,
                                                                    ufunc=_projection(left)))
    for algo in algos(coll):
        for name in ("left", "right"):
            xs = inputs(n, 6, seed=n)
            for r in range(n):
                xs[r][:] = r + 1
            progs, bufs = [], []
            for r in range(n):
                prog = build(Spec(coll, r, n, 6, chunk=4, depth=2), algo)
                progs.append(prog)
                bufs.append([xs[r], np.zeros(6, np.int64), np.empty(prog.scratch, np.int64)])
            for out in run(progs, bufs, op=name):
                for r in range(1 if coll == "exscan" else 0, n):
                    last = r - 1 if coll == "exscan" else r
                    want = 1 if name == "left" else last + 1
                    assert (out[r][RECV] == want).all(), (algo, name, r, out[r][RECV])


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("inplace", [False, True])
def test_gatherv(n, inplace):
    rng = np.random.default_rng(n)
    for trial in range(6):
        counts = tuple(int(c) for c in rng.integers(0, 9, size=n))
        if trial == 0:
            counts = (0,) * n
        displs, end = layout(counts, rng)
        for root in roots(n):
            xs = [inputs(1, counts[r], seed=trial * 10 + r)[0] for r in range(n)]
            progs, bufs = [], []
            for r in range(n):
                here = r == root
                spec = Spec("gatherv", r, n, counts[r], root=root, inplace=inplace and here,
                            counts=counts if here else (), displs=displs if here else ())
                prog = build(spec, "linear")
                progs.append(prog)
                recv = np.full(end if here else 0, 99, np.int64)
                send = xs[r].copy()
                if inplace and here:
                    recv[displs[r]:displs[r] + counts[r]] = xs[r]
                    send = recv[displs[r]:displs[r] + counts[r]]
                bufs.append([send, recv, np.empty(prog.scratch, np.int64)])
            for out in run(progs, bufs):
                got = out[root][RECV]
                for q in range(n):
                    np.testing.assert_array_equal(got[displs[q]:displs[q] + counts[q]], xs[q])
                covered = np.zeros(end, bool)
                for q in range(n):
                    covered[displs[q]:displs[q] + counts[q]] = True
                assert (got[~covered] == 99).all()      # gaps untouched


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("inplace", [False, True])
def test_scatterv(n, inplace):
    rng = np.random.default_rng(100 + n)
    for trial in range(6):
        counts = tuple(int(c) for c in rng.integers(0, 9, size=n))
        if trial == 0:
            counts = (0,) * n
        displs, end = layout(counts, rng)
        for root in roots(n):
            whole = inputs(1, end, seed=trial)[0]
            progs, bufs = [], []
            for r in range(n):
                here = r == root
                spec = Spec("scatterv", r, n, counts[r], root=root, inplace=inplace and here,
                            scounts=counts if here else (), sdispls=displs if here else ())
                prog = build(spec, "linear")
                progs.append(prog)
                send = whole.copy() if here else np.empty(0, np.int64)
                recv = np.full(counts[r], 99, np.int64)
                if inplace and here:
                    recv = send[displs[r]:displs[r] + counts[r]]
                bufs.append([send, recv, np.empty(prog.scratch, np.int64)])
            for out in run(progs, bufs):
                for r in range(n):
                    np.testing.assert_array_equal(out[r][RECV],
                                                  whole[displs[r]:displs[r] + counts[r]])


def test_v_forms_post_every_peer():
    """One message per peer, empty ones too (a count mismatch then errs, never hangs)."""
    n = 4
    counts, displs = (0, 3, 0, 2), (0, 0, 3, 3)
    root = build(Spec("gatherv", 0, n, 0, counts=counts, displs=displs), "linear")
    posts = [p for p in root.steps if isinstance(p, Post)]
    assert sorted(q for p in posts for q, _ in p.recvs) == [1, 2, 3]
    root = build(Spec("scatterv", 0, n, 0, scounts=counts, sdispls=displs), "linear")
    posts = [p for p in root.steps if isinstance(p, Post)]
    assert sorted(q for p in posts for q, _ in p.sends) == [1, 2, 3]


@pytest.mark.parametrize("coll", ["gather", "scatter", "scan", "exscan"])
def test_large_messages_are_suspendable_in_chunks(coll):
    """The pipelined algorithms wait once per chunk: preemption points."""
    algo = {"gather": "linear", "scatter": "linear", "scan": "chain", "exscan": "chain"}[coll]
    for r in range(3):
        prog = build(Spec(coll, r, 3, 100, chunk=10, depth=2, root=1), algo)
        if coll in ("gather", "scatter") and r != 1 or coll in ("scan", "exscan"):
            assert prog.waits >= 10, (coll, r, prog.waits)


@pytest.mark.parametrize("coll", ["gather", "scatter"])
@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("inplace", [False, True])
def test_shm_rooted(coll, n, inplace):
    """Staged through node-shared slots: more chunks than slots, slots with garbage in
    them, epochs after a base (previous collectives)."""
    from hpccoll.algorithms import shm
    fn = shm.gather if coll == "gather" else shm.scatter
    for m, chunk, slots, base in [(0, 6, 2, 0), (1, 6, 2, 5), (23, 6, 2, 3), (40, 12, 3, 11)]:
        for root in roots(n):
            progs, bufs = [], []
            whole = inputs(1, n * m, seed=m + root)[0]
            for r in range(n):
                prog = build(Spec(coll, r, n, m, chunk=chunk, slots=slots, root=root,
                                  inplace=inplace and r == root, local=tuple(range(n))), "shm")
                progs.append(prog)
                here = r == root
                if coll == "gather":
                    recv = np.full(n * m if here else 0, 99, np.int64)
                    send = whole[r * m:(r + 1) * m].copy()
                    if inplace and here:
                        recv[r * m:(r + 1) * m] = send
                        send = recv[r * m:(r + 1) * m]
                else:
                    send = whole.copy() if here else np.empty(0, np.int64)
                    recv = np.full(m, 99, np.int64)
                    if inplace and here:
                        recv = send[r * m:(r + 1) * m]
                bufs.append([send, recv, np.empty(prog.scratch, np.int64)])
            for seed in range(SEED_RUNS):
                sl = [[np.full(chunk, 77, np.int64) for _ in range(slots)] for _ in range(n)]
                cs = []
                for send, recv, scratch in bufs:
                    if (off := _inside(send, recv)) is not None:
                        c = recv.copy()
                        cs.append([c[off:off + send.size], c, scratch])
                    elif (off := _inside(recv, send)) is not None:
                        c = send.copy()
                        cs.append([c, c[off:off + recv.size], scratch])
                    else:
                        cs.append([send.copy(), recv.copy(), scratch])
                stepsim.run(progs, cs, seed=seed, slots=sl, base=base)
                if coll == "gather":
                    np.testing.assert_array_equal(cs[root][RECV], whole,
                                                  err_msg=f"m {m} root {root} seed {seed}")
                else:
                    for r in range(n):
                        np.testing.assert_array_equal(cs[r][RECV], whole[r * m:(r + 1) * m])
