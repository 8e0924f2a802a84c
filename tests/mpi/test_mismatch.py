"""The deferred mismatch check (check_mismatch="deferred", the default), path by path: each
one raises the same CollectiveMismatch on every rank, naming the ranks, the first
differing sequence number and the fields, within its documented bound
(core/mismatch.py): every mismatch_every collectives, mismatch_ms after the last
comparison over the control plane, a wait that stalls for mismatch_ms, and close()."""
import time

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
from hpccoll import CollectiveMismatch, ContextClosed

pytestmark = pytest.mark.mpi(min_size=2)


def op_mismatch(comm):
    """Same bytes on the wire, another op on rank 1: MPI completes it with garbage."""
    comm.allreduce(np.arange(4, dtype=np.int32), op="max" if comm.rank == 1 else "sum").wait()


def check(exc, seq):
    assert set(exc.fields) == {"op"} and exc.fields["op"]["max"] == [1]
    assert exc.ranks == (1,)
    assert f"collective #{seq} " in str(exc)


def test_every_nth_collective_compares_the_digest():
    with hpccoll.init(timeout=60, mismatch_every=4, mismatch_ms=60_000) as ctx:
        comm = ctx.world.dup()
        comm.barrier().wait()                        # #0
        op_mismatch(comm)                            # #1: returns garbage, no error yet
        with pytest.raises(CollectiveMismatch) as info:
            for _ in range(3):                       # #2, #3: the 4th carries the digest
                comm.barrier().wait(timeout=30)
        check(info.value, 1)
        with pytest.raises(ContextClosed, match="unusable"):
            comm.barrier()


@pytest.mark.parametrize("node_size", [0, 1])
def test_the_digest_rides_on_the_node_board_or_mpi(node_size):
    """Where every member shares the node, the digest check is posted on the node-shared
    board (no MPI call); across nodes (here: one fake node per rank) an MPI allreduce
    carries it.  Either way the collective carrying it raises the mismatch, on every
    rank, naming the first differing call; calls that agree carry it silently."""
    from hpccoll.engine.check import BoardCheckLane, CheckLane
    with hpccoll.init(timeout=60, mismatch_every=2, mismatch_ms=60_000,
                      node_size=node_size or None) as ctx:
        comm = ctx.world.dup()
        one_node = bool(comm._state.shm) and len(comm._state.shm["local"]) == comm.size
        for _ in range(40):                          # more checks than the board's entries
            comm.allreduce(np.ones(3, np.int64)).wait(timeout=30)
            work = comm.broadcast(np.ones(2, np.float32), root=comm.size - 1)
            assert type(work.check) is (BoardCheckLane if one_node else CheckLane)
            work.wait(timeout=30)
        assert one_node == (node_size == 0) or not comm._state.shm
        op_mismatch(comm)                            # #80, garbage
        with pytest.raises(CollectiveMismatch) as info:
            comm.barrier().wait(timeout=30)          # #81 carries the digest
        check(info.value, 80)


def test_a_quiet_communicator_is_compared_after_mismatch_ms():
    """No further collective after the mismatch: the control plane's note finds it, and
    the next call there raises it."""
    with hpccoll.init(timeout=60, mismatch_every=1000, mismatch_ms=50) as ctx:
        comm = ctx.world.dup()
        op_mismatch(comm)                            # #0
        deadline = time.monotonic() + 10
        while comm.broken is None and time.monotonic() < deadline:
            time.sleep(0.01)                         # the engine thread compares meanwhile
        with pytest.raises(CollectiveMismatch) as info:
            comm.barrier()
        check(info.value, 0)
        with pytest.raises(ContextClosed, match="unusable"):
            comm.barrier()


@pytest.mark.parametrize("longer", [300, 3000])
def test_a_stalled_wait_probes(longer):
    """Counts that differ on hpccoll's own point-to-point algorithm: the transfers cannot
    line up, a wait stalls, a probe finds who differs, every rank raises (a rank whose
    shorter message completed its own part raises on its next call there).  ``longer``:
    rank 0's count, an eager message (1.2 KB) or one sent by rendezvous (12 KB)."""
    if longer > 1000 and MPI.Get_library_version().startswith("Open MPI"):
        pytest.skip("Open MPI 5 dies (SIGSEGV) when a message sent by rendezvous is "
                    "truncated, with or without hpccoll")
    with hpccoll.init(timeout=60, mismatch_every=1000, mismatch_ms=50, mpi_coll_bytes=0,
                      cell_bytes=0, shm=False) as ctx:
        comm = ctx.world.dup()
        n = longer if ctx.rank == 0 else 5
        with pytest.raises(CollectiveMismatch) as info:
            comm.allreduce(np.ones(n, np.float32)).wait(timeout=30)
            deadline = time.monotonic() + 10
            while comm.broken is None and time.monotonic() < deadline:
                time.sleep(0.01)
            comm.barrier()
        assert set(info.value.fields) == {"count"}
        assert info.value.ranks and set(info.value.ranks) <= set(range(ctx.size))


def test_close_compares_what_was_not_compared_yet(mpi_world):
    """The mismatched collective is the last one: close() finds it on every rank and
    raises it once everything is freed (a with block does, when nothing else went wrong)."""
    ctx = hpccoll.init(timeout=60, mismatch_every=1000, mismatch_ms=60_000)
    op_mismatch(ctx.world)
    with pytest.raises(CollectiveMismatch) as info:
        ctx.close()
    check(info.value, 0)
    mpi_world.Barrier()          # every rank got here: nobody was left in close()


@pytest.mark.parametrize("kind", ["op", "dtype", "root"])
def test_free_compares_the_last_collectives(kind, mpi_world):
    """A mismatch in the last collective before free(): free() raises it on every rank,
    once the communicator is released (before, it was freed unchecked, and the wrong
    data stood).  Same bytes on the wire each time: MPI would complete the call."""
    r = mpi_world.rank
    with hpccoll.init(timeout=60, mismatch_every=1000, mismatch_ms=60_000) as ctx:
        comm = ctx.world.dup()
        comm.barrier().wait()                                        # #0 agrees
        if kind == "op":
            op_mismatch(comm)                                        # #1
        elif kind == "dtype":
            x = np.ones(4, np.int32 if r == 0 else np.float32)
            comm.allreduce(x, np.empty_like(x)).wait()
        else:
            comm.broadcast(np.zeros(4), root=int(r == 1)).wait()
        with pytest.raises(CollectiveMismatch) as info:
            comm.free()
        assert f"collective #1 " in str(info.value)
        assert set(info.value.fields) >= {kind}, info.value.fields
        if kind == "op":
            check(info.value, 1)
        with pytest.raises(ContextClosed):
            comm.barrier()
        comm.free()                                    # again: nothing left to compare
        ok = ctx.world.dup()                           # the context goes on
        ok.allreduce(np.ones(2)).wait(timeout=30)
        ok.free()                                      # agrees: no error
    mpi_world.Barrier()


def test_free_names_a_rank_that_issued_more(mpi_world):
    """Rank 0 issues one more collective than the others before free(): its extra one
    fails at once (ContextClosed: nobody will join it), and free() raises on every rank
    how many each issued."""
    r = mpi_world.rank
    with hpccoll.init(timeout=60, mismatch_every=1000, mismatch_ms=60_000) as ctx:
        comm = ctx.world.dup()
        comm.allreduce(np.ones(2)).wait()
        extra = comm.allreduce(np.ones(2)) if r == 0 else None
        with pytest.raises(CollectiveMismatch) as info:
            comm.free()
        if mpi_world.size > 2:                  # (at 2 ranks, neither is the odd one)
            assert info.value.ranks == (0,)
        assert info.value.fields["collectives issued"] == {
            "2": [0], "1": list(range(1, mpi_world.size))}
        if extra is not None:
            with pytest.raises(ContextClosed, match="freed communicator"):
                extra.wait(timeout=30)
    mpi_world.Barrier()


@pytest.mark.parametrize("coll", ["gather", "scatter"])
@pytest.mark.parametrize("per_rank", [1 << 20, 4 << 20])
def test_a_root_mismatch_in_single_copy_raises_collective_mismatch(coll, per_rank, mpi_world):
    """Ranks 0 and 1 each name themselves the root of a gather or scatter large enough to
    move by single copy (each reads or writes a peer's buffer in place): the peer's
    buffer is not what this rank expects (EFAULT), which was raised raw ("Bad address");
    now every rank raises the CollectiveMismatch naming the root, from the call or (where
    the call completed, by reference beyond 2 ranks) from close()."""
    r, n = mpi_world.rank, mpi_world.size
    m = per_rank // 4
    root = min(r, 1)
    with pytest.raises(CollectiveMismatch) as info:
        with hpccoll.init(timeout=30) as ctx:
            comm = ctx.world
            if coll == "gather":
                work = comm.gather(np.ones(m, np.float32), np.empty(m * n, np.float32),
                                   root=root)
            else:
                work = comm.scatter(np.ones(m * n, np.float32), np.empty(m, np.float32),
                                    root=root)
            work.wait(timeout=30)
    assert "root" in info.value.fields, str(info.value)
    mpi_world.Barrier()


def test_close_raises_a_verdict_that_no_call_has_carried(mpi_world):
    """A note finds the mismatch after its collective completed and no call follows on
    that communicator: the verdict broke it on every rank, and close() raises it on every
    rank (it does not vanish with the communicator it broke)."""
    ctx = hpccoll.init(timeout=60, mismatch_every=1000, mismatch_ms=20)
    op_mismatch(ctx.world)
    deadline = time.monotonic() + 20
    while ctx.world.broken is None and time.monotonic() < deadline:
        time.sleep(0.01)         # the engine's thread notes, probes and applies the verdict
    assert ctx.world.broken is not None
    with pytest.raises(CollectiveMismatch) as info:
        ctx.close()
    check(info.value, 0)
    mpi_world.Barrier()


def test_a_mismatch_writes_each_ranks_flight_record(tmp_path_factory, mpi_world):
    """dump_dir: every member that detects the mismatch writes its own flight record, which
    hpccoll-report reads: the mismatched collective is the last one each rank did."""
    from hpccoll import h5log
    from hpccoll.engine.flight import summary
    where = mpi_world.bcast(str(tmp_path_factory.mktemp("flight")) if mpi_world.rank == 0
                            else None, root=0)
    with hpccoll.init(timeout=60, check_mismatch="every", dump_dir=where) as ctx:
        comm = ctx.world.dup(name="m")
        comm.allreduce(np.ones(3)).wait()
        with pytest.raises(CollectiveMismatch):
            comm.allreduce(np.arange(4, dtype=np.int32),
                           op="max" if comm.rank == 1 else "sum").wait(timeout=30)
    mpi_world.Barrier()
    import glob
    mine = glob.glob(f"{where}/hpccoll-flight-*-rank{mpi_world.rank}-*.h5")
    assert len(mine) == 1, mine
    (run,) = h5log.read(mine[0])
    assert run.kind == "flight" and run.attrs["reason"] == "mismatch"
    assert "ranks disagree about collective #1" in run.attrs["trigger"]
    rows = run.tables["entries"]
    assert [(r["ident"], r["state"]) for r in rows][-1:] == [("m#0", "done")]
    text = "\n".join(summary(run))
    assert "flight record: mismatch detected on rank" in text
    assert "allreduce m#1 int32 x4" in text and "(pending)" in text


@pytest.mark.parametrize("mode", ["deferred", "every", "off"])
def test_a_truncated_message_raises_on_every_rank(mode):
    """Alltoallv where rank 0 sends rank 1 one element more than rank 1 expects: only
    rank 1's MPI sees it (a truncated receive).  Rank 1 raises CollectiveMismatch naming
    rank 0 and tells the others: they raise it in the Alltoallv if it is still pending
    there, else at their next call on that communicator (their call returned and the next
    one waited forever, in every mode)."""
    import hpccoll.mpi
    from mpi4py import MPI
    comm = hpccoll.mpi.Comm(MPI.COMM_WORLD, timeout=30, check_mismatch=mode)
    try:
        c = comm.Dup()
        n, r = c.size, c.rank
        scounts = [2] * n
        if r == 0:
            scounts[1] = 3
        sdispl = [sum(scounts[:i]) for i in range(n)]
        sbuf = np.arange(sum(scounts), dtype=np.float64)
        rbuf = np.zeros(2 * n)
        spec = [rbuf, ([2] * n, [2 * i for i in range(n)]), MPI.DOUBLE]
        if r == 1:
            with pytest.raises(CollectiveMismatch, match=r"rank\(s\) \[0") as got:
                c.Alltoallv([sbuf, (scounts, sdispl), MPI.DOUBLE], spec)
            assert 0 in got.value.ranks
            with pytest.raises(ContextClosed):
                c.Allreduce(np.ones(1), np.zeros(1))
        else:       # at the Alltoallv where it was still pending when rank 1 told, or next
            with pytest.raises(CollectiveMismatch, match="found by rank 1"):
                c.Alltoallv([sbuf, (scounts, sdispl), MPI.DOUBLE], spec)
                c.Allreduce(np.ones(1), np.zeros(1))
        c.Free()
        out = np.zeros(1)                        # the other communicators are untouched
        comm.Allreduce(np.ones(1), out)
        assert out[0] == n
    finally:
        comm.context.close()
