"""The MPI transport: every data-path MPI call of a collective.

- point-to-point: nonblocking sends and receives of raw bytes on the communicator's
  private duplicate, one tag per collective.  Everything travels as bytes: reductions
  happen in hpccoll, so MPI never needs to know the dtype (float16 and bfloat16 work on
  any MPI);
- the MPI library's own nonblocking collectives (the ``mpi`` algorithm row), and for tiny
  messages its persistent ones (MPI-4 ``*_init``), started again and again on staging
  arrays of their own (``Persistent``);
- MPI's predefined reduction ops for hpccoll's op names, and back (the adapter's map).
"""
from __future__ import annotations

from typing import Optional

import numpy as np
from mpi4py import MPI

from ..base import ops as table

name = "mpi"


# -- point-to-point --------------------------------------------------------------------------
def post(comm, tag: int, sends, recvs, views) -> list:
    """Start the transfers; ``views(region)`` gives the bytes of a region.  Receives are
    posted first so that a peer's eager message finds its buffer."""
    reqs = [comm.Irecv(views(reg), peer, tag) for peer, reg in recvs]
    reqs += [comm.Isend(views(reg), peer, tag) for peer, reg in sends]
    return reqs


def test_all(reqs: list) -> bool:
    return MPI.Request.Testall(reqs)


def pending(reqs: list) -> list:
    """Which requests are still in flight (without completing them)."""
    out = []
    for r in reqs:
        out.append(r != MPI.REQUEST_NULL and not r.Get_status())
    return out


def cancel(reqs: list, n_recvs: int) -> None:
    """Cancel unfinished receives (sends cannot be cancelled portably)."""
    for r in reqs[:n_recvs]:
        if r != MPI.REQUEST_NULL:
            try:
                r.Cancel()
            except MPI.Exception:
                pass


# -- MPI's own collectives ------------------------------------------------------------------
NONBLOCKING = {"allreduce": "Iallreduce", "broadcast": "Ibcast", "allgather": "Iallgather",
               "alltoall": "Ialltoall", "barrier": "Ibarrier", "reduce": "Ireduce",
               "reduce_scatter": "Ireduce_scatter_block", "gather": "Igather",
               "scatter": "Iscatter", "scan": "Iscan", "exscan": "Iexscan"}
PERSISTENT = {"allreduce": "Allreduce_init", "broadcast": "Bcast_init",
              "allgather": "Allgather_init", "alltoall": "Alltoall_init",
              "barrier": "Barrier_init", "reduce": "Reduce_init",
              "reduce_scatter": "Reduce_scatter_block_init", "gather": "Gather_init",
              "scatter": "Scatter_init", "scan": "Scan_init", "exscan": "Exscan_init"}


def persistent_collectives() -> bool:
    """MPI-4 persistent collectives (``Allreduce_init`` and friends) in mpi4py and MPI."""
    return hasattr(MPI.Comm, "Allreduce_init") and MPI.Get_version() >= (4, 0)


class Recipe:
    """Which MPI collective (``post``: the bound method that starts it), with which op,
    root and divisor (avg: contributions divided before MPI sums them), which persistent
    requests it takes (``persist``: their key, or None), and whether MPI needs an array
    of its own at each call (``scratch``: see ``scratch``).  A plan holds one."""

    def __init__(self, kind, mpi_comm, mop, root, rank, divisor, inplace, persist):
        self.kind, self.mpi, self.mop, self.root, self.rank = kind, mpi_comm, mop, root, rank
        self.post = getattr(mpi_comm, NONBLOCKING[kind])
        self.divisor, self.inplace, self.persist = divisor, inplace, persist
        # MPI's in-place reduce_scatter leaves the result in block 0, not in this rank's
        # block: the input goes in as a copy; MPI leaves rank 0's exscan output undefined,
        # and hpccoll leaves it as it was: MPI writes elsewhere
        self.scratch = ((kind == "reduce_scatter" and inplace)
                        or (kind == "exscan" and rank == 0))


class Persistent:
    """One persistent request (MPI-4 ``*_init``) on staging arrays of its own.  ``Init``
    is a collective call: it is made when the slot is first started, which happens in
    the communicator's collective order like any start; the staging arrays (``shapes``:
    element counts of send and receive, None where this rank has none, and the dtype)
    are made then too, so a slot never used costs nothing."""

    def __init__(self, shapes):
        self.shapes = shapes
        self.send = self.recv = self.req = None
        self.busy = False

    def make(self) -> None:
        ns, nr, dt = self.shapes
        self.send = None if ns is None else np.empty(ns, dt)
        self.recv = None if nr is None else np.empty(nr, dt)

    def free(self) -> bool:
        """Free the request unless it is in flight; False if it is."""
        if self.req is None:
            return True
        if self.busy:
            return False
        try:
            self.req.Free()
        except MPI.Exception:
            pass
        self.req = None
        return True


def start_collective(mpi_comm, kind, send, recv, op=None, root=0, persistent=False):
    """Start (or, ``persistent``, initialise) MPI's own collective ``kind``; ``send`` may
    be MPI.IN_PLACE.  Returns the request."""
    fn = getattr(mpi_comm, (PERSISTENT if persistent else NONBLOCKING)[kind])
    if kind in ("allreduce", "reduce_scatter", "scan", "exscan"):
        return fn(send, recv, op)
    if kind in ("gather", "scatter"):
        return fn(send, recv, root)
    if kind == "reduce":
        return fn(send, recv, op, root)
    if kind == "broadcast":
        return fn(recv, root)
    if kind == "barrier":
        return fn()
    return fn(send, recv)


def scratch(r: Recipe, send):
    """The array of its own that MPI reads or writes in this call of recipe ``r`` (where
    ``r.scratch``): the caller holds it until the request completes, since MPI may touch
    it during progress, long after the call that posted it (Open MPI does; mpi4py keeps
    no reference)."""
    return send.copy() if r.kind == "reduce_scatter" else np.empty_like(send)


def start(r: Recipe, send, recv, scratch=None):
    """Start the collective of recipe ``r`` on these arrays (and ``scratch``, where the
    recipe needs one); returns its request.  Every array must stay alive until the
    request completes."""
    kind = r.kind
    # reduce and reduce_scatter take no avg (the plan's rule).  Which ranks pass their
    # input in place may differ (only the root may, for reduce): the algorithm may not
    if kind == "reduce":
        if r.rank != r.root:
            return r.post(send, None, r.mop, r.root)
        return r.post(MPI.IN_PLACE if r.inplace else send, recv, r.mop, r.root)
    if kind == "reduce_scatter":
        return r.post(send if scratch is None else scratch, recv, r.mop)
    if kind == "gather":        # the receive buffer and MPI.IN_PLACE: the root's only
        if r.rank != r.root:
            return r.post(send, None, r.root)
        return r.post(MPI.IN_PLACE if r.inplace else send, recv, r.root)
    if kind == "scatter":
        if r.rank != r.root:
            return r.post(None, recv, r.root)
        return r.post(send, MPI.IN_PLACE if r.inplace else recv, r.root)
    if scratch is not None:     # rank 0's exscan
        return r.post(send, scratch, r.mop)
    if r.divisor:           # avg: divide into the output, then sum in place
        table.scale(recv, send, r.divisor)
        send = MPI.IN_PLACE
    elif r.inplace:         # the input already lies where the output goes
        send = MPI.IN_PLACE
    if kind == "allreduce" or kind == "scan" or kind == "exscan":
        return r.post(send, recv, r.mop)
    if kind == "broadcast":
        return r.post(recv, r.root)
    if kind == "barrier":
        return r.post()
    return r.post(send, recv)


def start_slot(r: Recipe, slot: Persistent, send):
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


def finish_slot(r: Recipe, slot: Persistent, recv) -> None:
    """Slot ``slot``'s collective completed: its result to ``recv``; the slot is free."""
    if slot.recv is not None and recv is not None and (r.kind != "broadcast"
                                                      or r.root != r.rank) and (
            r.kind != "exscan" or r.rank != 0):
        recv[...] = slot.recv
    slot.busy = False


def library_version() -> str:
    """The MPI library's version text, as C would print it: Open MPI's ends in a NUL
    byte, which HDF5 strings and terminals refuse."""
    return MPI.Get_library_version().split("\0", 1)[0].strip()


def library_name() -> str:
    """The MPI library's one-line name, as tables and result files name it: a calibration
    measured with another library (or another version of it) does not apply."""
    return " ".join(library_version().splitlines()[0].split())


# -- reduction ops ----------------------------------------------------------------------------
_MPI_OPS: dict = {}


def mpi_op(name: str):
    """MPI's own op for ``name`` (avg: MPI_SUM, on contributions divided beforehand)."""
    op = _MPI_OPS.get(name)
    if op is None:
        op = _MPI_OPS[name] = getattr(MPI, table.OPS[name].mpi)
    return op


_BY_MPI: dict = {}


def op_of_mpi(op) -> Optional[str]:
    """hpccoll's name for one of MPI's predefined ops (the adapter's map), or None."""
    if not _BY_MPI:
        for name, o in table.OPS.items():
            if name != "avg":
                _BY_MPI[getattr(MPI, o.mpi).py2f()] = name
    return _BY_MPI.get(op.py2f())
