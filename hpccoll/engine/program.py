"""Program lanes: a step machine's program being executed on one rank.

A ``ProgramLane`` holds everything a suspended collective needs to resume: its program
counter, the transfers it has posted and what it waits on.  Its instructions (the
program compiled once per plan: engine/code.py) run in C where the C executor has them
(node-shared memory on host arrays), else in Python; either way ``run`` continues at
``pc`` with the same requests, so nothing is redone.  Point-to-point transfers go to
transport/mpi.py, node-shared flags and slots to transport/shm.py, local reductions and
copies to NumPy or to the lane's reduction backend (transport/reduction.py).

``DeviceLane`` runs a program over device arrays: its kernels and copies are queued on
hpccoll's stream in program order, MPI moves device memory directly (CUDA-aware) or
staged through pinned host buffers (transport/staging.py), and the engine only polls
events (``Staged``), never blocks in a stream synchronize.
"""
from __future__ import annotations

import numpy as np

from ..algorithms.primitives import WaitFlags
from ..transport import mpi as transport
from ..transport import staging
from . import code as _code
from .code import _native
from .lane import GPU, HELD, Lane, lane_fields




class Shm:
    """What a plan's shared-memory programs need at run time: the communicator's area, the
    map from local index to communicator rank, peers' registered buffers (typed views),
    when the collective uses them, the plan's program compiled (``code``) and encoded for
    the C executor (``native``, or None where Python runs it)."""
    __slots__ = ("area", "local", "peer_send", "peer_recv", "code", "native")

    def __init__(self, area, local, peer_send=None, peer_recv=None):
        self.area, self.local = area, local
        self.peer_send, self.peer_recv = peer_send, peer_recv
        self.code = self.native = None


class ProgramLane(Lane):
    """One program being executed: ``code`` its instructions (engine/code.py), ``bufs``
    the send, receive and scratch arrays (flat, typed like the collective's data).
    (Its fields are declared in program.pxd: a compiled lane has no ``__dict__``.)"""

    def __init__(self, program, code, bufs, op, mpi_comm, tag, ops, shm=None, native=None):
        program_setup(self, program, code, bufs, op, mpi_comm, tag, ops, shm, native)

    def start(self) -> None:
        self.run()

    def run(self) -> bool:
        """Execute until a wait that does not hold yet, or the end; True if anything moved.
        Instructions the C executor has run there, in one call per poll; the others in
        Python (code.run)."""
        native = self.native
        if native is None:
            return _code.run(self)
        start = self.pc
        b = self.bufs
        a = self.addrs      # (the send and receive arrays' addresses: CommState._lane)
        if a is None:
            moved = _native.run(native, start, self.base, b[0], b[1], b[2])
        else:
            moved = _native.run(native, start, self.base, a[0], a[1], b[2])
        if moved is None:           # still waiting where it stopped (most polls)
            return False
        pc, waits = moved
        self.pc = pc
        self.waits_done += waits
        code = self.code
        if pc < len(code):
            self.waiting = code[pc][3]
            return pc != start
        self.waiting = None
        self.done = True
        return True

    def release(self) -> None:
        if self.pool is not None and self._pooled is not None:
            self.pool.put(self._pooled)
            self._pooled = None
        self.bufs = self._bytes = self.addrs = None
        self.shm = None

    def _view(self, x):
        """The bytes of an operand (engine/code.py: ``(buf, lo, hi)`` of the call's arrays,
        or a fixed array of node-shared memory): what a Post hands MPI."""
        if type(x) is not tuple:
            return x.view(np.uint8)
        buf, lo, hi = x
        b = self._bytes[buf]
        if b is None:
            b = self._bytes[buf] = self.bufs[buf].view(np.uint8)
        return b[lo * self.itemsize:hi * self.itemsize]

    def _arr(self, reg):
        return self.bufs[reg.buf][reg.off:reg.off + reg.n]

    def _post(self, p, sends, recvs):
        """Post step ``p``'s transfers (``sends``, ``recvs``: (peer, operand) pairs)."""
        reqs = transport.post(self.mpi, self.tag, sends, recvs, self._view)
        return reqs, self._describe(p), None

    # what a Post returned, tested, inspected and cancelled (device lanes hold back sends)
    _test = staticmethod(transport.test_all)
    _pending = staticmethod(transport.pending)
    _cancel = staticmethod(transport.cancel)

    def _describe(self, p):
        return [("recv", peer, reg.n * self.itemsize) for peer, reg in p.recvs] + \
               [("send", peer, reg.n * self.itemsize) for peer, reg in p.sends]

    def _end(self) -> None:
        """The program ran to its end (device lanes synchronize their stream here)."""

    def pending_peers(self):
        recv_from, send_to = set(), set()
        w = self.waiting
        if isinstance(w, WaitFlags):
            late = self.shm.area.behind(w.flag, self.base + w.epoch, w.peers)
            return {self.shm.local[q] for q in late}, send_to
        if w is not None and w in self.inflight:
            reqs, descr, _ = self.inflight[w]
            for still, (kind, peer, _) in zip(self._pending(reqs), descr):
                if still:
                    (recv_from if kind == "recv" else send_to).add(peer)
        return recv_from, send_to

    def recv_peers(self) -> list:
        return sorted({p for _, d, _ in self.inflight.values() for kind, p, _ in d
                       if kind == "recv"})

    def cancel(self) -> None:
        for reqs, descr, _ in self.inflight.values():
            self._cancel(reqs, sum(1 for d in descr if d[0] == "recv"))
        if self.shm is not None and any(ins[0] == _code.PUBLISH for ins in self.code):
            # a peer that had read what this rank published may still be writing into it
            # (single-copy gathers and scatters: process_vm_writev), and a write cannot be
            # cancelled: the buffers stay alive, so that it lands in memory nobody reuses
            HELD.append(self.bufs)


def program_setup(lane, program, code, bufs, op, mpi_comm, tag, ops, shm, native):
    """Every field of a ProgramLane (its one initialisation)."""
    lane_fields(lane, True, True)
    lane.done = len(code) == 0       # (set again where ``pc`` reaches the end)
    lane.program = program
    lane.code = code
    lane.native = native     # the same instructions for the C executor, or None
    lane.bufs = bufs
    lane._bytes = [None, None, None]   # byte views, made on first use
    # (the arrays' dtype is a NumPy dtype, device arrays' too: np.dtype(dt) would parse
    # keyword arguments, isinstance(dt, np.dtype) asks its metaclass: ~1,000 and ~600
    # instructions)
    lane.itemsize = bufs[0].dtype.itemsize
    lane.op = op
    lane.mpi = mpi_comm
    lane.tag = tag
    lane.ops = ops
    lane.pc = 0
    lane.inflight = {}      # handle -> (requests, [(kind, peer, nbytes)], finish or None)
    lane.waiting = None     # a handle (MPI transfers) or a WaitFlags (shared memory)
    lane.waits_done = 0
    lane.bytes_moved = 0
    lane.shm = shm          # the plan's Shm, where the program uses node-shared memory
    lane.base = 0           # the epoch before this collective's first (shared memory)
    lane.pool = None        # where the scratch buffer goes back to (BufferPool)
    lane._pooled = None
    # (``holds``: the communicator's shared slots, a Gate, where it uses them)
    lane.addrs = None       # (send, recv) addresses for the C executor, where known
    return lane


def program_lane(program, code, bufs, op, mpi_comm, tag, ops, shm=None, native=None):
    """A new ProgramLane: ProgramLane(...) without the call's argument parsing."""
    return program_setup(ProgramLane.__new__(ProgramLane), program, code, bufs, op, mpi_comm,
                         tag, ops, shm, native)


class Staged:
    """One Post of a device lane: transfers held back until an event recorded on
    hpccoll's stream has completed -- the device-to-host copies of the bytes to send
    (staged), or every kernel before the Post (direct: MPI touches device memory outside
    any stream) -- then posted.  Tested like a list of requests, so the engine polls the
    event where it polls MPI, and never blocks in a stream synchronize."""
    __slots__ = ("lane", "reqs", "n_recvs", "held", "event")

    def __init__(self, lane, reqs: list, held_recvs: list, held_sends: list, event):
        self.lane, self.reqs, self.event = lane, reqs, event
        self.n_recvs = len(reqs) + len(held_recvs)
        self.held = (held_recvs, held_sends) if held_recvs or held_sends else None

    def test(self) -> bool:
        if self.held is not None:
            if not _done(self.event):
                return False
            recvs, sends = self.held
            self.held = None
            lane = self.lane
            self.reqs = ([lane.mpi.Irecv(buf, peer, lane.tag) for peer, buf in recvs] + self.reqs
                         + [lane.mpi.Isend(buf, peer, lane.tag) for peer, buf in sends])
        return transport.test_all(self.reqs)

    def pending(self) -> list:
        if self.held is None:
            return transport.pending(self.reqs)
        recvs, sends = self.held   # not posted yet: pending (in _describe's order)
        return [True] * len(recvs) + transport.pending(self.reqs) + [True] * len(sends)

    def cancel(self, n_recvs: int) -> None:
        self.held = None
        # the receives lead self.reqs once posted; held ones were never posted
        transport.cancel(self.reqs, self.n_recvs if len(self.reqs) >= self.n_recvs else 0)


def _done(event) -> bool:
    return event is None or staging.done(event)


class DeviceLane(ProgramLane):
    """A program over device arrays (see the module docstring for the transport).  Its
    kernels and copies are queued on hpccoll's stream in program order, which orders them
    on the device; the engine thread only polls events (``Staged``), and synchronizes the
    stream once, at the end, so that the result is ready when ``wait()`` returns."""
    __slots__ = ("direct", "returns")

    def __init__(self, program, code, bufs, op, mpi_comm, tag, ops, direct: bool):
        super().__init__(program, code, bufs, op, mpi_comm, tag, ops)
        self.at_issue = False      # its start queues kernels and may synchronize the stream
        self.direct = direct
        self.holds = GPU
        self.returns = []       # (event, pinned buffers) back to the pool once it completed

    def run(self) -> bool:
        """The program, with the arrays' GPU current on whichever thread runs it (the
        engine's works on device 0 otherwise)."""
        device = self.ops.device
        if device is None:
            return _code.run(self)
        with staging.on_device(device):
            return _code.run(self)

    _test = staticmethod(lambda staged: staged.test())
    _pending = staticmethod(lambda staged: staged.pending())
    _cancel = staticmethod(lambda staged, n_recvs: staged.cancel(n_recvs))

    def _post(self, p, sends=None, recvs=None):
        stream = self.ops.stream
        self._give_back(False)
        descr = self._describe(p)
        if self.direct:
            view = lambda reg: staging.mpi_view(self._arr(reg))   # noqa: E731
            return Staged(self, [], [(peer, view(reg)) for peer, reg in p.recvs],
                          [(peer, view(reg)) for peer, reg in p.sends],
                          staging.record(stream)), descr, None
        isz = self.itemsize
        sends, recvs, used = [], [], []
        for peer, reg in p.sends:
            host = staging.STAGING.get(reg.n * isz)
            used.append(host)
            self._arr(reg).copy_to_host(host[:reg.n * isz].view(self._arr(reg).dtype),
                                        stream=stream)
            sends.append((peer, host[:reg.n * isz]))
        for peer, reg in p.recvs:
            host = staging.STAGING.get(reg.n * isz)
            used.append(host)
            recvs.append((peer, host, reg))
        # receives land in fresh host buffers: posted now; sends once their copies are done
        reqs = [self.mpi.Irecv(h[:r.n * isz], peer, self.tag) for peer, h, r in recvs]
        staged = Staged(self, reqs, [], sends, staging.record(stream) if sends else None)

        def finish():
            for _, host, reg in recvs:
                dev = self._arr(reg)
                dev.copy_to_device(host[:reg.n * isz].view(dev.dtype), stream=stream)
            # kernels after this read the copies in stream order; the host buffers go
            # back to the pool once the copies that read them are done
            self.returns.append((staging.record(stream), used))
        return staged, descr, finish

    def _give_back(self, everything: bool) -> None:
        keep = []
        for event, bufs in self.returns:
            if everything or staging.done(event):
                for buf in bufs:
                    staging.STAGING.put(buf)
            else:
                keep.append((event, bufs))
        self.returns = keep

    def _end(self) -> None:
        self.ops.sync()
        self._give_back(True)
