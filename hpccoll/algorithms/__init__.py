"""Algorithm families and the table that picks one per collective.

Each family is a module of pure step machines (``ring``, ``tree``, ``doubling``,
``pairwise``).  ``TABLE`` lists, per collective, candidates in priority order;
the first whose predicate holds is used.  Latency-optimal algorithms come first,
limited to small messages; the bandwidth-optimal pipelined ones catch the rest.

``build`` materializes a step machine into a ``Program`` (a tuple of primitives).
Step machines are data-independent, so programs are cached per ``Spec``: a
repeated collective pays for planning once (like Horovod's response cache).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable, NamedTuple

from . import doubling, pairwise, ring, tree
from .primitives import Wait, scratch_extent
from .spec import COLLECTIVES, Spec


def _small(nbytes: int, small_msg_bytes: int) -> bool:
    return nbytes <= small_msg_bytes


def _always(nbytes: int, small_msg_bytes: int) -> bool:
    return True


TABLE: dict[str, list[tuple[str, Callable, Callable]]] = {
    "allreduce": [("doubling", _small, doubling.allreduce), ("ring", _always, ring.allreduce)],
    "reduce": [("binomial", _small, tree.reduce), ("ring", _always, ring.reduce)],
    "broadcast": [("binomial", _small, tree.broadcast), ("chain", _always, tree.broadcast_chain)],
    "allgather": [("bruck", _small, doubling.allgather), ("ring", _always, ring.allgather)],
    "reduce_scatter": [("ring", _always, ring.reduce_scatter)],
    "alltoall": [("pairwise", _always, pairwise.alltoall)],
    "barrier": [("dissemination", _always, doubling.barrier)],
}
_BY_NAME = {(coll, name): fn for coll, rows in TABLE.items() for name, _, fn in rows}
_BY_NAME[("allgather", "direct")] = doubling.allgather_direct   # used by the fingerprint check


class Program(NamedTuple):
    algo: str
    steps: tuple
    scratch: int   # elements
    waits: int     # number of Wait steps (suspension points)


def message_bytes(coll: str, count: int, size: int, itemsize: int) -> int:
    """The size the selection looks at: the whole vector a rank ends up with."""
    if coll in ("allgather", "reduce_scatter", "alltoall"):
        return count * size * itemsize
    return count * itemsize


def select(coll: str, nbytes: int, small_msg_bytes: int) -> str:
    for name, pred, _ in TABLE[coll]:
        if pred(nbytes, small_msg_bytes):
            return name
    raise AssertionError(f"no algorithm for {coll}")  # the last row of each list always matches


@lru_cache(maxsize=512)
def build(spec: Spec, algo: str) -> Program:
    steps = tuple(_BY_NAME[(spec.coll, algo)](spec))
    return Program(algo, steps, scratch_extent(steps), sum(isinstance(p, Wait) for p in steps))


__all__ = ["COLLECTIVES", "Program", "Spec", "TABLE", "build", "message_bytes", "select"]
