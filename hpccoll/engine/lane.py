"""Lanes: what carries out one collective's data movement on one rank.

Every lane has the same interface (``Lane``), so a task, the policies and the watchdog
treat them alike; the plan (core/plan.py) picks the kind from the algorithm row:

- ``MpiLane``: the ``mpi`` row, the MPI library's own nonblocking collective (or, for
  tiny messages, a persistent one started again and again).  MPI progresses it, so it
  holds no execution slot (``needs_slot`` False);
- ``ProgramLane``: a step machine's program over host arrays, its program counter and the
  transfers it has posted -- all the context a suspended collective needs.  Resuming
  continues at ``pc`` with the same requests, so nothing is redone.  Local primitives go
  to a reduction backend (engine/reduction.py); transfers to MPI point-to-point
  (transport/mpi.py) or node-shared memory (transport/shm.py);
- ``DeviceLane``: a program over device arrays, moved directly by a CUDA-aware MPI or
  staged through pinned host buffers (transport/staging.py).

A lane holds the caller's arrays only while the collective runs: ``release()`` drops them
(and returns scratch space to its pool), so a finished collective keeps nothing alive.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..algorithms import MPI_PROGRAM
from ..algorithms.primitives import (PSEND, SLOT, Copy, Post, Reduce, ReduceN, Scale, Signal,
                                     Wait, WaitFlags)
from ..core import ops as table
from ..transport import mpi as transport
from . import code as _code
from .reduction import HostOps


class Gate:
    """A bounded resource a running collective holds from its start to its end, whatever
    the policy does meanwhile (a yield keeps the context, so it keeps the resource too).
    The policies start a collective only while its gate has room (Task.startable), so
    what collectives hold, not a constant, bounds how many progress at once."""
    __slots__ = ("name", "capacity", "held", "shared")

    def __init__(self, name: str, capacity: int = 1, shared: bool = False):
        self.name, self.capacity, self.held = name, capacity, 0
        # taken by collectives of every communicator (the GPU), not of one only: the
        # ordered policy must then put them in its global launch order
        self.shared = shared

    def __repr__(self) -> str:
        return f"Gate({self.name!r}, {self.held}/{self.capacity})"


# One collective's kernels fill the GPU (DFCCL's model) and its staging buffers are the
# process's pinned pool: device collectives run one at a time per process.
GPU = Gate("the GPU", 1, shared=True)


class Lane:
    """The interface (and defaults) of every lane."""
    __slots__ = ()
    needs_slot = True          # holds an execution slot while it runs (hpccoll drives it)
    holds = None               # a Gate it holds while it runs, or None (nothing bounded)
    code = None                # its program compiled (engine/code.py), where it is
    late_post = False          # posts its MPI collective after start (task.posted waits)
    mpi_posted = False
    done = False
    waits_done = 0             # suspension points passed (reports, counters)
    bytes_moved = 0

    def startable(self) -> bool:
        """May a lane that takes no execution slot start now?  (Task.startable)"""
        return True

    def start(self) -> None:
        """Post the first transfers and run to the first wait."""

    def run(self) -> bool:
        """Continue where possible; True if anything moved."""
        raise NotImplementedError

    def pending_peers(self):
        """(peers it waits to receive from, peers its sends still go to), communicator
        ranks; -1: every peer (an MPI collective)."""
        return set(), set()

    def recv_peers(self) -> list:
        """Peers a message longer than expected may have come from (diagnosis)."""
        return []

    def cancel(self) -> None:
        """Give up (the collective failed): cancel what can be cancelled."""

    def release(self) -> None:
        """The collective is over: drop the caller's arrays, return scratch space."""


# -- the MPI library's own collectives -----------------------------------------------------
class Persistent:
    """One persistent request (MPI-4 ``*_init``) on staging arrays of its own.  ``Init``
    is a collective call: it is made when the slot is first started, which happens in
    the communicator's collective order like any start; the staging arrays (``shapes``:
    element counts of send and receive, None where this rank has none, and the dtype)
    are made then too, so a slot never used costs nothing."""
    __slots__ = ("send", "recv", "req", "busy", "shapes")

    def __init__(self, shapes):
        self.shapes = shapes
        self.send = self.recv = self.req = None
        self.busy = False

    def make(self) -> None:
        ns, nr, dt = self.shapes
        self.send = None if ns is None else np.empty(ns, dt)
        self.recv = None if nr is None else np.empty(nr, dt)


NONBLOCKING = {"allreduce": "Iallreduce", "broadcast": "Ibcast", "allgather": "Iallgather",
               "alltoall": "Ialltoall", "barrier": "Ibarrier", "reduce": "Ireduce",
               "reduce_scatter": "Ireduce_scatter_block"}
PERSISTENT = {"allreduce": "Allreduce_init", "broadcast": "Bcast_init",
              "allgather": "Allgather_init", "alltoall": "Alltoall_init",
              "barrier": "Barrier_init", "reduce": "Reduce_init",
              "reduce_scatter": "Reduce_scatter_block_init"}


def start_collective(mpi_comm, kind, send, recv, op=None, root=0, persistent=False):
    """Start (or, ``persistent``, initialise) MPI's own collective ``kind``; ``send`` may
    be MPI.IN_PLACE.  Returns the request."""
    fn = getattr(mpi_comm, (PERSISTENT if persistent else NONBLOCKING)[kind])
    if kind in ("allreduce", "reduce_scatter"):
        return fn(send, recv, op)
    if kind == "reduce":
        return fn(send, recv, op, root)
    if kind == "broadcast":
        return fn(recv, root)
    if kind == "barrier":
        return fn()
    return fn(send, recv)


def post(r, send, recv):
    """Start the collective of recipe ``r`` (core/plan.py's MpiRecipe) on these arrays;
    returns its request."""
    kind = r.kind
    # reduce and reduce_scatter take no avg (the plan's rule).  Which ranks pass their
    # input in place may differ (only the root may, for reduce): the algorithm may not
    if kind == "reduce":
        if r.rank != r.root:
            return r.post(send, None, r.mop, r.root)
        return r.post(MPI.IN_PLACE if r.inplace else send, recv, r.mop, r.root)
    if kind == "reduce_scatter":
        # MPI's in-place form leaves the result in block 0, not in this rank's block
        return r.post(send.copy() if r.inplace else send, recv, r.mop)
    if r.divisor:           # avg: divide into the output, then sum in place
        table.scale(recv, send, r.divisor)
        send = MPI.IN_PLACE
    elif r.inplace:         # the input already lies where the output goes
        send = MPI.IN_PLACE
    if kind == "allreduce":
        return r.post(send, recv, r.mop)
    if kind == "broadcast":
        return r.post(recv, r.root)
    if kind == "barrier":
        return r.post()
    return r.post(send, recv)


def start_slot(r, slot, send):
    """Start persistent request ``slot`` of recipe ``r`` on ``send``'s data: copied into
    the slot's staging array (divided, for avg) unless this rank only receives; the
    request is initialised at its first start, in the collective order like any start.
    Returns the request."""
    kind = r.kind
    if slot.req is None:
        slot.make()
    if kind == "broadcast":
        if r.root == r.rank:
            slot.recv[...] = send
    elif slot.send is not None:
        if r.divisor:
            table.scale(slot.send, send, r.divisor)
        else:
            slot.send[...] = send
    req = slot.req
    if req is None:
        req = slot.req = start_collective(r.mpi, kind, slot.send, slot.recv, r.mop, r.root,
                                          persistent=True)
    slot.busy = True
    req.Start()
    return req


def finish_slot(r, slot, recv) -> None:
    """Slot ``slot``'s collective completed: its result to ``recv``; the slot is free."""
    if slot.recv is not None and recv is not None and (r.kind != "broadcast"
                                                      or r.root != r.rank):
        recv[...] = slot.recv
    slot.busy = False


class MpiLane(Lane):
    """One MPI collective.  ``recipe`` (core/plan.py's MpiRecipe) says which, with which
    op, root and divisor (avg: contributions divided before MPI sums them), and whether
    slot ``slot`` of its persistent requests runs it; ``recipe.post`` is the bound method
    that starts it (Iallreduce, Ibcast, ...)."""
    __slots__ = ("recipe", "send", "recv", "req", "slot", "done")
    needs_slot = False
    program = MPI_PROGRAM

    def __init__(self, recipe, send, recv, slot=None):
        self.recipe, self.send, self.recv, self.slot = recipe, send, recv, slot
        self.req = None
        self.done = False

    def startable(self) -> bool:
        """A persistent slot is free once its previous use completed here."""
        return self.slot is None or not self.slot.busy

    def start(self) -> None:
        if self.slot is None:
            self.req = post(self.recipe, self.send, self.recv)
        else:
            self.req = start_slot(self.recipe, self.slot, self.send)

    def run(self) -> bool:
        if self.done or not self.req.Test():
            return False
        self.finish()
        return True

    def test(self) -> bool:
        """Has MPI completed it?  (A loose task's poll: engine.py finishes it.)"""
        return self.req.Test()

    def finish(self) -> None:
        """MPI completed the request (the result to the caller's array, for a slot)."""
        if self.slot is not None:
            finish_slot(self.recipe, self.slot, self.recv)
        self.done = True

    @property
    def waits_done(self) -> int:
        return 1 if self.done else 0

    @property
    def bytes_moved(self) -> int:
        return self.recv.nbytes if self.done and self.recv is not None else 0

    def pending_peers(self):
        return ({-1} if not self.done else set()), set()

    def release(self) -> None:
        self.send = self.recv = None


class DetourLane(Lane):
    """A small collective over device arrays, run by the host path: one copy of the input
    to a pinned host buffer on hpccoll's stream, MPI's own nonblocking collective on the
    host buffers once that copy's event completed, one copy of the result back.  Every
    step is polled (an event, then the request, then an event), never waited for.  The
    MPI collective is posted only after the first copy, so the task counts as posted
    (``late_post``; Task.posted, which lets the communicator's next collective start)
    only once it is: every rank still posts its MPI collectives in issue order."""
    __slots__ = ("recipe", "send", "recv", "devs", "inplace", "stream", "gpu", "hsend",
                 "hrecv", "held", "event", "req", "phase", "done", "mpi_posted")
    needs_slot = False
    late_post = True
    program = MPI_PROGRAM

    def __init__(self, recipe, send, recv, devs, inplace, stream, gpu):
        self.recipe, self.send, self.recv, self.devs = recipe, send, recv, devs
        self.inplace, self.stream, self.gpu = inplace, stream, gpu
        self.hsend = self.hrecv = self.event = self.req = None
        self.held = []
        self.phase = 0
        self.done = self.mpi_posted = False

    def _host(self, dev):
        from ..transport.staging import STAGING
        raw = STAGING.get(max(1, dev.nbytes))
        self.held.append(raw)
        return raw[:dev.nbytes].view(dev.dtype)

    def start(self) -> None:
        from ..transport.staging import on_device, record
        send, recv = self.send, self.recv
        with on_device(self.gpu):
            if self.inplace:
                # one buffer holds both: copy the larger, view the other inside it
                sdev, rdev = self.devs
                if recv.size >= send.size:
                    outer, odev, idev = recv, rdev, sdev
                else:
                    outer, odev, idev = send, sdev, rdev
                host = self._host(outer)
                if outer.size:
                    outer.copy_to_host(host, stream=self.stream)
                lo = (idev.ptr - odev.ptr) // outer.dtype.itemsize if outer.size else 0
                inner = host[lo:lo + (send.size if outer is recv else recv.size)]
                self.hsend, self.hrecv = (inner, host) if outer is recv else (host, inner)
            else:
                self.hsend = self._host(send)
                if send.size:
                    send.copy_to_host(self.hsend, stream=self.stream)
                self.hrecv = self._host(recv)
            self.event = record(self.stream)

    def _gets_result(self) -> bool:
        r = self.recipe
        if r.kind == "reduce":
            return r.rank == r.root
        if r.kind == "broadcast":
            return r.rank != r.root
        return r.kind != "barrier"

    def run(self) -> bool:
        from ..transport.staging import done, on_device, record
        progressed = False
        if self.phase == 0:
            if not done(self.event):
                return False
            self.req = post(self.recipe, self.hsend, self.hrecv)
            self.mpi_posted = True
            self.phase = progressed = 1
        if self.phase == 1:
            if not self.req.Test():
                return bool(progressed)
            if self._gets_result() and self.recv.size:
                with on_device(self.gpu):
                    self.recv.copy_to_device(self.hrecv, stream=self.stream)
                    self.event = record(self.stream)
            else:
                self.event = None
            self.phase = 2
        if self.event is not None and not done(self.event):
            return True
        self._give_back()
        self.done = True
        return True

    def _give_back(self) -> None:
        from ..transport.staging import STAGING
        for raw in self.held:
            STAGING.put(raw)
        self.held = []

    # one MPI collective, as MpiLane's
    waits_done = MpiLane.waits_done
    bytes_moved = MpiLane.bytes_moved

    def pending_peers(self):
        return ({-1} if self.mpi_posted and not self.done else set()), set()

    def release(self) -> None:
        # done: run() gave the pinned buffers back already; failed: a copy may still read
        # or write them, so they are not reused
        self.held = []
        self.send = self.recv = self.hsend = self.hrecv = self.devs = None


# -- step machines over host arrays ----------------------------------------------------------
class Shm:
    """What a plan's shared-memory programs need at run time: the communicator's area, the
    map from local index to communicator rank, peers' registered buffers (typed views),
    when the collective uses them, and typed views of the slots, made on first use and
    kept (each collective's epoch base is its lane's), and the plan's program compiled
    (engine/code.py), or None where it is interpreted, and encoded for the C executor
    (``code.native``), or None where Python runs it."""
    __slots__ = ("area", "local", "peer_send", "peer_recv", "slots", "code", "native")

    def __init__(self, area, local, peer_send=None, peer_recv=None):
        self.area, self.local = area, local
        self.peer_send, self.peer_recv = peer_send, peer_recv
        self.slots = {}
        self.code = self.native = None


class ProgramLane(Lane):
    """One program being executed on host arrays: ``bufs`` are the send, receive and
    scratch arrays (flat, typed like the collective's data)."""
    __slots__ = ("program", "bufs", "_bytes", "itemsize", "op", "mpi", "tag", "pc", "inflight",
                 "waiting", "waits_done", "bytes_moved", "ops", "shm", "base", "pool",
                 "_pooled", "holds", "code")

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
        self.base = 0           # the epoch before this collective's first (shared memory)
        self.pool = None        # where the scratch buffer goes back to (BufferPool)
        self._pooled = None
        self.holds = None       # the communicator's shared slots (Gate), when it uses them
        self.code = None        # the program compiled (engine/code.py), where it is

    def start(self) -> None:
        self.run()

    def release(self) -> None:
        if self.pool is not None and self._pooled is not None:
            self.pool.put(self._pooled)
            self._pooled = None
        self.bufs = self._bytes = None
        self.shm = None

    @property
    def done(self) -> bool:
        return self.pc >= len(self.program.steps)

    def test(self) -> bool:
        """Continue, and say whether the program ran to its end (a loose task's poll)."""
        if self.code is not None:
            _code.run(self)       # (not through run(): a waiter calls this in its spin)
        else:
            self.run()
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
            index = (self.base + b[2]) % shm.area.slots
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
            return self._test(self.inflight[w][0])
        return self.shm.area.reached(w.flag, self.base + w.epoch, w.peers)

    def _post(self, p):
        reqs = transport.post(self.mpi, self.tag, p.sends, p.recvs, self._view)
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

    def run(self) -> bool:
        """Execute until a wait whose transfers are still in flight, or the end."""
        if self.code is not None:
            return _code.run(self)
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
                if not self._test(reqs):
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
                ops.scale(self._arr(p.dst), self._arr(p.src), p.divisor)
            elif kind is WaitFlags:
                if not self.shm.area.reached(p.flag, self.base + p.epoch, p.peers):
                    self.waiting = p
                    return self.pc != start
                self.waits_done += 1
            elif kind is Signal:
                self.shm.area.signal(p.flag, self.base + p.epoch)
            elif kind is ReduceN:
                ops.reduce_n(self.op, self._arr(p.dst), [self._arr(r) for r in p.srcs],
                             p.divisor)
            self.pc += 1
        self.waiting = None
        self._end()
        return True

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
    from ..transport.staging import done
    return event is None or done(event)


class DeviceLane(ProgramLane):
    """A program over device arrays (see the module docstring for the transport).  Its
    kernels and copies are queued on hpccoll's stream in program order, which orders them
    on the device; the engine thread only polls events (``Staged``), and synchronizes the
    stream once, at the end, so that the result is ready when ``wait()`` returns."""
    __slots__ = ("direct", "returns")

    def __init__(self, program, bufs, op, mpi_comm, tag, ops, direct: bool):
        super().__init__(program, bufs, op, mpi_comm, tag, ops)
        self.direct = direct
        self.holds = GPU
        self.returns = []       # (event, pinned buffers) back to the pool once it completed

    def run(self) -> bool:
        """The program, with the arrays' GPU current on whichever thread runs it (the
        engine's works on device 0 otherwise)."""
        device = self.ops.device
        if device is None:
            return ProgramLane.run(self)
        from ..transport.staging import on_device
        with on_device(device):
            return ProgramLane.run(self)

    _test = staticmethod(lambda staged: staged.test())
    _pending = staticmethod(lambda staged: staged.pending())
    _cancel = staticmethod(lambda staged, n_recvs: staged.cancel(n_recvs))

    def _post(self, p):
        from ..transport import staging
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
        from ..transport import staging
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
