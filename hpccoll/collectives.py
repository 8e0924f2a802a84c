"""Argument handling of the collectives, one function each, all the same shape:
validate, decide in-place, allocate the result, return a ``Call``.

Nothing here is queued: a bad argument raises before the engine sees anything,
with an error that names the argument and says what was expected.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional

import numpy as np

from .buffers import Buffer, as_buffer, check_op, check_recvbuf, new_buffer, overlap
from .errors import ArgumentError, ArgumentTypeError


class Call(NamedTuple):
    coll: str
    send: Buffer
    recv: Buffer          # what the algorithm writes (may be a view of the result)
    count: int            # the contract's n
    op: Optional[str]
    root: int
    inplace: bool
    result: Any           # what wait() returns
    # variable-count collectives (hpccoll/vcollectives.py): extra Spec fields as (name, value)
    # pairs, and what the mismatch check compares instead of ``count``
    layout: tuple = ()
    fp_count: Optional[int] = None


def _root(root: Any, size: int) -> int:
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < size:
        raise ArgumentError(f"root: expected an integer in [0, {size}), got {root!r}")
    return int(root)


def _block(b: Buffer, array, start: int, n: int) -> Buffer:
    """Elements [start, start+n) of a buffer, as a Buffer of its own."""
    return Buffer(array, b.flat[start:start + n], b.device,
                  b.ptr + start * b.dtype.itemsize if b.device else 0, b.stream)


def _output(sb: Buffer, recvbuf: Any, expected: int, what: str):
    """(recv Buffer, result, inplace) for the collectives whose output has ``expected`` elements."""
    if recvbuf is None:
        rb = new_buffer(expected, sb)
        return rb, rb.array, False
    if recvbuf is sb.array:
        rb = as_buffer(recvbuf, "recvbuf", writable=True)
        if rb.size != expected:
            raise ArgumentError(f"recvbuf: expected {expected} elements ({what}), got {rb.size}")
        return rb, recvbuf, True
    rb = check_recvbuf(recvbuf, expected, sb.dtype, what, sb.device)
    if rb.same_memory(sb):
        return rb, recvbuf, True
    if overlap(rb, sb):
        raise ArgumentError("recvbuf: overlaps sendbuf without being the same buffer "
                            "(pass the same array for in-place operation)")
    return rb, recvbuf, False


def allreduce(comm, sendbuf, recvbuf, op) -> Call:
    sb = as_buffer(sendbuf, "sendbuf")
    op = check_op(op, sb.dtype)
    rb, result, inplace = _output(sb, recvbuf, sb.size, "the same count as sendbuf")
    return Call("allreduce", sb, rb, sb.size, op, 0, inplace, result)


def reduce(comm, sendbuf, recvbuf, op, root) -> Call:
    root = _root(root, comm.size)
    sb = as_buffer(sendbuf, "sendbuf")
    op = check_op(op, sb.dtype)
    rb, result, inplace = _output(sb, recvbuf, sb.size, "the same count as sendbuf")
    return Call("reduce", sb, rb, sb.size, op, root, inplace, result)


def broadcast(comm, buf, root) -> Call:
    root = _root(root, comm.size)
    b = as_buffer(buf, "buf", writable=comm.rank != root)
    return Call("broadcast", b, b, b.size, None, root, True, buf)


def allgather(comm, sendbuf, recvbuf) -> Call:
    size, rank = comm.size, comm.rank
    sb = as_buffer(sendbuf, "sendbuf")
    if recvbuf is not None and recvbuf is sendbuf:
        # in place, the same array: size*n elements, this rank's contribution in block rank
        if sb.size % size:
            raise ArgumentError(f"sendbuf: in-place allgather needs size*n elements "
                                f"(size={size}), got {sb.size}")
        rb = as_buffer(recvbuf, "recvbuf", writable=True)
        m = sb.size // size
        return Call("allgather", _block(rb, sendbuf, rank * m, m), rb, m, None, 0, True, recvbuf)
    m = sb.size
    if recvbuf is None:
        rb = new_buffer(size * m, sb)
        return Call("allgather", sb, rb, m, None, 0, False, rb.array)
    rb = check_recvbuf(recvbuf, size * m, sb.dtype, f"size*n = {size}*{m}", sb.device)
    result = recvbuf
    if overlap(rb, sb):
        # NCCL's in-place form: sendbuf is block `rank` of recvbuf
        if sb.address == rb.address + rank * m * sb.dtype.itemsize:
            return Call("allgather", sb, rb, m, None, 0, True, result)
        raise ArgumentError("recvbuf: overlaps sendbuf; for in-place allgather sendbuf must be "
                            f"block {rank} of recvbuf, or pass the same array twice")
    return Call("allgather", sb, rb, m, None, 0, False, result)


def reduce_scatter(comm, sendbuf, recvbuf, op) -> Call:
    size, rank = comm.size, comm.rank
    sb = as_buffer(sendbuf, "sendbuf")
    op = check_op(op, sb.dtype)
    if sb.size % size:
        raise ArgumentError(f"sendbuf: expected size*n elements (size={size}), got {sb.size}, "
                            f"which is not a multiple of {size}")
    m = sb.size // size
    if recvbuf is not None and recvbuf is sendbuf:
        # in place, the same array: this rank's block of it receives the result
        rb = as_buffer(recvbuf, "recvbuf", writable=True)
        return Call("reduce_scatter", sb, _block(rb, recvbuf, rank * m, m), m, op, 0, True, recvbuf)
    if recvbuf is None:
        rb = new_buffer(m, sb)
        return Call("reduce_scatter", sb, rb, m, op, 0, False, rb.array)
    rb = check_recvbuf(recvbuf, m, sb.dtype, f"sendbuf's size / {size}", sb.device)
    if overlap(rb, sb):
        if rb.address == sb.address + rank * m * sb.dtype.itemsize:
            return Call("reduce_scatter", sb, rb, m, op, 0, True, recvbuf)
        raise ArgumentError("recvbuf: overlaps sendbuf; for in-place reduce_scatter recvbuf must be "
                            f"block {rank} of sendbuf, or pass the same array twice")
    return Call("reduce_scatter", sb, rb, m, op, 0, False, recvbuf)


def alltoall(comm, sendbuf, recvbuf) -> Call:
    size = comm.size
    sb = as_buffer(sendbuf, "sendbuf")
    if sb.size % size:
        raise ArgumentError(f"sendbuf: expected size*n elements (size={size}), got {sb.size}, "
                            f"which is not a multiple of {size}")
    rb, result, inplace = _output(sb, recvbuf, sb.size, "the same count as sendbuf")
    return Call("alltoall", sb, rb, sb.size // size, None, 0, inplace, result)


_EMPTY = np.empty(0, dtype=np.uint8)


def barrier(comm) -> Call:
    b = Buffer(_EMPTY, _EMPTY)
    return Call("barrier", b, b, 0, None, 0, True, None)


def check_blocks(blocks: Any, default: Optional[int]) -> Optional[int]:
    if blocks is None:
        return default
    if isinstance(blocks, bool) or not isinstance(blocks, (int, np.integer)) or blocks < 1:
        raise ArgumentError(f"blocks: expected a positive integer or None, got {blocks!r}")
    return int(blocks)


def check_key(key: Any) -> Optional[str]:
    if key is not None and not isinstance(key, str):
        raise ArgumentTypeError(f"key: expected a str or None, got {type(key).__name__}")
    return key
