"""hpccoll.mpi.Comm beyond results: malformed arguments raise what mpi4py raises,
unsupported calls are forwarded and counted, Dup/Split/Free, ranks that disagree about
counts, and nonblocking requests on two adapted communicators in divergent orders."""
import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
import hpccoll.mpi
from tests.mpi.conftest import POLICY
from tests.mpi.twins import assert_same, data, forwarded_calls, native_calls, twin

pytestmark = pytest.mark.mpi


# -- malformed arguments: the exception mpi4py raises, raised before anything is queued --

def _x(n=4, dt="i4"):
    return np.arange(n, dtype=dt)


def _ro():
    a = np.zeros(4, "i4")
    a.flags.writeable = False
    return a


MALFORMED = {
    "op as a string": lambda c: c.Allreduce(_x(), _x(), op="sum"),
    "op None": lambda c: c.Reduce(_x(), _x(), op=None),
    "not a buffer": lambda c: c.Allreduce(5, _x()),
    "recvbuf None": lambda c: c.Allgather(_x(), None),
    "five items": lambda c: c.Allreduce([_x(), 1, 2, 3, 4], _x()),
    "count mismatch": lambda c: c.Allreduce(_x(4), _x(3)),
    "datatype mismatch": lambda c: c.Allreduce(_x(4), _x(4, "f4")),
    "datatype handles differ": lambda c: c.Allreduce([_x(), MPI.INT], [_x(), MPI.INT32_T]),
    "unknown typecode": lambda c: c.Allreduce([_x(), "zz"], [_x(), "i"]),
    "negative count": lambda c: c.Allreduce([_x(), -1], [_x(), -1]),
    "float count": lambda c: c.Allreduce([_x(), 2.0], [_x(), 2]),
    "datatype as count": lambda c: c.Allreduce([_x(), MPI.INT, MPI.INT], [_x(), MPI.INT]),
    "negative displacement": lambda c: c.Allreduce([_x(), (2, -1)], [_x(), 2]),
    "displacement out of bounds": lambda c: c.Allreduce([_x(), (2, 5)], [_x(), 2]),
    "buffer None with a count": lambda c: c.Bcast([None, 3, MPI.INT]),
    "length not a multiple": lambda c: c.Allreduce([np.zeros(3, "u1"), MPI.INT], _x()),
    "read-only receive buffer": lambda c: c.Allreduce(_x(), _ro()),
    "bytes as receive buffer": lambda c: c.Allreduce(np.zeros(2, "i4"), b"12345678"),
    "non-contiguous": lambda c: c.Allreduce(_x(8)[::2], _x(4)),
    "non-native byte order": lambda c: c.Allreduce(np.zeros(4, ">i4"), np.zeros(4, ">i4")),
    "root as a string": lambda c: c.Bcast(_x(), root="0"),
    "root out of range": lambda c: c.Bcast(_x(), root=c.Get_size()),
    "negative root": lambda c: c.Reduce(_x(), _x(), root=-1),
    "aliased buffers": lambda c: (x := _x(4 * c.Get_size())) is None or c.Allreduce(x, x),
    "aliased alltoall": lambda c: (x := _x(4 * c.Get_size())) is None or c.Alltoall(x, x),
    "recvcounts wrong length": lambda c: c.Reduce_scatter(_x(4), _x(4), [4] * (c.Get_size() + 1)),
    "recvcounts not a sequence": lambda c: c.Reduce_scatter(_x(4), _x(4), 4),
    "recvcounts None in place": lambda c: c.Reduce_scatter(MPI.IN_PLACE, _x(4), None),
    "send count and sum(counts)": lambda c: c.Reduce_scatter(_x(5), _x(1), [1] * c.Get_size()),
    "v-counts wrong length": lambda c: c.Allgatherv(_x(1), [_x(8), [1] * (c.Get_size() + 1)]),
    "v-counts floats": lambda c: c.Allgatherv(_x(1), [_x(8), [1.0] * c.Get_size()]),
    "v-counts negative": lambda c: c.Allgatherv(_x(0), [_x(8), [-1] * c.Get_size()]),
    "v (counts,) tuple": lambda c: c.Alltoallv(_x(4), [_x(4), ([1] * c.Get_size(),), MPI.INT]),
    "MAX on complex": lambda c: c.Allreduce(np.ones(2, "c16"), np.ones(2, "c16"), op=MPI.MAX),
    "SUM on bool": lambda c: c.Allreduce(np.ones(2, "?"), np.ones(2, "?"), op=MPI.SUM),
    "LAND on float": lambda c: c.Allreduce(np.ones(2), np.ones(2), op=MPI.LAND),
    "BAND on bool": lambda c: c.Allreduce(np.ones(2, "?"), np.ones(2, "?"), op=MPI.BAND),
    "SUM on MPI.BYTE": lambda c: c.Allreduce([_x(4, "u1"), MPI.BYTE], [_x(4, "u1"), MPI.BYTE]),
    "MAXLOC on int": lambda c: c.Allreduce(_x(), _x(), op=MPI.MAXLOC),
    "nonblocking, op string": lambda c: c.Iallreduce(_x(), _x(), op="sum"),
}


# the same exception type, other words: Python's unpacking message instead of Cython's,
# and the buffer errors say what is wrong instead of naming mpi4py's DLPack fallback
OTHER_TEXT = {"v (counts,) tuple", "non-contiguous", "read-only receive buffer"}
# what some MPIs define beyond the standard (Intel MPI: MPI_LAND on floats; Open MPI:
# MPI_SUM on MPI_BYTE)
EXTENSIONS = {"LAND on float", "SUM on MPI.BYTE"}
# erroneous calls that an MPI does not check, undefined there (so not made on it): Open
# MPI takes an alltoall whose buffers alias and negative counts, and crashes later
UNCHECKED = {"aliased alltoall": ("Open MPI", MPI.ERR_BUFFER),
             "v-counts negative": ("Open MPI", MPI.ERR_COUNT)}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_raises_like_mpi4py(world, adapter, case):
    call = MALFORMED[case]
    library, error_class = UNCHECKED.get(case, (None, None))
    if library and MPI.Get_library_version().startswith(library):
        # erroneous, and this MPI does not say so: the adapter does
        with pytest.raises(MPI.Exception) as theirs:
            call(adapter)
        assert theirs.value.Get_error_class() == error_class, case
    else:
        try:
            call(world)
        except Exception as exc:
            mine = exc
        else:
            # this MPI defines it (Intel MPI takes MPI_LAND on floats): so does the adapter
            assert case in EXTENSIONS, case
            call(adapter)
            mine = None
        if mine is not None:
            with pytest.raises(Exception) as theirs:
                call(adapter)
            assert type(theirs.value) is type(mine), (case, mine, theirs.value)
            if isinstance(mine, MPI.Exception):
                assert theirs.value.Get_error_class() == mine.Get_error_class(), case
            elif case not in OTHER_TEXT:
                assert str(theirs.value) == str(mine), case
    # nothing was queued: the adapter still works, in step with the other ranks
    y = np.zeros(2, "i4")
    adapter.Allreduce(np.ones(2, "i4"), y)
    assert (y == world.size).all()


def test_the_same_arrays_again_are_read_again_where_they_changed(world, adapter):
    """Bcast and Allreduce keep the reading of their last small arrays; a call on the same
    array objects after a change of root, op, dtype, shape or writability sees the change
    (results as mpi4py's on copies; the same error as mpi4py's)."""
    n, r = world.size, world.rank
    buf = np.arange(4, dtype=np.int32) + 10 * r

    def bcast(root):
        theirs = buf.copy()
        world.Bcast(theirs, root=root)
        adapter.Bcast(buf, root=root)
        np.testing.assert_array_equal(buf, theirs)

    for root in (0, 0, n - 1, n - 1):
        buf[:] = np.arange(4) + 10 * r
        bcast(root)
    buf.dtype = np.int16                 # 8 elements now: every byte must travel
    buf[:] = np.arange(8) + 10 * r
    bcast(n - 1)
    assert (buf == np.arange(8) + 10 * (n - 1)).all()
    buf.shape = (2, 4)
    buf[...] = 10 * r + 1
    bcast(n - 1)
    assert (buf == 10 * (n - 1) + 1).all()

    x, y = np.arange(4, dtype=np.int32) + r, np.zeros(4, np.int32)

    def allreduce(send, op):
        want = np.empty_like(y)
        world.Allreduce(x if send is not MPI.IN_PLACE else y.copy(), want, op=op)
        adapter.Allreduce(send, y, op=op)
        np.testing.assert_array_equal(y, want)

    for op in (MPI.SUM, MPI.SUM, MPI.MAX, MPI.MIN):
        allreduce(x, op)
    # the arrays and the op as last time (MIN), their dtype not
    x.dtype = y.dtype = np.int16         # 8 elements now
    x[:] = np.arange(8) + r
    allreduce(x, MPI.MIN)
    x.dtype = y.dtype = np.float16       # the same count, another type
    x[:] = np.arange(8) + r + 0.5
    allreduce(x, MPI.MIN)
    for _ in range(2):
        y[:] = r + 1
        allreduce(MPI.IN_PLACE, MPI.SUM)
    assert (y == n * (n + 1) / 2).all()
    y.flags.writeable = False
    errors = []
    for comm in (world, adapter):
        with pytest.raises(Exception) as e:
            comm.Allreduce(x, y, op=MPI.SUM)
        errors.append(type(e.value))
    assert errors[0] is errors[1]


def test_counts_past_the_buffer_raise(adapter):
    """mpi4py hands MPI a count past the buffer's end (MPI then reads or writes foreign
    memory); the adapter refuses, before anything is queued."""
    n = adapter.Get_size()
    for call in (lambda: adapter.Allreduce([_x(4), 5], [_x(4), 5]),
                 lambda: adapter.Allgatherv(_x(5), [_x(4 * n), [5] * n]),
                 lambda: adapter.Allgatherv(_x(4), [_x(4 * n), ([4] * n, [4 * i + 1 for i in range(n)])])):
        with pytest.raises(ValueError, match="entries"):
            call()
    adapter.Barrier()


# -- forwarding ------------------------------------------------------------------------

def test_forwarded_calls_run_on_mpi_and_are_counted(world, adapter):
    n, r = world.size, world.rank
    x = data("int32", 3, r)
    # an op hpccoll lacks: MAXLOC on a pair type
    pair = np.dtype([("v", "f8"), ("i", "i4")], align=True)   # MPI.DOUBLE_INT's layout
    pairs = np.array([(float(r % 3), r)], dtype=pair)
    twin(world, adapter, "Allreduce",
         lambda: ([[pairs, MPI.DOUBLE_INT], [y := np.zeros_like(pairs), MPI.DOUBLE_INT],
                   MPI.MAXLOC], [y]), native=False,
         compare=lambda g, w, what: np.testing.assert_array_equal(g, w, err_msg=what))
    # a datatype hpccoll lacks: long double, and a derived type
    ld = np.ones(3, np.longdouble) * (r + 1)
    twin(world, adapter, "Allreduce",
         lambda: ([[ld, MPI.LONG_DOUBLE], [y := np.zeros_like(ld), MPI.LONG_DOUBLE]], [y]),
         native=False)
    gaps = MPI.INT.Create_vector(2, 1, 2).Commit()     # every other int: truly derived
    try:
        twin(world, adapter, "Bcast", lambda: ([[b := data("int32", 8, r), 2, gaps], 0], [b]),
             native=False)
    finally:
        gaps.Free()
    # a user-defined op
    op = MPI.Op.Create(lambda a, b, t: np.maximum(np.frombuffer(a, "i4"),
                                                   np.frombuffer(b, "i4"),
                                                   out=np.frombuffer(b, "i4")), commute=True)
    try:
        twin(world, adapter, "Allreduce", lambda: ([x, y := np.zeros(3, "i4"), op], [y]),
             native=False)
    finally:
        op.Free()
    # send and receive datatypes that differ: MPI moves the bytes
    twin(world, adapter, "Allgather",
         lambda: ([[x.view("f4"), MPI.FLOAT], [y := np.zeros(3 * n, "i4"), MPI.INT]], [y]),
         native=False)
    # nonblocking forwarded: a real MPI.Request
    req = adapter.Iallreduce([ld, MPI.LONG_DOUBLE], [y := np.zeros_like(ld), MPI.LONG_DOUBLE])
    assert isinstance(req, MPI.Request)
    req.Wait()
    # point to point and queries: mpi4py's own methods, inherited, not collectives
    got = adapter.sendrecv(r, dest=(r + 1) % n, source=(r - 1) % n)
    assert got == (r - 1) % n
    assert adapter.Get_name() == MPI.COMM_WORLD.Get_name()
    assert adapter.Is_intra()
    s = adapter.stats
    assert "sendrecv" not in s and "Get_name" not in s
    assert s["Iallreduce"]["forwarded"] >= 1 and s["Allreduce"]["forwarded"] >= 1


def test_stats_count_per_method():
    comm = hpccoll.mpi.Comm(MPI.COMM_WORLD, policy=POLICY, timeout=60)
    try:
        x = np.ones(4)
        comm.Allreduce(x, np.zeros(4))
        comm.Allreduce(MPI.IN_PLACE, x)
        comm.Allreduce(x, np.zeros(4), op=MPI.Op.Create(lambda a, b, t: None, commute=True))
        comm.Iallreduce(x, np.zeros(4)).Wait()
        comm.Scan(x, np.zeros(4))
        assert comm.stats == {"Allreduce": {"native": 2, "forwarded": 1},
                              "Iallreduce": {"native": 1, "forwarded": 0},
                              "Scan": {"native": 1, "forwarded": 0}}
    finally:
        comm.context.close()


# -- structure -----------------------------------------------------------------------

def test_dup_split_free(world, adapter):
    n, r = world.size, world.rank
    dup = adapter.Dup()
    assert isinstance(dup, hpccoll.mpi.Comm) and dup.context is adapter.context
    assert (dup.Get_rank(), dup.Get_size(), dup.rank, dup.size) == (r, n, r, n)
    assert adapter.Clone().context is adapter.context
    color = r % 2
    mine = world.Split(color, key=-r)
    sub = adapter.Split(color, key=-r)
    assert (sub.rank, sub.size) == (mine.rank, mine.size)
    twin(mine, sub, "Allreduce", lambda: ([data("int64", 9, r), y := np.zeros(9, "i8")], [y]))
    twin(mine, sub, "Alltoallv", lambda: ([data("int64", sub.size, r), y := np.zeros(sub.size, "i8")],
                                          [y]))
    assert adapter.Split(MPI.UNDEFINED) == MPI.COMM_NULL
    shared = adapter.Split_type(MPI.COMM_TYPE_SHARED)
    shared.Barrier()
    for c in (dup, sub, shared):
        c.Free()
        with pytest.raises(MPI.Exception):
            c.Allreduce(np.ones(2), np.zeros(2))
        with pytest.raises(MPI.Exception):     # freeing twice: mpi4py raises too
            c.Free()
    mine.Free()
    with pytest.raises(MPI.Exception):         # as mpi4py: COMM_WORLD cannot be freed
        adapter.Free()
    adapter.Barrier()


def test_wraps_only_intracommunicators():
    with pytest.raises(TypeError):
        hpccoll.mpi.Comm("world")
    with pytest.raises(hpccoll.ArgumentError):
        hpccoll.mpi.Comm(MPI.COMM_NULL)


def test_shares_an_existing_context():
    with hpccoll.init(policy=POLICY, timeout=60) as ctx:
        comm = hpccoll.mpi.Comm(MPI.COMM_WORLD, context=ctx)
        assert comm.context is ctx
        y = np.zeros(3)
        comm.Allreduce(np.ones(3), y)
        assert (y == comm.size).all()
        with pytest.raises(hpccoll.ArgumentError):
            hpccoll.mpi.Comm(MPI.COMM_WORLD, context=ctx, policy="fifo")


# -- ranks that disagree ---------------------------------------------------------------

@pytest.mark.mpi(min_size=2)
def test_disagreeing_counts_raise_collective_mismatch():
    """Reduce_scatter's recvcounts must be the same everywhere: one rank's differ, and every
    rank raises CollectiveMismatch from that call (check_mismatch="every") instead of
    hanging or returning garbage."""
    adapter = hpccoll.mpi.Comm(MPI.COMM_WORLD, policy=POLICY, timeout=60,
                               check_mismatch="every")
    n, r = adapter.size, adapter.rank
    comm = adapter.Dup()
    counts = [2] * n
    if r == n - 1:
        counts = [2] * (n - 1) + [3]
        counts[0] = 1
    with pytest.raises(hpccoll.CollectiveMismatch) as info:
        comm.Reduce_scatter(np.ones(sum(counts)), np.zeros(counts[r]), counts)
    assert "count" in info.value.fields
    adapter.context.close()


# -- the deadlock the adapter inherits the cure for -------------------------------------

@pytest.mark.parametrize("count", [5, 50_000])
def test_divergent_order_on_two_adapted_communicators(world, count):
    """Even ranks start A's collectives before B's, odd ranks B's before A's, and wait in
    that order, with one execution slot: run to completion one at a time (NCCL-style)
    this is a circular wait; under the preemptive policy it completes."""
    a = hpccoll.mpi.Comm(MPI.COMM_WORLD, policy="preemptive", max_active=1, timeout=60)
    try:
        b = a.Dup()
        assert b.context is a.context and a.context.policy == "preemptive"
        r = world.rank
        x = data("float64", count, r)
        z = data("int32", count * world.size, r, salt=1)
        reqs = {}
        order = ["A", "B"] if r % 2 == 0 else ["B", "A"]
        outs = {"A": (np.zeros(count), np.zeros(count * world.size, "i4")),
                "B": (np.zeros(count), np.zeros(count * world.size, "i4"))}
        for name in order:
            c = a if name == "A" else b
            reqs[name] = [c.Iallreduce(x, outs[name][0]), c.Ialltoall(z, outs[name][1])]
        for name in order:
            hpccoll.mpi.Request.Waitall(reqs[name])
        want, want_a2a = np.zeros(count), np.zeros_like(z)
        world.Allreduce(x, want)
        world.Alltoall(z, want_a2a)
        for name in "AB":
            assert_same(outs[name][0], want, world.size, name)
            np.testing.assert_array_equal(outs[name][1], want_a2a)
        assert native_calls(a, "Iallreduce") == 1 and native_calls(b, "Iallreduce") == 1
        assert forwarded_calls(a, "Iallreduce") == 0
        b.Free()
    finally:
        a.context.close()


# -- every named datatype, every predefined op: the same outcome as mpi4py ----------------

def _named_numeric_types():
    from mpi4py.util import dtlib
    out = []
    for name in sorted(n for n in dir(MPI) if isinstance(getattr(MPI, n), MPI.Datatype)):
        t = getattr(MPI, name)
        if t == MPI.DATATYPE_NULL:
            continue
        try:
            dt = np.dtype(dtlib.to_numpy_dtype(t))
        except Exception:   # no NumPy equivalent (pair types with padding, LB/UB, ...)
            continue
        if dt.kind in "iufcb" and dt.itemsize == t.Get_size():
            out.append((name, dt))
    return out


NAMED = _named_numeric_types()
PREDEFINED_OPS = ["SUM", "PROD", "MIN", "MAX", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR"]


# the types the issue names: these run natively with every op MPI defines on them
ISSUE_TYPES = {"INT8_T": "int8", "UINT8_T": "uint8", "INT16_T": "int16", "UINT16_T": "uint16",
               "INT32_T": "int32", "UINT32_T": "uint32", "INT64_T": "int64", "UINT64_T": "uint64",
               "SIGNED_CHAR": "int8", "UNSIGNED_CHAR": "uint8", "SHORT": "int16", "INT": "int32",
               "LONG": "int64", "LONG_LONG": "int64", "UNSIGNED": "uint32",
               "UNSIGNED_LONG": "uint64", "FLOAT": "float32", "DOUBLE": "float64",
               "C_FLOAT_COMPLEX": "complex64", "C_DOUBLE_COMPLEX": "complex128", "C_BOOL": "bool"}


# where an MPI's own reduction differs from NumPy's (its bug): the adapter gives NumPy's.
# Open MPI compares MPI_OFFSET (a signed type) as unsigned in MPI_MIN and MPI_MAX
MPI_BUGS = {("Open MPI", "OFFSET", "MIN"), ("Open MPI", "OFFSET", "MAX")}
NUMPY_OPS = {"SUM": np.add, "PROD": np.multiply, "MIN": np.minimum, "MAX": np.maximum,
             "LAND": np.logical_and, "LOR": np.logical_or, "LXOR": np.logical_xor,
             "BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}


def test_every_named_datatype_and_op(world, adapter):
    """Every predefined MPI datatype NumPy can represent, reduced with every predefined op
    and broadcast: a result equal to mpi4py's (and to NumPy's, where the MPI's own is
    wrong: MPI_BUGS), or the very error mpi4py raises (MPI_MAX on a complex type, MPI_SUM
    on MPI_BYTE, ...)."""
    from tests.mpi.twins import ops_for
    assert len(NAMED) > 40 and set(ISSUE_TYPES) <= {name for name, _ in NAMED}
    r = world.rank
    library = MPI.Get_library_version()
    native = set()
    for name, dt in NAMED:
        t = getattr(MPI, name)
        x = data(dt, 3, r)
        xs = world.allgather(x)
        twin(world, adapter, "Bcast", lambda: ([[b := x.copy(), t], 0], [b]),
             native=hpccoll.mpi._types.native_dtype(t) is not None)
        for opname in PREDEFINED_OPS:
            op = getattr(MPI, opname)
            outcome = {}
            for who, comm in (("mpi4py", world), ("adapter", adapter)):
                y = np.zeros(3, dt)
                before = native_calls(adapter, "Allreduce")
                try:
                    comm.Allreduce([x, t], [y, t], op)
                    outcome[who] = y
                except MPI.Exception as exc:
                    outcome[who] = ("MPI.Exception", exc.Get_error_class())
                if native_calls(adapter, "Allreduce") > before:
                    native.add((name, opname))
            what = f"{name} {opname}"
            if isinstance(outcome["mpi4py"], tuple):
                assert outcome["adapter"] == outcome["mpi4py"], what
            elif any(library.startswith(lib) and (name, opname) == (n, o)
                     for lib, n, o in MPI_BUGS):
                want = xs[0]
                for other in xs[1:]:
                    want = NUMPY_OPS[opname](want, other).astype(want.dtype)
                assert_same(outcome["adapter"], want, world.size, what)
            else:
                assert_same(outcome["adapter"], outcome["mpi4py"], world.size, what)
    for name, dtype in ISSUE_TYPES.items():
        for op in ops_for(dtype):
            opname = [n for n in PREDEFINED_OPS if getattr(MPI, n) == op][0]
            assert (name, opname) in native, f"{name} {opname} was not run natively"


def test_properties_and_communicators_wrapped_by_hand(adapter):
    dup = adapter.Dup()
    dup.name = "renamed"                       # mpi4py's settable property, on the shared handle
    assert dup.name == dup.mpi_comm.Get_name() == "renamed"
    group = adapter.group
    made = adapter.mpi_comm.Create_group(group)     # mpi4py's own communicator, wrapped
    assert isinstance(made, MPI.Intracomm) and not isinstance(made, hpccoll.mpi.Comm)
    wrapped = hpccoll.mpi.Comm(made, context=adapter.context)
    y = np.zeros(2, "i8")
    wrapped.Allreduce(np.ones(2, "i8"), y)
    assert (y == adapter.size).all() and native_calls(wrapped, "Allreduce") == 1
    for c in (wrapped, dup):
        c.Free()
    assert made == MPI.COMM_NULL     # freed through the adapter: the wrapped object is null too
    group.Free()


def test_cpu_kernels_fall_back_for_logical_and_bitwise_ops(world):
    """With Numba CPU kernels on (blocks=), the ops the kernels lack (mpi4py's logical and
    bitwise ones) still run, in NumPy, on every path (large: the pipelined ring)."""
    from numba_kernels import cpu
    comm = hpccoll.mpi.Comm(MPI.COMM_WORLD, policy=POLICY, timeout=120,
                            blocks=min(2, cpu.max_threads()))
    try:
        for count in (5, 40_003):
            x = data("int32", count, world.rank)
            for op in (MPI.LAND, MPI.BXOR, MPI.SUM):
                twin(world, comm, "Allreduce", lambda: ([x, y := np.zeros(count, "i4"), op], [y]))
    finally:
        comm.context.close()
