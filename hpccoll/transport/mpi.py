"""MPI point-to-point transport: nonblocking sends and receives of raw bytes on a
communicator private to hpccoll, one tag per collective.

Everything travels as bytes: reductions happen in hpccoll, so MPI never needs to
know the dtype (float16 and bfloat16 work on any MPI)."""
from __future__ import annotations

from mpi4py import MPI

name = "mpi"


def post(comm, tag: int, sends, recvs, views) -> list:
    """Start the transfers; ``views(region)`` gives the bytes of a region.  Receives are
    posted first so that a peer's eager message finds its buffer."""
    reqs = [comm.Irecv(views(reg), peer, tag) for peer, reg in recvs]
    reqs += [comm.Isend(views(reg), peer, tag) for peer, reg in sends]
    return reqs


def test_all(reqs: list) -> bool:
    return MPI.Request.Testall(reqs)


def pending(reqs: list) -> list[bool]:
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
