"""Node-shared memory for the ranks of a communicator that share a node.

A communicator's area is one piece of anonymous shared memory per node (``create``:
memfd, which the node's other ranks open through /proc/<pid>/fd; a file in ``shm_dir``
where that is set or where they cannot), mapped by the node's ranks (the world's node map
says which: ``Split_type(COMM_TYPE_SHARED)`` at init, or the fake nodes of the
``node_size`` setting); its creator's descriptor is closed, or the file unlinked, as soon
as all have mapped it, so nothing of it outlives the ranks however they end.  It costs no
MPI communicator context.  Each rank's segment holds three counters
(READY, REDUCED, CONSUMED), each on its own cache line, the mismatch digest board
(``post_digest``), a ring of ``CELL_RING`` cells
for small collectives (engine/_native.c: cells), then ``shm_slots`` staging slots of
``shm_slot_bytes``; pages are taken when first touched.

Memory ordering.  A writer stores its data (a copy into its slot, or a reduced part),
then a fence (MPI_Win_sync of a locked window of this process, ``Context.shm_fence``: a
full memory barrier in MPI's unified memory model), then stores the counter.  A reader loads the counter and, once it reached the epoch it
needs, calls the fence before loading the data.  The writer's barrier orders data
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

import errno
import mmap
import os
import secrets
import tempfile
import warnings
import weakref
from contextlib import contextmanager
from typing import Optional

import numpy as np
from mpi4py import MPI

from ..errors import ResourcesExhausted
from . import cma

CTRL_BYTES = 4096
FLAG_STRIDE = 8            # int64 slots between flags: 64 bytes, one cache line each
ADDR = 3                   # after the three counters: the addresses of the send, receive
#                            and scratch buffers a single-copy program published
#                            (algorithms/cma.py), a cache line each
DONE = 6                   # the last cell collective this rank completed (its own line)
SEEN = 7                   # the least DONE of its peers this rank last saw (no peer reads it)
BOARD = 8                  # lines BOARD.. of the page: the digest board (post_digest)
BOARD_ENTRIES = 32         # digest checks a rank may post ahead of a peer that reads them
SLOT_ALIGN = 64
CELL_RING = 8              # cells per rank: collectives in flight before a writer waits
assert (BOARD + BOARD_ENTRIES) * FLAG_STRIDE * 8 <= CTRL_BYTES


def node_comm(comm, world_ranks, node_size: Optional[int]):
    """The communicator's ranks on this rank's node (ordered by communicator rank)."""
    if node_size:
        color = world_ranks[comm.Get_rank()] // node_size
        return comm.Split(color, comm.Get_rank())
    return comm.Split_type(MPI.COMM_TYPE_SHARED, comm.Get_rank())


@contextmanager
def flag_lines(node):
    """Two cache lines of node-shared memory, the node's local rank 0's and 1's, each
    alone on its line: ``(mine, peer)`` addresses on those two ranks, None on the others
    (engine/code.py: handoff_ns).  Collective over ``node``, entering and leaving."""
    win = MPI.Win.Allocate_shared(256 if node.rank < 2 else 0, 1, comm=node)
    try:
        lines = None
        if node.rank < 2:
            # 256 bytes each: a 64-byte-aligned line inside, away from the neighbour's
            views = [np.frombuffer(win.Shared_query(q)[0], np.int64) for q in range(2)]
            views[node.rank][:] = 0
            at = [(v.__array_interface__["data"][0] + 127) // 64 * 64 for v in views]
            lines = (at[node.rank], at[1 - node.rank])
        node.Barrier()
        yield lines
    finally:
        node.Barrier()
        win.Free()


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


def aligned(slot_bytes: int) -> int:
    return -(-slot_bytes // SLOT_ALIGN) * SLOT_ALIGN


def cell_stride(cell_bytes: int) -> int:
    """One cell: its sequence word, then up to ``cell_bytes`` of data, in whole lines (data
    of up to 56 bytes shares the line of the word that publishes it)."""
    return aligned(8 + cell_bytes) if cell_bytes else 0


def segment_bytes(slot_bytes: int, slots: int, cell_bytes: int = 0) -> int:
    """One rank's segment: its counters, its ring of cells, then its slots."""
    return CTRL_BYTES + CELL_RING * cell_stride(cell_bytes) + slots * aligned(slot_bytes)


class ShmArea:
    """One communicator's node-shared flags and staging slots (see the module docstring),
    in one file of node-shared memory mapped by each of the node's ranks: the node leader's
    ``fd`` (it created it), or None to open ``path`` (see ``create``)."""

    def __init__(self, path: str, fd: Optional[int], local_rank: int, local_size: int,
                 slot_bytes: int, slots: int, fence, cell_bytes: int = 0):
        self.rank, self.size = local_rank, local_size
        self.slot_bytes = aligned(slot_bytes)
        self.slots = slots
        # cells (engine/_native.c: cell_post, cell_done): the largest input a rank
        # publishes in one (their sequence numbers: CommState.cell_seq)
        self.cell_bytes, self.cell_stride = cell_bytes, cell_stride(cell_bytes)
        self.slots_at = CTRL_BYTES + CELL_RING * self.cell_stride
        seg = segment_bytes(slot_bytes, slots, cell_bytes)
        total = seg * local_size
        if fd is None:
            fd = os.open(path, os.O_RDWR)
            if os.fstat(fd).st_size < total:      # not this communicator's: never map it
                os.close(fd)
                raise OSError(f"{path}: smaller than the {total} bytes expected")
        try:
            self.map = mmap.mmap(fd, total)
        finally:
            os.close(fd)           # the mapping keeps the memory; the name goes at unlink
        whole = np.frombuffer(self.map, dtype=np.uint8)
        self.segs = [whole[q * seg:(q + 1) * seg] for q in range(local_size)]
        self.flags = [s[:CTRL_BYTES].view(np.int64) for s in self.segs]
        self.epoch = 0            # epochs handed out so far (the next collective's base)
        self._sync = self.fence = fence
        self.cma = False          # every rank of the node may read every other's memory
        self.pids = ()            # the node's ranks' process ids, in local order

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

    def post_digest(self, check: int, digest: int) -> None:
        """Publish this rank's mismatch digest for digest check number ``check`` (engine/
        check.py), in its board's entry ``check % BOARD_ENTRIES``.  The entry's number is
        cleared first and set last, so a reader that saw the same number before and after
        reading the digest read that check's digest (a seqlock: the entry is reused)."""
        i = (BOARD + check % BOARD_ENTRIES) * FLAG_STRIDE
        f = self.flags[self.rank]
        f[i] = 0
        self._sync()
        f[i + 1] = digest
        self._sync()
        f[i] = check + 1          # (0: never posted, or being rewritten)

    def digest_of(self, q: int, check: int):
        """(number, digest) of what rank q last posted in the board entry of digest check
        ``check``: number -1 where it is being rewritten or was never posted, below
        ``check`` where q has not posted that check yet, above it where q went on and
        reused the entry."""
        i = (BOARD + check % BOARD_ENTRIES) * FLAG_STRIDE
        f = self.flags[q]
        before = int(f[i])
        if before == 0:
            return -1, 0
        self._sync()
        digest = int(f[i + 1])
        self._sync()
        if int(f[i]) != before:
            return -1, 0
        return before - 1, digest

    def slot(self, q: int, index: int) -> np.ndarray:
        start = self.slots_at + index * self.slot_bytes
        return self.segs[q][start:start + self.slot_bytes]

    def cells(self, q: int) -> int:
        """The address of rank q's ring of cells."""
        return self.segs[q][CTRL_BYTES:].__array_interface__["data"][0]

    def done_word(self, q: int) -> int:
        """The address of rank q's DONE word."""
        return self.flags[q][DONE * FLAG_STRIDE:].__array_interface__["data"][0]

    def seen_word(self) -> int:
        """The address of this rank's SEEN word."""
        return self.flags[self.rank][SEEN * FLAG_STRIDE:].__array_interface__["data"][0]

    def behind(self, flag: int, value: int, peers) -> list:
        """The peers whose counter ``flag`` has not reached ``value`` (diagnosis)."""
        i = flag * FLAG_STRIDE
        return [q for q in peers if self.flags[q][i] < value]

    def free(self) -> None:
        self.segs = self.flags = []
        try:
            self.map.close()
        except BufferError:        # a view escaped (a slot still referenced): let GC unmap
            pass


def layout(rank: int, world_ranks, node_of) -> tuple:
    """(local, cross) of communicator rank ``rank``: the communicator ranks on its node
    (communicator order), and those with its local index on every node (node order), or
    None if nodes hold unequal numbers of ranks; (None, None) when some rank of the
    communicator has no peer on its node (then no rank uses shared memory).  From the
    world's node map alone, so every rank computes the same without a message."""
    nodes: dict = {}
    for r, w in enumerate(world_ranks):
        nodes.setdefault(node_of[w], []).append(r)
    if min(len(ranks) for ranks in nodes.values()) < 2:
        return None, None
    local = tuple(nodes[node_of[world_ranks[rank]]])
    cross = None
    if len({len(ranks) for ranks in nodes.values()}) == 1:
        mine = local.index(rank)
        cross = tuple(ranks[mine] for ranks in sorted(nodes.values(), key=min))
    return local, cross


def shm_dir(setting: str = "") -> str:
    """Where node-shared files go: the shm_dir setting, else tmpfs where Linux has it,
    else the temporary directory."""
    if setting:
        return setting
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


# what a file system that cannot hold a file says (tmpfs full or too small, a quota, a
# file-size limit): the communicator goes without node-shared memory instead
NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.ENOMEM)


def _reserve(fd: int, nbytes: int) -> None:
    """Size the new memory behind ``fd`` and take its pages now: a page of sparse shared
    memory that cannot be had when first touched is a SIGBUS, which no rank can catch
    or tell the others about."""
    os.ftruncate(fd, nbytes)
    if nbytes and hasattr(os, "posix_fallocate"):
        os.posix_fallocate(fd, 0, nbytes)


def _new_memory(nbytes: int) -> tuple:
    """(the path through which other processes open it, descriptor) of new anonymous
    shared memory of ``nbytes`` (memfd), reserved."""
    fd = os.memfd_create(f"hpccoll-{os.getpid()}", os.MFD_CLOEXEC)
    try:
        _reserve(fd, nbytes)
    except OSError:
        os.close(fd)
        raise
    return f"/proc/{os.getpid()}/fd/{fd}", fd


def _new_file(nbytes: int, where: str) -> tuple:
    """(path, descriptor) of a new, private file of ``nbytes`` in ``where``, reserved."""
    for _ in range(8):
        path = os.path.join(where, f"hpccoll-{os.getpid()}-{secrets.token_hex(6)}")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue
        try:
            _reserve(fd, nbytes)
        except OSError:
            os.close(fd)
            os.unlink(path)
            raise
        return path, fd
    raise OSError(f"no free file name in {where}")


def room(nbytes: int, where: str) -> Optional[str]:
    """Why ``where`` cannot hold ``nbytes`` more now, or None (a probe, for memory that
    MPI maps itself)."""
    try:
        st = os.statvfs(where)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    if free >= nbytes:
        return None
    return f"{where} has {free} bytes free, {nbytes} are needed"


def create(comm, world_ranks, node_of, settings, fence_of) -> Optional[dict]:
    """Collective over ``comm`` at communicator creation: the node-local area, or None when
    shared memory is off or some rank of the communicator has no peer on its node.
    Returns {"area", "local" (comm ranks on my node, local order), "cross" (comm ranks with
    my local index on every node, node order) or None if nodes hold unequal numbers of
    ranks}.

    The node's first rank creates the memory and the others map it after an allgather of
    its name; once all have, the creator's descriptor is closed (a file is unlinked).
    Anonymous memory has no name at all, so a job killed at any moment, inside this call
    too, leaves nothing in /dev/shm.  No MPI communicator is made for it (a window would
    take two contexts of the ~2,000 MPICH has), and an error on any rank is every rank's
    (ResourcesExhausted)."""
    if not settings.shm or comm.Get_size() == 1:
        return None
    rank = comm.Get_rank()
    local, cross = layout(rank, world_ranks, node_of)
    if local is None:
        return None
    me = local.index(rank)
    nbytes = segment_bytes(settings.shm_slot_bytes, settings.shm_slots,
                           settings.cell_bytes) * len(local)
    where = shm_dir(settings.shm_dir)
    # anonymous memory first where no directory was asked for: it has no name, so a rank
    # killed at any moment leaves nothing behind; the node's other ranks open it through
    # /proc/<pid>/fd, and where one cannot, every rank goes again with a file in ``where``
    anonymous = not settings.shm_dir and hasattr(os, "memfd_create")
    while True:
        path = fd = error = area = None
        full = False
        if me == 0:
            try:
                path, fd = _new_memory(nbytes) if anonymous else _new_file(nbytes, where)
            except OSError as exc:
                error = f"{'anonymous memory' if anonymous else where}: {exc.strerror or exc}"
                full = exc.errno in NO_SPACE
        # (each rank's probe bytes ride along: transport/cma.py)
        if settings.cma:
            cma.allow_peers()
        made = comm.allgather((path, (error, full), cma.token()))
        short = [e for _, (e, f), _ in made if f]
        if short:
            # some node cannot hold its file: every rank of the communicator goes without
            # (the same decision everywhere: the allgather above), and every rank warns,
            # so that a filter turning warnings into errors raises on every rank alike
            _drop(path, fd, anonymous)
            warnings.warn(
                f"hpccoll: communicator of {comm.Get_size()} ranks: no node-shared memory "
                f"({short[0]}; {nbytes} bytes per node: shm_slots x shm_slot_bytes per "
                "rank); it exchanges through MPI only.  Give the container more memory or "
                "/dev/shm (docker --shm-size), lower shm_slot_bytes, or set shm_dir",
                RuntimeWarning, stacklevel=2)
            return None
        errors = [e for _, (e, _), _ in made if e]
        readable = False
        if not errors:
            try:
                # (the creator's descriptor stays open until every rank has opened it)
                area = ShmArea(made[local[0]][0], os.dup(fd) if anonymous and fd else fd,
                               me, len(local), settings.shm_slot_bytes, settings.shm_slots,
                               fence_of(), settings.cell_bytes)
            except (OSError, ValueError) as exc:
                error = f"{made[local[0]][0]}: {exc}"
            if not anonymous:
                fd = None            # (ShmArea closed it)
            readable = settings.cma and all(cma.probe(*made[q][2]) for q in local
                                            if q != rank)
        elif fd is not None and not anonymous:
            os.close(fd)
            fd = None
        agreed = comm.allgather((error, readable))
        errors += [e for e, _ in agreed if e]
        if area is not None:
            # single-copy programs where every rank of the node may read every other
            area.cma = all(agreed[q][1] for q in local)
            area.pids = tuple(made[q][2][0] for q in local)
        _drop(path, fd, anonymous)   # every rank of the node has mapped it (or failed to)
        if errors and area is not None:
            area.free()
        if errors and anonymous:
            anonymous = False          # (the same errors on every rank: all go again)
            continue
        break
    if errors:
        raise ResourcesExhausted(
            f"node-shared memory for a communicator of {comm.Get_size()} ranks "
            f"({nbytes} bytes per node: shm_slots x shm_slot_bytes per rank) could not be "
            f"set up: {errors[0]}; free() communicators no longer used, or lower shm_slots "
            f"or shm_slot_bytes")
    return {"area": area, "local": local, "cross": cross}


def _drop(path, fd, anonymous: bool) -> None:
    """The creator's name for the area goes: its descriptor (anonymous memory lives on in
    the ranks' mappings), or the file's name (a closed descriptor)."""
    if anonymous:
        if fd is not None:
            os.close(fd)
    elif path is not None:
        if fd is not None:
            os.close(fd)
        os.unlink(path)


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
