"""The adapter's lowercase object methods (``allreduce``, ``bcast``, ``allgather``, ...
of Python objects) on hpccoll, as methods ``Comm`` inherits (``_comm.py``).

mpi4py 4 has no nonblocking lowercase collectives (no ``ibarrier``, ``ibcast``, ...),
so there are none here either.

One protocol for every method:

1. Each rank encodes its object (``_codec.py``): a header of 16 int64 words that holds
   the object itself when it is small (numbers, NumPy scalars, short strings, tuples of
   up to 10 numbers, anything whose pickle stream has up to 104 bytes), and byte parts
   otherwise (an array's memory, or a pickle stream and its out-of-band buffers).
2. One collective moves the headers: allgather (allgather, allreduce, gather, reduce,
   scan, exscan), broadcast of the root's (bcast, scatter: a row per destination) or
   alltoall (alltoall).  For small objects that is the whole call.
3. Then one round per part (the pickle stream, each out-of-band buffer), all issued
   before any is waited for: up to SMALL bytes from every rank an allgather of padded
   blocks, above it allgatherv (allgather, allreduce), gatherv or scatterv (gather,
   reduce, scatter: the root's), alltoallv to the ranks that need the bytes (alltoall,
   scan, exscan), or broadcast (bcast).

Why every rank takes the same path without asking: the number of rounds and every
count come from the headers, and every rank that takes part in a round holds the same
headers (all of them, or the root's; for alltoall each sender's rows all carry the most
parts any of its objects has).
A rank that passes an int and one that passes a dict agree too: the int's header says
"no parts", the dict's "two parts", and all ranks run max(0, 2) rounds, the int's
rank with nothing to send.  Headers also carry the method, the root and a reduction's
op, so ranks that call different lowercase collectives, or one with another root or op,
raise CollectiveMismatch alike instead of exchanging mismatched data or computing
different results; a rank that cannot pickle its object sends a FAILED header and every
rank raises (mpi4py leaves the others waiting).

Reductions are mpi4py's: the op (an ``MPI.Op`` or any callable) is applied in Python to
the decoded objects in the very order mpi4py applies it (its binomial tree, or with
``mpi4py.rc.fast_reduce`` off its left fold; its recursive-doubling scan), so results
are mpi4py's exactly, also for floats, non-commutative ops and ``MPI.SUM`` on lists.
allreduce and the scans compute on every rank that needs the result instead of
sending it on: the op must give the same result on every rank, as MPI asks of ops.
"""
from __future__ import annotations

import operator

import mpi4py
import numpy as np

from ..core import validate
from ..core.validate import Call
from ..errors import CollectiveMismatch, HpcCollError
from . import _calls as calls
from . import _codec as codec
from ._types import MPI

BCAST, GATHER, SCATTER, ALLGATHER, ALLTOALL, REDUCE, ALLREDUCE, SCAN, EXSCAN = range(1, 10)
NAMES = {BCAST: "bcast", GATHER: "gather", SCATTER: "scatter", ALLGATHER: "allgather",
         ALLTOALL: "alltoall", REDUCE: "reduce", ALLREDUCE: "allreduce", SCAN: "scan",
         EXSCAN: "exscan"}

# mpi4py reads rc.fast_reduce (or MPI4PY_RC_FAST_REDUCE, which it writes back into rc)
# once, when MPI is imported (_types imports it before this line runs)
_FAST_REDUCE = mpi4py.rc.fast_reduce not in (False, "no")
_WORDS = codec.WORDS
# Up to this many bytes from any rank a round is an allgather of padded blocks (MPI's own
# collective, where allgatherv and alltoallv run step machines), also where only some
# ranks need the bytes; above it, exact counts to the ranks that need them.
SMALL = 4096


def _root(root, size: int) -> int:
    r = calls._root(root)
    calls._check_root(r, size)
    return r


class ObjectCalls:
    """Mixed into ``hpccoll.mpi.Comm``: uses its ``_hc``, ``_st``, ``_stats``, ``_heads``,
    ``_freed``, ``_blocks`` and ``_blocking``.  Each call counts as native in ``stats``
    once its arguments are read (a bad root raises first, as in ``calls.Runner.read``)."""

    # -- the methods ------------------------------------------------------------------------
    def barrier(self) -> None:
        self._blocking("barrier", calls.barrier)

    def bcast(self, obj, root: int = 0):
        hc = self._open()
        root = _root(root, hc.size)
        self._stats["bcast"]["native"] += 1
        m = codec.meta(BCAST, root)
        mine = hc.rank == root
        pool = self._heads.get(root)     # as in _headers: kept per root
        if pool:
            head, call = pool.pop()
        else:
            head = codec.new_header()
            call = Call("broadcast", head, head, _WORDS, None, root, True, None)
        enc = codec.encode(obj, m, True, head) if mine else None
        self._st.issue(call, None, self._blocks).wait()
        table = codec.Table(head, 1)
        self._heads.setdefault(root, []).append((head, call))
        _agree(table, enc, m, rows_of=root)
        rounds = table.own(0)
        if not rounds:
            return table.value(0)
        if table.overflow()[0]:
            lengths = (np.array([p.size for p in enc.parts[1 + codec.INLINE:]], np.int64)
                       if mine else np.empty(table.overflow()[0], np.int64))
            self._go(Call("broadcast", lengths, lengths, lengths.size, None, root, True,
                          None)).wait()
            table.extra = [lengths.tolist()]
        parts, works = [], []
        for k in range(rounds):
            buf = enc.parts[k] if mine else np.empty(table.length(0, k), np.uint8)
            if buf.size:
                works.append(self._go(Call("broadcast", buf, buf, buf.size, None, root, True,
                                           None)))
            parts.append(buf)
        for w in works:
            w.wait()
        return table.value(0, codec.own_copy(enc) if mine else parts)

    def gather(self, sendobj, root: int = 0):
        return self._at_root("gather", GATHER, sendobj, root)

    def _at_root(self, name: str, method: int, sendobj, root, op: int = 0):
        """Every rank's object at ``root`` (a list there; None elsewhere); ``op``: a
        reduction's (codec.op_code), which every rank must pass alike."""
        hc = self._open()
        root = _root(root, hc.size)
        self._stats[name]["native"] += 1
        values = self._to_some(hc, sendobj, method, root, None,
                               hc.size if hc.rank == root else 0, op)
        return values if hc.rank == root else None

    def scatter(self, sendobj, root: int = 0):
        hc = self._open()
        n, me = hc.size, hc.rank
        root = _root(root, n)
        self._stats["scatter"]["native"] += 1
        m = codec.meta(SCATTER, root)
        error = parts = None
        if me == root:
            rows, parts, error = codec.encode_each(sendobj, n, m)
            head = rows.reshape(-1)
        else:
            head = np.empty(_WORDS * n, np.int64)
        self._go(Call("broadcast", head, head, head.size, None, root, True, None)).wait()
        table = codec.Table(head, n)
        _agree(table, _Failed(error), m, rows_of=root)
        if not table.rounds():
            return table.value(me)
        # one round (scatter pickles in band)
        lengths = [table.length(i, 0) for i in range(n)]
        if max(lengths) <= SMALL:
            # every rank's bytes to all, each at its 64-byte boundary (MPI's own broadcast)
            displs, total = codec.aligned(lengths)
            buf = np.zeros(total, np.uint8) if me == root else np.empty(total, np.uint8)
            if me == root:
                for i, p in enumerate(parts):
                    if lengths[i]:
                        buf[displs[i]:displs[i] + lengths[i]] = p[0]
            self._go(Call("broadcast", buf, buf, total, None, root, True, None)).wait()
            if not table.own(me):
                return table.value(me)
            return table.value(me, (buf[displs[me]:displs[me] + lengths[me]],))
        # above it the root's blocks with exact counts (the core's scatterv); an object
        # given for several ranks is in the send buffer once
        send, sdispls = _concat(parts, lengths) if me == root else (codec.EMPTY, None)
        recv = np.empty(lengths[me], np.uint8)
        self._go(validate.scatterv(hc, send, recv, lengths, sdispls, root, False)).wait()
        if not table.own(me):
            return table.value(me)
        return table.value(me, (recv,))

    def allgather(self, sendobj):
        hc = self._open()
        self._stats["allgather"]["native"] += 1
        return self._everyone(hc, sendobj, ALLGATHER)

    def alltoall(self, sendobj):
        hc = self._open()
        n = hc.size
        self._stats["alltoall"]["native"] += 1
        m = codec.meta(ALLTOALL, 0)
        rows, parts, error = codec.encode_each(sendobj, n, m)
        head = np.empty(_WORDS * n, np.int64)
        self._go(Call("alltoall", rows.reshape(-1), head, _WORDS, None, 0, False, None)).wait()
        table = codec.Table(head, n)
        _agree(table, _Failed(error), m)
        if not table.rounds():
            return [table.value(i) for i in range(n)]
        mine = codec.Table(rows.reshape(-1), n)
        scounts = [mine.length(j, 0) for j in range(n)]
        send, sdispls = _concat(parts, scounts)
        rcounts = [table.length(i, 0) for i in range(n)]
        work, recv, rdispls = self._alltoallv(hc, send, scounts, sdispls, rcounts)
        work.wait()
        return [table.value(i, (recv[rdispls[i]:rdispls[i] + rcounts[i]],)
                            if table.own(i) else ()) for i in range(n)]

    def reduce(self, sendobj, op=MPI.SUM, root: int = 0):
        values = self._at_root("reduce", REDUCE, sendobj, root, codec.op_code(op))
        return None if values is None else _reduce(values, op)

    def allreduce(self, sendobj, op=MPI.SUM):
        hc = self._open()
        self._stats["allreduce"]["native"] += 1
        return _reduce(self._everyone(hc, sendobj, ALLREDUCE, codec.op_code(op)), op)

    def scan(self, sendobj, op=MPI.SUM):
        hc = self._open()
        self._stats["scan"]["native"] += 1
        me = hc.rank
        values = self._to_some(hc, sendobj, SCAN, 0, lambda i, j: i <= j, me + 1,
                               codec.op_code(op))
        return _scan(values, op, exclusive=False)

    def exscan(self, sendobj, op=MPI.SUM):
        hc = self._open()
        self._stats["exscan"]["native"] += 1
        me = hc.rank
        values = self._to_some(hc, sendobj, EXSCAN, 0, lambda i, j: i < j, me,
                               codec.op_code(op))
        if me == 0:
            return None
        return _scan(values, op, exclusive=True)

    # -- the protocol -------------------------------------------------------------------------
    def _open(self):
        if self._freed:
            raise MPI.Exception(MPI.ERR_COMM)
        return self._hc

    def _go(self, call):
        """The one issue (CommState.issue): flight row, mismatch check, watchdog."""
        return self._st.issue(call, None, self._blocks)

    def _headers(self, hc, sendobj, method: int, root: int, op: int = 0):
        """(this rank's encoding, every rank's header, checked, and every rank's object
        where each sent a number, or a tuple or list of ints, of one kind: allreduce's and
        allgather-of-shapes' common case, read straight from the headers; else None).
        The header buffers and their allgather's Call are kept for the next call (its
        plan with them); a call made while they are in use (another thread, or an op that
        calls back) takes new ones, and buffers of a call that raised are not reused."""
        m = codec.meta(method, root, op)
        n = hc.size
        heads = self._heads.get(-1)      # bcast's are kept by root
        if heads:
            send, recv, views, rows, call = heads.pop()
        else:
            heads = self._heads.setdefault(-1, [])
            send, recv = codec.new_header(), np.empty(_WORDS * n, np.int64)
            # (struct writes and reads them without NumPy's buffer export)
            views = (memoryview(send), memoryview(recv))
            rows = codec.Rows(n, recv)
            call = Call("allgather", send, recv, _WORDS, None, 0, False, None)
        enc = codec.encode(sendobj, m, True, views[0])
        self._st.issue(call, None, self._blocks).wait()
        agreed, values = rows.read(m)
        if values is not None:
            heads.append((send, recv, views, rows, call))
            return enc, None, values
        table = codec.Table(recv, n)
        if not agreed:
            _agree(table, enc, m)
        heads.append((send, recv, views, rows, call))
        return enc, table, None

    def _everyone(self, hc, sendobj, method: int, op: int = 0) -> list:
        """Every rank's object, on every rank."""
        enc, table, values = self._headers(hc, sendobj, method, 0, op)
        if values is not None:
            return values
        n = hc.size
        rounds = table.rounds()
        if not rounds:
            return _values(table, None, n)
        self._extra(hc, table, enc)
        works, got = [], []
        for k in range(rounds):
            counts = [table.length(i, k) for i in range(n)]
            if not any(counts):
                got.append(None)
                continue
            work, recv, displs = self._allgatherv(hc, _part(enc, k), counts)
            works.append(work)
            got.append((recv, counts, displs))
        for w in works:
            w.wait()
        return _values(table, got, n)

    def _to_some(self, hc, sendobj, method: int, root: int, to, count: int,
                 op: int = 0) -> list:
        """Rank i's object to the ranks j with ``to(i, j)``, or to ``root`` where ``to``
        is None: the objects of ranks 0..count-1 (those this rank receives).  Above SMALL
        bytes, parts go to the root with the core's gatherv (gather, reduce), else with
        alltoallv (the scans)."""
        enc, table, values = self._headers(hc, sendobj, method, root, op)
        if values is not None:
            return values[:count]
        rounds = table.rounds()
        if not rounds:
            return _values(table, None, count)
        n, me = hc.size, hc.rank
        self._extra(hc, table, enc)
        zeros = [0] * n
        works, got = [], []
        for k in range(rounds):
            lengths = [table.length(i, k) for i in range(n)]
            if not any(lengths):
                got.append(None)
                continue
            if max(lengths) <= SMALL:
                work, recv, displs = self._allgatherv(hc, _part(enc, k), lengths)
                works.append(work)
                got.append((recv, lengths, displs))
                continue
            if to is None:
                displs, total = codec.aligned(lengths)
                recv = np.empty(total if me == root else 0, np.uint8)
                call = validate.gatherv(hc, _part(enc, k), recv, lengths, displs, root, False)
                works.append(self._go(call))
                got.append((recv, lengths, displs))
                continue
            scounts = [lengths[me] if to(me, j) else 0 for j in range(n)]
            rcounts = [lengths[i] if to(i, me) else 0 for i in range(n)]
            work, recv, rdispls = self._alltoallv(hc, _part(enc, k), scounts, zeros, rcounts)
            works.append(work)
            got.append((recv, rcounts, rdispls))
        for w in works:
            w.wait()
        return _values(table, got, count)

    def _allgatherv(self, hc, send, counts):
        """(work, receive buffer, displacements) of an allgatherv of ``counts`` bytes."""
        n = hc.size
        top = max(counts)
        if top <= SMALL:
            m = (top + 15) & ~15            # every dtype's alignment, for arrays in place
            block = np.zeros(m, np.uint8)
            block[:send.size] = send
            recv = np.empty(m * n, np.uint8)
            work = self._go(Call("allgather", block, recv, m, None, 0, False, None))
            return work, recv, [m * i for i in range(n)]
        displs, total = codec.aligned(counts)
        recv = np.empty(total, np.uint8)
        return self._go(validate.allgatherv(hc, send, recv, counts, displs, False)), recv, displs

    def _alltoallv(self, hc, send, scounts, sdispls, rcounts):
        rdispls, total = codec.aligned(rcounts)
        recv = np.empty(total, np.uint8)
        call = validate.alltoallv(hc, send, recv, scounts, sdispls, rcounts, rdispls, False)
        return self._go(call), recv, rdispls

    def _extra(self, hc, table, enc) -> None:
        """The lengths of out-of-band buffers past those the headers hold (an object
        with more than codec.INLINE of them), to every rank."""
        over = table.overflow()
        if not any(over):
            return
        mine = np.array([p.size for p in enc.parts[1 + codec.INLINE:]], np.int64)
        displs = [sum(over[:i]) for i in range(hc.size)]
        recv = np.empty(sum(over), np.int64)
        self._go(validate.allgatherv(hc, mine, recv, over, displs, False)).wait()
        table.extra = [recv[d:d + c].tolist() for c, d in zip(over, displs)]


# -- helpers ------------------------------------------------------------------------------------

class _Failed:
    """The error of encoding several objects, where _agree expects an encoding."""
    __slots__ = ("error",)

    def __init__(self, error):
        self.error = error


def _agree(table, enc, m: int, rows_of=None) -> None:
    """table.check, except that the rank whose object could not be encoded raises its
    own error (the others raise HpcCollError naming it)."""
    try:
        table.check(NAMES, m, rows_of)
    except CollectiveMismatch:
        raise
    except HpcCollError:
        if enc is not None and enc.error is not None:
            raise enc.error from None
        raise


def _values(table, got, count: int) -> list:
    """The objects of rows 0..count-1."""
    if got is None:
        return [table.value(i) for i in range(count)]
    return [table.value(i, _parts(got, table, i)) for i in range(count)]


def _part(enc, k: int):
    return enc.parts[k] if k < len(enc.parts) else codec.EMPTY


def _parts(got, table, i: int):
    """Row i's received parts."""
    own = table.own(i)
    if not own:
        return ()
    out = []
    for k in range(own):
        g = got[k]
        if g is None:
            out.append(codec.EMPTY)
        else:
            recv, counts, displs = g
            out.append(recv[displs[i]:displs[i] + counts[i]])
    return out


def _concat(parts, lengths):
    """(one send buffer, displacement per destination) of part 0 of each destination's
    object; an object sent to several destinations is in it once."""
    at: dict = {}
    chunks, size = [], 0
    displs = []
    for p, c in zip(parts, lengths):
        if not c:
            displs.append(0)
            continue
        data = p[0]
        d = at.get(id(data))
        if d is None:
            d = at[id(data)] = size
            chunks.append(data)
            size += data.size
        displs.append(d)
    if not chunks:
        return codec.EMPTY, displs
    return (chunks[0] if len(chunks) == 1 else np.concatenate(chunks)), displs


# -- reductions in mpi4py's order ------------------------------------------------------------

def _max(x, y):
    return y if y > x else x


def _min(x, y):
    return y if y < x else x


# mpi4py's predefined ops applied to Python objects are these expressions (op_call in
# its opimpl.pxi: op_SUM is ``x + y``, op_MAX ``y if y > x else x``, ...), called here
# without the trip through MPI.Op.__call__; found by identity (an MPI.Op is unhashable)
_PLAIN_OPS = ((MPI.SUM, operator.add), (MPI.PROD, operator.mul), (MPI.MAX, _max),
              (MPI.MIN, _min))


def _plain(op):
    for mpi_op, fn in _PLAIN_OPS:
        if op is mpi_op:
            return fn
    return op


def _reduce(items: list, op):
    """mpi4py's result: its binomial tree towards rank 0 (PyMPI_reduce_p2p), or with
    fast_reduce off its left fold (_py_reduce)."""
    op = _plain(op)
    n = len(items)
    if not _FAST_REDUCE:
        result = items[0]
        for x in items[1:]:
            result = op(result, x)
        return result
    mask = 1
    while mask < n:
        r = 0
        while r < n - mask:     # (not a range: no range object made at each level)
            items[r] = op(items[r], items[r + mask])
            r += 2 * mask
        mask <<= 1
    return items[0]


def _block(items: list, lo: int, m: int, op):
    """The partial result mpi4py's recursive doubling holds for the complete block of
    ranks [lo, lo + m) (m a power of two)."""
    if m == 1:
        return items[lo]
    h = m // 2
    return op(_block(items, lo, h, op), _block(items, lo + h, h, op))


def _scan(items: list, op, exclusive: bool):
    """This rank's (the last item's owner's) result of mpi4py's scan or exscan:
    PyMPI_scan_p2p / PyMPI_exscan_p2p, or with fast_reduce off its left fold.  ``items``
    holds ranks 0..rank (scan) or 0..rank-1 (exscan); rank 0's exscan never gets here."""
    r = len(items) - 1 if not exclusive else len(items)
    op = _plain(op)
    if not _FAST_REDUCE:
        result = items[0]
        for x in items[1:]:
            result = op(result, x)
        return result
    # at each level whose bit is set in r, r receives the partial of the block of ranks
    # just below its own and applies it on the left; those blocks are complete
    result = None if exclusive else items[r]
    first = exclusive
    mask = 1
    while mask <= r:
        if r & mask:
            lo = (r ^ mask) & ~(mask - 1)
            partial = _block(items, lo, mask, op)
            if first:
                result, first = partial, False
            else:
                result = op(partial, result)
        mask <<= 1
    return result
