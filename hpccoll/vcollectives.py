"""Argument handling of the variable-count collectives (MPI's Allgatherv, Reduce_scatter
with recvcounts, Alltoallv), in the shape of ``collectives.py``: validate, return a ``Call``
that ``Communicator._submit`` queues.  The mpi4py adapter is their user.

Counts and displacements are in elements of the arrays' dtype; the arrays are flat
NumPy arrays (the adapter passes views of the caller's buffers).  Every rank of a
collective must pass the same ``counts`` (allgatherv, reduce_scatterv): the mismatch
check compares a hash of them.  Alltoallv's counts differ per rank by nature; there a
disagreement shows up as a truncated message (CollectiveMismatch) or a short block, as
with MPI.
"""
from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

from .buffers import Buffer, as_buffer, check_op, check_recvbuf, overlap
from .collectives import Call
from .errors import ArgumentError

ALLTOALLV_FP = -1   # alltoallv has no count all ranks share


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
    digest = hashlib.blake2b(np.asarray(counts, np.int64).tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _distinct(rb: Buffer, sb: Buffer) -> None:
    if overlap(rb, sb):
        raise ArgumentError("recvbuf: overlaps sendbuf (use the in-place form instead)")


def allgatherv(comm, sendbuf, recvbuf, counts, displs, inplace: bool) -> Call:
    """Rank i's counts[i] elements land at displs[i] of every rank's recvbuf.  In place,
    this rank's block is already at displs[rank] of recvbuf and sendbuf is ignored."""
    size, rank = comm.size, comm.rank
    counts, displs = _ints("counts", counts, size), _ints("displs", displs, size)
    rb = as_buffer(recvbuf, "recvbuf", writable=True)
    _fits("recvbuf", counts, displs, rb.size)
    if inplace:
        lo = displs[rank]
        sb = Buffer(recvbuf, rb.flat[lo:lo + counts[rank]])
    else:
        sb = as_buffer(sendbuf, "sendbuf")
        if sb.dtype != rb.dtype:
            raise ArgumentError(f"sendbuf: dtype {sb.dtype} differs from recvbuf's {rb.dtype}")
        if sb.size != counts[rank]:
            raise ArgumentError(f"sendbuf: expected counts[{rank}] = {counts[rank]} elements, "
                                f"got {sb.size}")
        _distinct(rb, sb)
    return Call("allgatherv", sb, rb, sum(counts), None, 0, inplace, recvbuf,
                layout=(("counts", counts), ("displs", displs)), fp_count=counts_hash(counts))


def reduce_scatterv(comm, sendbuf, recvbuf, counts, op, inplace: bool) -> Call:
    """sendbuf holds counts[i] elements for rank i, back to back; rank r gets the reduced
    block r in recvbuf.  In place, sendbuf is the input and recvbuf its first counts[r]
    elements (MPI_IN_PLACE's layout)."""
    size, rank = comm.size, comm.rank
    counts = _ints("counts", counts, size)
    sb = as_buffer(sendbuf, "sendbuf", writable=inplace)
    op = check_op(op, sb.dtype)
    if sb.size != sum(counts):
        raise ArgumentError(f"sendbuf: expected sum(counts) = {sum(counts)} elements, got {sb.size}")
    rb = check_recvbuf(recvbuf, counts[rank], sb.dtype, f"counts[{rank}]")
    if inplace:
        if counts[rank] and rb.address != sb.address:
            raise ArgumentError("recvbuf: in place, recvbuf must be the start of sendbuf")
    else:
        _distinct(rb, sb)
    return Call("reduce_scatterv", sb, rb, sum(counts), op, 0, inplace, recvbuf,
                layout=(("counts", counts),), fp_count=counts_hash(counts))


def alltoallv(comm, sendbuf, recvbuf, scounts, sdispls, rcounts, rdispls, inplace: bool) -> Call:
    """scounts[i] elements at sdispls[i] of sendbuf go to rank i; rcounts[i] from rank i
    land at rdispls[i] of recvbuf.  In place, recvbuf is also the input, with the receive
    layout (sendbuf and the send layout are ignored)."""
    size, rank = comm.size, comm.rank
    rcounts, rdispls = _ints("recvcounts", rcounts, size), _ints("rdispls", rdispls, size)
    rb = as_buffer(recvbuf, "recvbuf", writable=True)
    _fits("recvbuf", rcounts, rdispls, rb.size)
    if inplace:
        sb, scounts, sdispls = rb, rcounts, rdispls
    else:
        scounts, sdispls = _ints("sendcounts", scounts, size), _ints("sdispls", sdispls, size)
        sb = as_buffer(sendbuf, "sendbuf")
        if sb.dtype != rb.dtype:
            raise ArgumentError(f"sendbuf: dtype {sb.dtype} differs from recvbuf's {rb.dtype}")
        _fits("sendbuf", scounts, sdispls, sb.size)
        _distinct(rb, sb)
        if scounts[rank] > rcounts[rank]:
            raise ArgumentError(f"sendcounts[{rank}] = {scounts[rank]} is more than "
                                f"recvcounts[{rank}] = {rcounts[rank]} (this rank's own block)")
    return Call("alltoallv", sb, rb, sum(rcounts), None, 0, inplace, recvbuf,
                layout=(("counts", rcounts), ("displs", rdispls), ("scounts", scounts),
                        ("sdispls", sdispls)), fp_count=ALLTOALLV_FP)
