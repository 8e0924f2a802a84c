"""One function per natively run collective, all the same shape: read the mpi4py
arguments in mpi4py's order (raising what mpi4py raises), decide, and return either the
validated call (``hpccoll.core.validate.Call``) that the pipeline issues as it is, or
FORWARD.  Arguments are checked here, once: the pipeline does not check them again.

FORWARD means "let mpi4py do it": a datatype or op hpccoll lacks, a device buffer,
send and receive datatypes that differ.  The decision depends only on the datatypes and
the op, which every rank passes alike, so all ranks of a collective take the same path.
Errors MPI itself reports (root out of range, aliased buffers, negative counts) are
raised as the ``MPI.Exception`` of that error class, before anything is queued.
"""
from __future__ import annotations

import operator

import numpy as np

from ..core import validate
from ..core.validate import Call
from ._message import index_array, is_in_place, overlap, simple, vector, view
from ._types import _ARRAYS, MPI, derived_accepts, fast_dtype, native_dtype, native_op

_C_ALIGNED = 0x1 | 0x100     # NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED
_WRITEABLE = 0x400

FORWARD = None


# -- checks shared by the collectives ---------------------------------------------------

def _root(root) -> int:
    """mpi4py's ``int root``: integers (and numbers with __int__), never strings."""
    try:
        return operator.index(root)
    except TypeError:
        if isinstance(root, (str, bytes)) or not hasattr(type(root), "__int__"):
            raise TypeError("an integer is required") from None
        return int(root)


def _op(op) -> None:
    if not isinstance(op, MPI.Op):
        raise TypeError(f"Argument 'op' has incorrect type (expected mpi4py.MPI.Op, "
                        f"got {type(op).__name__})")


def _check_root(root: int, size: int) -> None:
    if not 0 <= root < size:
        raise MPI.Exception(MPI.ERR_ROOT)


def _declared(m):
    """The datatype the caller passed (``m.datatype`` is what it unrolls to)."""
    return m.datatype if m.declared is None else m.declared


def _same(s, r) -> None:
    """mpi4py's check of a reduction's send and receive buffers."""
    if _declared(s) != _declared(r):
        raise ValueError("mismatch in send and receive MPI datatypes")
    if s.count != r.count:
        raise ValueError(f"mismatch in send count {s.count // s.scale} and receive count "
                         f"{r.count // r.scale}")


def _alias(x: np.ndarray, y: np.ndarray) -> None:
    """MPI rejects a send buffer that overlaps the receive buffer (MPI_IN_PLACE is the way)."""
    if overlap(x, y):
        raise MPI.Exception(MPI.ERR_BUFFER)


def _on_device(*msgs) -> bool:
    return any(m is not None and m.device for m in msgs)


def _dtype(r, s=None):
    """The NumPy dtype both buffers run as, or None to forward (a datatype hpccoll lacks,
    or send and receive datatypes that differ: MPI then moves the bytes as they are)."""
    dt = native_dtype(r.datatype)
    if dt is None or (s is not None and native_dtype(s.datatype) != dt):
        return None
    return dt


def _reduction(m, op):
    """(dtype, hpccoll op) for reducing message m's datatype with ``op``; op None to
    forward (also where MPI does not take a predefined op on the caller's derived type)."""
    dt = native_dtype(m.datatype)
    name = None if dt is None else native_op(op, m.datatype, dt)
    if name is not None and m.declared is not None and \
            not derived_accepts(op, m.declared, dt, m.scale):
        name = None
    return dt, name


def _reduce_types(r, s, op):
    """(dtype, hpccoll op) of a reduction with receive buffer r and send buffer s (None:
    in place), after mpi4py's buffer checks; None to forward (device buffers, or a
    datatype or op hpccoll lacks)."""
    if _on_device(r, s):
        return None
    if s is not None:
        _same(s, r)
    dt, name = _reduction(r, op)
    return None if name is None else (dt, name)


def _counts(*vms) -> None:
    if any(c < 0 for vm in vms if vm is not None for c in vm.counts):
        raise MPI.Exception(MPI.ERR_COUNT)


def _span(vm) -> int:
    """Entries of a v-buffer that its blocks reach."""
    ends = [d + c for c, d in zip(vm.counts, vm.displs) if c]
    if any(d < 0 for c, d in zip(vm.counts, vm.displs) if c):
        raise ValueError(f"message: negative displacement in {list(vm.displs)}")
    return max(ends, default=0)


_EMPTY = np.empty(0, np.uint8)

# A loop that broadcasts one small array reads it once: an adapter method keeps the Call
# of its last plain 1-D array up to this size (and so a reference to it) and hands it
# over again while the array, its flags and its dtype are the same.
RECENT_BYTES = 64 << 10


# -- the same arguments again ------------------------------------------------------------
# A loop passes the same message again and again, often as the same list object
# (mpi4py's OSU demos: ``msg = [buf, size, MPI.BYTE]`` then ``comm.Bcast(msg, 0)`` a
# thousand times): reading it is most of a small call's cost (17.8 us against 4.5 for a
# plain array).  ``Kept`` remembers the Call read from a method's last arguments while
# they are the very same objects: every argument and every item of a message list, every
# NumPy array with the same flags and dtype.  Only what cannot change behind an identity is
# taken: buffers whose memory an export pins (NumPy arrays, bytes, bytearray, mmap,
# array.array, memoryview: the Call's views hold an export, so none can be resized), counts
# and roots (ints), MPI's predefined datatypes and ops, MPI.IN_PLACE; never a v-form's
# counts (a list or array the caller may change in place), never a large buffer (kept
# alive otherwise).
KEPT_METHODS = frozenset(
    prefix + name for prefix in ("", "I") for name in (
        "Barrier", "Bcast", "Reduce", "Allreduce", "Allgather", "Alltoall",
        "Reduce_scatter_block", "Gather", "Scatter", "Scan", "Exscan")) | {"barrier"}


def _buffer_class():
    import array
    import mmap
    return (np.ndarray, bytes, bytearray, mmap.mmap, array.array, memoryview)


_PINNED = _buffer_class()


def _steady(x) -> bool:
    """Whether ``x`` can stand in a kept reading (see above)."""
    cls = type(x)
    if cls is int or x is MPI.IN_PLACE or x is None or cls in _PINNED:
        return True
    if cls is MPI.Datatype or cls is MPI.Op:
        return x.is_predefined
    return False


class Kept:
    """The Call read from one method's last arguments (see above)."""

    def __init__(self, args: tuple, call):
        self.args, self.call = args, call
        self.counts = None  # the method's stats counters (Runner.read)
        # the message lists' items (a list is looked into: its items may be replaced)
        self.lists = tuple((i, tuple(a)) for i, a in enumerate(args)
                           if type(a) is list or type(a) is tuple)
        arrays = [a for a in args if type(a) is np.ndarray]
        arrays += [x for _, items in self.lists for x in items if type(x) is np.ndarray]
        # each array with its flags and dtype (both can change in place)
        self.arrays = tuple(arrays)
        self.flags = tuple(a.flags.num for a in arrays)
        self.dtypes = tuple(a.dtype for a in arrays)

    def holds(self, args: tuple) -> bool:
        """The same arguments, unchanged."""
        mine = self.args
        n = len(mine)
        if len(args) != n:
            return False
        for i in range(n):
            if args[i] is not mine[i]:
                return False
        for i, items in self.lists:
            a = args[i]
            n = len(items)
            if len(a) != n:
                return False
            for k in range(n):
                if a[k] is not items[k]:
                    return False
        arrays, flags, dtypes = self.arrays, self.flags, self.dtypes
        for k in range(len(arrays)):
            a = arrays[k]
            if a.flags.num != flags[k] or a.dtype is not dtypes[k]:
                return False
        return True


def keep(name: str, args: tuple, call):
    """A Kept for ``call`` read from ``args`` by method ``name``, or None where its
    reading may not be kept."""
    if name not in KEPT_METHODS or call is FORWARD or call.result is not None:
        return None
    send, recv = call.send, call.recv
    if ((send is not None and send.nbytes > RECENT_BYTES)
            or (recv is not None and recv.nbytes > RECENT_BYTES * 64)):
        return None
    for a in args:
        if type(a) is list or type(a) is tuple:
            if len(a) > 3 or not all(_steady(x) and type(x) is not tuple for x in a):
                return None
        elif not _steady(a):
            return None
    return Kept(args, call)


class Runner:
    """One adapter's native calls (``hpccoll.mpi.Comm._run``): read the arguments once
    (the Kept reading of a method's last ones, while they are the same), count the call,
    issue it on the communicator's one per-call path (``CommState.issue``), wait for it
    where it blocks, or forward it to mpi4py.  A class of its own, typed in _calls.pxd, so
    that a blocking call's way from the adapter method to ``issue`` is C calls on typed
    fields instead of attribute lookups on the adapter, an mpi4py subclass (about 3,000
    instructions of an 18,000-instruction 8 B Scatter)."""

    def __init__(self, hc, mpi_comm, stats):
        self.hc, self.mpi, self.stats = hc, mpi_comm, stats
        self.st, self.blocks = hc._state, hc._blocks
        self.kept = {}        # method -> Kept (any other message, read once)
        self.freed = False    # (Free: every later call raises MPI's ERR_COMM)

    def read(self, name: str, read, args: tuple):
        """The Kept reading of ``args`` by method ``name`` (its counters in ``counts``):
        the kept one while they are the last ones, unchanged, else read anew and kept
        for next time where it may be; None where the call is forwarded."""
        kept = self.kept.get(name)
        if kept is not None and kept.holds(args):
            return kept
        if self.freed:
            raise MPI.Exception(MPI.ERR_COMM)
        call = read(self.hc, *args)
        if call is FORWARD:
            self.kept.pop(name, None)
            return None
        kept = keep(name, args, call)
        if kept is None:
            self.kept.pop(name, None)
            kept = Kept((), call)
        else:
            self.kept[name] = kept
        kept.counts = self.stats[name]
        return kept

    def forward(self, name: str, args: tuple):
        """The call as mpi4py runs it, on the wrapped communicator (counted)."""
        self.stats[name]["forwarded"] += 1
        return getattr(self.mpi, name)(*args)

    def blocking(self, name: str, read, args: tuple):
        """Run natively, waiting on the calling thread, and return the Call that ran; or
        forward (None)."""
        kept = self.read(name, read, args)
        if kept is None:
            self.forward(name, args)
            return None
        self.again(kept.call, kept.counts)
        return kept.call

    def again(self, call, counts) -> None:
        """Run ``call`` natively, waiting, counted in ``counts`` (also Bcast's and
        Allreduce's shortcut for the same small array again: _buffers.py)."""
        counts["native"] += 1
        self.st.issue(call, None, self.blocks).wait()

    def start(self, name: str, read, args: tuple):
        """(the started collective's Work, None), or (None, mpi4py's return value) where
        forwarded."""
        kept = self.read(name, read, args)
        if kept is None:
            return None, self.forward(name, args)
        kept.counts["native"] += 1
        return self.st.issue(kept.call, None, self.blocks), None


# -- the collectives --------------------------------------------------------------------

def barrier(hc):
    return Call("barrier", _EMPTY, _EMPTY, 0, None, 0, True, None)


def bcast(hc, buf, root):
    # a NumPy array in C order and a rank: no message parsing (the common case; what
    # fast_dtype and _flat do, inline: this is the adapter's cheapest call)
    if type(buf) is np.ndarray and type(root) is int and 0 <= root < hc.size:
        flags = buf.flags.num
        if (flags & _C_ALIGNED == _C_ALIGNED
                and (_ARRAYS.get(buf.dtype) is not None or fast_dtype(buf) is not None)
                and (flags & _WRITEABLE or root == hc.rank)):
            x = buf if buf.ndim == 1 else buf.reshape(-1)
            return Call("broadcast", x, x, x.size, None, root, True, None)
    root = _root(root)
    m = simple(buf, readonly=root == hc.rank)
    _check_root(root, hc.size)
    if m.device or (dt := native_dtype(m.datatype)) is None:
        return FORWARD
    x = view(m, dt, m.count)
    return Call("broadcast", x, x, x.size, None, root, True, None)


def _flat(a):
    return a if a.ndim == 1 else a.reshape(-1)


def allreduce(hc, sendbuf, recvbuf, op):
    # NumPy arrays in C order, or MPI.IN_PLACE, and one of MPI's own ops: no message
    # parsing (the adapter's common case, and its per-call cost)
    if type(recvbuf) is np.ndarray:
        dt = fast_dtype(recvbuf)
        inplace = is_in_place(sendbuf)
        if dt is not None and (inplace or (type(sendbuf) is np.ndarray
                                           and fast_dtype(sendbuf) is dt)):
            name = native_op(op, None, dt) if type(op) is MPI.Op else None
            if name is not None and recvbuf.flags.writeable:
                y = _flat(recvbuf)
                if inplace:
                    return Call("allreduce", y, y, y.size, name, 0, True, None)
                x = _flat(sendbuf)
                if x.size != y.size:
                    raise ValueError(f"mismatch in send count {x.size} and receive count {y.size}")
                if x.base is not None or y.base is not None or x is y:
                    _alias(x, y)
                return Call("allreduce", x, y, y.size, name, 0, False, None)
    _op(op)
    r = simple(recvbuf, readonly=False)
    s = None if is_in_place(sendbuf) else simple(sendbuf, readonly=True)
    types = _reduce_types(r, s, op)
    if types is None:
        return FORWARD
    dt, name = types
    y = view(r, dt, r.count)
    x = y if s is None else view(s, dt, s.count)
    if s is not None:
        _alias(x, y)
    return Call("allreduce", x, y, y.size, name, 0, s is None, None)


def reduce(hc, sendbuf, recvbuf, op, root):
    _op(op)
    root = _root(root)
    r = s = None
    if root == hc.rank:
        r = simple(recvbuf, readonly=False)
        if not is_in_place(sendbuf):
            s = simple(sendbuf, readonly=True)
    else:   # the receive buffer matters at the root only
        s = simple(sendbuf, readonly=True)
    _check_root(root, hc.size)
    if _on_device(r, s):
        return FORWARD
    if r is not None and s is not None:
        _same(s, r)
    lead = r if r is not None else s
    dt, name = _reduction(lead, op)
    if name is None:
        return FORWARD
    if r is None:
        x = view(s, dt, s.count)
        return Call("reduce", x, np.empty(x.size, dt), x.size, name, root, False, None)
    y = view(r, dt, r.count)
    x = y if s is None else view(s, dt, s.count)
    if s is not None:
        _alias(x, y)
    return Call("reduce", x, y, y.size, name, root, s is None, None)


def allgather(hc, sendbuf, recvbuf):
    n, rank = hc.size, hc.rank
    # two NumPy arrays in C order: no message parsing (the common case)
    if type(sendbuf) is np.ndarray and type(recvbuf) is np.ndarray:
        dt = fast_dtype(recvbuf)
        if (dt is not None and fast_dtype(sendbuf) is dt and recvbuf.flags.writeable
                and recvbuf.size == n * sendbuf.size):
            x, y = _flat(sendbuf), _flat(recvbuf)
            if x.base is not None or y.base is not None or x is y:
                _alias(x, y)
            return Call("allgather", x, y, x.size, None, 0, False, None)
    r = simple(recvbuf, readonly=False, blocks=n)
    s = None if is_in_place(sendbuf) else simple(sendbuf, readonly=True)
    if _on_device(r, s) or (dt := _dtype(r, s)) is None:
        return FORWARD
    m = r.count
    if s is not None and s.count != m:
        raise ValueError(f"mismatch in send count {s.count} and receive count {m}")
    y = view(r, dt, n * m)
    if s is None:
        x = y[rank * m:(rank + 1) * m]
    else:
        x = view(s, dt, m)
        _alias(x, y)
    return Call("allgather", x, y, m, None, 0, s is None, None)


def allgatherv(hc, sendbuf, recvbuf):
    rank = hc.rank
    r = vector(recvbuf, readonly=False, blocks=hc.size)
    s = None if is_in_place(sendbuf) else simple(sendbuf, readonly=True)
    if _on_device(r, s) or (dt := _dtype(r, s)) is None:
        return FORWARD
    _counts(r)
    mine = r.counts[rank]
    if s is not None and s.count != mine:
        raise ValueError(f"mismatch in send count {s.count} and receive count {mine}")
    y = view(r, dt, _span(r))
    if s is None:
        x = y[r.displs[rank]:r.displs[rank] + mine]
    else:
        x = view(s, dt, mine)
        _alias(x, y)
    return validate.allgatherv(hc, x, y, r.counts, r.displs, s is None)


def alltoall(hc, sendbuf, recvbuf):
    n = hc.size
    r = simple(recvbuf, readonly=False, blocks=n)
    s = None if is_in_place(sendbuf) else simple(sendbuf, readonly=True, blocks=n)
    if _on_device(r, s) or (dt := _dtype(r, s)) is None:
        return FORWARD
    if s is not None and s.count != r.count:
        raise ValueError(f"mismatch in send count {s.count} and receive count {r.count}")
    y = view(r, dt, n * r.count)
    x = y if s is None else view(s, dt, n * s.count)
    if s is not None:
        _alias(x, y)
    return Call("alltoall", x, y, r.count, None, 0, s is None, None)


def alltoallv(hc, sendbuf, recvbuf):
    rank = hc.rank
    r = vector(recvbuf, readonly=False, blocks=hc.size)
    s = None if is_in_place(sendbuf) else vector(sendbuf, readonly=True, blocks=hc.size)
    if _on_device(r, s) or (dt := _dtype(r, s)) is None:
        return FORWARD
    _counts(r, s)
    if s is not None and s.counts[rank] > r.counts[rank]:
        raise MPI.Exception(MPI.ERR_TRUNCATE)   # this rank's own block does not fit
    y = view(r, dt, _span(r))
    if s is None:
        x, sc, sd = y, r.counts, r.displs
    else:
        x, sc, sd = view(s, dt, _span(s)), s.counts, s.displs
        _alias(x, y)
    return validate.alltoallv(hc, x, y, sc, sd, r.counts, r.displs, s is None)


def reduce_scatter_block(hc, sendbuf, recvbuf, op):
    _op(op)
    n = hc.size
    if is_in_place(sendbuf):   # input: n blocks of recvbuf; output: its first block
        r, s = simple(recvbuf, readonly=False, blocks=n), None
    else:
        r = simple(recvbuf, readonly=False)
        s = simple(sendbuf, readonly=True, blocks=n)
    types = _reduce_types(r, s, op)
    if types is None:
        return FORWARD
    dt, name = types
    m = r.count
    if s is None:
        full = view(r, dt, n * m)
        return validate.reduce_scatterv(hc, full, full[:m], (m,) * n, name, True)
    x, y = view(s, dt, n * m), view(r, dt, m)
    _alias(x, y)
    return Call("reduce_scatter", x, y, m, name, 0, False, None)


def reduce_scatter(hc, sendbuf, recvbuf, recvcounts, op):
    _op(op)
    n, rank = hc.size, hc.rank
    r = simple(recvbuf, readonly=False)
    s = None if is_in_place(sendbuf) else simple(sendbuf, readonly=True)
    if _on_device(r, s):
        return FORWARD
    dt, name = _reduction(r, op)
    if name is None:
        return FORWARD   # before the counts exchange below: mpi4py makes its own
    if recvcounts is None and s is not None:
        # like mpi4py: every rank's receive count, gathered (blocking, also for the
        # nonblocking form)
        counts = tuple(int(c) for c in hc.allgather(np.array([r.count], np.int64)).wait())
    else:
        counts = tuple(c * r.scale for c in index_array(recvcounts, n))
    total = sum(counts)
    if s is not None:
        if _declared(s) != _declared(r):
            raise ValueError("mismatch in send and receive MPI datatypes")
        if s.count != total:
            raise ValueError(f"mismatch in send count {s.count} and sum(counts) {total}")
        if r.count != counts[rank]:
            raise ValueError(f"mismatch in receive count {r.count} and counts[{rank}] "
                             f"{counts[rank]}")
    elif r.count != total:
        raise ValueError(f"mismatch in receive count {r.count} and sum(counts) {total}")
    if any(c < 0 for c in counts):
        raise MPI.Exception(MPI.ERR_COUNT)
    if s is None:
        x = view(r, dt, total)
        y = x[:counts[rank]]
    else:
        x, y = view(s, dt, total), view(r, dt, counts[rank])
        _alias(x, y)
    return validate.reduce_scatterv(hc, x, y, counts, name, s is None)


# -- rooted and prefix collectives --------------------------------------------------------
# mpi4py reads the receive buffer of Gather(v) and the send buffer of Scatter(v) at the
# root only (elsewhere they are not looked at: None is fine), and MPI.IN_PLACE is the
# root's send buffer of Gather(v), its receive buffer of Scatter(v).

def _rooted_dtype(lead, other):
    """The dtype a rooted collective runs as: ``lead`` is the buffer every rank passes
    (Gather's send, Scatter's receive), ``other`` the root's other one (None elsewhere,
    and in place).  Only the root sees both datatypes, so it cannot forward alone where
    they differ: a datatype as wide as ``lead``'s moves as its bytes, as MPI moves them
    (None to forward: a datatype hpccoll lacks; every rank must pass the same, as for
    every collective)."""
    dt = native_dtype(lead.datatype)
    if dt is None or other is None:
        return dt
    odt = native_dtype(other.datatype)
    return dt if odt is not None and odt.itemsize == dt.itemsize else None

def gather(hc, sendbuf, recvbuf, root):
    n, rank = hc.size, hc.rank
    # NumPy arrays in C order and a rank in range: no message parsing (the common case)
    if type(sendbuf) is np.ndarray and type(root) is int and 0 <= root < n:
        dt = fast_dtype(sendbuf)
        if dt is not None:
            x = _flat(sendbuf)
            if rank != root:
                return Call("gather", x, x[:0], x.size, None, root, False, None)
            if (type(recvbuf) is np.ndarray and fast_dtype(recvbuf) is dt
                    and recvbuf.flags.writeable and recvbuf.size == n * x.size):
                y = _flat(recvbuf)
                if x.base is not None or y.base is not None or x is y:
                    _alias(x, y)
                return Call("gather", x, y, x.size, None, root, False, None)
    root = _root(root)
    r = s = None
    if root == rank:
        r = simple(recvbuf, readonly=False, blocks=n)
        if not is_in_place(sendbuf):
            s = simple(sendbuf, readonly=True)
    else:
        s = simple(sendbuf, readonly=True)
    _check_root(root, n)
    lead, other = (r, None) if s is None else (s, r)
    if _on_device(r, s) or (dt := _rooted_dtype(lead, other)) is None:
        return FORWARD
    if r is None:
        x = view(s, dt, s.count)
        return Call("gather", x, x[:0], x.size, None, root, False, None)
    m = r.count
    if s is not None and s.count != m:
        raise ValueError(f"mismatch in send count {s.count} and receive count {m}")
    y = view(r, dt, n * m)
    if s is None:
        x = y[root * m:(root + 1) * m]
    else:
        x = view(s, dt, m)
        _alias(x, y)
    return Call("gather", x, y, m, None, root, s is None, None)


def scatter(hc, sendbuf, recvbuf, root):
    n, rank = hc.size, hc.rank
    if type(recvbuf) is np.ndarray and type(root) is int and 0 <= root < n:
        dt = fast_dtype(recvbuf)
        if dt is not None and recvbuf.flags.writeable:
            y = _flat(recvbuf)
            if rank != root:
                return Call("scatter", y[:0], y, y.size, None, root, False, None)
            if (type(sendbuf) is np.ndarray and fast_dtype(sendbuf) is dt
                    and sendbuf.size == n * y.size):
                x = _flat(sendbuf)
                if x.base is not None or y.base is not None or x is y:
                    _alias(x, y)
                return Call("scatter", x, y, y.size, None, root, False, None)
    root = _root(root)
    r = s = None
    if root == rank:
        s = simple(sendbuf, readonly=True, blocks=n)
        if not is_in_place(recvbuf):
            r = simple(recvbuf, readonly=False)
    else:
        r = simple(recvbuf, readonly=False)
    _check_root(root, n)
    lead, other = (s, None) if r is None else (r, s)
    if _on_device(r, s) or (dt := _rooted_dtype(lead, other)) is None:
        return FORWARD
    if s is None:
        y = view(r, dt, r.count)
        return Call("scatter", y[:0], y, y.size, None, root, False, None)
    m = s.count
    if r is not None and r.count != m:
        raise ValueError(f"mismatch in send count {m} and receive count {r.count}")
    x = view(s, dt, n * m)
    if r is None:
        y = x[root * m:(root + 1) * m]
    else:
        y = view(r, dt, m)
        _alias(x, y)
    return Call("scatter", x, y, m, None, root, r is None, None)


def gatherv(hc, sendbuf, recvbuf, root):
    n, rank = hc.size, hc.rank
    root = _root(root)
    r = s = None
    if root == rank:
        r = vector(recvbuf, readonly=False, blocks=n)
        if not is_in_place(sendbuf):
            s = simple(sendbuf, readonly=True)
    else:
        s = simple(sendbuf, readonly=True)
    _check_root(root, n)
    lead, other = (r, None) if s is None else (s, r)
    if _on_device(r, s) or (dt := _rooted_dtype(lead, other)) is None:
        return FORWARD
    if r is None:
        return validate.gatherv(hc, view(s, dt, s.count), None, (), (), root, False)
    _counts(r)
    mine = r.counts[rank]
    if s is not None and s.count != mine:
        raise ValueError(f"mismatch in send count {s.count} and receive count {mine}")
    y = view(r, dt, _span(r))
    if s is None:
        x = y[r.displs[rank]:r.displs[rank] + mine]
    else:
        x = view(s, dt, mine)
        _alias(x, y)
    return validate.gatherv(hc, x, y, r.counts, r.displs, root, s is None)


def scatterv(hc, sendbuf, recvbuf, root):
    n, rank = hc.size, hc.rank
    root = _root(root)
    r = s = None
    if root == rank:
        s = vector(sendbuf, readonly=True, blocks=n)
        if not is_in_place(recvbuf):
            r = simple(recvbuf, readonly=False)
    else:
        r = simple(recvbuf, readonly=False)
    _check_root(root, n)
    lead, other = (s, None) if r is None else (r, s)
    if _on_device(r, s) or (dt := _rooted_dtype(lead, other)) is None:
        return FORWARD
    if s is None:
        return validate.scatterv(hc, None, view(r, dt, r.count), (), (), root, False)
    _counts(s)
    mine = s.counts[rank]
    if r is not None and r.count != mine:
        raise ValueError(f"mismatch in send count {mine} and receive count {r.count}")
    x = view(s, dt, _span(s))
    if r is None:
        y = x[s.displs[rank]:s.displs[rank] + mine]
    else:
        y = view(r, dt, mine)
        _alias(x, y)
    return validate.scatterv(hc, x, y, s.counts, s.displs, root, r is None)


def scan(hc, sendbuf, recvbuf, op):
    # mpi4py reads Scan's and Exscan's arguments as Allreduce's
    call = allreduce(hc, sendbuf, recvbuf, op)
    if call is not FORWARD:
        call.coll = "scan"
    return call


def exscan(hc, sendbuf, recvbuf, op):
    call = allreduce(hc, sendbuf, recvbuf, op)
    if call is not FORWARD:
        call.coll = "exscan"
    return call
