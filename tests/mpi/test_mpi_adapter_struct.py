"""hpccoll.mpi.Comm is an mpi4py communicator: isinstance, equality and handles shared with
the wrapped communicator, every constructor returning an adapter on the same context
(topology ones included, ranks outside getting MPI's null communicator), Free without
double frees, and mpi4py's collectives it does not run counted as forwarded."""
import copy
import pickle

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll.mpi
from hpccoll.mpi import _coverage as coverage
from tests.mpi.twins import data, forwarded_calls, native_calls, twin

pytestmark = pytest.mark.mpi

ADAPTERS = (hpccoll.mpi.Comm, hpccoll.mpi.Cartcomm, hpccoll.mpi.Graphcomm,
            hpccoll.mpi.Distgraphcomm)


def test_is_an_mpi4py_intracommunicator(adapter):
    assert isinstance(adapter, MPI.Comm) and isinstance(adapter, MPI.Intracomm)
    assert adapter == MPI.COMM_WORLD and adapter == adapter.mpi_comm
    assert adapter != MPI.COMM_NULL and bool(adapter)
    assert adapter.py2f() == MPI.COMM_WORLD.py2f() and adapter.handle == MPI.COMM_WORLD.handle
    assert MPI.Comm.Compare(adapter, MPI.COMM_WORLD) == MPI.IDENT
    assert (adapter.rank, adapter.size) == (MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size)
    assert adapter.Is_intra() and adapter.topology == MPI.UNDEFINED
    assert type(MPI.Intracomm(adapter)) is MPI.Intracomm      # mpi4py's copy of the handle
    # an adapter carries this process's hpccoll context: it does not pickle or copy
    for how in (pickle.dumps, copy.copy, copy.deepcopy):
        with pytest.raises(ValueError, match="cannot serialize"):
            how(adapter)


def test_collectives_not_run_natively_are_inherited_and_counted(world, adapter):
    """Every mpi4py collective an adapter class has is native or a counting forwarder of
    mpi4py's own method: nothing reaches mpi4py uncounted."""
    for cls in ADAPTERS:
        for name in coverage.COLLECTIVES:
            if hasattr(cls, name):
                method = getattr(cls, name)
                assert coverage.native(cls, name) or getattr(method, "forwarded", False), \
                    (cls.__name__, name)
    n, r = world.size, world.rank
    x = data("int32", 2 * n, r)
    ints = [MPI.INT] * n
    twin(world, adapter, "Alltoallw", lambda: (
        [[x, [2] * n, [8 * i for i in range(n)], ints],
         [y := np.zeros(2 * n, "i4"), [2] * n, [8 * i for i in range(n)], ints]], [y]),
         native=False)
    req = adapter.Allreduce_init(x, y := np.zeros(2 * n, "i4"))      # persistent: forwarded
    req.Start()
    req.Wait()
    req.Free()
    want = np.zeros_like(y)
    world.Allreduce(x, want)
    np.testing.assert_array_equal(y, want)
    assert forwarded_calls(adapter, "Allreduce_init") == 1


def _check_native(mine, theirs, r):
    """The adapter's collectives on a new communicator: native, equal to mpi4py's."""
    assert isinstance(mine, hpccoll.mpi.Comm) and mine == mine.mpi_comm
    assert MPI.Comm.Compare(mine, theirs) == MPI.CONGRUENT
    x = data("int64", 5, r)
    twin(theirs, mine, "Allreduce", lambda: ([x, y := np.zeros(5, "i8")], [y]))
    twin(theirs, mine, "Bcast", lambda: ([b := data("int32", 3, r), mine.size - 1], [b]))


def test_constructors_return_adapters_on_the_same_context(world, adapter):
    r = world.rank
    group = adapter.Get_group()
    made = {
        "Dup": (adapter.Dup(), world.Dup()),
        "Dup info": (adapter.Dup(MPI.INFO_NULL), world.Dup(MPI.INFO_NULL)),
        "Dup_with_info": (adapter.Dup_with_info(MPI.INFO_NULL), world.Dup_with_info(MPI.INFO_NULL)),
        "Clone": (adapter.Clone(), world.Clone()),
        "Create": (adapter.Create(group), world.Create(group)),
        "Create_group": (adapter.Create_group(group), world.Create_group(group)),
        "Split": (adapter.Split(r % 2, key=-r), world.Split(r % 2, key=-r)),
        "Split_type": (adapter.Split_type(MPI.COMM_TYPE_SHARED, key=r),
                       world.Split_type(MPI.COMM_TYPE_SHARED, key=r)),
    }
    group.Free()
    for name, (mine, theirs) in made.items():
        assert type(mine) is hpccoll.mpi.Comm and mine.context is adapter.context, name
        assert (mine.rank, mine.size) == (theirs.rank, theirs.size), name
        _check_native(mine, theirs, r)
        # and what they make, in turn
        again = mine.Dup()
        assert again.context is adapter.context and native_calls(mine, "Dup") == 1
        for c in (again, mine, theirs):
            c.Free()
    comm, req = adapter.Idup()              # mpi4py's own: usable only once req completes
    req.Wait()
    assert not isinstance(comm, hpccoll.mpi.Comm) and forwarded_calls(adapter, "Idup") >= 1
    comm.Free()
    # ranks outside the new communicator get MPI's null one
    for mine in (adapter.Split(MPI.UNDEFINED), adapter.Split_type(MPI.UNDEFINED)):
        assert mine == MPI.COMM_NULL and not isinstance(mine, hpccoll.mpi.Comm)
    part = world.Get_group().Incl([0])
    mine, theirs = adapter.Create(part), world.Create(part)
    assert (mine == MPI.COMM_NULL) == (theirs == MPI.COMM_NULL) == (r != 0)
    for c in (mine, theirs):
        if c != MPI.COMM_NULL:
            c.Free()
    part.Free()


def test_cartesian_adapters(world, adapter):
    n, r = world.size, world.rank
    dims = MPI.Compute_dims(n, 2)
    mine = adapter.Create_cart(dims, periods=[True, False], reorder=False)
    theirs = world.Create_cart(dims, periods=[True, False], reorder=False)
    assert type(mine) is hpccoll.mpi.Cartcomm
    assert isinstance(mine, MPI.Cartcomm) and isinstance(mine, hpccoll.mpi.Comm)
    assert mine.context is adapter.context
    # the topology queries are mpi4py's own
    assert mine.Get_topo() == theirs.Get_topo() and mine.dims == dims
    assert mine.Get_coords(r) == theirs.Get_coords(r) and mine.Shift(0, 1) == theirs.Shift(0, 1)
    _check_native(mine, theirs, r)
    for remain in ([True, False], [False, True]):
        sub, tsub = mine.Sub(remain), theirs.Sub(remain)
        assert type(sub) is hpccoll.mpi.Cartcomm and sub.context is adapter.context
        assert sub.Get_topo() == tsub.Get_topo()
        _check_native(sub, tsub, r)
        sub.Free()
        tsub.Free()
    dup = mine.Dup()
    assert type(dup) is hpccoll.mpi.Cartcomm and dup.Get_topo() == mine.Get_topo()
    # the neighbourhood collectives: mpi4py's, counted
    x = data("int32", 1, r)
    twin(theirs, mine, "Neighbor_allgather",
         lambda: ([x, y := np.full(2 * len(dims), -1, "i4")], [y]), native=False)
    for c in (dup, mine, theirs):
        c.Free()
    # a grid smaller than the job: the ranks off it get MPI's null communicator
    if n > 1:
        off = adapter.Create_cart([n - 1])
        assert (off == MPI.COMM_NULL) == (r == n - 1)
        if r != n - 1:
            assert type(off) is hpccoll.mpi.Cartcomm and off.size == n - 1
            off.Barrier()
            off.Free()
    # an mpi4py Cartcomm wrapped by hand gets the Cartesian adapter
    plain = world.Create_cart([n])
    wrapped = hpccoll.mpi.Comm(plain, context=adapter.context)
    assert type(wrapped) is hpccoll.mpi.Cartcomm and wrapped.Get_topo() == plain.Get_topo()
    wrapped.Free()
    assert plain == MPI.COMM_NULL


def test_graph_adapters(world, adapter):
    n, r = world.size, world.rank
    # a ring: rank i's neighbours i-1 and i+1
    index = [2 * (i + 1) for i in range(n)]
    edges = [e for i in range(n) for e in ((i - 1) % n, (i + 1) % n)]
    mine, theirs = adapter.Create_graph(index, edges), world.Create_graph(index, edges)
    assert type(mine) is hpccoll.mpi.Graphcomm and isinstance(mine, MPI.Graphcomm)
    assert mine.Get_topo() == theirs.Get_topo() and mine.Get_neighbors(r) == theirs.Get_neighbors(r)
    _check_native(mine, theirs, r)
    x = data("int64", 2, r)
    twin(theirs, mine, "Neighbor_alltoall", lambda: ([x, y := np.zeros(2, "i8")], [y]),
         native=False)
    for c in (mine, theirs):
        c.Free()
    sources, dests = [(r - 1) % n], [(r + 1) % n]
    for name, args in [("Create_dist_graph_adjacent", (sources, dests)),
                       ("Create_dist_graph", ([r], [1], dests))]:
        mine, theirs = getattr(adapter, name)(*args), getattr(world, name)(*args)
        assert type(mine) is hpccoll.mpi.Distgraphcomm and isinstance(mine, MPI.Distgraphcomm)
        assert mine.Get_dist_neighbors_count() == theirs.Get_dist_neighbors_count()
        _check_native(mine, theirs, r)
        for c in (mine, theirs):
            c.Free()


def test_free_frees_once(world, adapter):
    """Free nulls the adapter and the wrapped communicator; whichever is freed first, the
    handle is freed once; freeing again raises MPI's error, as mpi4py does."""
    dup = adapter.Dup()
    inner = dup.mpi_comm
    dup.Free()
    assert dup == MPI.COMM_NULL and inner == MPI.COMM_NULL
    with pytest.raises(MPI.Exception) as e:
        dup.Free()
    assert e.value.Get_error_class() == MPI.ERR_COMM
    with pytest.raises(MPI.Exception):
        dup.Allreduce(np.ones(2), np.zeros(2))
    # the wrapped communicator freed first: the adapter does not free it again
    other = adapter.Dup()
    other.mpi_comm.Free()
    other.Free()
    assert other == MPI.COMM_NULL
    # Clone, Free: null, as in mpi4py's own test; Disconnect and mpi4py's free() alike
    clone = adapter.Clone()
    clone.Free()
    assert clone == MPI.COMM_NULL
    for how in ("Disconnect", "free"):
        made = adapter.Dup()
        inner = made.mpi_comm
        getattr(made, how)()
        assert made == MPI.COMM_NULL and inner == MPI.COMM_NULL
    with pytest.raises(MPI.Exception):      # COMM_WORLD cannot be freed
        adapter.Free()
    assert adapter == MPI.COMM_WORLD
    adapter.Barrier()


def test_coverage_cli_prints_the_table():
    """python -m hpccoll.mpi --coverage: the table made from the adapter classes."""
    from hpccoll.mpi.__main__ import table
    text = table()
    for name in sorted(coverage.native_methods(hpccoll.mpi.Comm)):
        op = name if name[0] != "I" else name[1].upper() + name[2:]
        assert f"`{op}`" in text
    assert "| `Allreduce` | **native** | **native** |" in text
    assert "| `Alltoallw` | forwarded | forwarded | forwarded |" in text
    assert "| `Create_cart` | an adapter on the same context |" in text
    assert "| `Sub` | an adapter on the same context |" in text
    assert "| `Idup` | mpi4py's own communicator |" in text


def test_the_kind_follows_the_handle(world, adapter):
    """The adapter class is chosen by the handle's topology, as mpi4py's constructors judge
    it; an adapter class of the wrong kind raises mpi4py's TypeError."""
    n = world.size
    cart = world.Create_cart([n])
    as_intracomm = MPI.Intracomm(cart)           # a Cartesian handle in an Intracomm object
    wrapped = hpccoll.mpi.Comm(as_intracomm, context=adapter.context)
    assert type(wrapped) is hpccoll.mpi.Cartcomm and wrapped.dims == [n]
    for kind in (hpccoll.mpi.Cartcomm, hpccoll.mpi.Graphcomm, hpccoll.mpi.Distgraphcomm):
        if kind is not hpccoll.mpi.Cartcomm:
            with pytest.raises(TypeError):
                kind(cart, context=adapter.context)
        with pytest.raises(TypeError):
            kind(world, context=adapter.context)
    wrapped.Free()
    assert as_intracomm == MPI.COMM_NULL and wrapped == MPI.COMM_NULL
    # (``cart`` still holds the freed handle: two mpi4py objects over one handle, as ever)
    cart = world.Create_cart([n])
    again = hpccoll.mpi.Cartcomm(cart, context=adapter.context)
    assert again.Get_topo() == cart.Get_topo()
    again.Free()
    assert cart == MPI.COMM_NULL
