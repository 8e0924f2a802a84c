"""hpccoll.mpi.Comm's lowercase object methods (allgather, allreduce, bcast, ...) against
mpi4py's own on the same inputs, compared exactly: the same types, the same values (floats
bit for bit: reductions run in mpi4py's order), arrays with the same dtype, shape and
memory order.  Objects small enough for the header, arrays, pickled objects with and
without out-of-band buffers, and ranks passing objects of different kinds in one call;
every root; predefined, user-defined and non-commutative ops; errors; and every call
counted native and on the per-call path (its flight rows)."""
import math
import pickle
import threading

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
import hpccoll.mpi
from hpccoll.mpi import _objects

pytestmark = pytest.mark.mpi


class Point:
    """A user class (pickled by reference to this module)."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __eq__(self, other):
        return type(other) is Point and (self.x, self.y) == (other.x, other.y)


def same(a, b) -> bool:
    """Exactly the same result: type, value (floats and NumPy data bit for bit), arrays'
    dtype, shape and memory order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return (a.dtype == b.dtype and a.dtype.char == b.dtype.char and a.shape == b.shape
                and a.flags.c_contiguous == b.flags.c_contiguous
                and a.flags.f_contiguous == b.flags.f_contiguous
                and (a.dtype.hasobject and a.tolist() == b.tolist()
                     or not a.dtype.hasobject and data(a) == data(b))
                and (not isinstance(a, np.ma.MaskedArray) or same(a.mask, b.mask)))
    if isinstance(a, np.generic):
        return a.dtype == b.dtype and a.tobytes() == b.tobytes()
    if isinstance(a, (float, complex)):
        return repr(a) == repr(b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return a == b


def data(a: np.ndarray) -> bytes:
    return np.ndarray.tobytes(a, order="A")     # a subclass's own tobytes may differ


def big_arrays(r, k, nbytes=300_000):
    """k arrays each over mpi4py's out-of-band threshold (256 KiB)."""
    return [np.full(nbytes // 8, r + i, np.float64) for i in range(k)]


# each: rank, size -> this rank's object
OBJECTS = {
    "None": lambda r, n: None,
    "bool": lambda r, n: r % 2 == 0,
    "int": lambda r, n: 7 - 3 * r,
    "int64 edges": lambda r, n: [2**63 - 1, -2**63][r % 2],
    "int beyond int64": lambda r, n: 2**64 + r,
    "int beyond int64 on some ranks": lambda r, n: 2**70 if r % 2 else r,
    "float": lambda r, n: 0.1 * r - 2.17,
    "float specials": lambda r, n: [-0.0, math.inf, math.nan, 5e-324][r % 4],
    "complex": lambda r, n: complex(r, -1.5),
    "str": lambda r, n: f"host-{r}",
    "str 40 bytes of UTF-8": lambda r, n: "ñ" * 20,
    "str long": lambda r, n: "mpi4py" * (20 + r),
    "str with a lone surrogate": lambda r, n: "a\ud800b",
    "bytes": lambda r, n: bytes(range(r, r + 10)),
    "bytes long": lambda r, n: bytes(100 + r),
    "bytearray": lambda r, n: bytearray(b"xy"),
    "tuple (a shape)": lambda r, n: (3, 4 + r),
    "tuple of 5 mixed": lambda r, n: (1, 2.5, None, True, -r),
    "tuple of 6": lambda r, n: tuple(range(6)),
    "tuple empty": lambda r, n: (),
    "tuple nested": lambda r, n: ((1, 2), r),
    "tuple with a big int": lambda r, n: (2**64, r),
    "list small": lambda r, n: [r, 0.5],
    "list": lambda r, n: list(range(r + 10)),
    "list of a few KiB": lambda r, n: list(range(300 + r)),
    "lists from inline to over SMALL": lambda r, n: list(range(1500 * r)),
    "dict": lambda r, n: {"rank": r, "name": f"r{r}", "xs": [1.5, None]},
    "set": lambda r, n: {1, 2, r},
    "user class": lambda r, n: Point(r, "y"),
    "numpy scalars": lambda r, n: [np.dtype(c).type(r + 1) for c in "?bBhHiIlLefdFD"],
    "numpy scalar float32": lambda r, n: np.float32(0.1 * r),
    "numpy scalar bool": lambda r, n: np.bool_(r % 2),
    "numpy scalar longlong": lambda r, n: np.longlong(r),
    "numpy scalar longdouble": lambda r, n: np.longdouble(r) / 3,
    "numpy datetime64": lambda r, n: np.datetime64("2026-12-03") + r,
    "array int32": lambda r, n: np.arange(5, dtype=np.int32) * r,
    "array float64 2-D": lambda r, n: np.arange(12.0).reshape(3, 4) + r,
    "array Fortran order": lambda r, n: np.asfortranarray(np.arange(12.0).reshape(3, 4)) - r,
    "array not contiguous": lambda r, n: np.arange(20)[::3] + r,
    "array 0-d": lambda r, n: np.array(r, np.int16),
    "array empty": lambda r, n: np.empty((0, 3), np.float32),
    "array 6-D": lambda r, n: np.zeros((1, 2, 1, 2, 1, 2)) + r,
    "array bool": lambda r, n: np.arange(7) % (r + 2) == 0,
    "array complex": lambda r, n: np.arange(3) * (1 + 2j) + r,
    "array float16": lambda r, n: np.linspace(0, 1, 9, dtype=np.float16),
    "array big-endian": lambda r, n: np.arange(4, dtype=">i4") + r,
    "array longlong": lambda r, n: np.arange(4, dtype=np.longlong),
    "array of objects": lambda r, n: np.array([{"a": r}, None], dtype=object),
    "array structured": lambda r, n: np.zeros(3, dtype=[("a", "i4"), ("b", "f8")]),
    "array read-only": lambda r, n: np.frombuffer(bytes(range(16)), np.uint8),
    "np.matrix": lambda r, n: np.matrix([[1, 2], [3, r]]),
    "masked array": lambda r, n: np.ma.masked_array([1, 2, 3], mask=[0, r % 2, 0]),
    "array rank-sized": lambda r, n: np.arange(1000 * r, dtype=np.float32),
    "array 1 MiB": lambda r, n: np.full(1 << 17, r, np.float64),
    "one buffer out of band": lambda r, n: {"w": big_arrays(r, 1)[0], "r": r},
    "seven buffers out of band": lambda r, n: big_arrays(r, 7),
    "buffers out of band on some ranks": lambda r, n: big_arrays(r, r % 3) + [r],
    "a kind per rank": lambda r, n: [7, 2.5, {"x": 1}, np.arange(3.0), "s", None,
                                     big_arrays(r, 2), (1, 2)][r % 8],
    "mpi4py's messages": lambda r, n: [None, True, False, -7, 0, 7, 2**31, -(2**63) + 1,
                                       2**63 - 1, -2.17, 0.0, +1.62, 1 + 2j, 2 - 3j, "mpi4py"],
}


def pair(a, b):
    """Neither commutative nor associative: the result shows the order ops were applied."""
    return (a, b)


def both(world, adapter, fn):
    """fn's result through mpi4py and through the adapter."""
    return fn(world), fn(adapter)


def check(world, adapter, method, fn, what):
    before = adapter.stats.get(method, {}).get("native", 0)
    want, got = both(world, adapter, fn)
    assert same(got, want), f"{method} of {what}: {got!r} != mpi4py's {want!r}"
    assert adapter.stats[method]["native"] == before + 1, f"{method} was not native"


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
@pytest.mark.parametrize("case", list(OBJECTS))
def test_every_method_moves_objects_like_mpi4py(world, adapter, case):
    n, r = world.size, world.rank
    make = OBJECTS[case]
    obj = make(r, n)
    check(world, adapter, "allgather", lambda c: c.allgather(obj), case)
    check(world, adapter, "alltoall", lambda c: c.alltoall([make(r * n + j, n)
                                                              for j in range(n)]), case)
    for root in range(n):
        check(world, adapter, "bcast", lambda c: c.bcast(obj, root=root), case)
        check(world, adapter, "gather", lambda c: c.gather(obj, root=root), case)
        check(world, adapter, "scatter",
              lambda c: c.scatter([make(j, n) for j in range(n)] if r == root else None,
                                  root=root), case)
        check(world, adapter, "reduce", lambda c: c.reduce(obj, op=pair, root=root), case)
    check(world, adapter, "allreduce", lambda c: c.allreduce(obj, op=pair), case)
    check(world, adapter, "scan", lambda c: c.scan(obj, op=pair), case)
    check(world, adapter, "exscan", lambda c: c.exscan(obj, op=pair), case)


def test_results_are_new_objects(world, adapter):
    """As after mpi4py's pickle round trip: the root's bcast result and a rank's own entry
    are copies, never the caller's object; results are writable arrays."""
    x = np.arange(4.0)
    d = {"x": big_arrays(0, 1)[0]}
    got = adapter.bcast(x, root=0)
    assert got is not x and not np.shares_memory(got, x) and got.flags.writeable
    got = adapter.bcast(d, root=0)
    assert not np.shares_memory(got["x"], d["x"])
    mine = adapter.allgather(x)[world.rank]
    assert not np.shares_memory(mine, x) and mine.flags.writeable
    mine[:] = -1
    assert (x == np.arange(4.0)).all()
    assert adapter.allreduce(d, op=MPI.NO_OP)["x"] is not d["x"]


# -- reductions ---------------------------------------------------------------------------

def numbers(r):
    return [r + 1, -r, 0.1 * r + 0.7, r % 2 == 1, np.float32(0.3 * r), np.int8(100 + r),
            np.uint64(r), complex(r, 1), 2**62 + r, np.array([r, 2 * r])]


PREDEFINED = [MPI.SUM, MPI.PROD, MPI.MAX, MPI.MIN, MPI.LAND, MPI.LOR, MPI.LXOR, MPI.BAND,
              MPI.BOR, MPI.BXOR, MPI.REPLACE, MPI.NO_OP]


def applies(op, x) -> bool:
    """Whether mpi4py's op can combine two of x (at more than one rank its error would
    leave the other ranks waiting in mpi4py)."""
    try:
        op(x, x)
        return not (isinstance(x, np.ndarray) and op in (MPI.MAX, MPI.MIN, MPI.LAND,
                                                         MPI.LOR, MPI.LXOR))
    except Exception:
        return False


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")   # int8, as mpi4py
@pytest.mark.parametrize("op", PREDEFINED, ids=lambda op: str(op.py2f()))
def test_predefined_ops_on_numbers_give_mpi4pys_results(world, adapter, op):
    n, r = world.size, world.rank
    for x in numbers(r):
        if not applies(op, x):
            continue
        check(world, adapter, "allreduce", lambda c: c.allreduce(x, op), repr(x))
        check(world, adapter, "scan", lambda c: c.scan(x, op), repr(x))
        check(world, adapter, "exscan", lambda c: c.exscan(x, op), repr(x))
        for root in range(n):
            check(world, adapter, "reduce", lambda c: c.reduce(x, op, root=root), repr(x))


def test_python_numbers_come_back_as_python_numbers(world, adapter):
    """allreduce(3.5) is a float; ints add up beyond int64 as Python ints do."""
    n = world.size
    assert type(adapter.allreduce(3.5)) is float and adapter.allreduce(3.5) == 3.5 * n
    assert adapter.allreduce(2**62, MPI.SUM) == n * 2**62
    assert type(adapter.allreduce(True)) is (bool if n == 1 else int)
    assert type(adapter.allreduce(np.float32(1))) is np.float32


def test_numbers_and_shapes_read_straight_from_the_headers(world, adapter):
    """The common case read at once (every rank a number, or a tuple or list of ints, of
    one kind and length) gives mpi4py's results: MAX/MIN on NaN and signed zeros as
    mpi4py's ``y if y > x else x``, new lists on every call, and ranks whose tuples differ
    in length (read row by row) too."""
    n, r = world.size, world.rank
    odd = [float("nan"), -0.0, 0.0, float("inf")]
    for op in (MPI.SUM, MPI.PROD, MPI.MAX, MPI.MIN):
        for x in (odd[r % 4], odd[(r + 1) % 4], 3 - r, -(2**62) + r):
            check(world, adapter, "allreduce", lambda c: c.allreduce(x, op), f"{x!r}")
    for obj in ((r, 2 * r, 7), [r, -r], (), (1,) * (r + 1), [r] * (n - r), (r, 2.5),
                (2**63 - 1, -(2**63)), (2**70 + r, 1), [True, r]):
        check(world, adapter, "allgather", lambda c: c.allgather(obj), repr(obj))
    first = adapter.allgather([r, r])
    first[0].append(99)
    again = adapter.allgather([r, r])
    assert again == [[i, i] for i in range(n)] and again[0] is not first[0]


def test_maxloc_and_minloc(world, adapter):
    r = world.rank
    for op in (MPI.MAXLOC, MPI.MINLOC):
        for x in ((r % 2, r), (1.5, -r), ([r], "a")):
            check(world, adapter, "allreduce", lambda c: c.allreduce(x, op), repr(x))
            check(world, adapter, "scan", lambda c: c.scan(x, op), repr(x))
            check(world, adapter, "exscan", lambda c: c.exscan(x, op), repr(x))


def test_sum_on_python_objects_is_their_plus(world, adapter):
    """MPI.SUM on lists, strings and tuples concatenates, as in mpi4py."""
    r = world.rank
    for x in ([r], f"{r}", (r, "x"), [np.arange(2) + r], np.arange(3) + r):
        check(world, adapter, "allreduce", lambda c: c.allreduce(x, MPI.SUM), repr(x))
        check(world, adapter, "scan", lambda c: c.scan(x, MPI.SUM), repr(x))


def _cat(x, y, datatype):
    return f"({x}.{y})"


def test_user_defined_ops(world, adapter):
    """Python callables and MPI.Op.Create ops, commutative or not, applied in mpi4py's
    order: the results show the order (strings, floats that round differently)."""
    r = world.rank
    ops = [MPI.Op.Create(_cat, commute=False), MPI.Op.Create(_cat, commute=True),
           lambda a, b: a * 10 + b, lambda a, b: a - b / 3.0, lambda a, b: b]
    try:
        for op in ops:
            x = f"r{r}" if op in ops[:2] else (r + 1 if op is ops[2] else 0.1 * r + 1)
            check(world, adapter, "allreduce", lambda c: c.allreduce(x, op), repr(op))
            check(world, adapter, "scan", lambda c: c.scan(x, op), repr(op))
            check(world, adapter, "exscan", lambda c: c.exscan(x, op), repr(op))
            for root in range(world.size):
                check(world, adapter, "reduce", lambda c: c.reduce(x, op, root=root), repr(op))
    finally:
        ops[0].Free()
        ops[1].Free()


def test_fast_reduce_off_folds_left(world, adapter, monkeypatch):
    """With mpi4py.rc.fast_reduce off mpi4py folds from the left (_py_reduce, _py_scan):
    so does the adapter."""
    monkeypatch.setattr(_objects, "_FAST_REDUCE", False)
    n, r = world.size, world.rank
    items = world.allgather(r)

    def fold(xs):
        out = xs[0]
        for x in xs[1:]:
            out = pair(out, x)
        return out
    assert same(adapter.allreduce(r, pair), fold(items))
    assert same(adapter.reduce(r, pair, root=n - 1), fold(items) if r == n - 1 else None)
    assert same(adapter.scan(r, pair), fold(items[:r + 1]))
    assert same(adapter.exscan(r, pair), fold(items[:r]) if r else None)


# -- errors ---------------------------------------------------------------------------------

def raised(fn):
    try:
        fn()
    except Exception as exc:
        return exc
    return None


BAD_ROOTS = {
    "bcast": lambda c, root: c.bcast(1, root=root),
    "gather": lambda c, root: c.gather(1, root=root),
    "scatter": lambda c, root: c.scatter(None, root=root),
    "reduce": lambda c, root: c.reduce(1, op=MPI.SUM, root=root),
}


@pytest.mark.parametrize("method", list(BAD_ROOTS))
def test_bad_roots_raise_like_mpi4py(world, adapter, method):
    n = world.size
    for root in (n, -1, -n - 1, "0", 1.5, None):
        call = BAD_ROOTS[method]
        want = raised(lambda: call(world, root))
        got = raised(lambda: call(adapter, root))
        assert type(got) is type(want), (method, root, got, want)
        if isinstance(want, MPI.Exception):
            assert got.Get_error_class() == want.Get_error_class() == MPI.ERR_ROOT
    assert adapter.allgather(world.rank) == list(range(n))    # still in step


def test_an_object_that_cannot_be_pickled_raises_on_every_rank(world, adapter):
    """mpi4py raises the pickling error on that rank and leaves the others waiting;
    here the others raise too, naming it, and the communicator stays usable."""
    n, r = world.size, world.rank
    bad = threading.Lock() if r == n - 1 else r
    for call in (lambda: adapter.allgather(bad), lambda: adapter.allreduce(bad),
                 lambda: adapter.gather(bad, root=0), lambda: adapter.scan(bad),
                 lambda: adapter.bcast(bad, root=n - 1),
                 lambda: adapter.alltoall([bad] * n)):
        exc = raised(call)
        if r == n - 1:
            assert type(exc) is type(raised(lambda: pickle.dumps(bad)))
        else:
            assert isinstance(exc, hpccoll.HpcCollError) and f"{n - 1}" in str(exc)
    assert adapter.allgather(r) == list(range(n))


def test_a_wrong_number_of_items_raises_on_every_rank(world, adapter):
    """scatter and alltoall take one item per rank: mpi4py's ValueError where it is
    wrong, an HpcCollError naming that rank elsewhere (mpi4py's other ranks wait)."""
    n, r = world.size, world.rank
    exc = raised(lambda: adapter.scatter(list(range(n + 1)) if r == 0 else None, root=0))
    if r == 0:
        assert type(exc) is ValueError and str(exc) == f"expecting {n} items, got {n + 1}"
    else:
        assert isinstance(exc, hpccoll.HpcCollError)
    exc = raised(lambda: adapter.alltoall([r] * (n + (r == 0))))
    assert type(exc) is ValueError if r == 0 else isinstance(exc, hpccoll.HpcCollError)
    exc = raised(lambda: adapter.alltoall(5))
    assert type(exc) is type(raised(lambda: world.alltoall(5)))   # TypeError, on every rank
    assert adapter.alltoall(None) == [None] * n


def test_an_op_that_raises_raises_on_every_rank(world, adapter):
    """MAX of arrays is ambiguous in Python: every rank computes allreduce's result and
    raises mpi4py's ValueError (mpi4py raises it on rank 0, the others wait)."""
    if world.size == 1:
        pytest.skip("one rank applies no op")
    exc = raised(lambda: adapter.allreduce(np.arange(3), MPI.MAX))
    assert type(exc) is ValueError
    assert adapter.allgather(1) == [1] * world.size


@pytest.mark.mpi(min_size=2)
def test_ranks_calling_different_methods_raise_collective_mismatch(world, adapter):
    """The headers carry the method and root: every rank raises CollectiveMismatch (MPI
    would pair the calls' messages and go on with garbage, or wait)."""
    r = world.rank
    exc = raised(lambda: adapter.allgather(r) if r == 0 else adapter.allreduce(r))
    assert isinstance(exc, hpccoll.CollectiveMismatch), exc
    assert "allgather" in str(exc) and "allreduce" in str(exc)
    exc = raised(lambda: adapter.gather(r, root=r))
    assert isinstance(exc, hpccoll.CollectiveMismatch) and "gather(root=1)" in str(exc)
    assert adapter.allgather(r) == list(range(world.size))     # the communicator is fine


@pytest.mark.mpi(min_size=2)
def test_ranks_passing_different_ops_raise_collective_mismatch(world, adapter):
    """The op is part of what the ranks agree on: with MPI.SUM on rank 0 and MPI.MAX
    elsewhere, mpi4py gives the ranks different results; here every rank raises."""
    r, n = world.rank, world.size
    ops = {"allreduce": lambda op: adapter.allreduce(r + 1.0, op),
           "reduce": lambda op: adapter.reduce(r + 1.0, op, root=0),
           "scan": lambda op: adapter.scan(r + 1.0, op),
           "exscan": lambda op: adapter.exscan(r + 1.0, op)}
    for name, call in ops.items():
        exc = raised(lambda: call(MPI.SUM if r == 0 else MPI.MAX))
        assert isinstance(exc, hpccoll.CollectiveMismatch), (name, exc)
        assert "op=SUM" in str(exc) and "op=MAX" in str(exc), str(exc)
        # a Python callable against a predefined op, and two callables by name
        exc = raised(lambda: call(MPI.MIN if r == 0 else (lambda a, b: a + b)))
        assert isinstance(exc, hpccoll.CollectiveMismatch), (name, exc)
        exc = raised(lambda: call(max if r == 0 else min))
        assert isinstance(exc, hpccoll.CollectiveMismatch), (name, exc)
    # the same op everywhere is fine, and the communicator stays usable
    assert adapter.allreduce(r + 1.0, MPI.MAX) == float(n)
    assert adapter.allreduce(r + 1, max) == n
    assert adapter.allreduce([r], MPI.SUM) == list(range(n))


def test_a_freed_communicator_raises_mpi4pys_error(world, adapter):
    comm, theirs = adapter.Dup(), world.Dup()
    comm.Free()
    theirs.Free()
    for name, args in (("allgather", (1,)), ("bcast", (1,)), ("allreduce", (1,))):
        want = raised(lambda: getattr(theirs, name)(*args))
        got = raised(lambda: getattr(comm, name)(*args))
        assert type(got) is type(want) is MPI.Exception
        assert got.Get_error_class() == want.Get_error_class()


# -- the per-call path ------------------------------------------------------------------------

def test_every_call_leaves_flight_rows(adapter):
    """Each call is collectives on the per-call path: the header, then its payload rounds
    (padded allgathers up to _objects.SMALL bytes a rank, exact counts above)."""
    rows = lambda: [row["coll"] for row in adapter.context._engine.flight.rows(0.0)]  # noqa
    small, medium, large = {"a": 1}, list(range(200)), list(range(3000))
    adapter.allreduce(1.5)
    assert rows()[-1] == "allgather"
    adapter.allgather(small)
    assert rows()[-1] == "allgather"
    adapter.bcast(np.arange(3), root=0)
    assert rows()[-2:] == ["broadcast", "broadcast"]
    adapter.allgather(medium)
    assert rows()[-2:] == ["allgather", "allgather"]
    adapter.allgather(large)
    assert rows()[-2:] == ["allgather", "allgatherv"]
    adapter.gather(large, root=0)
    assert rows()[-2:] == ["allgather", "gatherv"]
    adapter.scatter([large] * adapter.size if adapter.rank == 0 else None, root=0)
    assert rows()[-2:] == ["broadcast", "scatterv"]
    adapter.scan(large)
    assert rows()[-2:] == ["allgather", "alltoallv"]
    adapter.alltoall([1] * adapter.size)
    assert rows()[-1] == "alltoall"
    before = adapter.stats.get("barrier", {}).get("native", 0)
    adapter.barrier()
    assert rows()[-1] == "barrier"
    assert adapter.stats["barrier"] == {"native": before + 1, "forwarded": 0}


# -- mpi4py's pickler ---------------------------------------------------------------------------

def test_mpi4pys_pickler_and_threshold_are_used(world, adapter):
    """Objects are pickled with MPI.pickle: a pickler installed there (dill, cloudpickle)
    and its out-of-band threshold apply to the adapter too."""
    n, r = world.size, world.rank
    calls = []

    # (hpccoll's control messages, tuples, go through MPI.pickle too: not counted)
    def dumps(obj, protocol=None, buffer_callback=None):
        if type(obj) in (dict, list):
            calls.append("dumps")
        return pickle.dumps(obj, protocol, buffer_callback=buffer_callback)

    def loads(data, buffers=None):
        obj = pickle.loads(data, buffers=buffers)
        if type(obj) in (dict, list):
            calls.append("loads")
        return obj

    saved = MPI.pickle.THRESHOLD
    obj = {"a": [np.arange(300) + r, np.arange(200.0) * r], "s": "x" * 200}
    try:
        MPI.pickle.__init__(dumps, loads)
        MPI.pickle.THRESHOLD = 1024          # both arrays out of band, 7 of them for the list
        for x in (obj, [np.full(200, r + i) for i in range(7)]):
            calls.clear()
            adapter.allgather(x)
            mine = list(calls)
            # every rank goes on to the next collective, whatever its own verdict
            assert world.allreduce(mine == ["dumps"] + ["loads"] * n, op=MPI.LAND), mine
            check(world, adapter, "allgather", lambda c: c.allgather(x), "custom pickler")
            check(world, adapter, "bcast", lambda c: c.bcast(x, root=n - 1), "custom pickler")
            check(world, adapter, "gather", lambda c: c.gather(x, root=0), "custom pickler")
            check(world, adapter, "scan", lambda c: c.scan(x, op=pair), "custom pickler")
    finally:
        MPI.pickle.__init__()
        MPI.pickle.THRESHOLD = saved
