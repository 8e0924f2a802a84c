"""Every step machine, at 1..8 ranks, odd counts, several chunk sizes and pipeline
depths, run by the in-process step simulator and compared with NumPy (exact: integers)."""
import numpy as np
import pytest

from hpccoll.algorithms import ROWS_WITHOUT_STEPS, SHM_ALGOS, TABLE, build
from hpccoll.algorithms.primitives import RECV, Post
from hpccoll.algorithms.spec import Spec
from tests import stepsim

NP_OPS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}
SIZES = [1, 2, 3, 4, 5, 7, 8]
COUNTS = [0, 1, 2, 5, 13, 64]
SHAPES = [(1, 1), (3, 2), (64, 2), (4, 3)]   # (chunk elements, depth)


def algos(coll):
    """The point-to-point algorithms (shared memory: test_shm_algorithms.py; "mpi" is the
    MPI library's own collective and "cells" run in C, tested against MPI in tests/mpi)."""
    return [name for name, _, _ in TABLE[coll]
            if name not in SHM_ALGOS and name not in ROWS_WITHOUT_STEPS]


def fold(op, arrays):
    out = arrays[0].copy()
    for a in arrays[1:]:
        NP_OPS[op](out, a, out=out)
    return out


def inputs(n, length, seed, dtype=np.int64):
    rng = np.random.default_rng(seed)
    return [rng.integers(-3, 4, size=length).astype(dtype) for _ in range(n)]


def execute(coll, algo, n, count, chunk, depth, sends, recv_len, op="sum", root=0, avg=False,
            inplace=False, seed=0):
    progs, bufs = [], []
    for r in range(n):
        spec = Spec(coll, r, n, count, chunk=chunk, depth=depth, root=root, avg=avg, inplace=inplace)
        prog = build(spec, algo)
        progs.append(prog)
        recv = np.full(recv_len, 99, dtype=sends[r].dtype)
        if inplace and coll != "broadcast":
            recv[: sends[r].size] = sends[r]
            send = recv if sends[r].size == recv_len else sends[r]
        else:
            send = sends[r]
        bufs.append([send, recv, np.empty(prog.scratch, dtype=sends[r].dtype)])
    stepsim.run(progs, bufs, op=op, seed=seed)
    return [b[RECV] for b in bufs]


@pytest.mark.parametrize("algo", algos("allreduce"))
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
def test_allreduce(algo, n, op):
    for count in COUNTS:
        for chunk, depth in SHAPES:
            xs = inputs(n, count, seed=count * 31 + n)
            out = execute("allreduce", algo, n, count, chunk, depth, xs, count, op=op, seed=count)
            want = fold(op, xs)
            for r in range(n):
                np.testing.assert_array_equal(out[r], want, err_msg=f"rank {r} count {count}")


@pytest.mark.parametrize("algo", algos("allreduce"))
@pytest.mark.parametrize("n", [2, 3, 5])
def test_allreduce_inplace_and_avg_bitwise_equal(algo, n):
    count = 37
    rng = np.random.default_rng(n)
    xs = [rng.standard_normal(count).astype(np.float32) for _ in range(n)]
    out = execute("allreduce", algo, n, count, 4, 2, xs, count, avg=True, inplace=True)
    np.testing.assert_allclose(out[0], np.mean(xs, axis=0), rtol=1e-5, atol=1e-6)
    for r in range(1, n):  # every rank holds the very same bits
        assert out[r].tobytes() == out[0].tobytes()


@pytest.mark.parametrize("algo", algos("reduce"))
@pytest.mark.parametrize("n", SIZES)
def test_reduce(algo, n):
    for count in COUNTS:
        for root in sorted({0, n - 1, n // 2}):
            for chunk, depth in SHAPES[:3]:
                xs = inputs(n, count, seed=count + root)
                out = execute("reduce", algo, n, count, chunk, depth, xs, count, op="sum", root=root)
                np.testing.assert_array_equal(out[root], fold("sum", xs))


@pytest.mark.parametrize("algo", algos("broadcast"))
@pytest.mark.parametrize("n", SIZES)
def test_broadcast(algo, n):
    for count in COUNTS:
        for root in sorted({0, n - 1, n // 2}):
            for chunk, depth in SHAPES:
                xs = inputs(n, count, seed=count + 7 * root)
                progs, bufs = [], []
                for r in range(n):
                    prog = build(Spec("broadcast", r, n, count, chunk=chunk, depth=depth, root=root,
                                      inplace=True), algo)
                    buf = xs[r].copy()
                    progs.append(prog)
                    bufs.append([buf, buf, np.empty(prog.scratch, dtype=buf.dtype)])
                stepsim.run(progs, bufs)
                for r in range(n):
                    np.testing.assert_array_equal(bufs[r][RECV], xs[root])


@pytest.mark.parametrize("algo", algos("allgather"))
@pytest.mark.parametrize("n", SIZES)
def test_allgather(algo, n):
    for m in COUNTS:
        for chunk, depth in SHAPES:
            xs = inputs(n, m, seed=m + n)
            out = execute("allgather", algo, n, m, chunk, depth, xs, n * m)
            for r in range(n):
                np.testing.assert_array_equal(out[r], np.concatenate(xs))


@pytest.mark.parametrize("n", SIZES)
def test_allgather_direct(n):
    """The fingerprint check's one-round allgather."""
    for m in (0, 1, 6):
        xs = inputs(n, m, seed=m + n)
        out = execute("allgather", "direct", n, m, 1, 1, xs, n * m)
        for r in range(n):
            np.testing.assert_array_equal(out[r], np.concatenate(xs))


@pytest.mark.parametrize("n", SIZES)
def test_allgather_inplace(n):
    for algo in algos("allgather"):
        m = 5
        xs = inputs(n, m, seed=n)
        progs, bufs = [], []
        for r in range(n):
            prog = build(Spec("allgather", r, n, m, chunk=2, depth=2, inplace=True), algo)
            recv = np.full(n * m, 99, dtype=np.int64)
            recv[r * m:(r + 1) * m] = xs[r]
            progs.append(prog)
            bufs.append([recv[r * m:(r + 1) * m], recv, np.empty(prog.scratch, dtype=np.int64)])
        stepsim.run(progs, bufs)
        for r in range(n):
            np.testing.assert_array_equal(bufs[r][RECV], np.concatenate(xs))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("op", ["sum", "max"])
def test_reduce_scatter(n, op):
    for algo in algos("reduce_scatter"):
        for m in COUNTS:
            for chunk, depth in SHAPES:
                xs = inputs(n, n * m, seed=m)
                out = execute("reduce_scatter", algo, n, m, chunk, depth, xs, m, op=op)
                want = fold(op, xs)
                for r in range(n):
                    np.testing.assert_array_equal(out[r], want[r * m:(r + 1) * m])


@pytest.mark.parametrize("n", SIZES)
def test_reduce_scatter_inplace_nccl_view(n):
    m = 6
    xs = inputs(n, n * m, seed=n)
    progs, bufs = [], []
    for r in range(n):
        prog = build(Spec("reduce_scatter", r, n, m, chunk=4, depth=2, inplace=True), "ring")
        send = xs[r].copy()
        progs.append(prog)
        bufs.append([send, send[r * m:(r + 1) * m], np.empty(prog.scratch, dtype=np.int64)])
    stepsim.run(progs, bufs)
    want = fold("sum", xs)
    for r in range(n):
        np.testing.assert_array_equal(bufs[r][RECV], want[r * m:(r + 1) * m])


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("inplace", [False, True])
def test_alltoall(n, inplace):
    for m in COUNTS:
        for chunk, depth in SHAPES:
            xs = inputs(n, n * m, seed=m)
            out = execute("alltoall", "pairwise", n, m, chunk, depth, xs, n * m, inplace=inplace)
            for r in range(n):
                want = np.concatenate([xs[q][r * m:(r + 1) * m] for q in range(n)]) if m else \
                    np.empty(0, np.int64)
                np.testing.assert_array_equal(out[r], want)


@pytest.mark.parametrize("n", SIZES)
def test_barrier_rounds(n):
    progs = [build(Spec("barrier", r, n, 0), "dissemination") for r in range(n)]
    empty = np.empty(0)
    stepsim.run(progs, [[empty, empty, empty] for _ in range(n)])
    assert all(p.waits == (n - 1).bit_length() for p in progs)


def test_barrier_cannot_complete_alone():
    """A barrier is a real synchronization: without rank 1 nobody finishes."""
    progs = [build(Spec("barrier", r, 3, 0), "dissemination") for r in range(3)]
    empty = np.empty(0)
    progs[1] = progs[1]._replace(steps=())
    with pytest.raises(stepsim.Deadlock, match="no rank can move"):
        stepsim.run(progs, [[empty, empty, empty] for _ in range(3)])


def test_every_chunk_is_a_suspension_point():
    """Large messages wait once per chunk per ring step: that is where a collective can yield."""
    n, count, chunk = 4, 1000, 50
    prog = build(Spec("allreduce", 0, n, count, chunk=chunk, depth=2), "ring")
    per_block = -(-count // n // chunk)
    assert prog.waits == 2 * (n - 1) * per_block
    # ... because no transfer moves more than a chunk: each one is waited for on its own
    sizes = [reg.n for p in prog.steps if isinstance(p, Post) for _, reg in p.sends + p.recvs]
    assert sizes and max(sizes) <= chunk


def test_scratch_is_bounded_by_chunks():
    """The ring allreduce's scratch is depth x chunk, independent of the message size."""
    for count in (10_000, 1_000_000):
        prog = build(Spec("allreduce", 1, 4, count, chunk=256, depth=2), "ring")
        assert prog.scratch == 2 * 256


def test_programs_are_cached():
    spec = Spec("allreduce", 0, 4, 8, chunk=4)
    assert build(spec, "doubling") is build(spec, "doubling")


# -- variable counts: uneven blocks, gaps and any block order --------------------------

def layout(counts, rng):
    """Displacements placing the blocks in a random order with random gaps, and the length
    the blocks reach.  Empty blocks point past the end (MPI never looks at them)."""
    displs, pos = [0] * len(counts), 0
    for i in rng.permutation(len(counts)):
        pos += int(rng.integers(0, 3))
        displs[i] = pos
        pos += counts[i]
    end = max((d + c for d, c in zip(displs, counts) if c), default=0)
    return tuple(d if c else end + 7 for d, c in zip(displs, counts)), end


def run_v(coll, n, chunk, depth, sends, recvs, per_rank, inplace=False, op="sum", seed=0):
    """per_rank(r) -> the Spec fields counts/displs/scounts/sdispls of rank r."""
    progs, bufs = [], []
    for r in range(n):
        spec = Spec(coll, r, n, sum(per_rank(r)["counts"]), chunk=chunk, depth=depth,
                    inplace=inplace, **per_rank(r))
        prog = build(spec, "pairwise" if coll == "alltoallv" else "ring")
        progs.append(prog)
        bufs.append([sends[r], recvs[r], np.empty(prog.scratch, dtype=recvs[r].dtype)])
    stepsim.run(progs, bufs, op=op, seed=seed)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("inplace", [False, True])
def test_allgatherv(n, inplace):
    rng = np.random.default_rng(n)
    for trial in range(6):
        counts = tuple(int(c) for c in rng.integers(0, 9, size=n))
        if trial == 0:
            counts = (0,) * n
        xs = inputs(n, max(counts), seed=trial)
        xs = [x[:counts[r]] for r, x in enumerate(xs)]
        lay = [layout(counts, rng) for _ in range(n)]   # every rank its own displacements
        for chunk, depth in SHAPES:
            recvs = [np.full(lay[r][1], 99, np.int64) for r in range(n)]
            sends = []
            for r in range(n):
                d = lay[r][0][r]
                if inplace:
                    recvs[r][d:d + counts[r]] = xs[r]
                    sends.append(recvs[r][d:d + counts[r]])
                else:
                    sends.append(xs[r].copy())
            run_v("allgatherv", n, chunk, depth, sends, recvs,
                  lambda r: {"counts": counts, "displs": lay[r][0]}, inplace=inplace, seed=trial)
            for r in range(n):
                want = np.full(lay[r][1], 99, np.int64)
                for q in range(n):
                    want[lay[r][0][q]:lay[r][0][q] + counts[q]] = xs[q]
                np.testing.assert_array_equal(recvs[r], want, err_msg=f"rank {r} counts {counts}")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("op", ["sum", "max"])
@pytest.mark.parametrize("inplace", [False, True])
def test_reduce_scatterv(n, op, inplace):
    rng = np.random.default_rng(n + 100)
    for trial in range(6):
        counts = tuple(int(c) for c in rng.integers(0, 9, size=n))
        if trial == 0:
            counts = (0,) * n
        total = sum(counts)
        xs = inputs(n, total, seed=trial)
        want = fold(op, xs)
        offs = np.cumsum((0,) + counts)
        for chunk, depth in SHAPES:
            sends = [x.copy() for x in xs]
            recvs = [s[:counts[r]] if inplace else np.full(counts[r], 99, np.int64)
                     for r, s in enumerate(sends)]
            run_v("reduce_scatterv", n, chunk, depth, sends, recvs, lambda r: {"counts": counts},
                  inplace=inplace, op=op, seed=trial)
            for r in range(n):
                np.testing.assert_array_equal(recvs[r], want[offs[r]:offs[r + 1]],
                                              err_msg=f"rank {r} counts {counts}")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("inplace", [False, True])
def test_alltoallv(n, inplace):
    rng = np.random.default_rng(n + 200)
    for trial in range(6):
        # C[q][r]: elements rank q sends to rank r (symmetric in place: MPI's in-place form
        # sends and receives with the same counts)
        C = rng.integers(0, 6, size=(n, n))
        if inplace:
            C = np.triu(C) + np.triu(C, 1).T
        if trial == 0:
            C[:] = 0
        rlay = [layout([int(C[q][r]) for q in range(n)], rng) for r in range(n)]
        slay = rlay if inplace else [layout([int(C[r][q]) for q in range(n)], rng) for r in range(n)]
        xs = inputs(n, max(s[1] for s in slay), seed=trial)
        xs = [x[:slay[r][1]] for r, x in enumerate(xs)]

        def fields(r):
            return {"counts": tuple(int(C[q][r]) for q in range(n)), "displs": rlay[r][0],
                    "scounts": tuple(int(C[r][q]) for q in range(n)), "sdispls": slay[r][0]}
        for chunk, depth in SHAPES:
            recvs = [xs[r].copy() if inplace else np.full(rlay[r][1], 99, np.int64)
                     for r in range(n)]
            sends = recvs if inplace else [x.copy() for x in xs]
            run_v("alltoallv", n, chunk, depth, sends, recvs, fields, inplace=inplace, seed=trial)
            for r in range(n):
                want = xs[r].copy() if inplace else np.full(rlay[r][1], 99, np.int64)
                for q in range(n):
                    c, sdq, rdr = int(C[q][r]), slay[q][0][r], rlay[r][0][q]
                    want[rdr:rdr + c] = xs[q][sdq:sdq + c]
                np.testing.assert_array_equal(recvs[r], want, err_msg=f"rank {r} C {C.tolist()}")


def test_alltoallv_posts_every_peer():
    """Empty blocks are still messages, so a count mismatch cannot leave a message unmatched."""
    n = 4
    prog = build(Spec("alltoallv", 0, n, 0, counts=(0,) * n, displs=(0,) * n,
                      scounts=(0,) * n, sdispls=(0,) * n), "pairwise")
    posts = [p for p in prog.steps if isinstance(p, Post)]
    assert sorted(peer for p in posts for peer, _ in p.sends) == [1, 2, 3]
    assert sorted(peer for p in posts for peer, _ in p.recvs) == [1, 2, 3]
