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

from ..algorithms.primitives import Copy, Post, Reduce, Scale, Wait
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


class CpuKernelOps:
    name = "numba-cpu"

    def __init__(self, blocks: int):
        from numba_kernels import cpu
        self.k, self.blocks = cpu, blocks

    def reduce(self, op, dst, a, b):
        self.k.reduce(op, dst, (a, b), self.blocks)

    def copy(self, dst, src):
        self.k.copy(dst, src, self.blocks)

    def scale(self, dst, divisor):
        self.k.scale(dst, divisor, self.blocks)


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


class Lane:
    """One program being executed on host arrays."""
    __slots__ = ("program", "bufs", "_bytes", "itemsize", "op", "mpi", "tag", "pc", "inflight",
                 "waiting", "waits_done", "bytes_moved", "ops")

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
        self.waiting = None
        self.waits_done = 0
        self.bytes_moved = 0

    @property
    def done(self) -> bool:
        return self.pc >= len(self.program.steps)

    def _view(self, reg):
        b = self._bytes[reg.buf]
        if b is None:
            b = self._bytes[reg.buf] = self.bufs[reg.buf].view(np.uint8)
        return b[reg.off * self.itemsize:(reg.off + reg.n) * self.itemsize]

    def _arr(self, reg):
        return self.bufs[reg.buf][reg.off:reg.off + reg.n]

    def _post(self, p):
        reqs = transport.post(self.mpi, self.tag, p.sends, p.recvs, self._view)
        return reqs, self._describe(p), None

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
        if self.waiting is not None:
            if not transport.test_all(self.inflight[self.waiting][0]):
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
            elif kind is Reduce:
                ops.reduce(self.op, self._arr(p.dst), self._arr(p.a), self._arr(p.b))
            elif kind is Copy:
                ops.copy(self._arr(p.dst), self._arr(p.src))
            elif kind is Scale:
                ops.scale(self._arr(p.dst), p.divisor)
            self.pc += 1
        self.waiting = None
        self._end()
        return True

    def pending_peers(self):
        """(peers it waits to receive from, peers its sends are still going to)."""
        recv_from, send_to = set(), set()
        if self.waiting is not None and self.waiting in self.inflight:
            reqs, descr, _ = self.inflight[self.waiting]
            for still, (kind, peer, _) in zip(transport.pending(reqs), descr):
                if still:
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
