"""The node-shared-memory transport: the algorithms the table picks, results against
MPI's own collectives, registered buffers (ctx.empty / ctx.zeros) in every in-place form,
asymmetric use caught, the hierarchical algorithm on fake nodes (node_size), and the
handoff probe that decides how far copies into node-shared memory stream."""
import os
import time

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
from hpccoll import ArgumentError, CollectiveMismatch, algorithms
from hpccoll.engine import code
from hpccoll.transport import shm

pytestmark = pytest.mark.mpi

N = 70_001     # > shm_min_bytes in float32, and not a multiple of anything


@pytest.fixture(scope="module")
def sctx():
    # (single copy off: these are the staged programs; tests/mpi/test_cma.py has it)
    c = hpccoll.init(trace=True, timeout=60, shm_slot_bytes=64 << 10, cma=False)
    yield c
    c.close()


def algos(ctx):
    return {(r["coll"], r["algo"]) for r in ctx.trace(clear=True)}


def ints(n, rank, salt=0, dtype=np.float32):
    return ((np.arange(n) * 3 + rank * 5 + salt) % 17 - 8).astype(dtype)


@pytest.mark.mpi(min_size=2)
def test_table_picks_shared_memory_and_results_match_mpi(sctx, mpi_world):
    w = sctx.world
    n, r = w.size, w.rank
    x = ints(N, r)
    want = np.empty_like(x)
    mpi_world.Allreduce(x, want)
    np.testing.assert_array_equal(w.allreduce(x).wait(), want)
    y = ints(n * N, r, 1)
    yw = np.empty_like(y)
    mpi_world.Allreduce(y, yw)
    np.testing.assert_array_equal(w.reduce_scatter(y).wait(), yw[r * N:(r + 1) * N])
    g = np.empty(n * N, np.float32)
    mpi_world.Allgather(x, g)
    np.testing.assert_array_equal(w.allgather(x).wait(), g)
    z = x.copy()
    w.allreduce(z, z, op="max").wait()
    mx = np.empty_like(x)
    mpi_world.Allreduce(x, mx, op=MPI.MAX)
    np.testing.assert_array_equal(z, mx)
    # allgather: shared memory where it runs in C, up to GATHER_C_BYTES of output; MPI's
    # own elsewhere (docs/performance.md)
    gather = "shm" if sctx.c_programs and n * N * 4 <= algorithms.GATHER_C_BYTES else "mpi"
    assert algos(sctx) == {("allreduce", "shm"), ("reduce_scatter", "shm"), ("allgather", gather)}


@pytest.mark.mpi(min_size=2)
def test_registered_buffers_every_form(sctx, mpi_world):
    w = sctx.world
    n, r = w.size, w.rank
    src = ints(N, r, 2)
    want = np.empty_like(src)
    mpi_world.Allreduce(src, want)
    a = sctx.empty(N, np.float32)
    b = sctx.zeros(N, np.float32)
    a[:] = src
    assert w.allreduce(a, b).wait() is b
    np.testing.assert_array_equal(b, want)
    np.testing.assert_array_equal(a, src)                     # input untouched
    w.allreduce(a, a).wait()                                  # in place
    np.testing.assert_array_equal(a, want)
    # reduce_scatter: the same array, and NCCL's view form
    # (more than mpi_coll_bytes in all, so that shared memory, not MPI, runs)
    m = 17_001
    big = sctx.empty(n * m, np.float32)
    full = ints(n * m, r, 3)
    fw = np.empty_like(full)
    mpi_world.Allreduce(full, fw)
    big[:] = full
    out = sctx.empty(m, np.float32)
    w.reduce_scatter(big, out).wait()
    np.testing.assert_array_equal(out, fw[r * m:(r + 1) * m])
    w.reduce_scatter(big, big[r * m:(r + 1) * m]).wait()
    np.testing.assert_array_equal(big[r * m:(r + 1) * m], fw[r * m:(r + 1) * m])
    # allgather: separate buffers, then in place (block r of the output is the input);
    # from 2 MiB in all registered buffers take shared memory, below it MPI's own
    b = (2 << 20) // (4 * n) + 17
    mine = sctx.empty(b, np.float32)
    mine[:] = ints(b, r, 4)
    gathered = np.empty(n * b, np.float32)
    mpi_world.Allgather(mine.copy(), gathered)
    outg = sctx.zeros(n * b, np.float32)
    w.allgather(mine, outg).wait()
    np.testing.assert_array_equal(outg, gathered)
    ing = sctx.zeros(n * b, np.float32)
    ing[r * b:(r + 1) * b] = mine
    w.allgather(ing, ing).wait()
    np.testing.assert_array_equal(ing, gathered)
    assert {a for c, a in algos(sctx)} == {"shm"}


@pytest.mark.mpi(min_size=2)
def test_every_collective_starts_on_the_first_slot(mpi_world):
    """Collectives of one, two and three epochs in a row (128 KiB slots), each on the
    same slot as the others' first epoch (the epoch base rounded up to the slot count),
    in place and not, ordinary and registered: results exact against MPI."""
    with hpccoll.init(trace=True, timeout=60, shm_slot_bytes=128 << 10) as ctx:
        w = ctx.world
        r = w.rank
        area = w._state.shm["area"]
        per_slot = (128 << 10) // 4
        for k, epochs in enumerate([1, 3, 2, 1, 2, 3, 1, 1]):
            count = per_slot * epochs - 7 * k - 3       # not a multiple of the slot
            x = ints(count, r, k)
            want = np.empty_like(x)
            mpi_world.Allreduce(x, want)
            if k % 3 == 2:
                got = ctx.empty(count, np.float32)
                got[:] = x
                w.allreduce(got, got).wait()
            elif k % 3 == 1:
                got = x.copy()
                w.allreduce(got, got).wait()
            else:
                got = w.allreduce(x).wait()
            np.testing.assert_array_equal(got, want)
            assert area.epoch % area.slots == 0, (k, area.epoch)
        assert algos(ctx) == {("allreduce", "shm")}


@pytest.mark.mpi(min_size=2)
def test_reduce_through_shared_memory_every_root_and_form(sctx, mpi_world):
    """reduce takes shared memory above 64 KiB: every root, sum, max and avg, in place at
    the root, one and several epochs (64 KiB slots), against MPI's own; registered
    buffers on some ranks only are the same collective (it stages either way), even with
    the per-call check."""
    w = sctx.world
    n, r = w.size, w.rank
    algos(sctx)
    for count in (N, 3 * N + 1):
        for root in range(n):
            for op, mop in (("sum", MPI.SUM), ("max", MPI.MAX)):
                x = ints(count, r, root)
                want = np.empty_like(x)
                mpi_world.Reduce(x, want, op=mop, root=root)
                got = w.reduce(x, op=op, root=root).wait()
                if r == root:
                    np.testing.assert_array_equal(got, want)
                inplace = x.copy()
                w.reduce(inplace, inplace, op=op, root=root).wait()
                if r == root:
                    np.testing.assert_array_equal(inplace, want)
            x = ints(count, r, 1).astype(np.float64)
            want = np.empty_like(x)
            mpi_world.Reduce(x / n, want, root=root)
            got = w.reduce(x, op="avg", root=root).wait()
            if r == root:
                np.testing.assert_allclose(got, want, rtol=1e-12)
    assert algos(sctx) == {("reduce", "shm")}
    with hpccoll.init(timeout=30, check_mismatch="every") as ctx:
        src = ints(N, r, 4)
        want = np.empty_like(src)
        mpi_world.Reduce(src, want, root=n - 1)
        registered = ctx.empty(N, np.float32)       # (an allocation every rank makes)
        x = registered if r % 2 else np.empty(N, np.float32)
        x[:] = src
        got = ctx.world.reduce(x, x, root=n - 1).wait()
        if r == n - 1:
            np.testing.assert_array_equal(got, want)


@pytest.mark.mpi(min_size=2)
def test_broadcast_through_shared_memory(sctx, mpi_world):
    """A broadcast takes shared memory where MPI's own cannot run it (float16) and where a
    calibration picks it (here forced, as hpccoll-tune calibrate does): every root, one and
    several epochs (64 KiB slots), registered buffers on some ranks only."""
    w = sctx.world
    n, r = w.size, w.rank
    algos(sctx)
    for count in (N, 3 * N + 1):
        for root in range(n):
            half = ints(count, root, 5, np.float16)
            buf = half.copy() if r == root else np.zeros(count, np.float16)
            assert w.broadcast(buf, root=root).wait() is buf
            np.testing.assert_array_equal(buf, half)
    assert algos(sctx) == {("broadcast", "shm")}
    comm = w.dup(name="bcast-shm")
    comm._state.prefer = {"broadcast": "shm"}
    algos(sctx)                                     # (what dup itself ran)
    registered = sctx.empty(3 * N + 1, np.float32)  # (an allocation every rank makes)
    for count in (N, 3 * N + 1):
        for root in range(n):
            want = ints(count, root, 6)
            if r % 2:
                buf = registered[:count]
                buf[:] = want if r == root else 0
            else:
                buf = want.copy() if r == root else np.zeros(count, np.float32)
            comm.broadcast(buf, root=root).wait()
            np.testing.assert_array_equal(buf, want)
            ref = want.copy() if r == root else np.zeros(count, np.float32)
            mpi_world.Bcast(ref, root=root)
            np.testing.assert_array_equal(buf, ref)
    assert {a for _, a in algos(sctx)} == {"shm"}
    comm.free()


@pytest.mark.mpi(min_size=2)
def test_registered_used_asymmetrically_is_a_mismatch(mpi_world):
    with hpccoll.init(timeout=30, check_mismatch="every") as ctx:
        a = ctx.empty(N, np.float32)
        b = ctx.empty(N, np.float32)
        a[:] = 1
        b[:] = 1
        comm = ctx.world.dup()
        src = a if ctx.rank == 0 else b          # rank 0 uses another allocation
        with pytest.raises(CollectiveMismatch) as info:
            comm.allreduce(src, src).wait(timeout=30)
        assert "buffers" in info.value.fields


@pytest.mark.mpi(min_size=2)
def test_tiny_collectives_may_mix_registered_and_ordinary(mpi_world):
    """At <= mpi_coll_bytes the MPI library's own collective runs and reads no peer's
    buffers: where the arrays live does not matter and is not a mismatch."""
    with hpccoll.init(timeout=30, cell_bytes=0) as ctx:
        reg = ctx.empty(4, np.int32)
        reg[:] = ctx.rank + 1
        x = reg if ctx.rank == 0 else np.full(4, ctx.rank + 1, np.int32)
        w = ctx.world.allreduce(x)
        np.testing.assert_array_equal(w.wait(timeout=30), np.full(4, sum(range(1, ctx.size + 1))))
        assert w.counters["algo"] == "mpi"


def test_registered_allocation_must_be_symmetric(mpi_world):
    with hpccoll.init(timeout=30) as ctx:
        if ctx.size > 1:
            with pytest.raises(ArgumentError, match="symmetric"):
                ctx.empty(10 + ctx.rank)
        arr = ctx.zeros(5, np.int32)
        assert isinstance(arr, np.ndarray) and arr.tolist() == [0] * 5


@pytest.mark.mpi(min_size=4)
def test_hierarchical_on_fake_nodes(mpi_world):
    """node_size=2: ranks {0,1}, {2,3}, ... are 'nodes'; allreduce reduces in shared memory on
    each node and across nodes over MPI."""
    if mpi_world.size % 2:
        pytest.skip("needs an even number of ranks to form 2-rank nodes")
    with hpccoll.init(node_size=2, trace=True, timeout=60, shm_slot_bytes=64 << 10) as ctx:
        x = ints(N, ctx.rank, 5)
        want = np.empty_like(x)
        mpi_world.Allreduce(x, want)
        np.testing.assert_array_equal(ctx.world.allreduce(x).wait(), want)
        got = ctx.world.allreduce(x, op="avg").wait()
        np.testing.assert_allclose(got, want / ctx.size, rtol=1e-6)
        assert {r["algo"] for r in ctx.trace()} == {"hier"}
        # a communicator inside one fake node is flat shared memory again
        pair = ctx.world.split(ctx.rank // 2)
        np.testing.assert_array_equal(pair.allreduce(x).wait(),
                                      x + ints(N, ctx.rank ^ 1, 5))
        assert ("allreduce", "shm") in {(r["coll"], r["algo"]) for r in ctx.trace()}


def test_shm_can_be_switched_off(mpi_world):
    with hpccoll.init(shm=False, trace=True, timeout=60) as ctx:
        x = ints(N, ctx.rank)
        ctx.world.allreduce(x).wait()
        assert {r["algo"] for r in ctx.trace()} == {"ring"} if ctx.size > 1 else True


@pytest.mark.mpi(min_size=2)
def test_a_communicators_area_is_one_mapped_file_gone_from_the_file_system(sctx, mpi_world):
    """Every rank of the node maps the same memory (a counter one rank stores is seen by
    the others) and the file has no name left: a killed job leaves nothing in /dev/shm."""
    import os
    from hpccoll.transport.shm import shm_dir
    c = sctx.world.dup()
    try:
        shm = c._state.shm
        assert shm is not None and shm["area"].size == len(shm["local"]) >= 2
        area = shm["area"]
        area.flags[area.rank][7] = 1000 + c.rank       # a spare word of this rank's counters
        mpi_world.Barrier()
        for q, r in enumerate(shm["local"]):
            assert area.flags[q][7] == 1000 + r
        mpi_world.Barrier()
        area.flags[area.rank][7] = 0
        pids = set(mpi_world.allgather(os.getpid()))
        left = [f for f in os.listdir(shm_dir())
                if f.startswith("hpccoll-") and int(f.split("-")[1]) in pids]
        assert left == []
    finally:
        c.free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("off_on", ["none", "rank1", "all"])
def test_shared_memory_in_c_from_small_sizes_agreed_by_every_rank(mpi_world, off_on):
    """Where every rank runs shared-memory programs in C (shm_in_c, _native.c built), the
    reductions take them above shm_c_bytes (16 KiB here); where one rank has them off, no
    rank does (they must choose alike), and MPI's own runs them as before.  Results
    against MPI's own, integers exact, every op the C executor has and one it lacks."""
    from hpccoll.engine import code
    r = mpi_world.rank
    on = not (off_on == "all" or (off_on == "rank1" and r == 1))
    with hpccoll.init(trace=True, timeout=60, shm_in_c=on) as ctx:
        w = ctx.world
        n = w.size
        in_c = code._native is not None and off_on == "none"
        assert ctx.c_programs == in_c
        count = 4096 // n * n           # 16 KiB of int32 or float32
        for dt, op, mop in [(np.int32, "sum", MPI.SUM), (np.int32, "max", MPI.MAX),
                            (np.int32, "min", MPI.MIN), (np.float32, "sum", MPI.SUM),
                            (np.float32, "max", MPI.MAX)]:
            x = ints(count, r, 3, dt)
            want = np.empty_like(x)
            mpi_world.Allreduce(x, want, op=mop)
            np.testing.assert_array_equal(w.allreduce(x, op=op).wait(), want)
            np.testing.assert_array_equal(w.reduce_scatter(x, op=op).wait(),
                                          want[r * (count // n):(r + 1) * (count // n)])
            got = w.reduce(x, op=op, root=n - 1).wait()
            if r == n - 1:
                np.testing.assert_array_equal(got, want)
            # float max stays NumPy's (NaN rules): MPI's own runs it at this size
            c_here = in_c and not (dt is np.float32 and op == "max")
            assert algos(ctx) == {(c, "shm" if c_here else "mpi")
                                  for c in ("allreduce", "reduce_scatter", "reduce")}
        # at shm_c_bytes and below, cells where C runs them (every rank), else MPI's own
        w.allreduce(np.ones(2048, np.float32)).wait()
        assert algos(ctx) == {("allreduce", "cells" if in_c else "mpi")}


@pytest.mark.mpi(min_size=2)
def test_alltoall_through_shared_memory_where_it_runs_in_c(mpi_world):
    """Alltoalls up to 64 KiB (2 MiB at 2 ranks) take shared memory where every
    rank runs programs in C, MPI's own elsewhere and above: every form (in place, a
    returned array) and a few dtypes, exact against MPI's own, with more chunks than
    slots (small slots) on two communicators in opposite orders."""
    r = mpi_world.rank
    with hpccoll.init(trace=True, timeout=60, shm_slot_bytes=8 << 10, cma=False) as ctx:
        n = ctx.size
        in_c = ctx.c_programs
        comms = [ctx.world.dup(name=f"a2a{i}") for i in range(2)]
        order = (0, 1) if r % 2 == 0 else (1, 0)
        algos(ctx)          # (what dup ran)
        for total, dt in [(16 << 10, np.float32), (64 << 10, np.int64), (40 << 10, np.int16),
                          (96, np.int32), (256 << 10, np.int32)]:
            m = total // np.dtype(dt).itemsize // n
            for it in range(6):
                xs = [ints(n * m, r, 7 * it + c, dt) for c in range(2)]
                wants = []
                for c in range(2):
                    want = np.empty_like(xs[c])
                    mpi_world.Alltoall(xs[c], want)
                    wants.append(want)
                ins = [x.copy() for x in xs]
                works = {}
                for c in order:
                    works[c] = (comms[c].alltoall(ins[c], ins[c]) if it % 2
                                else comms[c].alltoall(xs[c]))
                for c in reversed(order):
                    np.testing.assert_array_equal(works[c].wait(), wants[c],
                                                  err_msg=f"{total} {dt} it {it}")
            shm_here = in_c and total <= (algorithms.EXCHANGE_C2_BYTES if n == 2
                                          else algorithms.EXCHANGE_C_BYTES)
            cells = in_c and total <= ctx.settings.cell_bytes
            assert algos(ctx) == {("alltoall", "cells" if cells else "shm" if shm_here
                                   else "mpi")}, (total, in_c)
        for c in comms:
            c.free()


@pytest.mark.mpi(min_size=2)
def test_many_sizes_on_two_communicators_in_divergent_orders_exact(mpi_world):
    """Real concurrency for the shared-memory programs (in C where built): allreduces and
    reduce_scatters of random sizes from 9 KiB to 600 KiB on two communicators, issued in
    opposite orders on alternate ranks, every result exact against NumPy (a fence or a
    flag out of place shows here as a wrong sum, not as a hang)."""
    r, n = mpi_world.rank, mpi_world.size
    rng = np.random.default_rng(1234)          # the same sizes on every rank
    with hpccoll.init(timeout=60) as ctx:
        comms = [ctx.world.dup(name=f"d{i}") for i in range(2)]
        for it in range(150):
            count = int(rng.integers(2300, 80_000)) // n * n
            dt = (np.int32, np.int64, np.uint16)[it % 3]
            xs = [((np.arange(count, dtype=np.int64) * (7 + q) + it) % 1000).astype(dt)
                  for q in range(n)]
            want = np.sum(xs, axis=0, dtype=dt)
            order = (0, 1) if (r + it) % 2 == 0 else (1, 0)
            works = {c: comms[c].allreduce(xs[r]) if c == 0 else comms[c].reduce_scatter(xs[r])
                     for c in order}
            per = count // n
            np.testing.assert_array_equal(works[0].wait(), want)
            np.testing.assert_array_equal(works[1].wait(), want[r * per:(r + 1) * per])


@pytest.mark.mpi(min_size=2)
def test_results_of_4_mib_and_up_streamed_past_the_caches_exact(mpi_world):
    """From a 4 MiB result on, the C executor writes the receive buffer with streaming
    stores (engine/_native.c): allreduce on ordinary and registered buffers, reduce, and
    a registered allgather, on two communicators in opposite orders on alternate ranks,
    unaligned counts, against MPI's own."""
    r, n = mpi_world.rank, mpi_world.size
    count = (4 << 20) // 4 + 1001
    block = count // n + 3
    with hpccoll.init(timeout=120) as ctx:
        comms = [ctx.world.dup(name=f"s{i}") for i in range(2)]
        order = (0, 1) if r % 2 == 0 else (1, 0)
        reg_in, reg_out = ctx.empty(count, np.int32), ctx.empty(count, np.int32)
        gat_in, gat_out = ctx.empty(block, np.int32), ctx.empty(n * block, np.int32)
        for it in range(3):
            x = ((np.arange(count, dtype=np.int64) * 7 + r * 3 + it) % 2001 - 1000).astype(
                np.int32)
            reg_in[:] = x
            gat_in[:] = x[:block]
            want = np.empty_like(x)
            mpi_world.Allreduce(x, want)
            gathered = np.empty(n * block, np.int32)
            mpi_world.Allgather(x[:block], gathered)
            out = [np.zeros(count, np.int32) for _ in range(2)]
            root = it % n
            red = np.zeros(count, np.int32)
            works = {}
            for c in order:
                works[c] = [comms[c].allreduce(x, out[c])]
                if c == 0:
                    works[c].append(comms[c].allreduce(reg_in, reg_out))
                    works[c].append(comms[c].reduce(x, red, root=root))
                else:
                    works[c].append(comms[c].allgather(gat_in, gat_out))
            for c in order:
                for w in works[c]:
                    w.wait()
            for c in range(2):
                np.testing.assert_array_equal(out[c], want)
            np.testing.assert_array_equal(reg_out, want)
            if r == root:
                np.testing.assert_array_equal(red, want)
            np.testing.assert_array_equal(gat_out, gathered)
        for c in comms:
            c.free()


@pytest.mark.mpi(min_size=2)
def test_a_rank_without_the_c_executor_is_named(mpi_world, monkeypatch):
    """One rank's install lacks _native.c's build: nobody runs programs in C (they must
    choose alike), and rank 0 warns naming that rank, where the others have it."""
    from hpccoll.engine import code
    if code._native is None:
        pytest.skip("the C executor is not built here: nothing to lack on one rank only")
    r = mpi_world.rank
    if r == 1:
        monkeypatch.setattr(code, "_native", None)
    import warnings
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with hpccoll.init(timeout=60, trace=True) as ctx:
            assert not ctx.c_programs
            x = ints(4096, r, 5, np.int32)          # 16 KiB: shared memory, were it in C
            want = np.empty_like(x)
            mpi_world.Allreduce(x, want)
            np.testing.assert_array_equal(ctx.world.allreduce(x).wait(), want)
            assert algos(ctx) == {("allreduce", "mpi")}
    named = [str(w.message) for w in seen if "lack the C executor" in str(w.message)]
    assert named == (["hpccoll: shared-memory programs run in Python on every rank: rank(s) 1 "
                      "lack the C executor (hpccoll/engine/_native.c, built at install where a "
                      "C compiler is present; `python -m hpccoll config` says so per install)"]
                     if r == 0 else [])


def _node(mpi_world):
    node = mpi_world.Split_type(MPI.COMM_TYPE_SHARED)
    if node.size < 2 or code._native is None:
        node.Free()
        pytest.skip("needs 2 ranks on one node and the C executor")
    return node


@pytest.mark.mpi(min_size=2)
def test_the_handoff_probe_gives_the_node_one_figure_and_the_context_its_streaming(mpi_world):
    node = _node(mpi_world)
    try:
        h = code.handoff_ns(node, rounds=2000, runs=3)
        assert len(set(node.allgather(h))) == 1
        cores = frozenset().union(*node.allgather(frozenset(os.sched_getaffinity(0))))
        if len(cores) >= node.size:
            # measured: each run is given up after 20 ms, so a loaded machine reads slow
            # (nan: not one round in that time), never stuck
            assert h != h or 0 < h < 1e9
        with hpccoll.init(timeout=60) as c:
            assert c.slot_streaming == code.stream_slots(c.handoff_ns)
            assert (c.handoff_ns == c.handoff_ns) == (not c.oversubscribed and c.c_programs)
    finally:
        node.Free()


@pytest.mark.mpi(min_size=2)
def test_a_probe_whose_peer_never_answers_gives_up_and_stops_the_peer(mpi_world):
    node = _node(mpi_world)
    try:
        with shm.flag_lines(node) as lines:
            if node.rank == 0:
                t0 = time.perf_counter()
                ns, done = code._native.handoff(lines[0], lines[1], 10**9, True, 2_000_000)
                assert done == 0 and time.perf_counter() - t0 < 5
            node.Barrier()
            if node.rank == 1:    # arrives after its peer gave up: stops at once, no limit
                assert code._native.handoff(lines[0], lines[1], 10**9, False, -1)[1] == 0
    finally:
        node.Free()
