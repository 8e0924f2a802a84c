"""Transports, in the order they are tried.

Only MPI point-to-point exists today; it works everywhere (any MPI, any placement)
and is therefore last: faster transports (node-shared memory, CUDA IPC) go
before it as they land, each with a predicate saying when it can connect.
"""
from __future__ import annotations

TRANSPORTS = ("mpi",)


def get(name: str = "mpi"):
    if name == "mpi":
        from . import mpi
        return mpi
    raise KeyError(name)
