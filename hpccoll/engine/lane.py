"""Executing a program: a lane is a program, its program counter and the transfers it has
posted -- all the context a suspended collective needs.  Resuming continues at ``pc``
with the same requests, so nothing is redone.

Local primitives (Reduce, Copy, Scale) go to an ``ops`` object:

- ``HostOps``: NumPy ufuncs (default for host arrays);
- ``CpuKernelOps(blocks)``: Numba CPU kernels on ``blocks`` threads (host arrays with an
  explicit block count: the contention-aware allocation decides how many threads);
- ``CudaOps(blocks, threads_per_block)``: numba_kernels' CUDA kernels on hpccoll's stream.

``DeviceLane`` moves device memory: directly with a CUDA-aware MPI, otherwise through
pinned host staging buffers (device -> host before a send, host -> device once a
receive completed).  Before anything is sent, the stream is synchronized, so kernels that
produced the data have finished; at the end of the program too, so the result is ready
when wait() returns.
"""
from __future__ import annotations

import numpy as np

from mpi4py import MPI

from ..algorithms.primitives import (PSEND, SLOT, Coll, Copy, Post, Reduce, ReduceN, Scale, Signal,
                                    Wait, WaitFlags)
from ..buffers import reduce_into, scale_into
from ..transport import mpi as transport


class HostOps:
    name = "numpy"

    @staticmethod
    def reduce(op, dst, a, b):
        reduce_into(op, dst, a, b)

    @staticmethod
    def copy(dst, src):
        np.copyto(dst, src)

    @staticmethod
    def scale(dst, divisor):
        scale_into(dst, divisor)

    @staticmethod
    def reduce_n(op, dst, srcs):
        if len(srcs) == 1:
            np.copyto(dst, srcs[0])
            return
        reduce_into(op, dst, srcs[0], srcs[1])
        for s in srcs[2:]:
            reduce_into(op, dst, dst, s)


class CpuKernelOps:
    name = "numba-cpu"

    def __init__(self, blocks: int):
        from numba_kernels import cpu, ops
        self.k, self.blocks = cpu, blocks
        self.kernel_ops = ops.COMBINE   # the others (logical, bitwise: mpi4py's) run in NumPy

    def reduce(self, op, dst, a, b):
        if op not in self.kernel_ops:
            HostOps.reduce(op, dst, a, b)
            return
        self.k.reduce(op, dst, (a, b), self.blocks)

    def copy(self, dst, src):
        self.k.copy(dst, src, self.blocks)

    def scale(self, dst, divisor):
        self.k.scale(dst, divisor, self.blocks)

    def reduce_n(self, op, dst, srcs):
        if len(srcs) == 1:
            self.k.copy(dst, srcs[0], self.blocks)
        elif op not in self.kernel_ops:
            HostOps.reduce_n(op, dst, srcs)
        else:
            self.k.reduce(op, dst, srcs, self.blocks)


class CudaOps:
    name = "numba-cuda"

    def __init__(self, blocks: int, threads_per_block: int):
        from numba_kernels import cuda as k
        from .. import device
        self.k, self.blocks, self.tpb = k, blocks, threads_per_block
        self.stream = device.engine_stream()

    def reduce(self, op, dst, a, b):
        self.k.reduce(op, dst, (a, b), self.blocks, self.tpb, self.stream)

    def copy(self, dst, src):
        self.k.copy(dst, src, self.blocks, self.tpb, self.stream)

    def scale(self, dst, divisor):
        self.k.scale(dst, divisor, self.blocks, self.tpb, self.stream)

    def sync(self):
        self.stream.synchronize()


MPI_OPS = {"sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}


def start_collective(mpi_comm, kind, send, recv, op=None, root=0):
    """Start the MPI library's own nonblocking collective ``kind`` (the ``mpi`` rows of
    the algorithm table, on the general path and on the express path); ``send`` may be
    MPI.IN_PLACE.  Returns its request."""
    if kind == "allreduce":
        return mpi_comm.Iallreduce(send, recv, op)
    if kind == "broadcast":
        return mpi_comm.Ibcast(recv, root)
    if kind == "allgather":
        return mpi_comm.Iallgather(send, recv)
    if kind == "alltoall":
        return mpi_comm.Ialltoall(send, recv)
    return mpi_comm.Ibarrier()


class Shm:
    """What a shared-memory program needs at run time: the communicator's area, this
    collective's epoch base, the map from local index to communicator rank, and peers'
    registered buffers (typed views), when the collective uses them."""
    __slots__ = ("area", "base", "local", "peer_send", "peer_recv", "slots")

    def __init__(self, area, base, local, peer_send=None, peer_recv=None):
        self.area, self.base, self.local = area, base, local
        self.peer_send, self.peer_recv = peer_send, peer_recv
        self.slots = {}


class Lane:
    """One program being executed on host arrays."""
    __slots__ = ("program", "bufs", "_bytes", "itemsize", "op", "mpi", "tag", "pc", "inflight",
                 "waiting", "waits_done", "bytes_moved", "ops", "shm", "pool", "_pooled")

    def __init__(self, program, bufs, op, mpi_comm, tag, ops=HostOps):
        self.program = program
        self.bufs = bufs
        self._bytes = [None, None, None]   # byte views, made on first use
        self.itemsize = np.dtype(bufs[0].dtype).itemsize
        self.op = op
        self.mpi = mpi_comm
        self.tag = tag
        self.ops = ops
        self.pc = 0
        self.inflight = {}      # handle -> (requests, [(kind, peer, nbytes)], finish or None)
        self.waiting = None     # a handle (MPI transfers) or a WaitFlags (shared memory)
        self.waits_done = 0
        self.bytes_moved = 0
        self.shm = None
        self.pool = None        # where the scratch buffer goes back to (BufferPool)
        self._pooled = None

    def release(self) -> None:
        """The collective is over: return its scratch buffer to the communicator's pool."""
        if self.pool is not None and self._pooled is not None:
            self.pool.put(self._pooled)
            self._pooled = None

    @property
    def done(self) -> bool:
        return self.pc >= len(self.program.steps)

    def _view(self, reg):
        if reg.buf.__class__ is tuple:
            return self._arr(reg).view(np.uint8)
        b = self._bytes[reg.buf]
        if b is None:
            b = self._bytes[reg.buf] = self.bufs[reg.buf].view(np.uint8)
        return b[reg.off * self.itemsize:(reg.off + reg.n) * self.itemsize]

    def _arr(self, reg):
        b = reg.buf
        if b.__class__ is tuple:
            return self._shared(b)[reg.off:reg.off + reg.n]
        return self.bufs[b][reg.off:reg.off + reg.n]

    def _shared(self, b):
        """A peer's slot or registered buffer, typed like this collective's data."""
        shm = self.shm
        if b[0] == SLOT:
            index = (shm.base + b[2]) % shm.area.slots
            key = (b[1], index)
            view = shm.slots.get(key)
            if view is None:
                dtype = self.bufs[0].dtype
                view = shm.slots[key] = shm.area.slot(b[1], index).view(dtype)
            return view
        return (shm.peer_send if b[0] == PSEND else shm.peer_recv)[b[1]]

    def _waited(self) -> bool:
        """Has what the lane waits on completed?"""
        w = self.waiting
        if w.__class__ is int:
            return transport.test_all(self.inflight[w][0])
        return self.shm.area.reached(w.flag, self.shm.base + w.epoch, w.peers)

    def _post(self, p):
        reqs = transport.post(self.mpi, self.tag, p.sends, p.recvs, self._view)
        return reqs, self._describe(p), None

    def _coll(self, p):
        """Start an MPI nonblocking collective (algorithms/mpicoll.py)."""
        send = MPI.IN_PLACE if p.send == p.recv else self._arr(p.send)
        req = start_collective(self.mpi, p.kind, send, self._arr(p.recv), MPI_OPS.get(self.op),
                               p.root)
        return [req], [("coll", -1, p.recv.n * self.itemsize)], None

    def _describe(self, p):
        return [("recv", peer, reg.n * self.itemsize) for peer, reg in p.recvs] + \
               [("send", peer, reg.n * self.itemsize) for peer, reg in p.sends]

    def _end(self) -> None:
        """The program ran to its end (device lanes synchronize their stream here)."""

    def run(self) -> bool:
        """Execute until a Wait whose transfers are still in flight, or the end.
        True if anything moved."""
        steps = self.program.steps
        start = self.pc
        if self.waiting is not None and not self._waited():
            return False
        ops = self.ops
        while self.pc < len(steps):
            p = steps[self.pc]
            kind = type(p)
            if kind is Wait:
                reqs, descr, finish = self.inflight[p.h]
                if not transport.test_all(reqs):
                    self.waiting = p.h
                    return self.pc != start
                del self.inflight[p.h]
                if finish is not None:
                    finish()
                self.waits_done += 1
                self.bytes_moved += sum(d[2] for d in descr)
            elif kind is Post:
                self.inflight[p.h] = self._post(p)
            elif kind is Coll:
                self.inflight[p.h] = self._coll(p)
            elif kind is Reduce:
                ops.reduce(self.op, self._arr(p.dst), self._arr(p.a), self._arr(p.b))
            elif kind is Copy:
                ops.copy(self._arr(p.dst), self._arr(p.src))
            elif kind is Scale:
                ops.scale(self._arr(p.dst), p.divisor)
            elif kind is WaitFlags:
                if not self.shm.area.reached(p.flag, self.shm.base + p.epoch, p.peers):
                    self.waiting = p
                    return self.pc != start
                self.waits_done += 1
            elif kind is Signal:
                self.shm.area.signal(p.flag, self.shm.base + p.epoch)
            elif kind is ReduceN:
                ops.reduce_n(self.op, self._arr(p.dst), [self._arr(r) for r in p.srcs])
            self.pc += 1
        self.waiting = None
        self._end()
        return True

    def pending_peers(self):
        """(peers it waits to receive from, peers its sends are still going to), as
        communicator ranks."""
        recv_from, send_to = set(), set()
        w = self.waiting
        if isinstance(w, WaitFlags):
            late = self.shm.area.behind(w.flag, self.shm.base + w.epoch, w.peers)
            return {self.shm.local[q] for q in late}, send_to
        if self.waiting is not None and self.waiting in self.inflight:
            reqs, descr, _ = self.inflight[self.waiting]
            for still, (kind, peer, _) in zip(transport.pending(reqs), descr):
                if still and kind == "coll":
                    recv_from.add(-1)        # every peer (an MPI collective)
                elif still:
                    (recv_from if kind == "recv" else send_to).add(peer)
        return recv_from, send_to

    def cancel(self) -> None:
        for reqs, descr, _ in self.inflight.values():
            transport.cancel(reqs, sum(1 for d in descr if d[0] == "recv"))


class DeviceLane(Lane):
    """A program over device arrays (see the module docstring for the transport)."""
    __slots__ = ("direct",)

    def __init__(self, program, bufs, op, mpi_comm, tag, ops, direct: bool):
        super().__init__(program, bufs, op, mpi_comm, tag, ops)
        self.direct = direct

    def _post(self, p):
        from .. import device
        self.ops.sync()     # kernels that wrote what we send have finished
        if self.direct:
            reqs = transport.post(self.mpi, self.tag, p.sends, p.recvs,
                                  lambda reg: device.mpi_view(self._arr(reg)))
            return reqs, self._describe(p), None
        isz = self.itemsize
        staged_sends, staged_recvs = [], []
        for peer, reg in p.sends:
            host = device.STAGING.get(reg.n * isz)
            typed = host[:reg.n * isz].view(self._arr(reg).dtype)
            self._arr(reg).copy_to_host(typed, stream=self.ops.stream)
            staged_sends.append((peer, host, reg))
        self.ops.sync()
        for peer, reg in p.recvs:
            staged_recvs.append((peer, device.STAGING.get(reg.n * isz), reg))
        reqs = [self.mpi.Irecv(h[:r.n * isz], peer, self.tag) for peer, h, r in staged_recvs]
        reqs += [self.mpi.Isend(h[:r.n * isz], peer, self.tag) for peer, h, r in staged_sends]

        def finish():
            for _, host, reg in staged_recvs:
                dev = self._arr(reg)
                dev.copy_to_device(host[:reg.n * isz].view(dev.dtype), stream=self.ops.stream)
            self.ops.sync()     # the host buffers are reused next
            for _, host, _ in staged_recvs + staged_sends:
                device.STAGING.put(host)
        return reqs, self._describe(p), finish

    def _end(self) -> None:
        self.ops.sync()
