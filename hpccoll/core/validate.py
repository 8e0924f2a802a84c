"""Every collective's arguments, checked once and turned into a ``Call``.

One function per collective, all the same shape: check the arrays and the other
arguments, decide in place or not, allocate the result if asked to, return a Call.
Nothing is queued here: a bad argument raises before the engine sees anything, with an
error that names the argument and says what was expected.  A Call is trusted from then
on: the plan and the issue stages never check it again (the mpi4py adapter builds Calls
from arguments it parsed itself, through ``trusted``).

Host arrays take a short path (an exact ``numpy.ndarray``, C-contiguous and aligned, of
a dtype of the table in core/ops.py); device arrays (CuPy, Numba, CUDA array interface,
DLPack) go through core/device.py.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence
from weakref import ref as _weakref

import numpy as np

from ..base.mismatch import stable_hash
from ..base.ops import _VALID, DTYPE_CODE, DTYPES, check_op, dtype_name
from ..config import MAX_BLOCKS
from ..errors import ArgumentError, ArgumentTypeError
from . import device

_C_ALIGNED = 0x1 | 0x100     # NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED
_WRITEABLE = 0x400           # NPY_ARRAY_WRITEABLE
_NOT_ARRAYS = (list, tuple, str, bytes, int, float)
ALLTOALLV_FP = -1            # alltoallv has no count that every rank shares


class Call:
    """A validated collective: flat 1-D views of the send and receive memory (NumPy
    arrays, or Numba device views), the contract's count n, and what wait() returns."""
    def __init__(self, coll, send, recv, count, op, root, inplace, result, device=None,
                 layout=(), fp_count=None):
        self.coll, self.send, self.recv, self.count = coll, send, recv, count
        self.op, self.root, self.inplace, self.result = op, root, inplace, result
        self.device = device        # None (host), or (send DeviceArray, recv DeviceArray)
        self.layout = layout        # variable counts: extra Spec fields as (name, value) pairs
        self.fp_count = fp_count    # what the mismatch check compares instead of count
        # its plan (a weak reference), and the plan cache it came from (CommState._plan)
        self.plan = self.plan_in = None
        # its arrays' memory addresses, for the C code of cells and programs: None before
        # its first use, () after it (core/state.py: addresses)
        self.addrs = None

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.send.dtype)


trusted = Call      # the adapter's calls, parsed and checked by the adapter itself


# -- the last call, again -------------------------------------------------------------------
# Validation is most of a small collective's Python cost, and a loop calls a collective on
# the same buffers again and again: each communicator keeps, per collective, the Call of its
# last plain 1-D arrays and hands it over again while the same arrays come back with the
# same flags, dtype, size and extra arguments.  Up to RECENT_BYTES the Call itself is kept
# (and so references to the arrays); larger arrays are held by weak references only, so
# that a finished collective keeps no large buffer alive, and their Call is made anew from
# the kept one's fields (one constructor call, not the checks: at 1 MiB, where every Python
# call runs on a cold cache, the checks cost 5-7 us of a 100 us broadcast).  An allocated
# result (recvbuf None) is never kept: each call gets its own.
RECENT_BYTES = 64 << 10


class Recent:
    def __init__(self):
        self.send = self.recv = self.call = self.dtype = self.weak = None
        self.a = self.b = self.sflags = self.rflags = None

    def read(self, check, args: tuple, send, recv, a=None, b=None) -> Call:
        """The Call of ``send`` and ``recv`` with extra arguments ``a`` and ``b`` (op, root):
        the kept one if these are the kept arrays, unchanged, with the same extra
        arguments (the same objects), else ``check(*args)``'s, kept for next time (never
        for an allocated result, ``recv`` None).  (One call on the per-call path: the
        hit is written out here, not in a helper.)"""
        if recv is None:
            return check(*args)
        if send is not self.send or recv is not self.recv:
            # large arrays, held weakly: NumPy refuses resize() on an array with weak
            # references, so the same object with the same dtype has the same size
            weak = self.weak
            if weak is None or send is not weak[0]() or recv is not weak[1]():
                return self.keep(check(*args), send, recv, a, b)
        if (a is self.a and b is self.b
                and send.flags.num == self.sflags and send.dtype is self.dtype
                and send.ndim == 1 and (recv is send or (
                    recv.flags.num == self.rflags and recv.dtype is self.dtype
                    and recv.ndim == 1))):
            call = self.call
            if call.send is None:
                return Call(call.coll, send, recv, call.count, call.op, call.root,
                            call.inplace, recv)
            return call
        return self.keep(check(*args), send, recv, a, b)

    def keep(self, call, send, recv, a=None, b=None) -> Call:
        if (type(send) is not _ND or type(recv) is not _ND or send.ndim != 1
                or recv.ndim != 1 or call.device is not None or call.result is not recv):
            return call
        if send.nbytes <= RECENT_BYTES and recv.nbytes <= RECENT_BYTES * 64:
            self.send, self.recv, self.call, self.weak = send, recv, call, None
        elif (call.send is send and call.recv is recv and not call.layout
              and call.fp_count is None):
            # what get() makes the Call from: the arrays themselves and these fields
            self.send = self.recv = None
            self.call = Call(call.coll, None, None, call.count, call.op, call.root,
                             call.inplace, None)
            self.weak = (_weakref(send), _weakref(recv))
        else:
            return call
        self.a, self.b = a, b
        self.sflags, self.rflags, self.dtype = send.flags.num, recv.flags.num, send.dtype
        return call


# -- arrays ---------------------------------------------------------------------------------
def _bad_host(x: np.ndarray, name: str, writable: bool):
    if x.dtype not in DTYPE_CODE:
        raise ArgumentTypeError(
            f"{name}: dtype {x.dtype} is not supported; expected one of {', '.join(DTYPES)}")
    if not x.flags.c_contiguous:
        raise ArgumentError(f"{name}: expected a C-contiguous array (use numpy.ascontiguousarray)")
    if not x.flags.aligned:
        raise ArgumentError(f"{name}: expected an array aligned to its dtype's size "
                            f"({x.dtype.itemsize} bytes); this one starts at an odd address "
                            "(numpy.frombuffer with an offset?): pass a copy (x.copy())")
    raise ArgumentError(f"{name}: expected a writable array, got a read-only one")


def array(x: Any, name: str, writable: bool = False):
    """(flat 1-D view, DeviceArray or None) of an array argument.  A NumPy subclass is
    read through its plain-array view (an np.matrix stays 2-D when reshaped; a masked
    array's data, without its mask, as mpi4py sends it)."""
    if isinstance(x, np.ndarray):
        if type(x) is not _ND:
            x = x.view(_ND)
        flags = x.flags.num
        if (flags & _C_ALIGNED != _C_ALIGNED or x.dtype not in DTYPE_CODE
                or (writable and not flags & _WRITEABLE)):
            _bad_host(x, name, writable)
        return (x if x.ndim == 1 else x.reshape(-1)), None
    if x is not None and not isinstance(x, _NOT_ARRAYS):
        if device.is_device_array(x):
            d = device.as_device(x, name, writable=writable)
            return d.view, d
    raise ArgumentTypeError(f"{name}: expected a numpy.ndarray or a device array (CuPy, "
                            f"__cuda_array_interface__), got {type(x).__name__}")


def _address(flat, dev) -> int:
    if dev is not None:
        return dev.ptr
    return flat.__array_interface__["data"][0] if flat.size else 0


def _overlap(a, b, da, db) -> bool:
    """Whether two arguments' memory overlaps."""
    if da is not None or db is not None:
        if da is None or db is None or not a.size or not b.size:
            return False
        return da.ptr < db.ptr + db.nbytes and db.ptr < da.ptr + da.nbytes
    if a.base is None and b.base is None and a is not b:
        return False          # two arrays that own their memory
    return a.size > 0 and b.size > 0 and np.may_share_memory(a, b)


def _same(a, b, da, db) -> bool:
    """The same memory (the in-place form written with two array objects)."""
    return (_overlap(a, b, da, db) and _address(a, da) == _address(b, db)
            and a.size == b.size)


def _new(n: int, flat, dev):
    """recvbuf=None: a new 1-D array of the input's dtype, on the input's device."""
    if dev is None:
        out = np.empty(n, flat.dtype)
        return out, None, out
    d = device.new_device_array(dev, n)
    return d.view, d, d.obj


def _recvbuf(recvbuf, expected: int, dt, what: str, sdev):
    r, rdev = array(recvbuf, "recvbuf", writable=True)
    if (rdev is None) != (sdev is None):
        where = ("a device array", "on the host") if sdev is not None else ("on the host",
                                                                             "a device array")
        raise ArgumentTypeError(f"recvbuf: sendbuf is {where[0]} but recvbuf is {where[1]}; "
                                "both must be on the same device")
    if (sdev is not None and rdev.device is not None and sdev.device is not None
            and rdev.device != sdev.device):
        raise ArgumentError(f"recvbuf: on GPU {rdev.device}, but sendbuf is on GPU "
                            f"{sdev.device}; expected both on one device")
    if r.dtype != dt:
        raise ArgumentTypeError(
            f"recvbuf: dtype {dtype_name(r.dtype)} differs from sendbuf's {dtype_name(dt)}")
    if r.size != expected:
        raise ArgumentError(f"recvbuf: expected {expected} elements ({what}), got {r.size}")
    return r, rdev


def _devices(sdev, rdev):
    return None if sdev is None else (sdev, rdev)


def _output(sendbuf, s, sdev, recvbuf, expected: int, what: str):
    """(recv view, its DeviceArray, result, inplace) for outputs of ``expected`` elements."""
    if recvbuf is None:
        r, rdev, result = _new(expected, s, sdev)
        return r, rdev, result, False
    if recvbuf is sendbuf:
        if sdev is None and not sendbuf.flags.writeable:
            raise ArgumentError("recvbuf: expected a writable array, got a read-only one")
        if s.size != expected:
            raise ArgumentError(f"recvbuf: expected {expected} elements ({what}), got {s.size}")
        return s, sdev, recvbuf, True
    r, rdev = _recvbuf(recvbuf, expected, s.dtype, what, sdev)
    if _overlap(s, r, sdev, rdev):
        if _same(s, r, sdev, rdev):
            return r, rdev, recvbuf, True
        raise ArgumentError("recvbuf: overlaps sendbuf without being the same buffer "
                            "(pass the same array for in-place operation)")
    return r, rdev, recvbuf, False


def root_of(root: Any, size: int) -> int:
    if type(root) is int and 0 <= root < size:
        return root
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < size:
        raise ArgumentError(f"root: expected an integer in [0, {size}), got {root!r}")
    return int(root)


def key_of(key: Any) -> Optional[str]:
    if key is not None and type(key) is not str and not isinstance(key, str):
        raise ArgumentTypeError(f"key: expected a str or None, got {type(key).__name__}")
    return key


def blocks_of(blocks: Any, default: Optional[int]) -> Optional[int]:
    if blocks is None:
        return default
    if (isinstance(blocks, bool) or not isinstance(blocks, (int, np.integer))
            or not 1 <= blocks <= MAX_BLOCKS):
        raise ArgumentError(f"blocks: expected an integer from 1 to {MAX_BLOCKS} or None, got "
                            f"{blocks!r}")
    return int(blocks)


def _sub(flat, dev, start: int, n: int):
    """Elements [start, start+n) of an argument, with its device record."""
    view = flat[start:start + n]
    if dev is None:
        return view, None
    return view, dev._replace(view=view, ptr=dev.ptr + start * np.dtype(flat.dtype).itemsize)


# -- the collectives ----------------------------------------------------------------------------
_ND = np.ndarray
_SEND_OK = _C_ALIGNED
_RECV_OK = _C_ALIGNED | _WRITEABLE


def allreduce(comm, sendbuf, recvbuf, op) -> Call:
    # the common case first, checked exactly as below: exact NumPy arrays, an op already
    # seen with this dtype (ops._VALID holds only valid pairs of supported dtypes), two
    # arrays that own their memory (or views, registered ones included, whose bounds do
    # not meet) or the same array
    if type(sendbuf) is _ND:
        dt = sendbuf.dtype
        name = _VALID.get((op, dt)) if type(op) is str else None
        if name is not None and sendbuf.flags.num & _SEND_OK == _SEND_OK:
            s = sendbuf if sendbuf.ndim == 1 else sendbuf.reshape(-1)
            if recvbuf is None:
                r = np.empty(s.size, dt)
                return Call("allreduce", s, r, s.size, name, 0, False, r)
            if (type(recvbuf) is _ND and recvbuf.flags.num & _RECV_OK == _RECV_OK
                    and recvbuf.dtype == dt and recvbuf.size == s.size):
                if recvbuf is sendbuf:
                    return Call("allreduce", s, s, s.size, name, 0, True, recvbuf)
                if ((sendbuf.base is None and recvbuf.base is None)
                        or not np.may_share_memory(sendbuf, recvbuf)):
                    r = recvbuf if recvbuf.ndim == 1 else recvbuf.reshape(-1)
                    return Call("allreduce", s, r, s.size, name, 0, False, recvbuf)
    s, sdev = array(sendbuf, "sendbuf")
    op = check_op(op, s.dtype)
    r, rdev, result, inplace = _output(sendbuf, s, sdev, recvbuf, s.size,
                                       "the same count as sendbuf")
    return Call("allreduce", s, r, s.size, op, 0, inplace, result, _devices(sdev, rdev))


def reduce(comm, sendbuf, recvbuf, op, root) -> Call:
    root = root_of(root, comm.size)
    s, sdev = array(sendbuf, "sendbuf")
    op = check_op(op, s.dtype)
    r, rdev, result, inplace = _output(sendbuf, s, sdev, recvbuf, s.size,
                                       "the same count as sendbuf")
    return Call("reduce", s, r, s.size, op, root, inplace, result, _devices(sdev, rdev))


def broadcast(comm, buf, root) -> Call:
    root = root_of(root, comm.size)
    b, dev = array(buf, "buf", writable=comm.rank != root)
    return Call("broadcast", b, b, b.size, None, root, True, buf, _devices(dev, dev))


def allgather(comm, sendbuf, recvbuf) -> Call:
    size, rank = comm.size, comm.rank
    s, sdev = array(sendbuf, "sendbuf")
    if recvbuf is not None and recvbuf is sendbuf:
        # in place, the same array: size*n elements, this rank's contribution in block rank
        if s.size % size:
            raise ArgumentError(f"sendbuf: in-place allgather needs size*n elements "
                                f"(size={size}), got {s.size}")
        r, rdev = array(recvbuf, "recvbuf", writable=True)
        m = s.size // size
        mine, mdev = _sub(r, rdev, rank * m, m)
        return Call("allgather", mine, r, m, None, 0, True, recvbuf, _devices(mdev, rdev))
    m = s.size
    if recvbuf is None:
        r, rdev, result = _new(size * m, s, sdev)
        return Call("allgather", s, r, m, None, 0, False, result, _devices(sdev, rdev))
    r, rdev = _recvbuf(recvbuf, size * m, s.dtype, f"size*n = {size}*{m}", sdev)
    # NCCL's in-place form: sendbuf is block `rank` of recvbuf
    inplace = _block_in_place("allgather", "sendbuf", s, sdev, "recvbuf", r, rdev, rank, m)
    return Call("allgather", s, r, m, None, 0, inplace, recvbuf, _devices(sdev, rdev))


def _block_in_place(coll, inner_name, inner, idev, outer_name, outer, odev, rank, m) -> bool:
    """Whether ``inner`` is block ``rank`` (of ``m`` elements) of ``outer``: the in-place
    form of allgather and reduce_scatter.  False where they do not overlap; any other
    overlap is an error."""
    if not _overlap(inner, outer, idev, odev):
        return False
    if _address(inner, idev) == _address(outer, odev) + rank * m * inner.dtype.itemsize:
        return True
    raise ArgumentError(f"recvbuf: overlaps sendbuf; for in-place {coll} {inner_name} must be "
                        f"block {rank} of {outer_name}, or pass the same array twice")


def reduce_scatter(comm, sendbuf, recvbuf, op) -> Call:
    size, rank = comm.size, comm.rank
    s, sdev = array(sendbuf, "sendbuf")
    op = check_op(op, s.dtype)
    if s.size % size:
        raise ArgumentError(f"sendbuf: expected size*n elements (size={size}), got {s.size}, "
                            f"which is not a multiple of {size}")
    m = s.size // size
    if recvbuf is not None and recvbuf is sendbuf:
        # in place, the same array: this rank's block of it receives the result
        array(recvbuf, "recvbuf", writable=True)
        r, rdev = _sub(s, sdev, rank * m, m)
        return Call("reduce_scatter", s, r, m, op, 0, True, recvbuf, _devices(sdev, rdev))
    if recvbuf is None:
        r, rdev, result = _new(m, s, sdev)
        return Call("reduce_scatter", s, r, m, op, 0, False, result, _devices(sdev, rdev))
    r, rdev = _recvbuf(recvbuf, m, s.dtype, f"sendbuf's size / {size}", sdev)
    inplace = _block_in_place("reduce_scatter", "recvbuf", r, rdev, "sendbuf", s, sdev, rank, m)
    return Call("reduce_scatter", s, r, m, op, 0, inplace, recvbuf, _devices(sdev, rdev))


def alltoall(comm, sendbuf, recvbuf) -> Call:
    size = comm.size
    s, sdev = array(sendbuf, "sendbuf")
    if s.size % size:
        raise ArgumentError(f"sendbuf: expected size*n elements (size={size}), got {s.size}, "
                            f"which is not a multiple of {size}")
    r, rdev, result, inplace = _output(sendbuf, s, sdev, recvbuf, s.size,
                                       "the same count as sendbuf")
    return Call("alltoall", s, r, s.size // size, None, 0, inplace, result, _devices(sdev, rdev))


_EMPTY = np.empty(0, dtype=np.uint8)


def barrier(comm) -> Call:
    return BARRIER


BARRIER = Call("barrier", _EMPTY, _EMPTY, 0, None, 0, True, None)   # (nothing of it varies)


# -- variable counts (the mpi4py adapter's Allgatherv, Reduce_scatter, Alltoallv) ---------------
def _ints(name: str, values: Sequence[int], size: int) -> tuple:
    vals = tuple(int(v) for v in values)
    if len(vals) != size:
        raise ArgumentError(f"{name}: expected {size} entries (one per rank), got {len(vals)}")
    if any(v < 0 for v in vals):
        raise ArgumentError(f"{name}: expected non-negative integers, got {list(vals)}")
    return vals


def _fits(name: str, counts: tuple, displs: tuple, length: int) -> None:
    for i, (c, d) in enumerate(zip(counts, displs)):
        if c and d + c > length:
            raise ArgumentError(f"{name}: block {i} ({c} elements at {d}) ends past the buffer's "
                                f"{length} elements")


def counts_hash(counts: tuple) -> int:
    """What the mismatch check compares for counts every rank must share."""
    return stable_hash(np.asarray(counts, np.int64).tobytes())


def _host_only(x, name, writable=False):
    flat, dev = array(x, name, writable)
    if dev is not None:
        raise ArgumentTypeError(f"{name}: variable-count collectives take host arrays")
    return flat


def _distinct(r, s) -> None:
    if _overlap(r, s, None, None):
        raise ArgumentError("recvbuf: overlaps sendbuf (use the in-place form instead)")


def _own_block(sendbuf, r, counts, displs, rank: int, inplace: bool):
    """This rank's block of a gathered vector ``r`` (allgatherv; gatherv at the root): in
    place, where it already lies in ``r``; else ``sendbuf``, checked against its place."""
    if inplace:
        return r[displs[rank]:displs[rank] + counts[rank]]
    s = _host_only(sendbuf, "sendbuf")
    _one_block("sendbuf", s, "recvbuf", r, counts, rank)
    _distinct(r, s)
    return s


def _one_block(name: str, x, other_name: str, other, counts, rank: int) -> None:
    """``x`` (argument ``name``) is this rank's block of the vector in ``other``: the same
    dtype, counts[rank] elements."""
    if x.dtype != other.dtype:
        raise ArgumentError(f"{name}: dtype {x.dtype} differs from {other_name}'s {other.dtype}")
    if x.size != counts[rank]:
        raise ArgumentError(f"{name}: expected counts[{rank}] = {counts[rank]} elements, "
                            f"got {x.size}")


def allgatherv(comm, sendbuf, recvbuf, counts, displs, inplace: bool) -> Call:
    """Rank i's counts[i] elements land at displs[i] of every rank's recvbuf.  In place,
    this rank's block is already at displs[rank] of recvbuf and sendbuf is ignored."""
    size, rank = comm.size, comm.rank
    counts, displs = _ints("counts", counts, size), _ints("displs", displs, size)
    r = _host_only(recvbuf, "recvbuf", writable=True)
    _fits("recvbuf", counts, displs, r.size)
    s = _own_block(sendbuf, r, counts, displs, rank, inplace)
    return Call("allgatherv", s, r, sum(counts), None, 0, inplace, recvbuf,
                layout=(("counts", counts), ("displs", displs)), fp_count=counts_hash(counts))


def reduce_scatterv(comm, sendbuf, recvbuf, counts, op, inplace: bool) -> Call:
    """sendbuf holds counts[i] elements for rank i, back to back; rank r gets the reduced
    block r in recvbuf.  In place, sendbuf is the input and recvbuf its first counts[r]
    elements (MPI_IN_PLACE's layout)."""
    size, rank = comm.size, comm.rank
    counts = _ints("counts", counts, size)
    s = _host_only(sendbuf, "sendbuf", writable=inplace)
    op = check_op(op, s.dtype)
    if s.size != sum(counts):
        raise ArgumentError(f"sendbuf: expected sum(counts) = {sum(counts)} elements, got {s.size}")
    r, _ = _recvbuf(recvbuf, counts[rank], s.dtype, f"counts[{rank}]", None)
    if inplace:
        if counts[rank] and _address(r, None) != _address(s, None):
            raise ArgumentError("recvbuf: in place, recvbuf must be the start of sendbuf")
    else:
        _distinct(r, s)
    return Call("reduce_scatterv", s, r, sum(counts), op, 0, inplace, recvbuf,
                layout=(("counts", counts),), fp_count=counts_hash(counts))


def alltoallv(comm, sendbuf, recvbuf, scounts, sdispls, rcounts, rdispls, inplace: bool) -> Call:
    """scounts[i] elements at sdispls[i] of sendbuf go to rank i; rcounts[i] from rank i
    land at rdispls[i] of recvbuf.  In place, recvbuf is also the input, with the receive
    layout (sendbuf and the send layout are ignored)."""
    size, rank = comm.size, comm.rank
    rcounts, rdispls = _ints("recvcounts", rcounts, size), _ints("rdispls", rdispls, size)
    r = _host_only(recvbuf, "recvbuf", writable=True)
    _fits("recvbuf", rcounts, rdispls, r.size)
    if inplace:
        s, scounts, sdispls = r, rcounts, rdispls
    else:
        scounts, sdispls = _ints("sendcounts", scounts, size), _ints("sdispls", sdispls, size)
        s = _host_only(sendbuf, "sendbuf")
        if s.dtype != r.dtype:
            raise ArgumentError(f"sendbuf: dtype {s.dtype} differs from recvbuf's {r.dtype}")
        _fits("sendbuf", scounts, sdispls, s.size)
        _distinct(r, s)
        if scounts[rank] > rcounts[rank]:
            raise ArgumentError(f"sendcounts[{rank}] = {scounts[rank]} is more than "
                                f"recvcounts[{rank}] = {rcounts[rank]} (this rank's own block)")
    return Call("alltoallv", s, r, sum(rcounts), None, 0, inplace, recvbuf,
                layout=(("counts", rcounts), ("displs", rdispls), ("scounts", scounts),
                        ("sdispls", sdispls)), fp_count=ALLTOALLV_FP)


# -- rooted and prefix collectives --------------------------------------------------------------
ROOTED_V_FP = -2             # gatherv, scatterv: only the root knows every count


def _host(x, name: str, writable: bool = False):
    flat, dev = array(x, name, writable)
    if dev is not None:
        raise ArgumentTypeError(f"{name}: gather, scatter, scan and exscan take host arrays "
                                "(numpy.ndarray); device arrays are not supported yet")
    return flat


def gather(comm, sendbuf, recvbuf, root) -> Call:
    """Every rank's n elements land in block r of the root's recvbuf (size*n elements).
    recvbuf is read on the root only; wait() returns it as passed elsewhere (None).
    In place at the root: recvbuf is sendbuf (block root already in place), or sendbuf
    is block root of recvbuf."""
    size, rank = comm.size, comm.rank
    root = root_of(root, size)
    s = _host(sendbuf, "sendbuf")
    if rank != root:
        return Call("gather", s, s[:0], s.size, None, root, False, recvbuf)
    if recvbuf is not None and recvbuf is sendbuf:
        if s.size % size:
            raise ArgumentError(f"sendbuf: in-place gather at the root needs size*n elements "
                                f"(size={size}), got {s.size}")
        _host(recvbuf, "recvbuf", writable=True)
        m = s.size // size
        return Call("gather", s[root * m:(root + 1) * m], s, m, None, root, True, recvbuf)
    m = s.size
    if recvbuf is None:
        r = np.empty(size * m, s.dtype)
        return Call("gather", s, r, m, None, root, False, r)
    r, _ = _recvbuf(recvbuf, size * m, s.dtype, f"size*n = {size}*{m}", None)
    inplace = _block_in_place("gather", "sendbuf", s, None, "recvbuf", r, None, root, m)
    return Call("gather", s, r, m, None, root, inplace, recvbuf)


def scatter(comm, sendbuf, recvbuf, root) -> Call:
    """Block r of the root's sendbuf (size*n elements) lands in rank r's recvbuf (n).
    sendbuf is read on the root only: elsewhere it may be None when recvbuf is given
    (otherwise recvbuf=None takes n and the dtype from it).  In place at the root:
    recvbuf is sendbuf (block root stays where it is), or recvbuf is block root of
    sendbuf."""
    size, rank = comm.size, comm.rank
    root = root_of(root, size)
    if rank != root and recvbuf is not None:
        r = _host(recvbuf, "recvbuf", writable=True)
        return Call("scatter", r[:0], r, r.size, None, root, False, recvbuf)
    if rank != root and sendbuf is None:
        raise ArgumentError("recvbuf: expected an array of n elements (or a sendbuf of "
                            "size*n elements to make one from), got None")
    s = _host(sendbuf, "sendbuf")
    if s.size % size:
        raise ArgumentError(f"sendbuf: expected size*n elements (size={size}), got {s.size}, "
                            f"which is not a multiple of {size}")
    m = s.size // size
    if rank != root:
        r = np.empty(m, s.dtype)
        return Call("scatter", s[:0], r, m, None, root, False, r)
    if recvbuf is None:
        r = np.empty(m, s.dtype)
        return Call("scatter", s, r, m, None, root, False, r)
    if recvbuf is sendbuf:
        _host(recvbuf, "recvbuf", writable=True)
        return Call("scatter", s, s[root * m:(root + 1) * m], m, None, root, True, recvbuf)
    r, _ = _recvbuf(recvbuf, m, s.dtype, f"sendbuf's size / {size}", None)
    inplace = _block_in_place("scatter", "recvbuf", r, None, "sendbuf", s, None, root, m)
    return Call("scatter", s, r, m, None, root, inplace, recvbuf)


def scan(comm, sendbuf, recvbuf, op, coll: str = "scan") -> Call:
    """Rank r gets x0 op x1 op ... op xr (scan) or x0 op ... op x(r-1) (exscan, whose
    rank 0 output is not written: zeros where recvbuf is None), n elements in and out."""
    s = _host(sendbuf, "sendbuf")
    op = check_op(op, s.dtype)
    if op == "avg":
        raise ArgumentError(f"op: 'avg' is not defined for {coll} (use 'sum' and divide by "
                            "rank + 1)")
    r, _, result, inplace = _output(sendbuf, s, None, recvbuf, s.size,
                                    "the same count as sendbuf")
    if recvbuf is None and coll == "exscan" and comm.rank == 0:
        r.fill(0)
    return Call(coll, s, r, s.size, op, 0, inplace, result)


def exscan(comm, sendbuf, recvbuf, op) -> Call:
    return scan(comm, sendbuf, recvbuf, op, "exscan")


def gatherv(comm, sendbuf, recvbuf, counts, displs, root, inplace: bool) -> Call:
    """Rank i's counts[i] elements land at displs[i] of the root's recvbuf; counts,
    displs and recvbuf are read on the root only.  In place (the root only), the root's
    block is already at displs[root] and sendbuf is ignored."""
    size, rank = comm.size, comm.rank
    root = root_of(root, size)
    if rank != root:
        s = _host_only(sendbuf, "sendbuf")
        return Call("gatherv", s, s[:0], s.size, None, root, False, recvbuf,
                    fp_count=ROOTED_V_FP)
    counts, displs = _ints("counts", counts, size), _ints("displs", displs, size)
    r = _host_only(recvbuf, "recvbuf", writable=True)
    _fits("recvbuf", counts, displs, r.size)
    s = _own_block(sendbuf, r, counts, displs, rank, inplace)
    return Call("gatherv", s, r, counts[rank], None, root, inplace, recvbuf,
                layout=(("counts", counts), ("displs", displs)), fp_count=ROOTED_V_FP)


def scatterv(comm, sendbuf, recvbuf, counts, displs, root, inplace: bool) -> Call:
    """counts[i] elements at displs[i] of the root's sendbuf land in rank i's recvbuf;
    counts, displs and sendbuf are read on the root only.  In place (the root only), the
    root's block stays at displs[root] of sendbuf and recvbuf is ignored."""
    size, rank = comm.size, comm.rank
    root = root_of(root, size)
    if rank != root:
        r = _host_only(recvbuf, "recvbuf", writable=True)
        return Call("scatterv", r[:0], r, r.size, None, root, False, recvbuf,
                    fp_count=ROOTED_V_FP)
    counts, displs = _ints("counts", counts, size), _ints("displs", displs, size)
    s = _host_only(sendbuf, "sendbuf")
    _fits("sendbuf", counts, displs, s.size)
    if inplace:
        r = s[displs[rank]:displs[rank] + counts[rank]]
    else:
        r = _host_only(recvbuf, "recvbuf", writable=True)
        _one_block("recvbuf", r, "sendbuf", s, counts, rank)
        _distinct(r, s)
    return Call("scatterv", s, r, counts[rank], None, root, inplace, recvbuf,
                layout=(("scounts", counts), ("sdispls", displs)), fp_count=ROOTED_V_FP)
