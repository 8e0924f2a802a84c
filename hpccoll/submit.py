"""From a validated call to a queued task: pick the algorithm (the table's first
candidate that applies), build and cache its program, make its lane (host or device, and
shared-memory state), name it (sequence number or key, message tag), fingerprint it for
the mismatch check, and make it start after its communicator's previous order-matched
collective.  Nothing here blocks; a bad key raises before anything is queued."""
from __future__ import annotations

import hashlib
from typing import Optional

import numpy as np

from . import algorithms, collectives
from .algorithms.spec import COLLECTIVES, Spec
from .buffers import dtype_code, op_code
from .errors import ArgumentError
from .work import Work


class RegisteredCall:
    """A collective whose send and receive buffers both live in registered allocations:
    (allocation, byte offset, bytes) for each."""

    def __init__(self, send, recv, dtype, coll, inplace):
        self.send, self.recv, self.dtype = send, recv, dtype
        # Peers read my buffers at *their* offsets, so what they read must sit at the same
        # offset of the same allocation on every rank: that goes into the fingerprint.
        # (NCCL's in-place views put the other buffer at a rank-dependent offset: not read.)
        if coll == "allreduce":
            read = (send, recv)
        elif coll == "allgather" and inplace:
            read = (recv,)
        else:
            read = (send,)
        h = 1
        for alloc, off, _ in read:
            h = ((h * 1_000_003) ^ (alloc.id << 40) ^ off) & ((1 << 62) - 1)
        self.fingerprint = h | 1


MPI_NATIVE_OPS = frozenset({"sum", "prod", "min", "max", "avg"})
MPI_NATIVE_DTYPES = frozenset(np.dtype(n) for n in (
    "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float32", "float64"))


def host_lane(call, program, blocks, pool, mpi_comm, tag):
    """Host arrays: NumPy ufuncs, or Numba CPU kernels on ``blocks`` threads (compiled
    here, on the calling thread, the first time, never inside the engine)."""
    from .engine import lane as lanes     # cached after the first import: a dict lookup
    ops = lanes.HostOps
    if blocks is not None:
        from numba_kernels import cpu
        if blocks > cpu.max_threads():
            raise ArgumentError(f"blocks: at most {cpu.max_threads()} CPU threads on this machine "
                                f"(NUMBA_NUM_THREADS), got {blocks}")
        if call.op is not None:
            cpu.prepare(call.op, call.send.dtype)
        ops = lanes.CpuKernelOps(blocks)
    dt = call.send.dtype
    raw = pool.get(program.scratch * dt.itemsize) if program.scratch else None
    scratch = raw[:program.scratch * dt.itemsize].view(dt) if raw is not None else _NO_SCRATCH
    lane = lanes.Lane(program, [call.send.flat, call.recv.flat, scratch], call.op, mpi_comm, tag, ops)
    lane.pool, lane._pooled = pool, raw
    return lane


_NO_SCRATCH = np.empty(0, np.uint8)


def device_lane(ctx, call, program, blocks, chunk):
    """Device arrays: CUDA kernels with ``blocks`` blocks (default: the size rule), on
    hpccoll's stream, after the arrays' own streams finished their queued work."""
    from . import device
    from .engine.lane import CudaOps, DeviceLane
    from numba_kernels import cuda as kernels
    s = ctx.settings
    device.wait_for_stream(call.send)
    if call.recv.array is not call.send.array:
        device.wait_for_stream(call.recv)
    if blocks is None:
        cap = s.max_blocks or 2 * kernels.multiprocessors()
        blocks = kernels.default_blocks(min(call.count * max(1, ctx.size), chunk),
                                        s.threads_per_block, cap)
    kernels.prepare(call.op, call.send.dtype)
    direct = {"yes": True, "no": False}.get(s.cuda_aware)
    if direct is None:
        direct = device.mpi_cuda_aware()
    scratch = device.empty(program.scratch, call.send.dtype)
    bufs = [call.send.flat, call.recv.flat, scratch]
    ops = CudaOps(blocks, s.threads_per_block)
    return lambda mpi_comm, tag: DeviceLane(program, bufs, call.op, mpi_comm, tag, ops, direct)


def key_hash(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") >> 1


def registered_pair(ctx, call):
    """Where a collective's buffers live in registered memory, or None unless both do."""
    if not ctx._allocs:
        return None
    found = []
    for buf in (call.send, call.recv):
        for alloc in ctx._allocs:
            off = alloc.offset(buf.address, buf.nbytes)
            if off is not None:
                found.append((alloc, off, buf.nbytes))
                break
        else:
            return None
    return RegisteredCall(found[0], found[1], call.send.dtype, call.coll, call.inplace)

def shm_runtime(ctx, comm, shm, base, registered):
    """Run-time state of a shared-memory collective: peers' registered buffers are the
    same offsets of their own segments (allocations are symmetric)."""
    from .engine.lane import Shm
    peer_send = peer_recv = None
    if registered is not None:
        nodes = [ctx._node_index[comm.world_ranks[c]] for c in shm["local"]]
        (sa, so, sn), (ra, ro, rn) = registered.send, registered.recv
        peer_send = [sa.segs[i][so:so + sn].view(registered.dtype) for i in nodes]
        peer_recv = [ra.segs[i][ro:ro + rn].view(registered.dtype) for i in nodes]
    return Shm(shm["area"], base, shm["local"], peer_send, peer_recv)


def submit(comm, call: collectives.Call, key: Optional[str], blocks) -> Work:
    """Turn a validated call into a queued task; returns its Work."""
    ctx = comm._ctx
    s = ctx.settings
    key = collectives.check_key(key)
    blocks = collectives.check_blocks(blocks, s.blocks)
    dt = call.send.dtype
    itemsize = dt.itemsize
    nbytes = algorithms.message_bytes(call.coll, call.count, comm.size, itemsize)
    shm = comm._shm if key is None and not call.send.device else None
    registered = registered_pair(ctx, call) if shm else None
    layout = ""
    if shm:
        layout = "flat" if len(shm["local"]) == comm.size else ("hier" if shm["cross"] else "")
    native = (key is None and not call.send.device and call.op in MPI_NATIVE_OPS
              and dt in MPI_NATIVE_DTYPES)
    choice = algorithms.Choice(nbytes, s.small_msg_bytes, layout, s.shm_min_bytes,
                               registered is not None, s.mpi_coll_bytes,
                               native or (call.op is None and key is None and not call.send.device))
    algo = algorithms.select(call.coll, choice)
    shared = algo in algorithms.SHM_ALGOS
    chunk = max(1, (s.shm_slot_bytes if shared else s.chunk_bytes) // itemsize)
    spec = Spec(call.coll, comm.rank, comm.size, call.count, chunk=chunk,
                depth=s.pipeline_depth, root=call.root, avg=call.op == "avg",
                inplace=call.inplace, slots=s.shm_slots,
                registered=shared and registered is not None,
                local=shm["local"] if shared else (), cross=(shm["cross"] or ()) if shared else (),
                **dict(call.layout))
    program = algorithms.build(spec, algo)
    if call.send.device:
        make_lane = device_lane(ctx, call, program, blocks, spec.chunk)
    else:
        make_lane = None
    work = Work(call.coll, ctx._engine)
    with comm._lock:
        if key is None:
            seq = comm._seq
            comm._seq += 1
            ident, tag, mpi_comm = seq, (seq % comm._tag_space) * 2, comm._data
        else:
            if key in comm._live_keys:
                raise ArgumentError(f"key: {key!r} is already pending on communicator "
                                    f"{comm.name!r}; wait for it before reusing the key")
            h = key_hash(key)
            tag = (h % comm._tag_space) * 2
            clash = [k for k, t in comm._live_keys.items() if t == tag]
            if clash:
                raise ArgumentError(f"key: {key!r} and the pending key {clash[0]!r} map to the "
                                    "same message tag on this communicator; rename one")
            comm._live_keys[key] = tag
            seq, ident, mpi_comm = None, h, comm._keyed
        fp = None
        if s.check_mismatch and comm.size > 1:
            count = call.count if call.fp_count is None else call.fp_count
            fp = (COLLECTIVES.index(call.coll) + 1, dtype_code(dt), count, call.root,
                  op_code(call.op), ident,
                  # only where peers read my buffers does it matter where they live
                  registered.fingerprint if spec.registered else 0,
                  algorithms.ALGO_CODES[algo])
        lane = (host_lane(call, program, blocks, comm._pool, mpi_comm, tag)
                if make_lane is None else make_lane(mpi_comm, tag))
        if shared:
            # epochs follow issue order on the communicator: the same on every rank
            area = shm["area"]
            lane.shm = shm_runtime(ctx, comm, shm, area.epoch,
                                   registered if spec.registered else None)
            area.epoch += program.epochs
        task = ctx._Task(work, comm, call.coll, dt, call.count, call.root, call.op, seq, key,
                         lane, call.result, fp)
        if key is not None:
            task.key_instance = comm._key_uses[key] = comm._key_uses.get(key, 0) + 1
        else:
            prev = comm._last_ordered
            if prev is not None and prev.t_start is None and not prev.finished:
                task.prev = prev
            comm._last_ordered = task
        work._task = task
        ctx._engine.submit(task, inline=nbytes <= s.inline_bytes and ctx._engine.idle())
    return work
