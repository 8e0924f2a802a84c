"""Lifetimes: what the application holds, frees or closes never crashes, hangs or leaks
(issue 18's findings on the new core): a finished collective keeps no memory alive,
free() lets pending collectives complete, a registered array stays valid after close(),
a done-callback may wait for a collective, bad registered allocations raise clearly."""
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll

sys.path.insert(0, str(Path(__file__).parents[2] / "scripts"))
from many_comms import hold_contexts  # noqa: E402  (scripts/many_comms.py)


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def test_results_nobody_keeps_are_freed():
    """A loop of 16 MiB allreduces whose results are discarded: flat RSS (each result
    lived on until Python's cycle collector ran, 64 MiB an iteration at 32 MiB)."""
    with hpccoll.init(timeout=60) as ctx:
        x = np.ones(1 << 22, np.float32)
        for _ in range(3):
            ctx.world.allreduce(x).wait()
        before = rss_mib()
        for _ in range(20):
            ctx.world.allreduce(x).wait()
        assert rss_mib() - before < 3 * 16       # 20 iterations of 16 MiB would be 320


def freed(refs, seconds: float = 5.0) -> bool:
    """Whether the weakly referenced objects are gone, within ``seconds`` (the thread
    that completed a collective may hold it in a local variable for a moment longer)."""
    import gc
    deadline = time.monotonic() + seconds
    while any(r() is not None for r in refs):
        if time.monotonic() > deadline:
            return False
        gc.collect()
        time.sleep(0.001)
    return True


@pytest.mark.parametrize("policy", ["preemptive", "ordered", "fifo"])
def test_the_last_result_is_not_kept_alive(policy):
    """A result the program dropped is freed at once, not when the communicator's next
    collective comes (the communicator kept its last task, and the preemptive policy the
    last one it scheduled): MPI's own collective (8 B), shared-memory programs (280 KiB,
    1 MiB), allocated and in place."""
    import weakref
    with hpccoll.init(timeout=60, policy=policy) as ctx:
        comm = ctx.world.dup()
        for n in (2, 70_001, 1 << 18):
            out = comm.allreduce(np.ones(n, np.float32)).wait()
            assert out[0] == ctx.size
            buf = np.ones(n, np.float32)
            comm.allreduce(buf, buf).wait()
            gone = [weakref.ref(out)]
            if n * 4 > 64 << 10:     # (smaller arrays passed again and again are kept
                gone.append(weakref.ref(buf))     # until other arrays come, by design)
            del out, buf
            assert freed(gone), n
        comm.free()


def test_free_lets_pending_collectives_complete(mpi_world):
    with hpccoll.init(timeout=60) as ctx:
        d = ctx.world.dup()
        x = np.ones(1 << 18, np.float64)
        w = d.allreduce(x)
        d.free()
        np.testing.assert_array_equal(w.wait(timeout=30), np.full(x.size, ctx.size))
        with pytest.raises(hpccoll.ContextClosed, match="freed"):
            d.allreduce(x)


def open_files() -> tuple:
    """(descriptors open in this process, mappings of hpccoll's node-shared files)."""
    with open("/proc/self/maps") as f:
        mapped = sum(1 for line in f if "hpccoll-" in line)
    return len(os.listdir("/proc/self/fd")), mapped


def test_a_freed_communicator_keeps_no_mapping_or_descriptor(mpi_world):
    """Each dup() maps a node-shared file; free() unmaps it and closes its descriptor at
    once, though the flight recorder still names the communicator's last collectives
    (their plans pointed into the mapping: 2,500 dup/free cycles held 40 more
    descriptors and 140 MiB of /dev/shm per rank before)."""
    with hpccoll.init(timeout=60) as ctx:
        def cycle():
            c = ctx.world.dup()
            for n in (2, 1000, 300_000):    # cells, shared-memory programs in C, large
                x = np.ones(n * c.size)
                out = np.empty_like(x)
                c.allreduce(x, out).wait(timeout=30)
                c.broadcast(x).wait(timeout=30)
                c.allgather(x[:n], out).wait(timeout=30)
                c.alltoall(x, out).wait(timeout=30)
            np.testing.assert_array_equal(out[::n], np.ones(c.size))
            c.free()
        cycle()
        fds, mapped = open_files()
        for _ in range(30):
            cycle()
        now = open_files()
        assert now[1] <= mapped, (mapped, now)
        assert now[0] <= fds, (fds, now)


def test_adapter_free_with_a_request_pending(mpi_world):
    """Legal MPI (MPI_Comm_free lets pending operations complete), as mpi4py runs it."""
    import hpccoll.mpi
    comm = hpccoll.mpi.Comm(MPI.COMM_WORLD, timeout=60)
    try:
        c = comm.Dup()
        x = np.ones(1 << 18, np.float64)
        y = np.zeros_like(x)
        r = c.Iallreduce(x, y)
        c.Free()
        r.Wait()
        np.testing.assert_array_equal(y, np.full(x.size, comm.size))
    finally:
        comm.context.close()


def test_registered_array_outlives_its_context():
    with hpccoll.init(timeout=60) as ctx:
        a = ctx.zeros(1 << 16, np.float64)
        b = a[10:20]
        a[:] = ctx.rank + 1
    assert a.sum() == (ctx.rank + 1) * (1 << 16)      # the memory is still mapped
    b[:] = 7
    assert a[10] == 7
    with hpccoll.init(timeout=60) as ctx:             # a registered array nobody keeps
        ctx.zeros(1 << 16, np.float64)


def test_bad_registered_allocations_raise_before_anything_is_allocated():
    with hpccoll.init(timeout=60) as ctx:
        with pytest.raises(hpccoll.ArgumentTypeError, match="dtype"):
            ctx.empty(4, object)
        with pytest.raises(hpccoll.HpcCollError, match="node-shared memory"):
            ctx.empty(1 << 50, np.uint8)
        np.testing.assert_array_equal(ctx.world.allreduce(np.ones(2)).wait(), ctx.size)


def test_a_done_callback_may_wait_for_a_collective():
    """Callbacks run once the engine's lock is released: one that issues and waits for a
    collective completes (it deadlocked on the engine's own lock)."""
    with hpccoll.init(timeout=60) as ctx:
        got = []

        def callback(w):
            got.append(ctx.world.allreduce(np.ones(3)).wait(timeout=30))
        w = ctx.world.allreduce(np.ones(1 << 16))
        w.add_done_callback(callback)
        w.wait(timeout=30)
        deadline = __import__("time").monotonic() + 30
        while not got and __import__("time").monotonic() < deadline:
            __import__("time").sleep(0.001)
        np.testing.assert_array_equal(got[0], np.full(3, ctx.size))


def test_running_out_of_communicators_is_a_clear_error_and_leaves_nothing_behind():
    """MPI's limit on communicators (MPICH: 2,048 contexts per process; Intel MPI and
    Open MPI have more, so all but 2,048 are taken first) ends in ResourcesExhausted naming
    what ran out, how many are live and what to do, on every rank; a failed creation takes
    nothing (repeated failures do not eat what freeing frees again), and freed
    communicators make room for new ones."""
    held = hold_contexts(MPI, 2048)
    try:
        run_out_of_communicators()
    finally:
        for c in held:
            c.Free()


def run_out_of_communicators():
    with hpccoll.init(timeout=60, shm_slot_bytes=4096, shm_slots=1) as ctx:
        comms = []
        with pytest.raises(hpccoll.ResourcesExhausted) as info:
            for _ in range(5000):
                comms.append(ctx.world.dup())
        text = str(info.value)
        assert "MPI ran out of communicator contexts" in text
        assert f"{len(comms) + 1} hpccoll communicator(s) are live on this rank" in text
        assert "free() the ones no longer used" in text
        for _ in range(5):
            with pytest.raises(hpccoll.ResourcesExhausted):
                ctx.world.dup()
        for c in comms[-2:]:
            c.free()
        again = [ctx.world.dup(), ctx.world.dup()]
        for c in again:
            assert c.allreduce(np.ones(2)).wait().tolist() == [ctx.size] * 2
        for c in comms[:-2] + again:
            c.free()
        assert ctx.world.allreduce(np.ones(1)).wait().tolist() == [ctx.size]


@pytest.mark.parametrize("nbytes", [8, 280_000])
@pytest.mark.parametrize("late", [False, True])
def test_a_collective_a_closed_peer_never_joins_fails_on_every_other_rank(nbytes, late):
    """Rank 0 closes while the others issue one more collective (before its closing notice
    arrives, or after): theirs raises ContextClosed naming rank 0 at once, so do later
    ones, and every close() returns without a mismatch report.  (The collective returned
    garbage: the final mismatch comparison posted on the data communicator and matched it.)"""
    if MPI.COMM_WORLD.size < 2:
        pytest.skip("needs a peer that closes")
    n = nbytes // 4
    with hpccoll.init(timeout=30, close_timeout=20) as ctx:
        comm = ctx.world.dup()
        for _ in range(3):
            np.testing.assert_array_equal(comm.allreduce(np.ones(n, np.float32)).wait(),
                                          np.full(n, ctx.size, np.float32))
        if ctx.rank == 0:
            if not late:
                time.sleep(0.2)       # the others' collective is posted, and waits
            ctx.close()
            return
        if late:
            time.sleep(0.2)           # rank 0's notice is here before the collective
        t = time.monotonic()
        with pytest.raises(hpccoll.ContextClosed, match="rank 0 closed"):
            comm.allreduce(np.ones(n, np.float32)).wait(timeout=20)
        assert time.monotonic() - t < 10
        with pytest.raises(hpccoll.ContextClosed):
            comm.allreduce(np.ones(n, np.float32)).wait(timeout=20)


def test_a_child_forked_after_init_gets_an_error_before_anything_is_sent():
    """A child forked after init shares its parent's MPI connections: its collective would
    be matched by the parent's peers (their next allreduce returned 1005 instead of 6).
    It raises HpcCollError naming the fork; the parents' next collective is right."""
    import os
    if not hasattr(os, "fork"):
        pytest.skip("no fork here")
    with hpccoll.init(timeout=30) as ctx:
        np.testing.assert_array_equal(ctx.world.allreduce(np.ones(3)).wait(), ctx.size)
        pid = os.fork()
        if pid == 0:                  # the child: never returns into pytest
            code = 3
            try:
                try:
                    ctx.world.allreduce(np.full(3, 1000.0)).wait(timeout=5)
                    code = 2
                except hpccoll.HpcCollError as e:
                    code = 0 if "forked" in str(e) else 4
                ctx.close()           # a no-op in the child
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        for _ in range(3):
            np.testing.assert_array_equal(ctx.world.allreduce(np.ones(3)).wait(timeout=20),
                                          np.full(3, ctx.size))
