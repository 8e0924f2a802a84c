"""Node-shared memory for the ranks of a communicator that share a node.

MPI sets the memory up and frees it: ``MPI.Win.Allocate_shared`` over the node's ranks
(``Split_type(COMM_TYPE_SHARED)``, or the fake nodes of the ``node_size`` setting).  Each
rank's segment holds three counters (READY, REDUCED, CONSUMED), each on its own cache
line, then ``shm_slots`` staging slots of ``shm_slot_bytes``.  The window is locked
(``Lock_all``) for its whole life, which makes ``Win.Sync`` a valid memory barrier.

Memory ordering.  A writer stores its data (a copy into its slot, or a reduced part),
then ``Win.Sync()`` (MPI_Win_sync: a full memory barrier in MPI's unified memory model),
then stores the counter.  A reader loads the counter and, once it reached the epoch it
needs, calls ``Win.Sync()`` before loading the data.  The writer's barrier orders data
before counter, the reader's orders counter before data, so a reader that sees epoch e
sees everything written before epoch e was published (on x86-64, whose stores are not
reordered with stores nor loads with loads, the barriers cost little; on weaker memory
models they are what makes it correct).  Counters are aligned 8-byte stores, single-copy
atomic on every 64-bit target, and only ever grow, so a stale read is merely too low and
the reader polls again: there is no ABA.  Slots are reused only after every peer's
CONSUMED counter passed the epoch that last used them.

Registered buffers (``ctx.empty``/``ctx.zeros``) are allocated the same way, collectively
and symmetrically: allocation k has the same size on every rank, so a peer's copy of my
array is at the same offset of its own segment.
"""
from __future__ import annotations

import weakref
from typing import Optional

import numpy as np
from mpi4py import MPI

CTRL_BYTES = 4096
FLAG_STRIDE = 8            # int64 slots between flags: 64 bytes, one cache line each
SLOT_ALIGN = 64


def node_comm(comm, world_ranks, node_size: Optional[int]):
    """The communicator's ranks on this rank's node (ordered by communicator rank)."""
    if node_size:
        color = world_ranks[comm.Get_rank()] // node_size
        return comm.Split(color, comm.Get_rank())
    return comm.Split_type(MPI.COMM_TYPE_SHARED, comm.Get_rank())


def headroom(ncomm) -> None:
    """MPICH's Win_allocate_shared duplicates its communicator, and where no communicator
    context is left it crashes (SIGSEGV) instead of returning an error.  Two duplicates
    made and freed first turn running out into the MPI error a caller can handle."""
    probes = []
    try:
        for _ in range(2):
            probes.append(ncomm.Dup())
    finally:
        for p in probes:
            p.Free()


class ShmArea:
    """One communicator's node-shared flags and staging slots (see the module docstring)."""

    def __init__(self, ncomm, slot_bytes: int, slots: int):
        self.comm = ncomm
        self.rank, self.size = ncomm.Get_rank(), ncomm.Get_size()
        self.slot_bytes = -(-slot_bytes // SLOT_ALIGN) * SLOT_ALIGN
        self.slots = slots
        nbytes = CTRL_BYTES + slots * self.slot_bytes
        self.win = MPI.Win.Allocate_shared(nbytes, 1, comm=ncomm)
        self.win.Lock_all(MPI.MODE_NOCHECK)
        self.segs = [np.frombuffer(self.win.Shared_query(q)[0], dtype=np.uint8, count=nbytes)
                     for q in range(self.size)]
        self.flags = [seg[:CTRL_BYTES].view(np.int64) for seg in self.segs]
        self.flags[self.rank][:] = 0
        self.win.Sync()
        ncomm.Barrier()
        self.epoch = 0            # epochs handed out so far (the next collective's base)
        self._sync = self.win.Sync

    def signal(self, flag: int, value: int) -> None:
        self._sync()              # data before counter
        self.flags[self.rank][flag * FLAG_STRIDE] = value

    def reached(self, flag: int, value: int, peers) -> bool:
        i = flag * FLAG_STRIDE
        flags = self.flags
        for q in peers:
            if flags[q][i] < value:
                return False
        self._sync()              # counter before data
        return True

    def slot(self, q: int, index: int) -> np.ndarray:
        start = CTRL_BYTES + index * self.slot_bytes
        return self.segs[q][start:start + self.slot_bytes]

    def behind(self, flag: int, value: int, peers) -> list:
        """The peers whose counter ``flag`` has not reached ``value`` (diagnosis)."""
        i = flag * FLAG_STRIDE
        return [q for q in peers if self.flags[q][i] < value]

    def free(self) -> None:
        try:
            self.win.Unlock_all()
            self.win.Free()
            self.comm.Free()
        except MPI.Exception:
            pass


def create(comm, world_ranks, settings) -> Optional[dict]:
    """Collective over ``comm`` at communicator creation: the node-local area, or None when
    shared memory is off or no other rank of the communicator shares this node.  Returns
    {"area", "local" (comm ranks on my node, local order), "cross" (comm ranks with my local
    index on every node, node order) or None if nodes hold unequal numbers of ranks}."""
    if not settings.shm or comm.Get_size() == 1:
        return None
    ncomm = node_comm(comm, world_ranks, settings.node_size)
    local = tuple(ncomm.allgather(comm.Get_rank()))
    # every rank must agree on whether shared memory is used at all (collectively)
    usable = comm.allreduce(1 if len(local) > 1 else 0, op=MPI.MIN)
    if not usable:
        ncomm.Free()
        return None
    layout = comm.allgather((local.index(comm.Get_rank()), local))
    sizes = {len(loc) for _, loc in layout}
    cross = None
    if len(sizes) == 1:
        mine = local.index(comm.Get_rank())
        nodes = sorted({loc for _, loc in layout}, key=min)
        cross = tuple(loc[mine] for loc in nodes)
    try:
        headroom(ncomm)
        area = ShmArea(ncomm, settings.shm_slot_bytes, settings.shm_slots)
    except MPI.Exception:
        ncomm.Free()
        raise
    return {"area": area, "local": local, "cross": cross}


_KEPT: list = []   # allocations an array still used when their context closed


class Registered:
    """One symmetric allocation in node-shared memory (ctx.empty / ctx.zeros).

    The array handed out (``user``) is an array of its own over this rank's segment: every
    view of it keeps it alive, and ``in_use`` (a weak reference to it) tells whether any
    does.  The window is freed only when no rank of the node still uses its allocation;
    otherwise it stays mapped until MPI_Finalize, so that an array used after
    ``ctx.close()`` never reads unmapped memory."""

    def __init__(self, ident: int, ncomm, nbytes: int):
        self.id = ident
        self.nbytes = nbytes
        self.win = MPI.Win.Allocate_shared(max(nbytes, 1), 1, comm=ncomm)
        size = ncomm.Get_size()
        self.segs = [np.frombuffer(self.win.Shared_query(q)[0], dtype=np.uint8, count=nbytes)
                     for q in range(size)]
        self.mine = self.segs[ncomm.Get_rank()]
        self.base = self.mine.__array_interface__["data"][0] if nbytes else 0
        user = np.frombuffer(self.win.Shared_query(ncomm.Get_rank())[0], dtype=np.uint8,
                             count=nbytes)
        self.user = user
        self._users = weakref.ref(user)

    def hand_out(self) -> np.ndarray:
        """The array the application gets (held only by it from now on)."""
        user, self.user = self.user, None
        return user

    def in_use(self) -> bool:
        return self._users() is not None

    def offset(self, address: int, nbytes: int) -> Optional[int]:
        if self.nbytes and self.base <= address and address + nbytes <= self.base + self.nbytes:
            return address - self.base
        return None

    def free(self) -> None:
        try:
            self.win.Free()
        except MPI.Exception:
            pass

    def keep(self) -> None:
        """Closing while an array still uses it: the window stays until MPI_Finalize."""
        _KEPT.append(self)
