"""A communicator's matching state, with one owner, and the one issue function.

``CommState`` owns everything that makes the k-th collective on a communicator the same
collective on every member: the sequence number and message tags of order-matched
collectives, the live keys of keyed ones, the start order (a collective's MPI calls start
only after its predecessor's did), the private duplicate the data travels on, the
node-shared area and its epochs, the persistent requests, the scratch pool, the plan
cache and the mismatch ledger.  It changes them under one lock, in ``issue`` (and the
lanes it makes there); nothing else writes them.

``issue`` is the per-call path's one issue, for every collective, keyed or not, from the
native API and the mpi4py adapter alike: plan (cached per signature), name (sequence
number and tag, or key), fingerprint into the ledger, the lane and, when due, the check,
the task; then the engine starts it on the calling thread or queues it (Engine.issue).
"""
from __future__ import annotations

from functools import partial
from typing import Optional
from weakref import ref as _weakref

import numpy as np

from ..base import mismatch
from ..base.pool import BufferPool
from ..engine.check import CheckLane, digest_check
from ..engine.lane import Gate, buffer_addresses, cell_lane, mpi_lane, new_lock
from ..engine.program import program_lane
from ..engine.task import Task, new as new_task, started
from ..errors import ArgumentError, CollectiveMismatch, ContextClosed, mpi_failure
from ..transport import shm as shared_memory
from . import device
from . import plan as plans

PLAN_CACHE = 1024   # plans per communicator (signatures a training loop repeats: a few)
FAILED_PARENTS: list = []    # MPI communicators whose Dup or Split failed (free_mpi)
_NO_SCRATCH = np.empty(0, np.uint8)


def _row(fp, seq):
    return np.array([mismatch.with_seq(fp, seq)], np.int64)


def key_hash(key: str) -> int:
    return mismatch.stable_hash(key.encode())


def addresses(call):
    """Where a Call's send and receive memory start, for the C code that runs its cells or
    its program (the lane holds the arrays): a Call used again (kept by the adapter or
    validate.Recent) passes addresses, read at its second use, because a NumPy buffer
    export costs about 370 instructions; None at its first use (a Call used once pays
    nothing for them: the C code exports the arrays)."""
    addrs = call.addrs
    if addrs is None:
        call.addrs = ()
        return None
    if not addrs:
        addrs = call.addrs = buffer_addresses(call.send, call.recv)
    return addrs


class CommState:
    def __init__(self, ctx, mpi_comm, name: str, uid: str):
        MPI = ctx._MPI
        self.ctx = ctx
        self.engine = ctx._engine
        self.name, self.uid = name, uid
        self.lock = new_lock()
        # (bound once: a method call looks the method up each time; issue takes the lock)
        self._acquire, self._release = self.lock.acquire, self.lock.release
        self.broken: Optional[BaseException] = None
        self.unreported: Optional[BaseException] = None   # a verdict the caller has not seen
        self.freed = False
        self.ok = True                 # none of: closed, engine broken, broken, freed, no member
        self.seq = 0
        # order-matched collectives a member will ever issue here (it closed its context
        # after that many: Engine.on_closing), and the error issuing more raises
        self.limit = 1 << 62
        self.limit_error = None
        # the last order-matched task, while it may not have started (start order): a
        # weak reference (a task that is gone has finished), or None once it started, so
        # that a finished collective's result is not kept alive here
        self.last = None
        self.live_keys: dict = {}
        self.key_uses: dict = {}       # key -> how many times it was issued (ordered policy)
        self.plans: dict = {}
        # names the plan cache now in use (use_plans): a kept Call's plan is valid while
        # it names the same (a token, not the cache itself, which a Call shared by every
        # communicator, validate.BARRIER, would keep alive with all its plans)
        self.plans_token = object()
        # persistent requests per collective (plan.PersistentSet), made at the same call on
        # every rank, so their insertion order (and eviction) is the same on every rank
        self.persist: dict = {}
        self.orphans: list = []        # persistent requests of evicted sets, not freed yet
        self.prefer: dict = {}         # collective -> candidate: what a calibration times
        self.pool = BufferPool()       # scratch space, reused by the collectives
        self.noted_at = 0.0
        self.ledger = None
        self.shm = None
        # the sequence number of the last cell collective handed out (its area's cells)
        self.cell_seq = 0
        self.gate = None               # the node-shared slots: one collective at a time
        self.data = None
        self.failed_child = False
        if mpi_comm == MPI.COMM_NULL:
            self.mpi = None
            self.ok = False
            self.rank, self.size, self.world_ranks = -1, 0, ()
            return
        self.mpi = mpi_comm
        self.rank, self.size = mpi_comm.Get_rank(), mpi_comm.Get_size()
        world_group = ctx._ctl.Get_group()
        group = mpi_comm.Get_group()
        self.world_ranks = tuple(MPI.Group.Translate_ranks(group, list(range(self.size)),
                                                           world_group))
        group.Free()
        world_group.Free()
        self.shape = ctx.shape_of(self.world_ranks)
        # the private duplicate the data travels on, order-matched and keyed alike (MPI's
        # own collectives run on it, so it is not the one dup() and split() call on)
        try:
            self.data = mpi_comm.Dup()
            self.shm = shared_memory.create(mpi_comm, self.world_ranks, ctx._node_of,
                                            ctx.settings, ctx.shm_fence)
        except MPI.Exception as exc:
            # nothing half-made stays: what this state took, and the communicator it was
            # handed (made for it by dup, split or wrap; kept where its Dup failed)
            self.failed_child = self.data is None
            self.free_mpi()
            self.mpi = None
            raise mpi_failure(f"communicator {name!r}", exc, len(ctx._comms), MPI) from exc
        if self.shm:
            self.gate = Gate(f"node-shared slots of {name}")
        ub = ctx._ctl.Get_attr(MPI.TAG_UB) or 32767
        # message tags on `data`: order-matched collectives in the lower half, keyed ones in
        # the upper; a collective's check rides on its tag + 1
        self.tag_space = max(2, (int(ub) + 1) // 4)
        s = ctx.settings
        self.check = s.check_mismatch if self.size > 1 else "off"
        if self.check != "off":
            self.ledger = mismatch.Ledger(s.mismatch_every, max(64, 2 * s.mismatch_every))

    # -- the pipeline -------------------------------------------------------------------
    def usable(self) -> None:
        """Raise if no collective may be issued here (``ok`` is False: it says why)."""
        ctx = self.ctx
        if ctx._closed or ctx._engine.broken is not None:
            ctx._check_open()
        if self.mpi is None:
            raise ArgumentError(f"this rank (world rank {ctx.rank}) is not a member of "
                                f"communicator {self.name!r}")
        if self.freed:
            raise ContextClosed(f"communicator {self.name!r} was freed")
        if self.broken is not None:
            exc, self.unreported = self.unreported, None
            if exc is not None:      # a mismatch found after its collective had completed
                raise exc
            raise ContextClosed(f"communicator {self.name!r} is unusable after: {self.broken}") \
                from self.broken

    def closed_at(self, count: int, exc: BaseException) -> None:
        """A member closed its context after ``count`` order-matched collectives here."""
        if count < self.limit:
            self.limit, self.limit_error = count, exc

    def stop(self, exc: Optional[BaseException] = None) -> None:
        """No collective may be issued here any more (``usable`` says why)."""
        self.ok = False
        if exc is not None and self.broken is None:
            self.broken = exc

    def issue(self, call, key: Optional[str] = None, blocks: Optional[int] = None) -> Task:
        """Turn a validated call into a task, started on the calling thread or queued
        (Engine.issue); returns it (its Work).  The one issue of every collective."""
        if not self.ok:
            self.usable()
        plan = self._plan(call, key is not None, blocks)
        engine = self.engine
        self._acquire()     # (not a with: its __exit__ takes three arguments)
        try:
            if key is not None:
                task = self._keyed(plan, call, key)
            else:
                seq = self.seq
                if seq >= self.limit:
                    raise self.limit_error
                self.seq = seq + 1
                tag = (seq % self.tag_space) * 2
                lane = self._lane(plan, call, tag)
                check = None
                gated = False
                ledger = self.ledger
                if ledger is not None:
                    digest = ledger.record(seq, plan.fp, plan.fp_hash)
                    if self.check == "every":
                        check = CheckLane(mismatch.call_hash(plan.fp_hash, seq),
                                          partial(_row, plan.fp, seq), self, self.data,
                                          tag + 1)
                        # MPI's own collective waits for the check: a mismatched call can
                        # make the MPI library itself abort
                        gated = plan.recipe is not None or plan.detour is not None
                    elif digest is not None:
                        check = digest_check(digest, seq, self, self.data, tag + 1)
                prev = self.last
                if prev is not None:
                    prev = prev()
                    if started(prev):
                        prev = None
                task = new_task(engine, self, plan, seq, None, lane, call.result, check, prev,
                                gated)
            engine.issue(task, plan.inline)
            if key is None:
                # the next collective's start waits for this one's (a weak reference: a
                # task that is gone has finished)
                self.last = None if task.posted else _weakref(task)
        finally:
            self._release()
        return task

    def _plan(self, call, keyed: bool, blocks):
        """The plan of this call's signature (made the first time it is seen).  Where the
        buffers live (registered or not) is looked at only where it can change the plan:
        where registered buffers would take shared memory (``reg_matters``)."""
        cache = self.plans
        plain = not keyed and blocks is None
        plan = None
        if plain and call.plan_in is self.plans_token:
            # a kept Call (validate.Recent, the adapter's Kept) again: its plan, while this
            # cache is in use (a calibration swaps the cache per candidate) and holds it (a
            # weak reference: a kept Call keeps no plan alive, nor the views of the
            # node-shared area a shared-memory plan's runtime holds)
            plan = call.plan()
        if plan is None:
            if not plain or call.device is not None or call.layout:
                sig = (call.coll, call.send.dtype, call.count, call.op, call.root,
                       call.inplace, keyed, blocks, call.device is None, call.layout)
            else:   # the common signature: a shorter key
                sig = (call.coll, call.send.dtype, call.count, call.op, call.root,
                       call.inplace)
            plan = cache.get(sig)
            if plan is None:
                plan = self._remember(sig, plans.make(self, call, keyed, blocks, None))
            if plain:
                call.plan, call.plan_in = _weakref(plan), self.plans_token
        if self.ctx._allocs and plan.reg_matters and not keyed and call.device is None:
            reg = plans.registered(self.ctx, call)
            if reg is not None:
                sig = (call.coll, call.send.dtype, call.count, call.op, call.root,
                       call.inplace, keyed, blocks, True, call.layout, reg.key)
                plan = self.plans.get(sig)
                if plan is None:
                    plan = self._remember(sig, plans.make(self, call, keyed, blocks, reg))
        return plan

    def use_plans(self, cache: dict) -> None:
        """Plan from ``cache`` from now on (a calibration's per-candidate caches)."""
        self.plans = cache
        self.plans_token = object()

    def _remember(self, sig, plan):
        self.plans[sig] = plan
        if len(self.plans) > PLAN_CACHE:
            self._evict(self.plans)
        return plan

    def _lane(self, plan, call, tag: int):
        """The lane of one call (the lock is held): the next persistent request of its
        collective, or the next epochs of the node-shared area, are this call's."""
        recipe = plan.recipe
        if recipe is not None:
            slot = None
            if recipe.persist is not None:
                pset = plan.pset
                if pset is None or not pset.live:
                    pset = self.persist.get(recipe.persist)
                    if pset is None:
                        if len(self.persist) >= PLAN_CACHE:
                            self._evict_locked(self.persist)
                        pset = self.persist[recipe.persist] = plans.persistent_set(
                            self.size, self.rank, call)
                    plan.pset = pset
                slot = pset.slots[pset.uses % plans.PERSISTENT_SLOTS]
                pset.uses += 1
            return mpi_lane(recipe, call.send, call.recv, slot)
        if plan.cells is not None:
            # cell sequence numbers follow issue order on the communicator, as epochs do
            self.cell_seq += 1
            return cell_lane(plan.cells, self.cell_seq, call.send, call.recv, addresses(call))
        if plan.detour is not None:
            return device.detour_lane(plan, call)
        if plan.device:
            return device.device_lane(plan, self.ctx.settings, call, tag, self.data)
        program = plan.program
        dt = plan.dtype
        raw = self.pool.get(program.scratch * dt.itemsize) if program.scratch else None
        scratch = raw[:program.scratch * dt.itemsize].view(dt) if raw is not None else _NO_SCRATCH
        rt = plan.rt
        lane = program_lane(program, plan.code, [call.send, call.recv, scratch], plan.op,
                            self.data, tag, plan.ops, rt, plan.native)
        lane.pool, lane._pooled = self.pool, raw
        if plan.native is not None:
            lane.addrs = addresses(call)
        if plan.shared:
            # epochs follow issue order on the communicator: the same on every rank
            area = rt.area
            lane.base = area.epoch
            # the next collective starts on the same slot, however many epochs this one
            # took: a repeated collective reuses memory still in cache instead of
            # alternating between slots (1 MiB allreduce: 4% less time; the stage wait
            # counts epochs with >=, so the skipped ones cost nothing)
            area.epoch = -(-(area.epoch + program.epochs) // area.slots) * area.slots
            # a later epoch's counters would overtake this one's: one collective at a time
            lane.holds = self.gate
        return lane

    def _evict(self, cache: dict) -> None:
        """The plan cache and the persistent requests are bounded: a program whose message
        sizes keep changing would otherwise keep a plan (and, for tiny messages, persistent
        MPI requests) for every size it ever sent.  The oldest quarter goes; a plan in
        flight lives on in its tasks.  An evicted set of persistent requests is made anew
        at its collective's next call, on every rank alike (sets are made and evicted at the
        same calls everywhere); its requests are freed only once every collective issued
        here so far has started: a queued task may still hold one of them."""
        with self.lock:
            self._evict_locked(cache)

    def _evict_locked(self, cache: dict) -> None:
        for key in list(cache)[:max(1, len(cache) // 4)]:
            value = cache.pop(key, None)
            if isinstance(value, plans.PersistentSet):
                value.live = False
                self.orphans += [s for s in value.slots if s.req is not None]
        if self.orphans and started(self._last()):
            self.orphans = [s for s in self.orphans if not s.free()]

    def _last(self):
        """The last order-matched task if it may not have started yet, else None."""
        last = self.last
        return None if last is None else last()

    def _keyed(self, plan, call, key):
        """A keyed collective: matched by its key's message tag (the upper half)."""
        if key in self.live_keys:
            raise ArgumentError(f"key: {key!r} is already pending on communicator "
                                f"{self.name!r}; wait for it before reusing the key")
        h = key_hash(key)
        tag = (self.tag_space + h % self.tag_space) * 2
        clash = [k for k, t in self.live_keys.items() if t == tag]
        if clash:
            raise ArgumentError(f"key: {key!r} and the pending key {clash[0]!r} map to the "
                                "same message tag on this communicator; rename one")
        self.live_keys[key] = tag
        lane = self._lane(plan, call, tag)
        check = None
        if self.check != "off":      # keyed collectives may start in any order: direct rows
            fp = mismatch.with_seq(plan.fp, h)
            check = CheckLane(0, np.array([fp], np.int64), self, self.data, tag + 1,
                              direct=True)
        task = new_task(self.engine, self, plan, None, key, lane, call.result, check)
        task.key_instance = self.key_uses[key] = self.key_uses.get(key, 0) + 1
        return task

    def pending(self) -> list:
        """The collectives issued here that have not finished."""
        return self.engine.pending_tasks(self)

    def retire(self, task) -> None:
        """A keyed or checked task finished (the engine's driver; no lock: the issuing
        thread may hold this state's lock meanwhile, and each step is one dict or int
        store)."""
        if task.key is not None:
            self.live_keys.pop(task.key, None)
        elif task.check is not None and task.state == "done" and self.ledger is not None:
            self.ledger.agreed = max(self.ledger.agreed, task.seq)

    # -- the mismatch check ----------------------------------------------------------------
    def suspect(self, task) -> None:
        """A collective here saw something a mismatch would explain (engine/crosscheck.py)."""
        self.engine.crosscheck.suspect(self)

    def mismatch_error(self, seq, fields: dict, odd, task=None) -> CollectiveMismatch:
        """The CollectiveMismatch of a verdict about collective ``seq`` (a key's hash for
        keyed ones), worded for this rank."""
        me = self.world_ranks[self.rank]
        if task is not None:
            ident, mine = (f"#{task.seq}" if task.key is None else repr(task.key)), \
                task.describe()
        else:
            ident = f"#{seq}"
            fp = self._fp_at(seq)
            mine = mismatch.describe_fp(fp) if fp is not None else "nothing recorded"
        return CollectiveMismatch(mismatch.message(ident, self.name, me, mine, fields),
                                  ranks=odd, fields=fields)

    def _fp_at(self, seq):
        return None if self.ledger is None else self.ledger.fp_at(seq)

    # -- lifetime ---------------------------------------------------------------------------
    def free_mpi(self) -> None:
        # the flight recorder's ring keeps the plans of recent collectives (its report
        # names them): what of a plan points into the node-shared area goes first, so
        # that the area is unmapped now, its descriptor closed, not once the ring moved on
        for plan in self.plans.values():
            plan.rt = plan.code = plan.native = plan.cells = None
        if self.shm:
            self.shm["area"].free()
            self.shm = None
        for pset in self.persist.values():
            pset.live = False
            for slot in pset.slots:
                slot.free()
        # what is still busy now (a collective a mismatch broke off) may not be freed
        # (MPI-4 6.13): it is left to MPI_Finalize
        for slot in self.orphans:
            slot.free()
        self.orphans = []
        self.use_plans({})
        self.persist = {}
        for c in (self.data, self.mpi):
            if c is self.mpi and self.failed_child:
                # MPI failed to make a communicator from it (out of contexts): Open MPI
                # may still progress that failed agreement on it, and crashes where it
                # was freed; it stays, for the life of the process
                FAILED_PARENTS.append(c)
            elif c is not None:
                try:
                    c.Free()
                except Exception:
                    pass
