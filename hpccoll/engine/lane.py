"""Lanes: what carries out one collective's data movement on one rank.

Every lane has the same interface (``Lane``), so a task, the policies and the watchdog
treat them alike; the communicator's state (core/state.py) makes the kind its plan names:

- ``MpiLane`` (here): the ``mpi`` row, the MPI library's own nonblocking collective (or,
  for tiny messages, a persistent one started again and again: transport/mpi.py).  MPI
  progresses it, so it holds no execution slot (``needs_slot`` False);
- ``CellLane`` (here): the ``cells`` row, a small collective in one handoff through
  node-shared cells (engine/_native.c), which holds no execution slot either;
- ``DetourLane`` (here): a small collective over device arrays through the host: one
  copy each way around MPI's own collective;
- ``ProgramLane`` and ``DeviceLane`` (engine/program.py): a step machine's program,
  compiled into instructions (engine/code.py), over host or device arrays.

A lane holds the caller's arrays only while the collective runs: ``release()`` drops them
(and returns scratch space to its pool), so a finished collective keeps nothing alive.
"""
from __future__ import annotations

import threading

from ..algorithms import CELLS_PROGRAM, MPI_PROGRAM
from ..transport import mpi as transport
from ..transport import staging
from .code import _native

# the arrays of failed lanes that MPI or a peer may still read or write (a collective
# cannot be cancelled, nor a peer's single-copy write), kept for the life of the process
HELD: list = []

# (bound once: a per-call lookup of the module and its attribute is a tenth of a cell's
# own cost)
_cell_post = _native.cell_post if _native is not None else None
_cell_done = _native.cell_done if _native is not None else None
_address = _native.address if _native is not None else None


class Gate:
    """A bounded resource a running collective holds from its start to its end, whatever
    the policy does meanwhile (a yield keeps the context, so it keeps the resource too).
    The policies start a collective only while its gate has room (Task.startable), so
    what collectives hold, not a constant, bounds how many progress at once.  Only the
    engine's driver changes ``held``."""
    __slots__ = ("name", "capacity", "held", "shared")

    def __init__(self, name: str, capacity: int = 1, shared: bool = False):
        self.name, self.capacity, self.held = name, capacity, 0
        # taken by collectives of every communicator (the GPU), not of one only: the
        # ordered policy must then put them in its global launch order
        self.shared = shared

    def __repr__(self) -> str:
        return f"Gate({self.name!r}, {self.held}/{self.capacity})"


def new_lock():
    """A mutex for the per-call path (a communicator's state, the engine's driver):
    ``_native.Lock``, threading.Lock's interface without the argument parsing its
    ``acquire`` does on every call (about 450 instructions, twice per small collective),
    or threading.Lock where the C module is not built."""
    return _native.Lock() if _native is not None else threading.Lock()


# One collective's kernels fill the GPU (DFCCL's model) and its staging buffers are the
# process's pinned pool: device collectives run one at a time per process.
GPU = Gate("the GPU", 1, shared=True)


class Lane:
    """The interface (and defaults) of every lane.  The fields the engine reads at every
    call (lane.pxd: fields, not class attributes) are set by ``lane_fields``: from each
    lane's setup function (mpi_setup, cell_setup, program_setup) or, for a lane with none
    (DetourLane, CheckLane), from its constructor."""
    waits_done = 0             # suspension points passed (reports, counters)
    bytes_moved = 0

    def __init__(self):
        lane_fields(self, True, False)

    def startable(self) -> bool:
        """May a lane that takes no execution slot start now?  (Task.startable)"""
        return True

    def start(self) -> None:
        """Post the first transfers and run to the first wait."""

    def ready(self):
        """A cheap test, or None: a function of no arguments that returns True once
        ``run`` would make progress (a waiter spins on it while nothing else is
        pending).  Calling ``run`` is always right; this only spares its bookkeeping."""
        return None

    def arrived(self) -> None:
        """The function ``ready`` gave returned True: ``run`` need not test again."""

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


def lane_fields(lane, needs_slot: bool, at_issue: bool, late_post: bool = False):
    """The fields every lane has, set: ``needs_slot``, it holds an execution slot while it
    runs (hpccoll drives it); ``at_issue``, it may start on the calling thread when
    issued (Engine.issue: nothing in its start waits for a device or blocks the caller);
    ``late_post``, it posts its MPI collective after start (task.posted waits for
    ``mpi_posted``); ``holds``, a Gate it holds while it runs, or None (nothing
    bounded); ``done``."""
    lane.needs_slot, lane.at_issue, lane.late_post = needs_slot, at_issue, late_post
    lane.mpi_posted = lane.done = False
    lane.holds = None


class OneWait(Lane):
    """A lane whose collective is one wait, its whole result in ``recv`` once ``done``
    (MPI's own collective, cells, the device detour): what reports and counters read."""

    @property
    def waits_done(self) -> int:
        return 1 if self.done else 0

    @property
    def bytes_moved(self) -> int:
        return self.recv.nbytes if self.done and self.recv is not None else 0


class MpiLane(OneWait):
    """One MPI collective: ``recipe`` (transport/mpi.py's Recipe) says which, with which
    op, root and divisor, and whether persistent request ``slot`` runs it."""
    program = MPI_PROGRAM

    def __init__(self, recipe, send, recv, slot=None):
        mpi_setup(self, recipe, send, recv, slot)

    def startable(self) -> bool:
        """A persistent slot is free once its previous use completed here."""
        return self.slot is None or not self.slot.busy

    def start(self) -> None:
        if self.slot is None:
            r = self.recipe
            if r.scratch:
                self.scratch = transport.scratch(r, self.send)
            self.req = transport.start(r, self.send, self.recv, self.scratch)
        else:
            self.req = transport.start_slot(self.recipe, self.slot, self.send)

    def ready(self):
        # (a test of a completed request keeps answering True: MPI's inactive or null
        # request; run() then completes the collective)
        return self.req.Test if not self.done else None

    def arrived(self) -> None:
        self.tested = True

    def run(self) -> bool:
        # (a second test of a completed request costs as much as the first: an MPI call,
        # its progress engine and the GIL let go and taken again)
        if self.done or not (self.tested or self.req.Test()):
            return False
        if self.slot is not None:
            transport.finish_slot(self.recipe, self.slot, self.recv)
        self.done = True
        return True

    def pending_peers(self):
        return ({-1} if not self.done else set()), set()

    def cancel(self) -> None:
        if self.req is not None and not self.done:
            # MPI may still read or write these arrays (a collective cannot be cancelled):
            # they stay alive, so that it touches memory nobody reuses
            HELD.append((self.req, self.send, self.recv, self.scratch))

    def release(self) -> None:
        self.send = self.recv = self.scratch = None


def mpi_setup(lane, recipe, send, recv, slot):
    """Every field of an MpiLane (its one initialisation)."""
    lane_fields(lane, False, True)
    lane.recipe, lane.send, lane.recv, lane.slot = recipe, send, recv, slot
    lane.req = lane.scratch = None
    lane.tested = False
    return lane


def mpi_lane(recipe, send, recv, slot=None):
    """A new MpiLane: MpiLane(...) without the call's argument parsing."""
    return mpi_setup(MpiLane.__new__(MpiLane), recipe, send, recv, slot)


class CellLane(OneWait):
    """One cell collective (the ``cells`` row): cell ``seq`` of the communicator's ring in
    node-shared memory, run by engine/_native.c (``cell_post`` publishes this rank's input,
    ``cell_done`` completes it from the peers' cells: its docstring has the protocol).
    Nothing of MPI: it holds no execution slot, and it starts on the calling thread."""
    program = CELLS_PROGRAM

    def __init__(self, layout, seq, send, recv, addrs=None):
        cell_setup(self, layout, seq, send, recv, addrs)

    def start(self) -> None:
        # (a full ring, a peer that has not read the cell this one reuses: run() again;
        # peers there first, or nothing to read: done here)
        self.finish()

    def ready(self):
        return self.finish if not self.done else None

    def finish(self) -> bool:
        """Publish, then complete where every cell this rank reads holds this seq."""
        if not self.posted:
            self.posted = _cell_post(self.layout, self.seq, self.src)
            if not self.posted:
                return False
        if _cell_done(self.layout, self.seq, self.dst):
            self.done = True
            return True
        return False

    def run(self) -> bool:
        return self.done or self.finish()

    def pending_peers(self):
        if self.done:
            return set(), set()
        return set(_native.cell_waits(self.layout, self.seq)), set()

    def release(self) -> None:
        self.send = self.recv = self.src = self.dst = None


def cell_setup(lane, layout, seq, send, recv, addrs):
    """Every field of a CellLane (its one initialisation).  ``addrs``: where the send and
    receive memory start (buffer_addresses), or None: the C code then reads the arrays'
    buffers itself (a NumPy buffer export costs more than an 8 B cell's copy, so a Call
    used again passes addresses; the lane holds the arrays either way)."""
    lane_fields(lane, False, True)
    lane.layout, lane.seq, lane.send, lane.recv = layout, seq, send, recv
    if addrs is None:
        lane.src, lane.dst = send, recv
    else:
        lane.src, lane.dst = addrs
    lane.posted = False
    return lane


def cell_lane(layout, seq, send, recv, addrs=None):
    """A new CellLane: CellLane(...) without the call's argument parsing."""
    return cell_setup(CellLane.__new__(CellLane), layout, seq, send, recv, addrs)


def buffer_addresses(send, recv) -> tuple:
    """(send, receive) memory addresses of a call's host arrays, for cell_setup and the C
    executor (ProgramLane.addrs); an array that cannot be exported so stays itself."""
    return _address(send, False), _address(recv, True)


class DetourLane(OneWait):
    """A small collective over device arrays, run by the host path: one copy of the input
    to a pinned host buffer on hpccoll's stream, MPI's own nonblocking collective on the
    host buffers once that copy's event completed, one copy of the result back.  Every
    step is polled (an event, then the request, then an event), never waited for.  The
    MPI collective is posted only after the first copy, so the task counts as posted
    (``late_post``; Task.posted, which lets the communicator's next collective start)
    only once it is: every rank still posts its MPI collectives in issue order."""
    __slots__ = ("recipe", "send", "recv", "devs", "inplace", "stream", "gpu", "hsend",
                 "hrecv", "scratch", "held", "event", "req", "phase")
    program = MPI_PROGRAM

    def __init__(self, recipe, send, recv, devs, inplace, stream, gpu):
        lane_fields(self, False, False, late_post=True)
        self.recipe, self.send, self.recv, self.devs = recipe, send, recv, devs
        self.inplace, self.stream, self.gpu = inplace, stream, gpu
        self.hsend = self.hrecv = self.scratch = self.event = self.req = None
        self.held = []
        self.phase = 0

    def _host(self, dev):
        raw = staging.STAGING.get(max(1, dev.nbytes))
        self.held.append(raw)
        return raw[:dev.nbytes].view(dev.dtype)

    def start(self) -> None:
        send, recv = self.send, self.recv
        with staging.on_device(self.gpu):
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
            self.event = staging.record(self.stream)

    def _gets_result(self) -> bool:
        r = self.recipe
        if r.kind == "reduce":
            return r.rank == r.root
        if r.kind == "broadcast":
            return r.rank != r.root
        return r.kind != "barrier"

    def run(self) -> bool:
        progressed = False
        if self.phase == 0:
            if not staging.done(self.event):
                return False
            r = self.recipe
            if r.scratch:
                self.scratch = transport.scratch(r, self.hsend)
            self.req = transport.start(r, self.hsend, self.hrecv, self.scratch)
            self.mpi_posted = True
            self.phase = progressed = 1
        if self.phase == 1:
            if not self.req.Test():
                return bool(progressed)
            if self._gets_result() and self.recv.size:
                with staging.on_device(self.gpu):
                    self.recv.copy_to_device(self.hrecv, stream=self.stream)
                    self.event = staging.record(self.stream)
            else:
                self.event = None
            self.phase = 2
        if self.event is not None and not staging.done(self.event):
            return True
        self._give_back()
        self.done = True
        return True

    def _give_back(self) -> None:
        for raw in self.held:
            staging.STAGING.put(raw)
        self.held = []

    def pending_peers(self):
        return ({-1} if self.mpi_posted and not self.done else set()), set()

    def cancel(self) -> None:
        if self.req is not None and not self.done:     # (as MpiLane.cancel)
            HELD.append((self.req, self.held, self.scratch))

    def release(self) -> None:
        # done: run() gave the pinned buffers back already; failed: a copy may still read
        # or write them, so they are not reused
        self.held = []
        self.send = self.recv = self.hsend = self.hrecv = self.devs = self.scratch = None
