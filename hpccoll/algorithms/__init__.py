"""Algorithm families and the table that picks one per collective.

Each family is a module of pure step machines (``ring``, ``tree``, ``doubling``,
``pairwise``, ``linear``, ``prefix``, ``shm``).
``TABLE`` lists, per collective, candidates in priority order;
the first whose predicate holds is used, unless a calibration measured another
candidate faster for this size (``Choice.prefer``: hpccoll/algorithms/calibration.py) and that
candidate can run here (``applies``).  The MPI library's own nonblocking collective is
a row like the others (``mpi``): it has no step machine, because the MPI library runs it
(hpccoll/engine/lane.py's ``MpiLane``).  Latency-optimal algorithms come first, limited
to small messages; the bandwidth-optimal pipelined ones catch the rest.

``build`` materializes a step machine into a ``Program`` (a tuple of primitives).
Step machines are data-independent, so programs are cached per ``Spec``: a
repeated collective pays for planning once (like Horovod's response cache).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable, NamedTuple

from . import cma, doubling, linear, pairwise, prefix, ring, shm, tree
from .primitives import Signal, Wait, WaitFlags, prescaled, scratch_extent
from ..base.mismatch import ALGO_CODES
from .spec import COLLECTIVES, Spec


class Choice(NamedTuple):
    """What the table's predicates look at."""
    nbytes: int
    small_msg_bytes: int = 64 << 10
    shm: str = ""              # "flat": every rank on one node shares memory; "hier": nodes
    shm_min_bytes: int = 64 << 10
    registered: bool = False   # send and receive buffers are registered (ctx.empty)
    mpi_coll_bytes: int = 0    # tiny messages may use MPI's own nonblocking collectives,
    native: bool = False       # when the dtype and op are MPI's and the collective unkeyed
    prefer: str = ""           # the calibration's pick for this size, if any
    shm_c_bytes: int = 0       # above this, shared memory run in C (engine/_native.c) beats
    #                            MPI's own, where it runs this reduction (0: it does not)
    cma: bool = False          # every rank on one node, each may read the others' memory
    #                            (transport/cma.py), host arrays, no kernel backend
    ranks: int = 0             # the communicator's size (0: not known)
    cell_bytes: int = 0        # up to this, one handoff through node-shared cells (0: none
    #                            here: no C module, a reduction it lacks, not one node)


# the collectives whose shared-memory programs shm_c_bytes brings below shm_min_bytes
# (where it was measured; core/plan.py sets Choice.shm_c_bytes for them)
C_SHM_COLLECTIVES = frozenset({"allreduce", "reduce", "reduce_scatter", "allgather",
                               "alltoall", "broadcast"})


def _c_shm(c: Choice) -> bool:
    """Shared memory run in C beats MPI's own collective from small sizes on (2 ranks,
    against MPI's blocking collective: 16 KiB allreduce 0.94x, reduce 1.05x against
    0.68x and 0.69x through MPI's own nonblocking one; 64 KiB allreduce 1.06-1.08x,
    reduce 1.34-1.40x, reduce_scatter 1.08-1.12x against 0.58-0.82x; 4 ranks 64 KiB
    0.82-1.11x against 0.55-0.64x; 8 KiB MPI's own stays ahead, 0.51 against 0.46x)."""
    return c.shm_c_bytes > 0 and c.shm == "flat" and c.nbytes > c.shm_c_bytes


def _cells(c: Choice) -> bool:
    """Every rank on one node, a message a cell holds: each rank publishes its input with
    a sequence number in a cell of its own and reads its peers' (engine/_native.c), one
    cache-line handoff per peer for up to 56 bytes, no MPI call and no system call.
    Against MPI's own blocking call (2 ranks, docs/performance.md "Cells"): see there."""
    return c.cell_bytes > 0 and c.shm == "flat" and c.nbytes <= c.cell_bytes


def _small(c: Choice) -> bool:
    return c.nbytes <= c.small_msg_bytes


def _always(c: Choice) -> bool:
    return True


def _shm(c: Choice) -> bool:
    """Shared memory wins once a message is large enough to pay for its three flag rounds;
    registered buffers always take it (the data never needs to move otherwise)."""
    return c.shm == "flat" and (c.registered or c.nbytes >= c.shm_min_bytes or _c_shm(c))


def _shm_staged(c: Choice) -> bool:
    """reduce, broadcast: shared memory once a message pays for its flag rounds,
    registered or not (they stage either way).  Broadcast takes it where MPI's own
    cannot run (float16), where ``_bcast`` leaves it, or where a calibration picks it.
    Reduce, against the ring over point-to-point (``hpccoll-tune calibrate``, 2 ranks):
    256 KiB 68 against 87 us, 1 MiB 254 against 316, 4 MiB 772 against 1,012, 16 MiB 3.3
    against 4.2 ms; 4 ranks alike."""
    return c.shm == "flat" and (c.nbytes >= c.shm_min_bytes or _c_shm(c))


def _tiny(c: Choice) -> bool:
    return c.native and 0 < c.mpi_coll_bytes and c.nbytes <= c.mpi_coll_bytes and not _c_shm(c)


def _native(c: Choice) -> bool:
    """A broadcast, allgather or alltoall MPI can run: its own beats hpccoll's
    point-to-point algorithms at every size on one node (shared memory run in C takes
    some sizes back: ``_bcast``, ``_gather``, ``_c_exchange``).  Broadcast, against the
    chain (2 ranks: 1 MiB 0.89x, 16 MiB 0.84-0.91x the blocking MPI_Bcast, against 0.66x
    and 0.52-0.61x; scripts/bench_adapter.py).
    Alltoall, against the pairwise exchange over point-to-point (1 MiB: 72 against 189 us
    at 2 ranks, 246 against 666 us at 4; 16 MiB: 1,496 against 2,454 us at 2 ranks, 7,146
    against 7,430 at 4): both copy each block through shared memory once, so there is
    nothing for hpccoll to win."""
    return c.native and c.mpi_coll_bytes > 0


def _bcast(c: Choice) -> bool:
    """broadcast: MPI's own, but shared memory run in C (the root copies each chunk into
    its slot once, every other rank copies it out) from above shm_c_bytes to 128 KiB,
    where it beats MPI's own through hpccoll in every job (2 ranks, same buffers for all,
    root 0: 16 KiB 23-29 against 32-42 us, 64 KiB 29-48 against 42-54, 128 KiB 36-45
    against 50-61; MPI's blocking call 15-33).  From 256 KiB it depends on the VM's phase:
    as fast or faster in some jobs (1 MiB 110-114 against 152-161 us), 2-3x slower in
    others (338-381), where MPICH's single-copy transfer (process_vm_readv) is not hurt
    by lines moving between the cores; MPI's own keeps those sizes."""
    return _native(c) and not (_c_shm(c) and c.nbytes <= _BCAST_C_BYTES)


_BCAST_C_BYTES = 128 << 10


def _c_exchange(c: Choice) -> bool:
    """alltoall: shared memory run in C, issued and waited for through core/_express.c,
    beats MPI's own at every size up to 64 KiB (the whole output; 2 ranks, against MPI's
    blocking call: 8 B 0.56x, 1 KiB 0.51x, 8 KiB 0.57-0.60x, 16 KiB 0.93-0.98x, 32 KiB
    0.91-0.93x, 64 KiB 0.81-0.94x, against 0.45-0.49x, 0.47-0.53x and 0.64-0.79x through
    MPI's own nonblocking one; 4 ranks 0.64-0.66x at 16 B-8 KiB, 1.12-1.23x at 32-64 KiB
    against 0.49-0.57x).  From 128 KiB at 2 ranks (64 KiB per peer) MPICH's own turns
    faster than either (7.0 us against 15.5 through shared memory)."""
    return c.shm_c_bytes > 0 and c.shm == "flat" and c.nbytes <= _EXCHANGE_C_BYTES


def _exchange(c: Choice) -> bool:
    return _native(c) and not _c_exchange(c)


_EXCHANGE_C_BYTES = 64 << 10


def _hier(c: Choice) -> bool:
    return c.shm == "hier" and c.nbytes >= c.shm_min_bytes


def _gather(c: Choice) -> bool:
    """MPI's own allgather copies each block once, as shared memory does, with less
    Python per call: against shared memory run in Python it wins at every size on ordinary
    buffers (2 ranks: 1 MiB 104 against 142-148 us, 16 MiB 1,389 against 1,640-2,232; 4
    ranks even to 0.99x at 1 and 16 MiB); against shared memory run in C only above
    ``_GATHER_C_BYTES``; on registered buffers up to 1 MiB; from 4 MiB registered shared
    memory moves less (2 ranks 16 MiB: 1,121 against 1,400 us; 4 ranks 3,120 against
    5,192).  Measured by
    ``hpccoll-tune calibrate``, docs/performance.md."""
    return _native(c) and not (
        c.registered and c.shm == "flat" and c.nbytes >= _GATHER_SHM_BYTES) and not (
        _c_shm(c) and c.nbytes <= _GATHER_C_BYTES)


_GATHER_SHM_BYTES = 2 << 20
# Shared memory run in C, issued and waited for through core/_express.c, beats MPI's own
# allgather up to here (the whole output; 2 ranks, against MPI's blocking call: 16 KiB
# 0.82-0.88x, 64 KiB 0.83-0.87x, 256 KiB 0.95-0.96x, against 0.62-0.68x, 0.66-0.68x and
# 0.84-0.85x through MPI's own nonblocking one; 4 ranks 0.85x / 1.07x / 1.20x against
# 0.56x / 0.66x / 0.63x).  With the C executor's own copy loop it kept ahead at 512 KiB
# (2 ranks, same buffers for all: 121-245 against 269-349 us through MPI's own), but not
# at 1-2 MiB (1 MiB 394-397 against 259-271 us in two jobs of three, 154 against 181 in
# the third; 4-8 MiB even): MPI's own, with its single-copy transfer, keeps 1 MiB and up.
_GATHER_C_BYTES = 512 << 10


def _cma(c: Choice) -> bool:
    return c.cma and not c.registered


def _cma_exchange(c: Choice) -> bool:
    """alltoall: single copy (algorithms/cma.py) above where shared memory run in C keeps
    it (``_c_exchange``).  Against MPI's own run for hpccoll, the same buffers for every
    contender, medians (2 ranks, seven jobs: 1 MiB 136-157 against 137-206 us, 16 MiB
    2.7-5.2 against 3.2-6.3 ms; 4 ranks: 1 MiB 671 against 751 us, 16 MiB 7.8 against
    10.0 ms).  Staged shared memory copies twice: 1 MiB 148-276 us, 16 MiB 3.3-5.6 ms at
    2 ranks (docs/performance.md, "Single copy between processes")."""
    return _cma(c) and c.nbytes > _EXCHANGE_C_BYTES


def _cma_allreduce(c: Choice) -> bool:
    """allreduce at 2 ranks from above 4 MiB: each rank reads the peer's half (one copy),
    reduces it with its own, and reads the peer's reduced half, where staged shared
    memory copies in, reduces and copies out.  It is the steady one: 16 MiB 4.8-6.5 ms in
    every job, staged 4.2-5.0 in three and 7.6-8.4 in six by the VM's phase, MPI's
    blocking call 9.7-12.5; 4 MiB even; 1 MiB staged ahead (251-521 against 403-627 us).
    At 4 ranks on 2 cores staged stays ahead (16 MiB 16.6 against 19.5 ms): there a
    calibration may still pick it."""
    return _cma(c) and c.ranks == 2 and c.nbytes > _CMA_REDUCE_BYTES


def _calibrated_only(c: Choice) -> bool:
    """allgather, broadcast, reduce_scatter: single copy was nowhere ahead of the built-in
    choice in every job (2 ranks: allgather 1 MiB 290-346 against 207-232 us through MPI's
    own; broadcast within 5% of MPI's own; reduce_scatter behind staged shared memory at
    every size; 4 ranks alike): it runs where a calibration measured it faster."""
    return False


_CMA_REDUCE_BYTES = 4 << 20


def _cma_gather(c: Choice) -> bool:
    """gather: the root reads every peer's input straight into its output (one copy, one
    flag round), above 1 MiB (the root's whole output).  Against MPI's own run for
    hpccoll through the adapter, 2 ranks on a crowded 2-core machine (other jobs at load
    8-10: single runs, noisy): 4 MiB 2.7 against 4.6 ms, 16 MiB 5.1 against 8.7, 2 MiB
    1.3 against 2.5; 1 MiB 377 against 344 us, 512 KiB 353 against 519."""
    return _cma(c) and c.nbytes > _CMA_GATHER_BYTES


def _cma_scatter(c: Choice) -> bool:
    """scatter: every rank reads its block straight from the root's input, above 256 KiB
    (the root's whole input; same runs as ``_cma_gather``: 512 KiB 466 against 517 us,
    1 MiB 92 against 116, 4 MiB 299 against 397, 16 MiB 1.24 against 2.13 ms; 128 KiB
    410 against 325)."""
    return _cma(c) and c.nbytes > _CMA_SCATTER_BYTES


_CMA_GATHER_BYTES = 1 << 20
_CMA_SCATTER_BYTES = 256 << 10


def _shm_rooted(c: Choice) -> bool:
    """gather, scatter: staged through node-shared slots, run in C, above 8 KiB (up to
    where single copy takes over).  Against MPI's own run for hpccoll through the adapter
    (2 ranks, load 3-4 from other jobs, one run): gather 16 KiB 59 against 78 us, 64 KiB
    49 against 76, 256 KiB 55 against 84, 1 MiB 114 against 180; scatter 16 KiB 27
    against 71, 64 KiB 38 against 82, 256 KiB 86 against 108; 1 KiB even (53 against
    58, 19 against 21): MPI's own (persistent requests) keeps the tiny ones."""
    return c.shm == "flat" and c.nbytes > _SHM_ROOTED_BYTES


_SHM_ROOTED_BYTES = 8 << 10


# What a candidate needs to run at all, whatever the size: the rows' predicates add the
# sizes where each is the built-in choice.  A calibration's pick is used only where it
# applies (another machine's table may name shared memory where there is none).
APPLIES: dict[str, Callable] = {
    "mpi": _native,
    "cells": _cells,
    "shm": lambda c: c.shm == "flat",
    "hier": lambda c: c.shm == "hier",
    "cma": _cma,
}


# Ordered by preference: MPI's own nonblocking collectives for tiny messages, shared memory
# where it applies, latency-optimal algorithms for small messages, then the
# bandwidth-optimal pipelined ones (which always apply).
MPI = None    # the ``mpi`` rows: no step machine, the MPI library runs the collective
CELLS = None  # the ``cells`` rows: no step machine, one handoff through node-shared cells
TABLE: dict[str, list[tuple[str, Callable, Callable]]] = {
    "allreduce": [("cells", _cells, CELLS), ("mpi", _tiny, MPI),
                  ("cma", _cma_allreduce, cma.allreduce),
                  ("shm", _shm, shm.allreduce),
                  ("hier", _hier, shm.allreduce_hier), ("doubling", _small, doubling.allreduce),
                  ("ring", _always, ring.allreduce)],
    "reduce": [("cells", _cells, CELLS), ("mpi", _tiny, MPI),
               ("shm", _shm_staged, shm.reduce),
               ("binomial", _small, tree.reduce), ("ring", _always, ring.reduce)],
    "broadcast": [("cells", _cells, CELLS), ("cma", _calibrated_only, cma.broadcast),
                  ("mpi", _bcast, MPI), ("shm", _shm_staged, shm.broadcast),
                  ("binomial", _small, tree.broadcast), ("chain", _always, tree.broadcast_chain)],
    "allgather": [("cells", _cells, CELLS), ("cma", _calibrated_only, cma.allgather),
                  ("mpi", _gather, MPI), ("shm", _shm, shm.allgather),
                  ("bruck", _small, doubling.allgather), ("ring", _always, ring.allgather)],
    "reduce_scatter": [("cells", _cells, CELLS), ("mpi", _tiny, MPI),
                       ("cma", _calibrated_only, cma.reduce_scatter),
                       ("shm", _shm, shm.reduce_scatter),
                       ("ring", _always, ring.reduce_scatter)],
    "alltoall": [("cells", _cells, CELLS), ("cma", _cma_exchange, cma.alltoall),
                 ("mpi", _exchange, MPI), ("shm", _c_exchange, shm.alltoall),
                 ("pairwise", _always, pairwise.alltoall)],
    "barrier": [("cells", _cells, CELLS), ("mpi", _tiny, MPI),
                ("dissemination", _always, doubling.barrier)],
    # variable counts (the mpi4py adapter's Allgatherv, Reduce_scatter, Alltoallv)
    "allgatherv": [("ring", _always, ring.allgatherv)],
    "reduce_scatterv": [("ring", _always, ring.reduce_scatterv)],
    "alltoallv": [("pairwise", _always, pairwise.alltoallv)],
    # rooted and prefix collectives: single copy for large gathers and scatters on one
    # node, else MPI's own wherever it can run them (they move each block once, as
    # hpccoll's would, with less Python per call); hpccoll's own for the rest (float16,
    # bfloat16, keyed calls, ops MPI lacks)
    "gather": [("cells", _cells, CELLS),
               ("cma", _cma_gather, cma.gather), ("shm", _shm_rooted, shm.gather),
               ("mpi", _native, MPI),
               ("binomial", _small, tree.gather), ("linear", _always, linear.gather)],
    "scatter": [("cells", _cells, CELLS),
                ("cma", _cma_scatter, cma.scatter), ("shm", _shm_rooted, shm.scatter),
                ("mpi", _native, MPI),
                ("binomial", _small, tree.scatter), ("linear", _always, linear.scatter)],
    "scan": [("mpi", _native, MPI), ("doubling", _small, prefix.scan_doubling),
             ("chain", _always, prefix.scan_chain)],
    "exscan": [("mpi", _native, MPI), ("doubling", _small, prefix.exscan_doubling),
               ("chain", _always, prefix.exscan_chain)],
    "gatherv": [("linear", _always, linear.gatherv)],
    "scatterv": [("linear", _always, linear.scatterv)],
}
# every algorithm has its number in the mismatch fingerprint (ranks must agree on it)
_UNNUMBERED = {name for rows in TABLE.values() for name, _, _ in rows} - set(ALGO_CODES)
assert not _UNNUMBERED, f"algorithms without a fingerprint code (base/mismatch.py): {_UNNUMBERED}"
SHM_ALGOS = frozenset({"shm", "hier", "cma"})   # programs on the node-shared area's flags
ROWS_WITHOUT_STEPS = frozenset({"mpi", "cells"})  # run by the MPI library, or by cells
STAGED = frozenset({"reduce", "broadcast", "alltoall"})   # shared-memory programs that never read peers' buffers
# step machines that compute an average themselves (ReduceN's divisor); the others get
# their input divided first (primitives.prescaled)
_AVG_NATIVE = SHM_ALGOS
_BY_NAME = {(coll, name): fn for coll, rows in TABLE.items() for name, _, fn in rows}
_BY_NAME[("allgather", "direct")] = doubling.allgather_direct   # used by the fingerprint check


class Program(NamedTuple):
    algo: str
    steps: tuple
    scratch: int   # elements
    waits: int     # number of Wait/WaitFlags steps (suspension points)
    epochs: int    # shared-memory epochs the program uses (its flags run base+1 .. base+epochs)


def message_bytes(coll: str, count: int, size: int, itemsize: int) -> int:
    """The size the selection looks at: the whole vector a rank ends up with.  (The
    variable-count collectives pass their total count.)"""
    if coll in ("allgather", "reduce_scatter", "alltoall", "gather", "scatter"):
        return count * size * itemsize
    return count * itemsize


def select(coll: str, choice) -> str:
    """The calibration's pick where it applies, else the first candidate of ``coll``
    whose predicate holds; ``choice`` is a Choice (or a message size in bytes, for the
    MPI-only algorithms)."""
    if not isinstance(choice, Choice):
        choice = Choice(int(choice))
    return _select(coll, choice)


def applies(coll: str, name: str, choice: Choice) -> bool:
    """Whether candidate ``name`` of ``coll`` can run for ``choice``, whatever its size."""
    if (coll, name) not in _BY_NAME or name == "direct":
        return False
    need = APPLIES.get(name)
    return need is None or need(choice)


def candidates(coll: str, choice: Choice) -> list:
    """Every candidate of ``coll`` that can run for ``choice``: what a calibration times."""
    return [name for name, _, _ in TABLE[coll] if applies(coll, name, choice)]


@lru_cache(maxsize=4096)
def _select(coll: str, choice: Choice) -> str:
    if choice.prefer and applies(coll, choice.prefer, choice):
        return choice.prefer
    for name, pred, _ in TABLE[coll]:
        if pred(choice):
            return name
    raise AssertionError(f"no algorithm for {coll}")  # the last row of each list always matches


def input_extent(spec: Spec) -> int:
    """Elements of the input a reduction reads (what an avg divides beforehand)."""
    if spec.coll == "reduce_scatter":
        return spec.size * spec.count
    return spec.count


# what traces, counters and reports show of the rows without a step machine
MPI_PROGRAM = Program("mpi", (), 0, 1, 0)
CELLS_PROGRAM = Program("cells", (), 0, 1, 0)


@lru_cache(maxsize=512)
def build(spec: Spec, algo: str) -> Program:
    fn = _BY_NAME[(spec.coll, algo)]
    if fn is None:
        return CELLS_PROGRAM if algo == "cells" else MPI_PROGRAM
    if spec.avg and algo not in _AVG_NATIVE:
        steps = tuple(fn(spec._replace(avg=False)))
        steps = tuple(prescaled(steps, spec.size, input_extent(spec), spec.inplace,
                                scratch_extent(steps)))
    else:
        steps = tuple(fn(spec))
    epochs = max((p.epoch for p in steps if isinstance(p, Signal)), default=0)
    return Program(algo, steps, scratch_extent(steps),
                   sum(isinstance(p, (Wait, WaitFlags)) for p in steps), epochs)


__all__ = ["ALGO_CODES", "APPLIES", "CELLS_PROGRAM", "COLLECTIVES", "Choice", "MPI_PROGRAM",
           "Program", "ROWS_WITHOUT_STEPS", "SHM_ALGOS", "STAGED", "Spec", "TABLE", "applies",
           "build", "candidates", "input_extent",
           "message_bytes", "select"]
