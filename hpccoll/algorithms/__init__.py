"""Algorithm families and the table that picks one per collective.

Each family is a module of pure step machines (``ring``, ``tree``, ``doubling``,
``pairwise``, ``linear``, ``prefix``, ``shm``).
``TABLE`` lists, per collective, candidates in priority order, each with the rows (data:
capabilities a message needs or lacks, size bounds in bytes or named settings) where it is
the built-in choice; the first candidate one of whose rows holds is used, unless a
calibration measured another candidate faster for this size (``Choice.prefer``:
hpccoll/algorithms/calibration.py) and that candidate can run here (``applies``): one
table, which a calibration file overrides.  The MPI library's own nonblocking collective is
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
    """What the table's rows look at: the message's size, its capabilities
    (``capabilities``) and the thresholds the rows name (settings)."""
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


def capabilities(c: Choice) -> frozenset:
    """What the table's rows ask of a message besides its size."""
    flat = c.shm == "flat"
    have = {"native": c.native, "mpi": c.native and c.mpi_coll_bytes > 0,
            "flat": flat, "hier": c.shm == "hier", "registered": c.registered,
            "reg_flat": c.registered and flat,
            # shared memory run in C (engine/_native.c) where it has the reduction
            "c_shm": flat and c.shm_c_bytes > 0,
            "cells": flat and c.cell_bytes > 0,
            "cma": c.cma, "two_ranks": c.ranks == 2}
    return frozenset(k for k, v in have.items() if v)


class Row(NamedTuple):
    """One region of the table where a candidate is the built-in choice: a message with
    every capability in ``needs`` and none in ``lacks`` (``capabilities``), whose size
    (``Choice.nbytes``) is above, at most, at least and below every bound given.  A bound
    is a number of bytes, or the name of a Choice field: the setting of that name (e.g.
    ``small_msg_bytes``).  ``picked``: never the built-in choice, only a calibration's
    pick."""
    needs: frozenset = frozenset()
    lacks: frozenset = frozenset()
    above: tuple = ()
    upto: tuple = ()
    from_: tuple = ()
    below: tuple = ()
    picked: bool = False

    def holds(self, c: Choice, have: frozenset) -> bool:
        if self.picked or not self.needs <= have or self.lacks & have:
            return False
        n = c.nbytes
        return (all(n > _bound(c, b) for b in self.above)
                and all(n <= _bound(c, b) for b in self.upto)
                and all(n >= _bound(c, b) for b in self.from_)
                and all(n < _bound(c, b) for b in self.below))


def _bound(c: Choice, b) -> int:
    return getattr(c, b) if b.__class__ is str else b


def _row(needs=(), lacks=(), **bounds) -> Row:
    for k, v in bounds.items():
        if k != "picked" and not isinstance(v, tuple):
            bounds[k] = (v,)
    return Row(frozenset(needs), frozenset(lacks), **bounds)


ALWAYS = (_row(),)
SMALL = (_row(upto="small_msg_bytes"),)    # latency-optimal point-to-point algorithms
PICKED = (_row(picked=True),)
# Up to cell_bytes, every rank on one node, one handoff through node-shared cells
# (engine/_native.c; docs/performance.md "Cells").
CELLS = (_row(["cells"], upto="cell_bytes"),)
# MPI's own for tiny messages, but shared memory run in C above shm_c_bytes (2 ranks,
# against MPI's blocking collective: 16 KiB allreduce 0.94x, reduce 1.05x against 0.68x
# and 0.69x through MPI's own nonblocking one; 64 KiB allreduce 1.06-1.08x, reduce
# 1.34-1.40x, reduce_scatter 1.08-1.12x against 0.58-0.82x; 4 ranks 64 KiB 0.82-1.11x
# against 0.55-0.64x; 8 KiB MPI's own stays ahead, 0.51 against 0.46x).
TINY = (_row(["mpi"], ["c_shm"], upto="mpi_coll_bytes"),
        _row(["mpi", "c_shm"], upto=("mpi_coll_bytes", "shm_c_bytes")))
# Shared memory once a message pays for its three flag rounds; registered buffers always
# (the data never needs to move otherwise); from above shm_c_bytes where C runs it.
SHM = (_row(["flat", "registered"]), _row(["flat"], from_="shm_min_bytes"),
       _row(["c_shm"], above="shm_c_bytes"))
# reduce, broadcast: they stage either way, registered or not.  Reduce, against the ring
# over point-to-point (``hpccoll-tune calibrate``, 2 ranks): 256 KiB 68 against 87 us,
# 1 MiB 254 against 316, 4 MiB 772 against 1,012, 16 MiB 3.3 against 4.2 ms; 4 ranks alike.
SHM_STAGED = (_row(["flat"], from_="shm_min_bytes"), _row(["c_shm"], above="shm_c_bytes"))
# A broadcast, allgather or alltoall MPI can run: its own beats hpccoll's point-to-point
# algorithms at every size on one node.  Broadcast, against the chain (2 ranks: 1 MiB
# 0.89x, 16 MiB 0.84-0.91x the blocking MPI_Bcast, against 0.66x and 0.52-0.61x).
# Alltoall, against the pairwise exchange (1 MiB: 72 against 189 us at 2 ranks, 246
# against 666 at 4; 16 MiB: 1,496 against 2,454 us at 2 ranks, 7,146 against 7,430 at 4).
NATIVE = (_row(["mpi"]),)
# broadcast: MPI's own, but shared memory run in C from above shm_c_bytes to 128 KiB (the
# root copies each chunk into its slot once, every other rank copies it out; 2 ranks, root
# 0: 16 KiB 23-29 against 32-42 us, 64 KiB 29-48 against 42-54, 128 KiB 36-45 against
# 50-61; MPI's blocking call 15-33).  From 256 KiB it depends on the VM's phase (1 MiB
# 110-114 against 152-161 us in some jobs, 338-381 in others, where MPICH's single-copy
# transfer is not hurt by lines moving between the cores): MPI's own keeps those.
# At 2 ranks, since copies into slots stream, shared memory in C is ahead of cells by
# reference up to 1 MiB, where cache lines hand off fast, and even where they do not
# (scripts/bench_candidates.py, medians in us: 512 KiB MPICH 45 against 61, Open MPI
# 32-36 against 59-62, Intel MPI 35-39 against 51-70; 1 MiB 59 against 92, 50-55
# against 109-113, 55-63 against 91-120; at 230-280 ns 512 KiB 48-71 against 46-61,
# 1 MiB 74-104 against 87-110); at 2 MiB MPI's own is (75-135 against 109-144).
BCAST_C_BYTES = 128 << 10
BCAST_C2_BYTES = 1 << 20
BCAST = (_row(["mpi"], ["c_shm"]), _row(["mpi", "c_shm"], upto="shm_c_bytes"),
         _row(["mpi", "c_shm"], ["two_ranks"], above=BCAST_C_BYTES),
         _row(["mpi", "c_shm", "two_ranks"], above=BCAST_C2_BYTES))
# alltoall: shared memory run in C beats MPI's own at every size up to 64 KiB (the whole
# output; 2 ranks, against MPI's blocking call: 16 KiB 0.93-0.98x, 32 KiB 0.91-0.93x,
# 64 KiB 0.81-0.94x, against 0.45-0.49x, 0.47-0.53x and 0.64-0.79x through MPI's own; 4
# ranks 1.12-1.23x at 32-64 KiB against 0.49-0.57x).  From 128 KiB at 2 ranks MPICH's own
# turns faster (7.0 us against 15.5 through shared memory).
# At 2 ranks, since copies into slots stream, shared memory in C is ahead of single copy
# up to 2 MiB on every MPI (scripts/bench_candidates.py, medians in us, two jobs each:
# 1 MiB MPICH 50-86 against 64-91, Open MPI 60-69 against 80-85, Intel MPI 53-69
# against 85-119; 2 MiB 132-146 against 141-174, 123-146 against 158-172, 114-160
# against 182-240); not at 4 MiB (1,161-1,333 against 208-215).
EXCHANGE_C_BYTES = 64 << 10
EXCHANGE_C2_BYTES = 2 << 20
C_EXCHANGE = (_row(["c_shm"], upto=EXCHANGE_C_BYTES),
              _row(["c_shm", "two_ranks"], upto=EXCHANGE_C2_BYTES))
EXCHANGE = (_row(["mpi"], ["c_shm"]), _row(["mpi", "c_shm"], ["two_ranks"],
                                            above=EXCHANGE_C_BYTES),
            _row(["mpi", "c_shm", "two_ranks"], above=EXCHANGE_C2_BYTES))
HIER = (_row(["hier"], from_="shm_min_bytes"),)
# allgather: MPI's own copies each block once, as shared memory does, with less Python per
# call: against shared memory run in Python it wins at every size on ordinary buffers (2
# ranks: 1 MiB 104 against 142-148 us, 16 MiB 1,389 against 1,640-2,232); against shared
# memory run in C only above GATHER_C_BYTES; on registered buffers up to 1 MiB; from
# GATHER_SHM_BYTES registered shared memory moves less (2 ranks 16 MiB: 1,121 against
# 1,400 us; 4 ranks 3,120 against 5,192).  Shared memory run in C beats MPI's own up to
# 2 MiB (the whole output), since its copies into slots stream (2 ranks, median us,
# scripts/bench_candidates.py: 1 MiB 49 against 74 on the MPICH wheel, 61 against 99 on
# Open MPI, 59 against 94 on Intel MPI where a cache-line handoff took 60 ns; 78-134
# against 120-177 in six MPICH jobs at 230-300 ns; 2 MiB 180-309 against 220-355), not
# at 4 MiB (938-1,207 against 460-791).
GATHER_SHM_BYTES = 2 << 20
GATHER_C_BYTES = 2 << 20
GATHER = (_row(["mpi"], ["reg_flat", "c_shm"]),
          _row(["mpi", "reg_flat"], ["c_shm"], below=GATHER_SHM_BYTES),
          _row(["mpi", "c_shm"], ["reg_flat"], upto="shm_c_bytes"),
          _row(["mpi", "c_shm"], ["reg_flat"], above=GATHER_C_BYTES),
          _row(["mpi", "c_shm", "reg_flat"], upto="shm_c_bytes", below=GATHER_SHM_BYTES),
          _row(["mpi", "c_shm", "reg_flat"], above=GATHER_C_BYTES, below=GATHER_SHM_BYTES))
# Single copy (algorithms/cma.py) on ordinary buffers, above where shared memory in C
# keeps a collective.  alltoall, against MPI's own run for hpccoll (2 ranks, seven jobs:
# 1 MiB 136-157 against 137-206 us, 16 MiB 2.7-5.2 against 3.2-6.3 ms; 4 ranks: 1 MiB 671
# against 751 us, 16 MiB 7.8 against 10.0 ms; staged shared memory copies twice).
CMA_EXCHANGE = (_row(["cma"], ["registered", "c_shm"], above=EXCHANGE_C_BYTES),
                _row(["cma", "c_shm"], ["registered", "two_ranks"], above=EXCHANGE_C_BYTES),
                _row(["cma", "c_shm", "two_ranks"], ["registered"], above=EXCHANGE_C2_BYTES))
# allreduce at 2 ranks above 4 MiB: each rank reads the peer's half, reduces it with its
# own, reads the peer's reduced half: 16 MiB 4.8-6.5 ms in every job, staged 4.2-5.0 in
# three and 7.6-8.4 in six by the VM's phase, MPI's blocking call 9.7-12.5; 4 MiB even; at
# 4 ranks on 2 cores staged stays ahead (16 MiB 16.6 against 19.5 ms).
CMA_REDUCE_BYTES = 4 << 20
CMA_ALLREDUCE = (_row(["cma", "two_ranks"], ["registered"], above=CMA_REDUCE_BYTES),)
# scatter above 256 KiB (the root's whole buffer), each reader reading the head of its
# block while the root writes the tails: at 2 ranks, against cells by reference (each
# reader reading all of its block; 1,000-call loops through the adapter, mpi4py
# interleaved, hpccoll's us, two to four jobs each): 512 KiB 23-26 against 26-28, 1 MiB
# 37-41 against 49-52, 2 MiB 66-68 against 91-94, 4 MiB 121-131 against 97-153, 16 MiB
# 709-806 against 726-972; staged ahead at 256 KiB (13 against 14-15).  Where cells run by
# reference beyond 2 ranks they stay ahead (4 ranks on 2 cores: 128 KiB 23-51 against
# 37-41, 1 MiB 72-76 against 83-87, 4 MiB 171-208 against 204-208); this row catches
# those sizes where cells do not run.
# gather above 128 KiB, each peer writing the head of its block into the root's output
# while the root copies its own block and reads the tails (algorithms/cma.py: _split),
# against staged shared memory (1,000-call loops through the adapter, mpi4py interleaved,
# hpccoll's us, three to nine jobs each; 2 ranks, where cache lines hand off in 50-60 ns):
# 256 KiB 14-16 against 16-18, 512 KiB 22-27 against 32-34, 1 MiB 38-42 against 42-44,
# 4 MiB 118-142 against 207-228, 16 MiB 570-798 against 1,086-1,124; behind at 128 KiB
# (9 against 8) and at 2 MiB (65-70 against 58-68, 1.55-1.73x MPI's own against
# 1.71-1.99x).  4 ranks on 2 cores: 256 KiB 36-38 against 43-44, 1 MiB 91-92 against
# 135-170, 4 MiB 214-246 against 411-473, even at 128 KiB; 3 ranks: 6 MiB 343-348 against
# 580-630, even at 384 KiB-1.5 MiB.  Before, the root read every peer's block whole in
# turn while the peers waited (2 ranks 4 MiB 240-272 us), and ran above 1 MiB only.
CMA_GATHER_BYTES = 128 << 10
CMA_SCATTER_BYTES = 256 << 10
CMA_GATHER = (_row(["cma"], ["registered"], above=CMA_GATHER_BYTES),)
CMA_SCATTER = (_row(["cma"], ["registered"], above=CMA_SCATTER_BYTES),)
# gather, scatter: staged through node-shared slots, run in C, above 8 KiB (against MPI's
# own through the adapter, 2 ranks: gather 16 KiB 59 against 78 us, 64 KiB 49 against 76,
# 1 MiB 114 against 180; scatter 16 KiB 27 against 71, 64 KiB 38 against 82; 1 KiB even).
SHM_ROOTED_BYTES = 8 << 10
SHM_ROOTED = (_row(["flat"], above=SHM_ROOTED_BYTES),)
# Cells by reference (engine/_native.c): a broadcast's, gather's or scatter's cell holds
# where its writer's buffer is, read in place by its readers (one system call each, no
# program), where every rank may read the others' memory.  A writer returns once its
# readers have read, so where readers outnumber the cores it waits for them to be
# scheduled: it runs where it was ahead at 2 and 4 ranks (bench_adapter, 2-core VM, three
# jobs each, against the row it replaces): gather up to 128 KiB (2 ranks: 16 KiB 1.25x
# against 0.95x MPI's own, 128 KiB 0.89x against 0.76x; 4 ranks: 16 KiB 28 against 49 us,
# 128 KiB 50 against 72; from 256 KiB staged shared memory, both cores copying, is ahead);
# broadcast above 128 KiB to 1 MiB (MPI's own there: 2 ranks 256 KiB 43 against 51 us,
# 512 KiB 71 against 84; 4 ranks 121 against 140, 164 against 193; below, the root's copy
# into its slot lets it return before its readers: 4 ranks 16 KiB 22 against 44 us, and
# at 2 ranks, with copies into slots streamed (engine/_native.c), mpi4py interleaved:
# 32 KiB 1.45x against 1.03x by reference, 64 KiB 1.32x against 1.08x, 128 KiB 1.02x
# against 0.88x; 16 KiB, its copies cached, 1.28x against 0.89x where a cache-line
# handoff took 60 ns, 0.72-0.85x against 0.98-1.07x where it took 250 ns);
# scatter above 64 KiB, in place of the single-copy program above 256 KiB (2 ranks
# 512 KiB 39 against 41 us, 1 MiB 1.17x against 1.03x, 16 MiB 1.58x against 1.08x; 4 ranks
# 512 KiB 60 against 70 us) and of the staged one above 64 KiB, which back-to-back calls
# make slow (1,000-call loops: 2 ranks 256 KiB 17.6 against 24.5-79 us, 128 KiB 11.9
# against 14.7, mpi4py 10.5; 4 ranks 31 against 67 and 26 against 47), though single
# calls at 4 ranks on 2 cores, where the root waits for three readers to be scheduled,
# favour staged (128 KiB 44 against 27 us); up to 64 KiB staged (loops even, single
# calls at 4 ranks 16 KiB 8.7 against 29 us).
#
# Since copies into slots stream (engine/_native.c: slot_stream_bytes), the staged
# programs are ahead at 2 ranks, where no reader waits to be scheduled (mpi4py
# interleaved in one job, three jobs each, staged against by reference): gather 16 KiB
# 1.22x against 1.03x, 32 KiB 1.19x against 1.00x, 64 KiB 1.18x against 0.97x, 128 KiB
# 1.11x against 0.98x; scatter 128 KiB 1.20x against 0.95x, 256 KiB 1.14x against
# 0.99x.  At 4 ranks on 2 cores by reference stays ahead for gathers up to 32 KiB (16 KiB
# 2.84x against 1.29x, 32 KiB 2.62x against 1.38x; 64 KiB 1.46x against 1.61x, 128 KiB
# 1.35x against 1.94x) and for scatters above 64 KiB (128 KiB 2.23x against 1.36x,
# 256 KiB 2.90x against 1.59x).
REF_GATHER_BYTES = 32 << 10
REF_BCAST_BYTES = 1 << 20
REF_SCATTER_BYTES = 64 << 10    # (above, beyond 2 ranks)
GATHER_CELLS = CELLS + (_row(["cells", "cma"], ["two_ranks"], above="cell_bytes",
                             upto=REF_GATHER_BYTES),)
BCAST_CELLS = CELLS + (_row(["cells", "cma"], ["c_shm"], above=BCAST_C_BYTES,
                             upto=REF_BCAST_BYTES),
                        _row(["cells", "cma", "c_shm"], ["two_ranks"], above=BCAST_C_BYTES,
                             upto=REF_BCAST_BYTES))
SCATTER_CELLS = CELLS + (_row(["cells", "cma"], ["two_ranks"], above=REF_SCATTER_BYTES),)
# allgather, broadcast, reduce_scatter through single copy were nowhere ahead of the
# built-in choice in every job (2 ranks: allgather 1 MiB 290-346 against 207-232 us
# through MPI's own; broadcast within 5% of MPI's own; reduce_scatter behind staged
# shared memory at every size): they run where a calibration measured them faster.

# What a candidate needs to run at all, whatever its size (the rows add the sizes where
# it is the built-in choice).  A calibration's pick is used only where it applies
# (another machine's table may name shared memory where there is none).
APPLIES: dict = {
    "mpi": (_row(["mpi"]),),
    "cells": CELLS,            # (a cell holds so much)
    "shm": (_row(["flat"]),),
    "hier": (_row(["hier"]),),
    "cma": (_row(["cma"], ["registered"]),),
}

# The table: per collective, its candidates in order of preference, each with the rows
# where it is the built-in choice (data: the first candidate one of whose rows holds
# runs, unless a calibration picked another that applies) and its step machine.  Cells
# and MPI's own for small messages, shared memory and single copy where they apply,
# latency-optimal algorithms for small messages, then the bandwidth-optimal pipelined
# ones (which always apply).
NO_STEPS = None    # ``mpi`` (the MPI library runs it) and ``cells`` (engine/_native.c)
TABLE: dict[str, list[tuple[str, tuple, Callable]]] = {
    "allreduce": [("cells", CELLS, NO_STEPS), ("mpi", TINY, NO_STEPS),
                  ("cma", CMA_ALLREDUCE, cma.allreduce), ("shm", SHM, shm.allreduce),
                  ("hier", HIER, shm.allreduce_hier), ("doubling", SMALL, doubling.allreduce),
                  ("ring", ALWAYS, ring.allreduce)],
    "reduce": [("cells", CELLS, NO_STEPS), ("mpi", TINY, NO_STEPS),
               ("shm", SHM_STAGED, shm.reduce),
               ("binomial", SMALL, tree.reduce), ("ring", ALWAYS, ring.reduce)],
    "broadcast": [("cells", BCAST_CELLS, NO_STEPS), ("cma", PICKED, cma.broadcast),
                  ("mpi", BCAST, NO_STEPS), ("shm", SHM_STAGED, shm.broadcast),
                  ("binomial", SMALL, tree.broadcast), ("chain", ALWAYS, tree.broadcast_chain)],
    "allgather": [("cells", CELLS, NO_STEPS), ("cma", PICKED, cma.allgather),
                  ("mpi", GATHER, NO_STEPS), ("shm", SHM, shm.allgather),
                  ("bruck", SMALL, doubling.allgather), ("ring", ALWAYS, ring.allgather)],
    "reduce_scatter": [("cells", CELLS, NO_STEPS), ("mpi", TINY, NO_STEPS),
                       ("cma", PICKED, cma.reduce_scatter),
                       ("shm", SHM, shm.reduce_scatter),
                       ("ring", ALWAYS, ring.reduce_scatter)],
    "alltoall": [("cells", CELLS, NO_STEPS), ("cma", CMA_EXCHANGE, cma.alltoall),
                 ("mpi", EXCHANGE, NO_STEPS), ("shm", C_EXCHANGE, shm.alltoall),
                 ("pairwise", ALWAYS, pairwise.alltoall)],
    "barrier": [("cells", CELLS, NO_STEPS), ("mpi", TINY, NO_STEPS),
                ("dissemination", ALWAYS, doubling.barrier)],
    # variable counts (the mpi4py adapter's Allgatherv, Reduce_scatter, Alltoallv)
    "allgatherv": [("ring", ALWAYS, ring.allgatherv)],
    "reduce_scatterv": [("ring", ALWAYS, ring.reduce_scatterv)],
    "alltoallv": [("pairwise", ALWAYS, pairwise.alltoallv)],
    # rooted and prefix collectives: single copy for large gathers and scatters on one
    # node, else MPI's own wherever it can run them (they move each block once, as
    # hpccoll's would, with less Python per call); hpccoll's own for the rest (float16,
    # bfloat16, keyed calls, ops MPI lacks)
    "gather": [("cells", GATHER_CELLS, NO_STEPS),
               ("cma", CMA_GATHER, cma.gather), ("shm", SHM_ROOTED, shm.gather),
               ("mpi", NATIVE, NO_STEPS),
               ("binomial", SMALL, tree.gather), ("linear", ALWAYS, linear.gather)],
    "scatter": [("cells", SCATTER_CELLS, NO_STEPS),
                ("cma", CMA_SCATTER, cma.scatter), ("shm", SHM_ROOTED, shm.scatter),
                ("mpi", NATIVE, NO_STEPS),
                ("binomial", SMALL, tree.scatter), ("linear", ALWAYS, linear.scatter)],
    "scan": [("mpi", NATIVE, NO_STEPS), ("doubling", SMALL, prefix.scan_doubling),
             ("chain", ALWAYS, prefix.scan_chain)],
    "exscan": [("mpi", NATIVE, NO_STEPS), ("doubling", SMALL, prefix.exscan_doubling),
               ("chain", ALWAYS, prefix.exscan_chain)],
    "gatherv": [("linear", ALWAYS, linear.gatherv)],
    "scatterv": [("linear", ALWAYS, linear.scatterv)],
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
    one of whose rows holds; ``choice`` is a Choice (or a message size in bytes, for the
    MPI-only algorithms)."""
    if not isinstance(choice, Choice):
        choice = Choice(int(choice))
    return _select(coll, choice)


def applies(coll: str, name: str, choice: Choice) -> bool:
    """Whether candidate ``name`` of ``coll`` can run for ``choice``, whatever its size."""
    if (coll, name) not in _BY_NAME or name == "direct":
        return False
    need = APPLIES.get(name)
    if need is None:
        return True
    have = capabilities(choice)
    return any(r._replace(picked=False).holds(choice, have) for r in need)


def candidates(coll: str, choice: Choice) -> list:
    """Every candidate of ``coll`` that can run for ``choice``: what a calibration times."""
    return [name for name, _, _ in TABLE[coll] if applies(coll, name, choice)]


@lru_cache(maxsize=4096)
def _select(coll: str, choice: Choice) -> str:
    if choice.prefer and applies(coll, choice.prefer, choice):
        return choice.prefer
    have = capabilities(choice)
    for name, rows, _ in TABLE[coll]:
        for row in rows:
            if row.holds(choice, have):
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
    if fn is NO_STEPS:
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


__all__ = ["ALGO_CODES", "APPLIES", "Row", "capabilities", "CELLS_PROGRAM", "COLLECTIVES", "Choice", "MPI_PROGRAM",
           "Program", "ROWS_WITHOUT_STEPS", "SHM_ALGOS", "STAGED", "Spec", "TABLE", "applies",
           "build", "candidates", "input_extent",
           "message_bytes", "select"]
