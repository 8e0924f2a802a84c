"""hpccoll.mpi.Comm's Gather(v), Scatter(v), Scan, Exscan and their nonblocking forms
against mpi4py's own on the same inputs: every predefined numeric type, every op MPI
defines on it, every root, mpi4py's argument forms, MPI.IN_PLACE, counts including 0;
``stats`` show every call native (twins.twin checks it)."""
import numpy as np
import pytest
from mpi4py import MPI

from tests.mpi.conftest import POLICY
from tests.mpi.twins import (ALL_DTYPES, DISPL, FORMS, assert_same, data, forwarded_calls,
                             mpi_type, ops_for, padded, spec, twin)

pytestmark = pytest.mark.mpi

COUNTS = [0, 1, 7, 300]
BIG = 40_000


def roots(n):
    return sorted({0, n // 2, n - 1})


def at_root(r, root, n):
    """Compare outputs at the root only (MPI leaves the others' receive buffers alone)."""
    def compare(got, want, what):
        if r == root:
            assert_same(got, want, n, what)
    return compare


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_gather(world, adapter, dtype):
    n, r = world.size, world.rank
    T = mpi_type(dtype)
    for count in COUNTS + [BIG // 4]:
        for j, root in enumerate(roots(n)):
            form = FORMS[(j + count) % len(FORMS)]
            x = data(dtype, count, r, salt=root)
            cmp = at_root(r, root, n)
            twin(world, adapter, "Gather",
                 lambda: ([x, y := np.zeros(n * count, dtype), root], [y]), compare=cmp)
            def forms():
                send = spec(padded(x, form), dtype, form, count, DISPL.get(form, 0))
                if r != root:
                    return [send, None, root], []
                return [send, [y := np.zeros(n * count, dtype), T], root], [y]
            twin(world, adapter, "Igather", forms, compare=cmp)

            def in_place():
                if r != root:
                    return [x, None, root], []
                b = np.zeros(n * count, dtype)
                b[r * count:(r + 1) * count] = x
                return [MPI.IN_PLACE, b, root], [b]
            twin(world, adapter, "Gather", in_place, compare=cmp)
            # the block-count form: [buf, count, type] at the root
            twin(world, adapter, "Gather",
                 lambda: ([[x, T], [y := np.zeros(n * count + 3, dtype), count, T], root], [y]),
                 compare=cmp)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_scatter(world, adapter, dtype):
    n, r = world.size, world.rank
    T = mpi_type(dtype)
    for count in COUNTS + [BIG // 4]:
        for j, root in enumerate(roots(n)):
            whole = data(dtype, n * count, root, salt=3)    # the same on every rank
            twin(world, adapter, "Scatter",
                 lambda: ([whole, y := np.zeros(count, dtype), root], [y]))
            twin(world, adapter, "Iscatter",
                 lambda: ([[whole, T] if r == root else None, [y := np.zeros(count, dtype), T],
                           root], [y]))

            def in_place():
                if r != root:
                    return [None, y := np.zeros(count, dtype), root], [y]
                return [b := whole.copy(), MPI.IN_PLACE, root], [b]
            twin(world, adapter, "Scatter", in_place)
            twin(world, adapter, "Scatter",
                 lambda: ([[whole, count, T], [y := np.zeros(count + 2, dtype), count, T], root],
                          [y]))


def uneven(n, salt):
    return [(3 * i + salt) % 5 for i in range(n)]


def layout(counts, reverse):
    order = range(len(counts) - 1, -1, -1) if reverse else range(len(counts))
    displs, pos = [0] * len(counts), 0
    for i in order:
        displs[i] = pos
        pos += counts[i] + 1
    return displs, pos


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_gatherv(world, adapter, dtype):
    n, r = world.size, world.rank
    T = mpi_type(dtype)
    for salt in range(3):
        counts = uneven(n, salt)
        displs, length = layout(counts, reverse=salt % 2 == 1)
        x = data(dtype, counts[r], r, salt=salt)
        for root in roots(n):
            cmp = at_root(r, root, n)
            twin(world, adapter, "Gatherv",
                 lambda: ([x, [y := np.zeros(length, dtype), counts, displs, T], root], [y]),
                 compare=cmp)
            def pair_form():
                if r != root:
                    return [[x, T], None, root], []
                return [[x, T], [y := np.zeros(length, dtype), (counts, displs), T], root], [y]
            twin(world, adapter, "Igatherv", pair_form, compare=cmp)
            twin(world, adapter, "Gatherv",   # blocks back to back
                 lambda: ([x, [y := np.zeros(sum(counts), dtype), counts, T], root], [y]),
                 compare=cmp)

            def in_place():
                if r != root:
                    return [x, None, root], []
                b = np.zeros(length, dtype)
                b[displs[r]:displs[r] + counts[r]] = x
                return [MPI.IN_PLACE, [b, counts, displs, T], root], [b]
            twin(world, adapter, "Gatherv", in_place, compare=cmp)
    big = [BIG // n + q for q in range(n)]
    x = data(dtype, big[r], r)
    twin(world, adapter, "Gatherv",
         lambda: ([x, [y := np.zeros(sum(big), dtype), big, T], n - 1], [y]),
         compare=at_root(r, n - 1, n))


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_scatterv(world, adapter, dtype):
    n, r = world.size, world.rank
    T = mpi_type(dtype)
    for salt in range(3):
        counts = uneven(n, salt)
        displs, length = layout(counts, reverse=salt % 2 == 0)
        for root in roots(n):
            whole = data(dtype, length, root, salt=salt)
            twin(world, adapter, "Scatterv",
                 lambda: ([[whole, counts, displs, T], y := np.zeros(counts[r], dtype), root],
                          [y]))
            twin(world, adapter, "Iscatterv",
                 lambda: ([[whole, (counts, displs), T] if r == root else None,
                           [y := np.zeros(counts[r], dtype), T], root], [y]))

            def in_place():
                if r != root:
                    return [None, y := np.zeros(counts[r], dtype), root], [y]
                return [[b := whole.copy(), counts, displs, T], MPI.IN_PLACE, root], [b]
            twin(world, adapter, "Scatterv", in_place)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_scan_exscan(world, adapter, dtype):
    n, r = world.size, world.rank
    for count in COUNTS + [BIG]:
        ops = ops_for(dtype) if count != BIG else ops_for(dtype)[:1]
        for i, op in enumerate(ops):
            form = FORMS[(i + count) % len(FORMS)]
            x = data(dtype, count, r, salt=i)
            for name in ("Scan", "Exscan", "Iscan", "Iexscan"):
                # exscan: rank 0's output is undefined in MPI (hpccoll leaves it alone)
                cmp = (lambda g, w, what: r == 0 or assert_same(g, w, n, what)) \
                    if "xscan" in name else None
                twin(world, adapter, name, lambda: (
                    [spec(s := padded(x, form), dtype, form, count, DISPL.get(form, 0)),
                     spec(y := padded(np.zeros(count, dtype), form), dtype, form, count,
                          DISPL.get(form, 0)), op], [y]), compare=cmp)
                twin(world, adapter, name, lambda: ([MPI.IN_PLACE, b := x.copy(), op], [b]),
                     compare=cmp)


def test_exscan_rank0_untouched(adapter):
    x = np.arange(5, dtype=np.int64)
    y = np.full(5, -7, np.int64)
    adapter.Exscan(x, y)
    if adapter.Get_rank() == 0:
        assert (y == -7).all()
    b = x.copy()
    adapter.Exscan(MPI.IN_PLACE, b, op=MPI.MAX)
    if adapter.Get_rank() == 0:
        np.testing.assert_array_equal(b, x)


MALFORMED = {
    "gather root out of range": lambda c: c.Gather(np.ones(2), np.ones(2 * c.size), root=c.size),
    "gather root a string": lambda c: c.Gather(np.ones(2), np.ones(2 * c.size), root="0"),
    "gather not divisible": lambda c: c.Gather(np.ones(2), np.ones(2 * c.size + 1),
                                               root=c.Get_rank()),
    "scatter not divisible": lambda c: c.Scatter(np.ones(2 * c.size + 1), np.ones(2),
                                                 root=c.Get_rank()),
    "scan count mismatch": lambda c: c.Scan(np.ones(3), np.ones(2)),
    "scan dtype mismatch": lambda c: c.Scan(np.ones(3), np.ones(3, "f4")),
    "scan op string": lambda c: c.Scan(np.ones(3), np.ones(3), op="sum"),
    "exscan read-only": lambda c: c.Exscan(np.ones(3), _ro()),
    "gatherv counts wrong length": lambda c: c.Gatherv(
        np.ones(1), [np.ones(8), [1] * (c.size + 1)], root=c.Get_rank()),
    "scatterv negative count": lambda c: c.Scatterv(
        [np.ones(8), [-1] * c.size], np.ones(0), root=c.Get_rank()),
    "iscan MAX on complex": lambda c: c.Iscan(np.ones(2, "c16"), np.ones(2, "c16"), op=MPI.MAX),
}


def _ro():
    a = np.zeros(3)
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_raises_like_mpi4py(world, adapter, case):
    if "divisible" in case and world.size == 1:
        pytest.skip("one rank divides anything")
    call = MALFORMED[case]
    with pytest.raises(Exception) as mine:
        call(world)
    with pytest.raises(Exception) as theirs:
        call(adapter)
    assert type(theirs.value) is type(mine.value), (case, mine.value, theirs.value)
    if isinstance(mine.value, MPI.Exception):
        assert theirs.value.Get_error_class() == mine.value.Get_error_class(), case
    y = np.zeros(2, "i4")
    adapter.Scan(np.ones(2, "i4"), y)
    assert (y == world.rank + 1).all()


def test_forwarded_where_hpccoll_cannot(world, adapter):
    """A user-defined op, a derived datatype, send and receive types that differ."""
    n, r = world.size, world.rank
    op = MPI.Op.Create(lambda a, b, t: np.maximum(np.frombuffer(a, "i4"),
                                                   np.frombuffer(b, "i4"),
                                                   out=np.frombuffer(b, "i4")), commute=True)
    x = data("int32", 3, r)
    try:
        twin(world, adapter, "Scan", lambda: ([x, y := np.zeros(3, "i4"), op], [y]),
             native=False)
    finally:
        op.Free()
    pair_t = MPI.INT.Create_contiguous(2).Commit()    # two ints back to back: native
    gap_t = MPI.INT.Create_vector(2, 1, 2).Commit()   # two ints with a gap: forwarded
    try:
        twin(world, adapter, "Gather",
             lambda: ([[data("int32", 4, r), 2, pair_t],
                       [y := np.zeros(4 * n, "i4"), 2, pair_t], 0], [y]),
             compare=at_root(r, 0, n))
        twin(world, adapter, "Gather",
             lambda: ([[data("int32", 3, r), 1, gap_t],
                       [y := np.zeros(3 * n, "i4"), 1, gap_t], 0], [y]),
             native=False, compare=at_root(r, 0, n))
    finally:
        pair_t.Free()
        gap_t.Free()
    assert forwarded_calls(adapter, "Scan") >= 1
    # send and receive datatypes that differ at the root, as wide: only the root sees
    # both, so it moves the bytes natively, as every other rank does (as MPI does)
    twin(world, adapter, "Scatter",
         lambda: ([[np.arange(3 * n, dtype="i4").view("f4"), MPI.FLOAT],
                   [y := np.zeros(3, "i4"), MPI.INT], 0], [y]))
    twin(world, adapter, "Gather",
         lambda: ([[x.view("f4"), MPI.FLOAT], [y := np.zeros(3 * n, "i4"), MPI.INT], 0], [y]),
         compare=at_root(r, 0, n))


@pytest.mark.skipif(POLICY == "fifo", reason="fifo may deadlock on divergent orders "
                    "(the contract: the watchdog turns it into CollectiveTimeout)")
def test_divergent_order_on_two_adapted_communicators(world, adapter):
    """Nonblocking rooted calls on two adapters, started in opposite orders by odd and
    even ranks, all complete (hpccoll's scheduling; MPI's own would too)."""
    n, r = world.size, world.rank
    a, b = adapter.Dup(), adapter.Dup()
    try:
        for count in (4, 5000):
            x = data("int64", count, r)
            want_scan = np.empty_like(x)
            world.Scan(x, want_scan)
            want_g = np.empty(n * count, "int64")
            world.Allgather(x, want_g)
            for rep in range(10):
                g = np.zeros(n * count, "int64")
                s = np.zeros(count, "int64")
                calls = [lambda: a.Igather(x, g, root=rep % n), lambda: b.Iscan(x, s)]
                if (r + rep) % 2:
                    calls.reverse()
                reqs = [c() for c in calls]
                for q in reqs[::-1]:
                    q.Wait()
                np.testing.assert_array_equal(s, want_scan)
                if r == rep % n:
                    np.testing.assert_array_equal(g, want_g)
    finally:
        a.Free()
        b.Free()
