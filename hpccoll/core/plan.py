"""Plans: everything about a collective that does not change from one call to the next,
worked out once per call signature and cached by the communicator's state (Horovod's
response cache, applied per rank).

A signature is the collective, dtype, count, op, root, in-place or not, keyed or not,
block count, host or device, variable-count layout and, for registered buffers, which
allocation and offsets.  Its plan holds:

- the algorithm: the calibration's pick for this size where it can run, else the first
  row of ``algorithms.TABLE`` whose predicate holds.  MPI's own nonblocking collective is
  one of those rows (``mpi``), not a separate path;
- the program (the step machine, materialized), or for the ``mpi`` row its recipe,
  naming the persistent requests tiny messages take (MPI-4 ``*_init``, where MPI has
  them; ``PersistentSet``);
- the fingerprint (everything but the sequence number) and its hash;
- how to make the lane of each call (``lane``): which kind, which backend;
- whether a call may start on the calling thread (``early``: MPI runs it, no slot).

Nothing here blocks, and a plan never changes: a second identical call does no planning.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from .. import algorithms
from ..algorithms.spec import COLLECTIVES, Spec
from ..errors import ArgumentError
from . import mismatch
from .ops import dtype_code, mpi_native, mpi_op, op_code

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


class MpiRecipe:
    """The ``mpi`` row's plan: which MPI collective (``post``: the bound method that starts
    it), with which op, root and divisor (avg: contributions divided before MPI sums
    them), and which persistent requests it takes (``persist``: a PersistentSet's key, or
    None)."""
    __slots__ = ("kind", "mpi", "post", "mop", "root", "rank", "divisor", "inplace", "persist")

    def __init__(self, kind, mpi_comm, mop, root, rank, divisor, inplace, persist):
        from ..engine.lane import NONBLOCKING
        self.kind, self.mpi, self.mop, self.root, self.rank = kind, mpi_comm, mop, root, rank
        self.post = getattr(mpi_comm, NONBLOCKING[kind])
        self.divisor, self.inplace, self.persist = divisor, inplace, persist


class PersistentSet:
    """The persistent requests of one collective on one communicator, used round-robin:
    the i-th call takes request i mod PERSISTENT_SLOTS on every rank.  MPI matches a
    persistent request to its peers' by the order of their ``*_init``, so a rank must
    start the same request as every other rank: the set belongs to what the fingerprint
    names (collective, dtype, count, op, root), not to a plan, whose signature also holds
    what may differ between ranks (in place or not: a reduce's root; registered or not)."""
    __slots__ = ("slots", "uses")

    def __init__(self, slots):
        self.slots, self.uses = slots, 0

    def next(self):
        """The request the next call takes (``uses`` advances once that call is committed)."""
        return self.slots[self.uses % PERSISTENT_SLOTS]


def _persistent(state, call, nbytes: int):
    """The key of the persistent requests of a tiny MPI-row collective, or None where MPI
    has no persistent collectives or the message is larger than ``persistent_bytes``."""
    from ..engine.lane import PERSISTENT
    limit = state.ctx.settings.persistent_bytes
    if call.coll not in PERSISTENT or not limit or nbytes > limit or not state.ctx.persistent_ok:
        return None
    return (call.coll, call.send.dtype.str, call.count, call.op, call.root)


def persistent_set(state, call) -> PersistentSet:
    """A new set of persistent requests for ``call``'s collective, on staging arrays of its
    own (each request is initialised at its first start, in the collective order)."""
    from ..engine.lane import Persistent
    dt, n, size = call.send.dtype, call.count, state.size
    # in-place forms need no MPI.IN_PLACE (the input is copied in), and a reduce's result
    # lands on its root only
    shapes = {"allreduce": (n, n), "broadcast": (None, n), "allgather": (n, size * n),
              "alltoall": (size * n, size * n), "barrier": (None, None),
              "reduce": (n, n if state.rank == call.root else None),
              "reduce_scatter": (size * n, n)}[call.coll]
    shapes = shapes + (dt,)
    return PersistentSet(tuple(Persistent(shapes) for _ in range(PERSISTENT_SLOTS)))


class Plan:
    __slots__ = ("coll", "dtype", "count", "op", "root", "inplace", "algo", "program", "spec",
                 "nbytes", "fp", "fp_hash", "recipe", "early", "shared", "registered", "backend",
                 "blocks", "device", "inline", "reg_matters", "ops", "rt", "detour", "cx")

    def lane(self, state, call, tag, mpi_comm):
        """The lane of one call (engine/lane.py); the caller holds the state's lock."""
        recipe = self.recipe
        if recipe is not None:
            slot = None
            if recipe.persist is not None:
                # (state.persistent and PersistentSet.next written out: the per-call path)
                pset = state.persist.get(recipe.persist)
                if pset is None:
                    pset = state.persistent(recipe.persist, call)
                slot = pset.slots[pset.uses % PERSISTENT_SLOTS]
                pset.uses += 1
            return _lanes.MpiLane(recipe, call.send, call.recv, slot)
        if self.detour is not None:
            return _detour_lane(self, call)
        if self.device:
            return _device_lane(self, state, call, tag, mpi_comm)
        program = self.program
        dt = self.dtype
        raw = state.pool.get(program.scratch * dt.itemsize) if program.scratch else None
        scratch = raw[:program.scratch * dt.itemsize].view(dt) if raw is not None else _NO_SCRATCH
        lane = _lanes.ProgramLane(program, [call.send, call.recv, scratch], self.op, mpi_comm,
                                 tag, self.ops)
        lane.pool, lane._pooled = state.pool, raw
        if self.shared:
            # epochs follow issue order on the communicator: the same on every rank
            area = state.shm["area"]
            rt = self.rt
            if rt is None:     # one per plan: its typed views of the slots are made once
                rt = self.rt = _shm_runtime(state, self.registered if self.spec.registered
                                            else None)
                if self.ops is _lanes.HostOps:
                    rt.code = _lanes._code.build(program, rt, dt, self.op)
                    if state.ctx.c_programs:
                        rt.native = _lanes._code.native(rt.code, dt, self.op)
            lane.shm, lane.base, lane.code = rt, area.epoch, rt.code
            # the next collective starts on the same slot, however many epochs this one
            # took: a repeated collective reuses memory still in cache instead of
            # alternating between slots (1 MiB allreduce: 4% less time; the stage wait
            # counts epochs with >=, so the skipped ones cost nothing)
            area.epoch = -(-(area.epoch + program.epochs) // area.slots) * area.slots
            # a later epoch's counters would overtake this one's: one collective at a time
            gate = state.shm.get("gate")
            if gate is None:
                gate = state.shm["gate"] = _lanes.Gate(f"node-shared slots of {state.name}")
            lane.holds = gate
        return lane


_NO_SCRATCH = np.empty(0, np.uint8)
_lanes = None     # hpccoll.engine.lane, once the first plan is made


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


def _host_ops(blocks):
    from ..engine.reduction import CpuKernelOps, HostOps
    return HostOps if blocks is None else CpuKernelOps(blocks)


def _shm_runtime(state, reg):
    """What a plan's shared-memory collectives need at run time, whatever their epoch
    base: peers' registered buffers are the same offsets of their own segments
    (allocations are symmetric)."""
    from ..engine.lane import Shm
    shm = state.shm
    peer_send = peer_recv = None
    if reg is not None:
        ctx = state.ctx
        nodes = [ctx._node_index[state.world_ranks[c]] for c in shm["local"]]
        (sa, so, sn), (ra, ro, rn) = reg.send, reg.recv
        peer_send = [sa.segs[i][so:so + sn].view(reg.dtype) for i in nodes]
        peer_recv = [ra.segs[i][ro:ro + rn].view(reg.dtype) for i in nodes]
    return Shm(shm["area"], shm["local"], peer_send, peer_recv)


def _engine_stream_after(call):
    """(GPU of the call's arrays, hpccoll's stream there), the stream ordered after the
    work queued so far on the arrays' own streams (on the device: the host never
    blocks)."""
    from ..transport import staging
    from . import device
    sdev, rdev = call.device
    gpu = sdev.device if sdev.device is not None else rdev.device   # validate: the same
    stream = staging.engine_stream(gpu)
    with staging.on_device(gpu):
        device.order_after(sdev.stream, stream)
        if rdev.obj is not sdev.obj and rdev.stream != sdev.stream:
            device.order_after(rdev.stream, stream)
    return gpu, stream


def _detour_lane(plan, call):
    """A small device collective through the host (engine/lane.py: DetourLane)."""
    gpu, stream = _engine_stream_after(call)
    return _lanes.DetourLane(plan.detour, call.send, call.recv, call.device, call.inplace,
                             stream, gpu)


def _device_lane(plan, state, call, tag, mpi_comm):
    """Device arrays: CUDA kernels with the plan's blocks, on hpccoll's stream, ordered
    (on the device) after the work queued on the arrays' own streams; scratch from the
    device pool."""
    from ..engine.lane import DeviceLane
    from ..engine.reduction import CudaOps
    from ..transport import staging
    s = state.ctx.settings
    gpu, stream = _engine_stream_after(call)
    direct = {"yes": True, "no": False}.get(s.cuda_aware)
    if direct is None:
        direct = staging.mpi_cuda_aware()
    scratch, raw = staging.scratch(plan.program.scratch, plan.dtype, gpu)
    lane = DeviceLane(plan.program, [call.send, call.recv, scratch], plan.op, mpi_comm, tag,
                      CudaOps(plan.blocks, s.threads_per_block, gpu), direct)
    if raw is not None:       # back to the pool when the collective is released
        lane.pool, lane._pooled = staging.scratch_pool(gpu), raw
    return lane


def make(state, call, keyed: bool, blocks: Optional[int], reg: Optional[RegisteredCall]) -> Plan:
    """Work out the plan of a call signature (once: the state caches it)."""
    global _lanes
    from ..engine import lane as _lanes     # imports mpi4py.MPI: only once MPI is initialised
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
        # the root's; in place or not may differ by rank, so it cannot decide (lane.post)
        native = native and call.op != "avg"
    # shared memory run in C from smaller sizes on, for the reductions measured there
    c_bytes = (s.shm_c_bytes if layout == "flat" and ctx.c_programs
               and coll in algorithms.C_SHM_COLLECTIVES
               and len(shm["local"]) <= _lanes._code.C_MAX_RANKS
               and _lanes._code.c_reduces(dt, call.op) else 0)
    choice = algorithms.Choice(nbytes, s.small_msg_bytes, layout, s.shm_min_bytes,
                               reg is not None, s.mpi_coll_bytes, native,
                               "" if on_device else _prefer(state, coll, nbytes, reg is not None),
                               c_bytes,
                               # single copy between host arrays (the area agreed it at
                               # creation, so every rank's choice is the same)
                               layout == "flat" and shm["area"].cma and blocks is None,
                               size)
    algo = algorithms.select(coll, choice)
    # a small device collective MPI can run goes through the host: one copy each way
    # around MPI's own collective, instead of a copy per step of hpccoll's algorithms
    detour = (on_device and not keyed and nbytes <= s.device_host_bytes
              and coll in _lanes.NONBLOCKING and mpi_native(call.op, dt)
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
    plan.cx = None       # what core/_express.c reads of it, gathered there at its first use
    plan.ops = plan.rt = None
    count = call.count if call.fp_count is None else call.fp_count
    plan.fp = (COLLECTIVES.index(coll) + 1, dtype_code(dt), count, call.root, op_code(call.op),
               0,
               # only where peers read my buffers does it matter where they live
               reg.fingerprint if spec.registered else 0,
               algorithms.ALGO_CODES[algo])
    plan.fp_hash = mismatch.fp_hash(plan.fp)
    plan.recipe = plan.detour = None
    if algo == "mpi":
        divisor = size if call.op == "avg" and size > 1 else 0
        # (through the host, MPI's collective runs on pinned buffers: no persistent ones)
        recipe = MpiRecipe(coll, state.data, mpi_op(call.op) if call.op else None,
                           call.root, state.rank, divisor, call.inplace,
                           None if detour else _persistent(state, call, nbytes))
        if detour:
            plan.detour = recipe
        else:
            plan.recipe = recipe
        plan.backend = "mpi"
    elif on_device:
        from numba_kernels import cuda as kernels
        if blocks is None:
            cap = s.max_blocks or 2 * kernels.multiprocessors()
            blocks = kernels.default_blocks(min(call.count * max(1, size), spec.chunk),
                                            s.threads_per_block, cap)
        kernels.prepare(call.op, dt)
        plan.backend = "numba-cuda"
    elif blocks is not None:
        from numba_kernels import cpu
        if blocks > cpu.max_threads():
            raise ArgumentError(f"blocks: at most {cpu.max_threads()} CPU threads on this machine "
                                f"(NUMBA_NUM_THREADS), got {blocks}")
        if call.op is not None:
            cpu.prepare(call.op, dt)      # compiled here, on the calling thread, never inside
        plan.backend = "numba-cpu"
    else:
        plan.backend = "numpy"
    if plan.recipe is None and not on_device:
        plan.ops = _host_ops(blocks)        # (made once: an import and, with blocks, an object)
    plan.blocks = blocks
    # MPI runs it: no execution slot, so it may start at once on the calling thread
    plan.early = plan.recipe is not None
    return plan
