"""What a step machine needs to know about one collective on one rank."""
from __future__ import annotations

from typing import NamedTuple

from ..base.ops import COLLECTIVES  # noqa: F401  (the step machines' collectives)


class Spec(NamedTuple):
    coll: str
    rank: int
    size: int
    count: int        # the contract's n: elements each rank contributes (per block for alltoall)
    chunk: int = 1 << 18   # elements per pipeline chunk
    depth: int = 2    # chunks in flight
    root: int = 0
    avg: bool = False  # divide the sum by size (op "avg")
    inplace: bool = False
    slots: int = 2            # shared-memory staging slots per rank (algorithms/shm.py)
    registered: bool = False  # send and receive buffers are registered (ctx.empty)
    local: tuple = ()         # communicator ranks on this rank's node, in local order
    cross: tuple = ()         # communicator ranks with this rank's local index, node order
    # variable-count collectives (tuples, one entry per rank, so that a Spec stays hashable):
    counts: tuple = ()    # elements of rank i's block (allgatherv, reduce_scatterv) or from rank i (alltoallv)
    displs: tuple = ()    # where those elements lie in RECV (allgatherv, alltoallv)
    scounts: tuple = ()   # alltoallv: elements sent to rank i
    sdispls: tuple = ()   # alltoallv: where they lie in SEND
