"""hpccoll.mpi.Comm against mpi4py: every natively run method, the same call on the same
inputs through both, results equal; every predefined numeric type, every op MPI defines
on it, mpi4py's argument forms, in place and out of place, counts including 0."""
import numpy as np
import pytest
from mpi4py import MPI

import hpccoll.mpi
from tests.mpi.twins import (ALL_DTYPES, FORMS, INTS, WINDOWED, DISPL, assert_same,
                             data, mpi_type, native_calls, ops_for, padded, spec, twin)

pytestmark = pytest.mark.mpi

COUNTS = [0, 1, 7, 300]
BIG = 40_000   # x 8 B > small_msg_bytes: the ring / chain / pipelined paths


def close(n):
    def compare(got, want, what):
        assert_same(got, want, n, what)
    return compare


# -- reductions ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_allreduce(world, adapter, dtype):
    r = world.rank
    for count in COUNTS:
        for i, op in enumerate(ops_for(dtype)):
            form = FORMS[(i + count) % len(FORMS)]
            x = data(dtype, count, r, salt=i)

            def out_of_place():
                send, recv = padded(x, form), padded(np.zeros(count, dtype), form)
                return ([spec(send, dtype, form, count, DISPL.get(form, 0)),
                         spec(recv, dtype, form, count, DISPL.get(form, 0)), op], [recv, send])

            def in_place():
                buf = padded(x, form)
                return [MPI.IN_PLACE, spec(buf, dtype, form, count, DISPL.get(form, 0)), op], [buf]
            twin(world, adapter, "Allreduce", out_of_place)
            twin(world, adapter, "Allreduce", in_place)
            twin(world, adapter, "Iallreduce", in_place if i % 2 else out_of_place)


@pytest.mark.parametrize("dtype", ["int16", "float64", "complex128", "uint8", "bool"])
def test_allreduce_large(world, adapter, dtype):
    """Large enough for the pipelined and shared-memory paths, with every op."""
    x = data(dtype, BIG + 3, world.rank)
    for op in ops_for(dtype):
        twin(world, adapter, "Allreduce", lambda: ([x, y := np.zeros_like(x), op], [y]))
        twin(world, adapter, "Allreduce", lambda: ([MPI.IN_PLACE, b := x.copy(), op], [b]))


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_reduce(world, adapter, dtype):
    n, r = world.size, world.rank
    for count in COUNTS + [BIG]:
        for root in sorted({0, n - 1}):
            for i, op in enumerate(ops_for(dtype)[:4] if count != BIG else ops_for(dtype)[:1]):
                x = data(dtype, count, r, salt=root + i)
                twin(world, adapter, "Reduce",
                     lambda: ([x, y := np.zeros(count, dtype), op, root], [y]))
                if r == root:   # MPI_IN_PLACE is for the root
                    twin(world, adapter, "Reduce",
                         lambda: ([MPI.IN_PLACE, b := x.copy(), op, root], [b]))
                else:           # receive buffer ignored off the root, as in mpi4py
                    twin(world, adapter, "Reduce", lambda: ([x, None, op, root], []))
                twin(world, adapter, "Ireduce", lambda: (
                    [[x, mpi_type(dtype)], [y := np.zeros(count, dtype), mpi_type(dtype)], op, root],
                    [y]))


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_reduce_scatter_block(world, adapter, dtype):
    n, r = world.size, world.rank
    for count in COUNTS:
        for i, op in enumerate(ops_for(dtype)):
            x = data(dtype, n * count, r, salt=i)
            twin(world, adapter, "Reduce_scatter_block",
                 lambda: ([x, y := np.zeros(count, dtype), op], [y]))
            # in place: n blocks in the receive buffer, the result in its first block;
            # what MPI leaves in the others is not defined
            twin(world, adapter, "Ireduce_scatter_block" if i % 2 else "Reduce_scatter_block",
                 lambda: ([MPI.IN_PLACE, b := x.copy(), op], [b[:count]]))
            # the block-count form of the receive buffer: [buf, count, type]
            twin(world, adapter, "Reduce_scatter_block",
                 lambda: ([[x, mpi_type(dtype)], [y := np.zeros(count + 3, dtype), count,
                                                  mpi_type(dtype)], op], [y]))


def test_reduce_scatter_block_large(world, adapter):
    n = world.size
    x = data("int64", n * BIG, world.rank)
    twin(world, adapter, "Reduce_scatter_block", lambda: ([x, y := np.zeros(BIG, "int64")], [y]))
    twin(world, adapter, "Reduce_scatter_block", lambda: ([MPI.IN_PLACE, b := x.copy()], [b[:BIG]]))


def uneven(n: int, salt: int) -> list:
    """Per-rank counts, zeros included."""
    return [(3 * i + salt) % 5 for i in range(n)]


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_reduce_scatter(world, adapter, dtype):
    n, r = world.size, world.rank
    for salt in range(3):
        counts = uneven(n, salt)
        total = sum(counts)
        for i, op in enumerate(ops_for(dtype)):
            x = data(dtype, total, r, salt=i + salt)
            twin(world, adapter, "Reduce_scatter",
                 lambda: ([x, y := np.zeros(counts[r], dtype), counts, op], [y]))
            # recvcounts=None: mpi4py gathers every rank's receive count
            twin(world, adapter, "Ireduce_scatter" if i % 2 else "Reduce_scatter",
                 lambda: ([x, y := np.zeros(counts[r], dtype), None, op], [y]))
            twin(world, adapter, "Reduce_scatter",
                 lambda: ([MPI.IN_PLACE, b := x.copy(), counts, op], [b[:counts[r]]]))
    big = [BIG + i for i in range(n)]
    x = data("float32", sum(big), r)
    twin(world, adapter, "Reduce_scatter", lambda: ([x, y := np.zeros(big[r], "float32"), big], [y]))


# -- data movement ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_bcast(world, adapter, dtype):
    n, r = world.size, world.rank
    for count in COUNTS + [BIG]:
        for j, root in enumerate(sorted({0, n // 2, n - 1})):
            form = FORMS[(j + count) % len(FORMS)]
            x = data(dtype, count, r, salt=root)
            buf = lambda: padded(x, form, fill=x[:1].sum() if count else None)   # noqa: E731
            twin(world, adapter, "Bcast", lambda: (
                [spec(b := buf(), dtype, form, count, DISPL.get(form, 0)), root], [b]))
            twin(world, adapter, "Ibcast", lambda: ([b := x.copy(), root], [b]))


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_allgather(world, adapter, dtype):
    n, r = world.size, world.rank
    for count in COUNTS + [BIG // 4]:
        x = data(dtype, count, r)
        twin(world, adapter, "Allgather", lambda: ([x, y := np.zeros(n * count, dtype)], [y]))
        twin(world, adapter, "Iallgather",
             lambda: ([[x, mpi_type(dtype)], [y := np.zeros(n * count + 2, dtype), count,
                                              mpi_type(dtype)]], [y]))

        def in_place():
            b = np.zeros(n * count, dtype)
            b[r * count:(r + 1) * count] = x
            return [MPI.IN_PLACE, b], [b]
        twin(world, adapter, "Allgather", in_place)


def layout(counts, reverse: bool):
    """Displacements with a gap after every block, blocks in rank order or reversed."""
    order = range(len(counts) - 1, -1, -1) if reverse else range(len(counts))
    displs, pos = [0] * len(counts), 0
    for i in order:
        displs[i] = pos
        pos += counts[i] + 1
    return displs, pos


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_allgatherv(world, adapter, dtype):
    n, r = world.size, world.rank
    T = mpi_type(dtype)
    for salt in range(3):
        counts = uneven(n, salt)
        x = data(dtype, counts[r], r, salt=salt)
        displs, length = layout(counts, reverse=salt % 2 == 1)
        twin(world, adapter, "Allgatherv",
             lambda: ([x, [y := np.zeros(length, dtype), counts, displs, T]], [y]))
        twin(world, adapter, "Iallgatherv",
             lambda: ([x, [y := np.zeros(length, dtype), (counts, displs), T]], [y]))
        twin(world, adapter, "Allgatherv",   # displacements implied: blocks back to back
             lambda: ([[x, T], [y := np.zeros(sum(counts), dtype), counts, T]], [y]))

        def in_place():
            b = np.zeros(length, dtype)
            b[displs[r]:displs[r] + counts[r]] = x
            return [MPI.IN_PLACE, [b, counts, displs, T]], [b]
        twin(world, adapter, "Allgatherv", in_place)
    # plain receive buffer: mpi4py splits it as evenly as it can
    total = 2 * n + 1
    counts = [total // n + (total % n > i) for i in range(n)]
    x = data(dtype, counts[r], r)
    twin(world, adapter, "Allgatherv", lambda: ([x, y := np.zeros(total, dtype)], [y]))
    # same count everywhere, strided: [buf, count, stride, type]
    x = data(dtype, 2, r)
    twin(world, adapter, "Allgatherv",
         lambda: ([x, [y := np.zeros(3 * n, dtype), 2, 3, T]], [y]))


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_alltoall(world, adapter, dtype):
    n, r = world.size, world.rank
    for count in COUNTS + [BIG // 4]:
        x = data(dtype, n * count, r)
        twin(world, adapter, "Alltoall", lambda: ([x, y := np.zeros(n * count, dtype)], [y]))
        twin(world, adapter, "Ialltoall", lambda: ([MPI.IN_PLACE, b := x.copy()], [b]))
        twin(world, adapter, "Alltoall",
             lambda: ([[x, count, mpi_type(dtype)], [y := np.zeros(n * count + 1, dtype), count,
                                                     mpi_type(dtype)]], [y]))


def matrix(n: int, salt: int, symmetric=False):
    """C[q][p]: elements rank q sends to rank p."""
    C = [[(q * 7 + p * 3 + salt) % 4 for p in range(n)] for q in range(n)]
    if symmetric:
        C = [[C[min(p, q)][max(p, q)] for p in range(n)] for q in range(n)]
    return C


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_alltoallv(world, adapter, dtype):
    n, r = world.size, world.rank
    T = mpi_type(dtype)
    for salt in range(3):
        C = matrix(n, salt)
        scounts = C[r]
        rcounts = [C[q][r] for q in range(n)]
        sdispls, slen = layout(scounts, reverse=salt == 1)
        rdispls, rlen = layout(rcounts, reverse=salt != 1)
        x = data(dtype, slen, r, salt=salt)
        twin(world, adapter, "Alltoallv", lambda: (
            [[x, scounts, sdispls, T], [y := np.zeros(rlen, dtype), rcounts, rdispls, T]], [y]))
        twin(world, adapter, "Ialltoallv", lambda: (
            [[x, (scounts, sdispls), T], [y := np.zeros(rlen, dtype), (rcounts, rdispls), T]],
            [y]))
        xs = data(dtype, sum(scounts), r, salt=salt)
        twin(world, adapter, "Alltoallv",
             lambda: ([[xs, scounts], [y := np.zeros(sum(rcounts), dtype), rcounts]], [y]))
        # in place: the receive layout is also the send layout (counts symmetric)
        S = matrix(n, salt, symmetric=True)
        counts = S[r]
        displs, length = layout(counts, reverse=salt == 2)
        b0 = data(dtype, length, r, salt=10 + salt)
        twin(world, adapter, "Alltoallv",
             lambda: ([MPI.IN_PLACE, [b := b0.copy(), counts, displs, T]], [b]))
    # plain buffers: the same count to everyone
    x = data(dtype, 2 * n, r)
    twin(world, adapter, "Alltoallv", lambda: ([x, y := np.zeros(2 * n, dtype)], [y]))


def test_alltoallv_large(world, adapter):
    n, r = world.size, world.rank
    scounts = [BIG // n + q for q in range(n)]
    rcounts = [BIG // n + r] * n
    x = data("float64", sum(scounts), r)
    twin(world, adapter, "Alltoallv",
         lambda: ([[x, scounts], [y := np.zeros(sum(rcounts)), rcounts]], [y]))


def test_barrier(world, adapter):
    """Nobody leaves the adapter's barrier before the last rank entered it."""
    import time
    before = native_calls(adapter, "Barrier")
    entered = np.array([time.time()])
    if world.rank == 0:
        time.sleep(0.2)
        entered[0] = time.time()
    adapter.Barrier()
    left = time.time()
    latest = np.empty(1)
    world.Allreduce(entered, latest, op=MPI.MAX)
    assert left >= latest[0] - 0.01
    req = adapter.Ibarrier()
    assert req.Wait() is True
    assert native_calls(adapter, "Barrier") == before + 1
    assert native_calls(adapter, "Ibarrier") >= 1


def test_every_form_and_typecode(world, adapter):
    """Each argument form with a window of a larger buffer: the bytes outside the window
    are untouched, as with mpi4py."""
    r = world.rank
    for dtype in ["int16", "float64", "complex64"]:
        for form in FORMS:
            x = data(dtype, 5, r)
            twin(world, adapter, "Allreduce", lambda: (
                [spec(s := padded(x, form), dtype, form, 5, DISPL.get(form, 0)),
                 spec(y := padded(np.zeros(5, dtype), form), dtype, form, 5, DISPL.get(form, 0))],
                [y, s]))
        assert any(f in WINDOWED for f in FORMS)


def test_multidimensional_and_fortran_order(world, adapter):
    """mpi4py sends contiguous buffers in memory order, C or Fortran."""
    r = world.rank
    x = np.asfortranarray(np.arange(12, dtype=np.int32).reshape(3, 4) + r)
    twin(world, adapter, "Allreduce", lambda: ([x, y := np.zeros((3, 4), np.int32, order="F")], [y]))
    twin(world, adapter, "Allreduce", lambda: ([x, y := np.zeros((4, 3), np.int32)], [y]))
    b = bytearray(np.arange(8, dtype=np.uint8).tobytes())
    twin(world, adapter, "Allreduce",
         lambda: ([bytes(b), y := bytearray(8), MPI.MAX], [np.frombuffer(y, np.uint8)]))


@pytest.mark.skipif("e" not in MPI._typedict, reason="this MPI has no float16 type for mpi4py")
def test_float16(world, adapter):
    x = data("float16", 9, world.rank)
    twin(world, adapter, "Allreduce", lambda: ([x, y := np.zeros(9, np.float16)], [y]))
    twin(world, adapter, "Bcast", lambda: ([b := x.copy(), 0], [b]))


def test_nonblocking_requests_api(world, adapter):
    """wait/test/Test/Waitall/Testall behave like mpi4py's, on mixed lists too."""
    n, r = world.size, world.rank
    x = data("int64", 10, r)
    want = np.empty(10, np.int64)
    world.Allreduce(x, want)
    reqs, outs = [], []
    for _ in range(3):
        y = np.zeros(10, np.int64)
        reqs.append(adapter.Iallreduce(x, y))
        outs.append(y)
    gathered = np.zeros(n, np.int64)
    wide = np.full(1, r, np.longdouble)        # long double: forwarded, an MPI.Request
    reqs.append(adapter.Iallreduce([wide, MPI.LONG_DOUBLE],
                                   [total := np.zeros(1, np.longdouble), MPI.LONG_DOUBLE]))
    assert isinstance(reqs[-1], MPI.Request)
    reqs.append(adapter.Iallgather(x[:1], gathered))
    assert hpccoll.mpi.Request.Waitall(reqs) is True
    for y in outs:
        np.testing.assert_array_equal(y, want)
    assert total[0] == sum(range(n))
    want_g = np.empty(n, np.int64)
    world.Allgather(x[:1], want_g)
    np.testing.assert_array_equal(gathered, want_g)

    req = adapter.Iallreduce(x, y := np.zeros(10, np.int64))
    while not req.Test():
        pass
    assert req.test() == (True, None) and req.wait() is None      # mpi4py's values
    np.testing.assert_array_equal(y, want)
    reqs = [adapter.Ibarrier(), adapter.Ibcast(np.zeros(3), root=0)]
    while not hpccoll.mpi.Request.Testall(reqs):
        pass
    assert hpccoll.mpi.Request.waitall(reqs) == [None, None]
    assert hpccoll.mpi.Request.testall(reqs) == (True, [None, None])
    status = MPI.Status()
    adapter.Iallreduce(x, y).Wait(status)
    assert status.Get_error() == MPI.SUCCESS
    with pytest.raises(TypeError):
        hpccoll.mpi.Request.Waitall([object()])


@pytest.mark.parametrize("dtype", INTS[:2] + ["float32"])
def test_zero_counts_everywhere(world, adapter, dtype):
    """Count 0 in every collective: nothing moves, nothing hangs, nothing is written."""
    n = world.size
    e = np.zeros(0, dtype)
    for method, args in [("Allreduce", [e, e.copy()]), ("Reduce", [e, e.copy()]),
                         ("Bcast", [e]), ("Allgather", [e, e.copy()]),
                         ("Alltoall", [e, e.copy()]), ("Reduce_scatter_block", [e, e.copy()]),
                         ("Allgatherv", [e, [e.copy(), [0] * n]]),
                         ("Alltoallv", [[e, [0] * n], [e.copy(), [0] * n]]),
                         ("Reduce_scatter", [e, e.copy(), [0] * n])]:
        twin(world, adapter, method, lambda: (args, []))
