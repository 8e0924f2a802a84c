"""Plans: everything about a collective that does not change from one call to the next,
worked out once per call signature and cached by the communicator's state (Horovod's
response cache, applied per rank).

A signature is the collective, dtype, count, op, root, in-place or not, keyed or not,
block count, host or device, variable-count layout and, for registered buffers, which
allocation and offsets.  Its plan holds:

- the algorithm: the calibration's pick for this size where it can run, else the first
  candidate of ``algorithms.TABLE`` one of whose rows holds.  MPI's own nonblocking
  collective is one of those candidates (``mpi``), not a separate path, and so are cells;
- for the ``mpi`` row its recipe (transport/mpi.py), naming the persistent requests tiny
  messages take (MPI-4 ``*_init``, where MPI has them); for the others the program (the
  step machine, materialized) and its instructions (engine/code.py), with the
  node-shared runtime they run against and their encoding for the C executor;
- the fingerprint (everything but the sequence number) and its hash;
- the reduction backend (NumPy, Numba CPU kernels with a block count, CUDA kernels).

A plan is plain data: making one reads the communicator's state and writes nothing; it
never changes afterwards, so a second identical call does no planning.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from .. import algorithms
from ..algorithms.spec import Spec
from ..base import mismatch
from ..base.ops import COLLECTIVES, dtype_code, mpi_native, op_code
from ..engine import code as _code
from ..engine.program import Shm
from ..errors import ArgumentError
from ..transport import mpi as transport
from ..transport.reduction import CpuKernelOps, HostOps

PERSISTENT_SLOTS = 16   # persistent requests per collective: identical calls in flight at once


class RegisteredCall:
    """A collective whose send and receive memory both lie in registered allocations:
    (allocation, byte offset, bytes) for each."""

    def __init__(self, send, recv, dtype, coll, inplace):
        self.send, self.recv, self.dtype = send, recv, dtype
        # Peers read my buffers at *their* offsets, so what they read must sit at the same
        # offset of the same allocation on every rank: that goes into the fingerprint.
        # (NCCL's in-place views put the other buffer at a rank-dependent offset: not read.)
        if coll == "allreduce":
            read = (send, recv)
        elif coll == "allgather" and inplace:
            read = (recv,)
        else:
            read = (send,)
        h = 1
        for alloc, off, _ in read:
            h = ((h * 1_000_003) ^ (alloc.id << 40) ^ off) & ((1 << 62) - 1)
        self.fingerprint = h | 1
        self.key = (send[0].id, send[1], recv[0].id, recv[1])


def registered(ctx, call) -> Optional[RegisteredCall]:
    """Where a host collective's buffers live in registered memory, or None unless both do."""
    if not ctx._allocs:
        return None
    found = []
    for flat in (call.send, call.recv):
        address = flat.__array_interface__["data"][0] if flat.size else 0
        for alloc in ctx._allocs:
            off = alloc.offset(address, flat.nbytes)
            if off is not None:
                found.append((alloc, off, flat.nbytes))
                break
        else:
            return None
    return RegisteredCall(found[0], found[1], call.send.dtype, call.coll, call.inplace)


class PersistentSet:
    """The persistent requests of one collective on one communicator, used round-robin:
    the i-th call takes request i mod PERSISTENT_SLOTS on every rank.  MPI matches a
    persistent request to its peers' by the order of their ``*_init``, so a rank must
    start the same request as every other rank: the set belongs to what the fingerprint
    names (collective, dtype, count, op, root), not to a plan, whose signature also holds
    what may differ between ranks (in place or not: a reduce's root; registered or not)."""

    def __init__(self, slots):
        self.slots, self.uses = slots, 0
        self.live = True     # False once evicted or freed (a plan may still point to it)


def persistent_key(state, call, nbytes: int):
    """The key of the persistent requests of a tiny MPI-row collective, or None where MPI
    has no persistent collectives or the message is larger than ``persistent_bytes``."""
    limit = state.ctx.settings.persistent_bytes
    if (call.coll not in transport.PERSISTENT or not limit or nbytes > limit
            or not state.ctx.persistent_ok):
        return None
    return (call.coll, call.send.dtype.str, call.count, call.op, call.root)


def persistent_set(size: int, rank: int, call) -> PersistentSet:
    """A new set of persistent requests for ``call``'s collective, on staging arrays of its
    own (each request is initialised at its first start, in the collective order)."""
    dt, n = call.send.dtype, call.count
    # in-place forms need no MPI.IN_PLACE (the input is copied in), and a reduce's result
    # lands on its root only
    shapes = {"allreduce": (n, n), "broadcast": (None, n), "allgather": (n, size * n),
              "alltoall": (size * n, size * n), "barrier": (None, None),
              "reduce": (n, n if rank == call.root else None),
              "reduce_scatter": (size * n, n), "scan": (n, n), "exscan": (n, n),
              "gather": (n, size * n if rank == call.root else None),
              "scatter": (size * n if rank == call.root else None, n)}[call.coll]
    shapes = shapes + (dt,)
    return PersistentSet(tuple(transport.Persistent(shapes) for _ in range(PERSISTENT_SLOTS)))


class Plan:
    """One call signature's plan (see the module docstring); made by ``make``."""


def _prefer(state, coll: str, nbytes: int, registered: bool) -> str:
    """The candidate a calibration picked for this message ("" where none did): the one
    being timed, while ``hpccoll-tune calibrate`` times this communicator."""
    forced = state.prefer.get(coll) if state.prefer else None
    if forced is not None:
        return forced
    cal = state.ctx.calibration
    if not cal:
        return ""
    return cal.choose(coll, "registered" if registered else "host", nbytes, *state.shape)


def _shm_runtime(state, reg) -> Shm:
    """What a plan's shared-memory collectives need at run time, whatever their epoch
    base: peers' registered buffers are the same offsets of their own segments
    (allocations are symmetric)."""
    shm = state.shm
    peer_send = peer_recv = None
    if reg is not None:
        ctx = state.ctx
        nodes = [ctx._node_index[state.world_ranks[c]] for c in shm["local"]]
        (sa, so, sn), (ra, ro, rn) = reg.send, reg.recv
        peer_send = [sa.segs[i][so:so + sn].view(reg.dtype) for i in nodes]
        peer_recv = [ra.segs[i][ro:ro + rn].view(reg.dtype) for i in nodes]
    return Shm(shm["area"], shm["local"], peer_send, peer_recv)


def make(state, call, keyed: bool, blocks: Optional[int], reg: Optional[RegisteredCall]) -> Plan:
    """Work out the plan of a call signature (once: the state caches it)."""
    ctx = state.ctx
    s = ctx.settings
    dt = call.send.dtype
    itemsize = dt.itemsize
    coll, size = call.coll, state.size
    nbytes = algorithms.message_bytes(coll, call.count, size, itemsize)
    on_device = call.device is not None
    shm = state.shm if not keyed and not on_device else None
    layout = ""
    if shm:
        layout = "flat" if len(shm["local"]) == size else ("hier" if shm["cross"] else "")
    native = not keyed and not on_device and mpi_native(call.op, dt)
    if coll in ("reduce", "reduce_scatter"):
        # avg would divide into the output, which is not the input's size here, or only
        # the root's; in place or not may differ by rank, so it cannot decide (transport)
        native = native and call.op != "avg"
    # shared memory run in C from smaller sizes on, for the reductions measured there
    c_bytes = (s.shm_c_bytes if layout == "flat" and ctx.c_programs
               and coll in algorithms.C_SHM_COLLECTIVES
               and len(shm["local"]) <= _code.C_MAX_RANKS
               and _code.c_reduces(dt, call.op) else 0)
    # one handoff through node-shared cells: on host arrays, order-matched (a cell's
    # sequence number is the communicator's), where C runs the reduction
    cell_bytes = (shm["area"].cell_bytes if layout == "flat" and ctx.c_programs
                  and blocks is None and coll in _code.CELL_KINDS
                  and (call.op is None or _code.c_reduces(dt, call.op)) else 0)
    choice = algorithms.Choice(nbytes, s.small_msg_bytes, layout, s.shm_min_bytes,
                               reg is not None, s.mpi_coll_bytes, native,
                               "" if on_device else _prefer(state, coll, nbytes, reg is not None),
                               c_bytes,
                               # single copy between host arrays (the area agreed it at
                               # creation, so every rank's choice is the same)
                               layout == "flat" and shm["area"].cma and blocks is None,
                               size, cell_bytes)
    algo = algorithms.select(coll, choice)
    # a small device collective MPI can run goes through the host: one copy each way
    # around MPI's own collective, instead of a copy per step of hpccoll's algorithms
    detour = (on_device and not keyed and nbytes <= s.device_host_bytes
              and coll in transport.NONBLOCKING and mpi_native(call.op, dt)
              and not (coll in ("reduce", "reduce_scatter") and call.op == "avg"))
    if detour:
        algo = "mpi"
    # registered buffers would take shared memory: the caller looks for them on each call
    reg_choice = choice._replace(registered=True,
                                 prefer=choice.prefer if reg is not None or on_device
                                 else _prefer(state, coll, nbytes, True))
    # (reduce and broadcast stage whatever their buffers are, so where those live never
    # changes their plan: they are never looked up, and ``reg`` is None for them)
    reg_matters = (coll not in algorithms.STAGED
                   and algorithms.select(coll, reg_choice) in algorithms.SHM_ALGOS)
    shared = algo in algorithms.SHM_ALGOS
    chunk = max(1, (s.shm_slot_bytes if shared else s.chunk_bytes) // itemsize)
    spec = Spec(coll, state.rank, size, call.count, chunk=chunk, depth=s.pipeline_depth,
                root=call.root, avg=call.op == "avg", inplace=call.inplace, slots=s.shm_slots,
                registered=shared and reg is not None,
                local=shm["local"] if shared else (), cross=(shm["cross"] or ()) if shared else (),
                **dict(call.layout))
    plan = Plan()
    plan.coll, plan.dtype, plan.count, plan.op, plan.root = coll, dt, call.count, call.op, call.root
    plan.inplace, plan.algo, plan.spec, plan.nbytes = call.inplace, algo, spec, nbytes
    plan.program = algorithms.build(spec, algo)
    plan.shared, plan.registered, plan.device = shared, reg, on_device
    plan.reg_matters = reg_matters
    plan.inline = nbytes <= s.inline_bytes
    plan.ops = plan.rt = plan.code = plan.native = None
    plan.pset = None          # its persistent requests, once used (CommState._lane)
    count = call.count if call.fp_count is None else call.fp_count
    plan.fp = (COLLECTIVES.index(coll) + 1, dtype_code(dt), count, call.root, op_code(call.op),
               0,
               # only where peers read my buffers does it matter where they live
               reg.fingerprint if spec.registered else 0,
               mismatch.ALGO_CODES[algo])
    plan.fp_hash = mismatch.fp_hash(plan.fp)
    plan.recipe = plan.detour = plan.cells = None
    if algo == "cells":
        plan.cells = _code.cells_layout(shm["area"], coll, call.root, call.count, dt, call.op)
        if plan.cells is None:
            raise AssertionError(f"cells picked for a {coll} they cannot run")
        plan.backend = "cells"
    elif algo == "mpi":
        divisor = size if call.op == "avg" and size > 1 else 0
        # (through the host, MPI's collective runs on pinned buffers: no persistent ones)
        recipe = transport.Recipe(coll, state.data,
                                  transport.mpi_op(call.op) if call.op else None,
                                  call.root, state.rank, divisor, call.inplace,
                                  None if detour else persistent_key(state, call, nbytes))
        if detour:
            plan.detour = recipe
        else:
            plan.recipe = recipe
        plan.backend = "mpi"
    elif on_device:
        from numba_kernels import cuda as kernels     # (optional: Numba's CUDA target)
        if blocks is None:
            cap = s.max_blocks or 2 * kernels.multiprocessors()
            blocks = kernels.default_blocks(min(call.count * max(1, size), spec.chunk),
                                            s.threads_per_block, cap)
        kernels.prepare(call.op, dt)
        plan.backend = "numba-cuda"
        plan.code = _code.built(plan.program, dt, call.op, host=False)
    else:
        if blocks is not None:
            from numba_kernels import cpu     # (Numba, compiled on first use: only with blocks)
            if blocks > cpu.max_threads():
                raise ArgumentError(f"blocks: at most {cpu.max_threads()} CPU threads on this "
                                    f"machine (NUMBA_NUM_THREADS), got {blocks}")
            if call.op is not None:
                cpu.prepare(call.op, dt)   # compiled here, on the calling thread, never inside
            plan.backend = "numba-cpu"
            plan.ops = CpuKernelOps(blocks)
        else:
            plan.backend = "numpy"
            plan.ops = HostOps
        host = plan.ops is HostOps
        if shared:
            rt = plan.rt = _shm_runtime(state, reg if spec.registered else None)
            plan.code = _code.build(plan.program, rt, dt, call.op, host)
            if host and ctx.c_programs:
                plan.native = _code.native(plan.code, dt, call.op)
        else:
            plan.code = _code.built(plan.program, dt, call.op, host)
    plan.blocks = blocks
    return plan
