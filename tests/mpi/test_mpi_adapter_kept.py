"""The adapter reads the same arguments once (``_calls.Kept``): a message passed again as
the very same objects reuses its reading, anything changed in it is read anew.  Results
against mpi4py's own collectives on a duplicate of the world, every iteration."""
import mmap
import warnings

import numpy as np
import pytest
from mpi4py import MPI

pytestmark = pytest.mark.mpi


def test_the_osu_loop_same_list_new_contents(adapter, world):
    """mpi4py's OSU demos: ``msg = [buf, size, MPI.BYTE]`` then Bcast(msg) in a loop."""
    r = world.rank
    buf, ref = mmap.mmap(-1, 4096), mmap.mmap(-1, 4096)
    for size in (1, 8, 100, 4096):
        msg, want = [buf, size, MPI.BYTE], [ref, size, MPI.BYTE]
        for it in range(20):
            if r == it % world.size:
                data = bytes((it * 7 + k) % 251 for k in range(size))
                buf[:size], ref[:size] = data, data
            adapter.Bcast(msg, it % world.size)
            world.Bcast(want, it % world.size)
            assert buf[:size] == ref[:size], (size, it)
    assert adapter.stats["Bcast"]["native"] >= 80


def test_a_changed_item_is_read_again(adapter, world):
    """The same list with another count, the same array with another dtype: read anew."""
    r, n = world.rank, world.size
    a = np.zeros(64, np.int32)
    msg = [a, 64, MPI.INT]
    a[:] = r + 1
    adapter.Allreduce(MPI.IN_PLACE, msg)
    assert (a == n * (n + 1) // 2).all()
    a[:] = r + 1
    msg[1] = 10                                    # fewer elements: the rest untouched
    adapter.Allreduce(MPI.IN_PLACE, msg)
    assert (a[:10] == n * (n + 1) // 2).all() and (a[10:] == r + 1).all()
    b = np.full(8, r + 1, np.int32)
    adapter.Allreduce(MPI.IN_PLACE, [b, MPI.INT])
    b.dtype = np.int16                             # in place: twice the elements
    b[:] = r + 1
    adapter.Allreduce(MPI.IN_PLACE, [b, MPI.SHORT])
    assert b.dtype == np.int16 and (b == n * (n + 1) // 2).all()


def test_the_v_forms_counts_are_read_every_time(adapter, world):
    """Reduce_scatter's recvcounts, changed in place between calls, always count."""
    r, n = world.rank, world.size
    counts = np.ones(n, np.int64)
    send = np.arange(2 * n, dtype=np.float64) + r
    for k in (1, 2):
        counts[:] = k
        out = np.zeros(k, np.float64)
        adapter.Reduce_scatter(send[:k * n], out, counts)
        want = np.zeros(k, np.float64)
        world.Reduce_scatter(send[:k * n], want, counts)
        np.testing.assert_array_equal(out, want)


def test_nonblocking_forms_reuse_the_reading_too(adapter, world):
    r, n = world.rank, world.size
    x = np.full(4, r, np.float64)
    y = np.zeros(4)
    for it in range(10):
        x[:] = r + it
        adapter.Iallreduce([x, MPI.DOUBLE], [y, MPI.DOUBLE]).Wait()
        assert (y == n * it + n * (n - 1) // 2).all()


def test_a_kept_call_on_a_freed_communicator_raises_mpi4pys_error(adapter, world):
    """Allreduce and Bcast keep the last small arrays' reading with what their run needs;
    after Free the very same arrays again raise MPI's error, as mpi4py does, and nothing
    is issued."""
    comm, theirs = adapter.Dup(), world.Dup()
    x, y = np.arange(4, dtype=np.int64), np.empty(4, np.int64)
    for _ in range(3):
        comm.Allreduce(x, y)
        assert y.tolist() == (np.arange(4) * world.size).tolist()
        comm.Bcast(x, 0)
    issued = comm.context._engine.flight.rows(0.0)
    comm.Free()
    theirs.Free()
    for call in (lambda c: c.Allreduce(x, y), lambda c: c.Bcast(x, 0),
                 lambda c: c.Allreduce(MPI.IN_PLACE, y)):
        with pytest.raises(MPI.Exception) as want:
            call(theirs)
        with pytest.raises(MPI.Exception) as got:
            call(comm)
        assert got.value.Get_error_class() == want.value.Get_error_class()
    assert len(comm.context._engine.flight.rows(0.0)) == len(issued)


def test_a_kept_reading_sees_flags_and_strides_changed_in_place(adapter, world):
    """The same arrays again reuse their reading (Gather, Scatter, Allgather: the kept
    path every method without one of its own takes); an array made read-only, or given
    other strides, in place, is read anew and raises or runs as mpi4py does."""
    r, n = world.rank, world.size
    x = np.arange(4, dtype=np.int64) + 10 * r
    g, ref = np.zeros(4 * n, np.int64), np.zeros(4 * n, np.int64)
    for it in range(5):
        x += 1
        adapter.Gather(x, g, root=it % n)
        world.Gather(x, ref, root=it % n)
        if r == it % n:
            np.testing.assert_array_equal(g, ref)
        s, t = np.zeros(4, np.int64), np.zeros(4, np.int64)
        adapter.Scatter(g, s, root=it % n)
        world.Scatter(ref, t, root=it % n)
        np.testing.assert_array_equal(s, t)
    adapter.Allgather(x, g)
    g.flags.writeable = False
    with pytest.raises(BufferError):
        world.Allgather(x, g)
    with pytest.raises(BufferError):
        adapter.Allgather(x, g)
    g.flags.writeable = True
    wide = np.zeros(8 * n, np.int64)
    view = wide[:4 * n]
    adapter.Allgather(x, view)
    world.Allgather(x, ref)
    np.testing.assert_array_equal(view, ref)
    with warnings.catch_warnings():     # (NumPy 2.4 deprecates it; it still does it)
        warnings.simplefilter("ignore", DeprecationWarning)
        view.strides = (16,)            # in place: the same object, now every other entry
    with pytest.raises(Exception) as theirs:
        world.Allgather(x, view)
    with pytest.raises(theirs.type):
        adapter.Allgather(x, view)
    assert adapter.stats["Gather"]["native"] == 5 and adapter.stats["Scatter"]["native"] == 5
