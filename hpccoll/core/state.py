"""A communicator's matching state, with one owner.

``CommState`` owns everything that makes the k-th collective on a communicator the same
collective on every member: the sequence number and message tags of order-matched
collectives, the live keys of keyed ones, the start order (a collective's MPI calls start
only after its predecessor's did), the private duplicates the data travels on, the
node-shared area and its epochs, the scratch pool, the plan cache and the mismatch
ledger.  It changes them under one lock, in ``issue`` and ``retire``; nothing else writes
them.

``issue`` is the one pipeline's last stage before progress, for every collective: plan
(cached per signature), name (sequence number and tag, or key), fingerprint, lane, task;
then start the task on the calling thread when its plan allows it and nothing of this
communicator is queued before it, or queue it for the engine.
"""
from __future__ import annotations

import threading
from functools import partial
from typing import Optional
from weakref import ref as _weakref

import numpy as np

from ..errors import ArgumentError, CollectiveMismatch, ContextClosed, mpi_failure
from . import mismatch
from . import plan as plans
from .pool import BufferPool


PLAN_CACHE = 1024   # plans per communicator (signatures a training loop repeats: a few)

# from hpccoll.engine, once a communicator exists (they import mpi4py.MPI)
MpiLane = RUNNING = FAILED = post = start_slot = finish_slot = started = None

try:     # the per-call path in C (_express.c), where the install built it
    from . import _express
except ImportError:
    _express = None
_bound = False


def _row(fp, seq):
    return np.array([mismatch.with_seq(fp, seq)], np.int64)


def key_hash(key: str) -> int:
    return mismatch.stable_hash(key.encode())


class CommState:
    def __init__(self, ctx, mpi_comm, name: str, uid: str):
        MPI = ctx._MPI
        global MpiLane, RUNNING, FAILED, post, start_slot, finish_slot, started, _bound
        # these import mpi4py.MPI: only once MPI is initialised
        from ..engine.lane import MpiLane, finish_slot, post, start_slot
        from ..engine.task import DONE, FAILED, RUNNING, Task, started
        if _express is not None and not _bound:
            _express.bind(Task, MpiLane, RUNNING, DONE, FAILED, plans.PERSISTENT_SLOTS)
            from ..engine import code
            if code._native is not None:     # the shared-memory programs' route too
                from ..engine.lane import ProgramLane
                from ..engine.reduction import HostOps
                _express.bind_programs(ProgramLane, HostOps, plans._NO_SCRATCH,
                                       code._native.run)
            _bound = True
        self.Task = Task
        self.ctx = ctx
        self.engine = ctx._engine
        self.name, self.uid = name, uid
        self.lock = threading.Lock()
        self.broken: Optional[BaseException] = None
        self.unreported: Optional[BaseException] = None   # a verdict the caller has not seen
        self.freed = False
        self.ok = True                 # none of: closed, engine broken, broken, freed, no member
        self.seq = 0
        # the last order-matched task, while it may not have started (start order): a
        # weak reference (a task that is gone has finished), or None once it started, so
        # that a finished collective's result is not kept alive here
        self.last = None
        self.live_keys: dict = {}
        self.key_uses: dict = {}       # key -> how many times it was issued (ordered policy)
        self.plans: dict = {}
        # persistent requests per collective (plan.PersistentSet), made at the same call on
        # every rank, so their insertion order (and eviction) is the same on every rank
        self.persist: dict = {}
        self.orphans: list = []        # persistent requests of evicted sets, not freed yet
        self.prefer: dict = {}         # collective -> candidate: what a calibration times
        self.pool = BufferPool()       # scratch space, reused by the collectives
        self.noted_at = 0.0
        self.ledger = None
        self.fast = False
        self.cissue = None             # _express.issue, where it may take calls
        self.cx = None                 # what _express.c reads of this state, gathered there
        self.spin = 0
        self.shm = None
        self.data = None
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
        from ..transport import shm
        try:
            self.data = mpi_comm.Dup()
            self.shm = shm.create(mpi_comm, self.world_ranks, ctx._node_of, ctx.settings,
                                  ctx.shm_fence)
        except MPI.Exception as exc:
            # nothing half-made stays: what this state took, and the communicator it was
            # handed (made for it by dup, split or wrap)
            self.free_mpi()
            self.mpi = None
            raise mpi_failure(f"communicator {name!r}", exc, len(ctx._comms)) from exc
        ub = ctx._ctl.Get_attr(MPI.TAG_UB) or 32767
        # message tags on `data`: order-matched collectives in the lower half, keyed ones in
        # the upper; a collective's check rides on its tag + 1
        self.tag_space = max(2, (int(ub) + 1) // 4)
        s = ctx.settings
        self.check = s.check_mismatch if self.size > 1 else "off"
        # run() may start and poll a collective with no task (see there), spin polls long
        self.fast = self.engine.early and self.check != "every" and not s.trace
        self.spin = s.spin_polls
        if self.fast and s.calls_in_c and _express is not None:
            self.cissue = _express.issue
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

    def stop(self, exc: Optional[BaseException] = None) -> None:
        """No collective may be issued here any more (``usable`` says why)."""
        self.ok = False
        if exc is not None and self.broken is None:
            self.broken = exc

    def _plan(self, call, keyed: bool, blocks):
        """The plan of this call's signature (made the first time it is seen).  Where the
        buffers live (registered or not) is looked at only where it can change the plan:
        where registered buffers would take shared memory (``reg_matters``).  (_express.c
        looks up the common signature the same way.)"""
        if keyed or blocks is not None or call.device is not None or call.layout:
            sig = (call.coll, call.send.dtype, call.count, call.op, call.root, call.inplace,
                   keyed, blocks, call.device is None, call.layout)
        else:   # the common signature: a shorter key
            sig = (call.coll, call.send.dtype, call.count, call.op, call.root, call.inplace)
        plan = self.plans.get(sig)
        if plan is None:
            plan = self._remember(sig, plans.make(self, call, keyed, blocks, None))
        if self.ctx._allocs and plan.reg_matters and not keyed and call.device is None:
            reg = plans.registered(self.ctx, call)
            if reg is not None:
                sig += (reg.key,)
                plan = self.plans.get(sig)
                if plan is None:
                    plan = self._remember(sig, plans.make(self, call, keyed, blocks, reg))
        return plan

    def _remember(self, sig, plan):
        self.plans[sig] = plan
        if len(self.plans) > PLAN_CACHE:
            self._evict(self.plans)
        return plan

    def persistent(self, key, call):
        """The persistent requests of the collective ``key`` names (made at its first call,
        which is the same call on every rank)."""
        pset = self.persist.get(key)
        if pset is None:      # (the caller holds the lock)
            if len(self.persist) >= PLAN_CACHE:
                self._evict_locked(self.persist)
            pset = self.persist[key] = plans.persistent_set(self, call)
        return pset

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
                self.orphans += [s for s in value.slots if s.req is not None]
        if self.orphans and started(self._last()):
            self.orphans = self._free_slots(self.orphans)

    @staticmethod
    def _free_slots(slots) -> list:
        """Free the persistent requests of ``slots`` that are not in flight; returns the
        others."""
        busy = []
        for slot in slots:
            if slot.req is None:
                continue
            if slot.busy:
                busy.append(slot)
                continue
            try:
                slot.req.Free()
            except Exception:
                pass
            slot.req = None
        return busy

    def issue(self, call, key: Optional[str] = None, blocks: Optional[int] = None,
              express: bool = True):
        """Turn a validated call into a started or queued task; returns it (its Work).
        ``express`` False: the C route was tried already (Communicator's methods)."""
        if not self.ok:
            self.usable()
        if express and key is None and blocks is None and self.cissue is not None:
            task = self.cissue(self, call)    # the loose route below, in C
            if task is not None:
                return task
        plan = self._plan(call, key is not None, blocks)
        engine = self.engine
        error = failed = None
        with self.lock:
            if key is not None:
                task = self._keyed(plan, call, key)
            else:
                seq = self.seq
                self.seq = seq + 1
                tag = (seq % self.tag_space) * 2
                lane = plan.lane(self, call, tag, self.data)
                check = None
                gated = False
                ledger = self.ledger
                if ledger is not None:
                    digest = ledger.record(seq, plan.fp, plan.fp_hash)
                    if self.check == "every":
                        check = self._check(mismatch.call_hash(plan.fp_hash, seq),
                                            partial(_row, plan.fp, seq), tag)
                        gated = plan.recipe is not None or plan.detour is not None
                    elif digest is not None:
                        check = self._check(digest, ledger.padded_later(ledger.every), tag)
                prev = self.last
                if prev is not None:
                    prev = prev()
                    if started(prev):
                        prev = None
                task = self.Task(engine, self, plan, seq, None, lane, call.result, check, prev,
                                 gated)
                self.last = None       # (started below) or a weak reference (queued)
                # MPI runs it: start it here unless something of this communicator is
                # queued before it, or the persistent request it takes is still busy
                if (plan.early and prev is None and engine.early
                        and (lane.slot is None or not lane.slot.busy)):
                    if self.fast:
                        # loose: its waiter polls it (with the digest check riding along,
                        # if due), the engine adopts it only if needed
                        try:
                            task.start(task.t_issue)
                        except Exception as exc:   # MPI's error at post time: the task's
                            error = exc
                        else:
                            task.loose = True
                            engine.loose[task] = None
                            return task
                    elif engine.start_now(task):
                        return task
                elif (lane.code is not None and prev is None and self.fast
                      and engine.solo and not engine._live and not engine.sq
                      and lane.holds.held < lane.holds.capacity):
                    # a shared-memory program while the engine has nothing to do: it
                    # starts here and its waiter runs it, loose like MPI's own above
                    task.start(task.t_issue)
                    if task.state is not FAILED:
                        task.loose = True
                        engine.loose_programs[task] = None   # (first: see programs_loose)
                        engine.loose[task] = None
                        return task
                    failed = task
            if error is None and failed is None:
                if key is None:
                    self.last = _weakref(task)
                engine.submit(task, inline=plan.inline and engine.idle())
        if error is not None or failed is not None:   # (the engine's lock after ours)
            with engine.lock:
                engine.adopt(task, start_error=error)
        elif engine.loose:
            # a queued task may wait for a persistent request a loose one holds: the
            # engine must poll that one too
            engine.adopt_loose()
        return task

    def _express_failed(self, task, exc, program: bool = False) -> None:
        """MPI raised ``exc`` when _express.issue started ``task``, or its program's first
        run did (``program``: as Task.poll's failure would); the lock let go."""
        with self.engine.lock:
            if program:
                self.engine.adopt(task, poll_error=exc)
            else:
                self.engine.adopt(task, start_error=exc)

    def run(self, call, blocks: Optional[int] = None):
        """Issue ``call`` and wait for it on the calling thread (the mpi4py adapter's
        blocking calls); returns its result.

        A collective the MPI library runs itself, with nothing of this communicator queued
        before it, no check riding along and nobody driving the engine, starts and is
        polled right here with no task at all: the blocking call's per-call cost is then
        MPI's own plus the naming.  Only if it has not completed after ``spin_polls``
        polls (or MPI reports an error) does it become a task of the engine, where the
        watchdog, reports and the mismatch probes see it."""
        if not self.ok:
            self.usable()
        plan = self._plan(call, False, blocks)
        if plan.early and self.fast:
            engine = self.engine
            task = error = req = None
            recipe = plan.recipe
            lock = self.lock
            lock.acquire()
            try:
                prev = self._last()
                seq = self.seq
                ledger = self.ledger
                pset = None if recipe.persist is None else self.persistent(recipe.persist, call)
                slot = None if pset is None else pset.next()
                # the previous collective of this communicator has posted its MPI calls
                # (Task.posted is set after them): no lock of the engine is needed
                if (started(prev) and (ledger is None or not ledger.due(seq))
                        and (slot is None or not slot.busy)):
                    self.seq = seq + 1
                    if slot is not None:
                        pset.uses += 1
                    if ledger is not None:
                        ledger.record(seq, plan.fp, plan.fp_hash)
                    self.last = None      # posted: nothing waits on it to start
                    # no lane object unless it becomes a task after all
                    try:
                        if slot is None:
                            req = post(recipe, call.send, call.recv)
                        else:
                            req = start_slot(recipe, slot, call.send)
                    except Exception as exc:   # fails like a task: named, peers told
                        error = exc
                        task = self._started(plan, seq, call, slot, None)
            finally:
                lock.release()
            if task is not None:               # (the engine's lock after ours: never inside)
                with engine.lock:
                    engine.adopt(task, start_error=error)
                return task.wait()
            if req is not None:
                test = req.Test
                try:
                    for _ in range(self.spin):
                        if test():
                            if slot is not None:
                                finish_slot(recipe, slot, call.recv)
                            return call.result
                except Exception as exc:       # MPI's error: the task's to explain
                    error = exc
                task = self._started(plan, seq, call, slot, req)
                with engine.lock:
                    engine.adopt(task, poll_error=error)
                return task.wait()
        return self.issue(call, None, blocks).wait()

    def _started(self, plan, seq, call, slot, req):
        """The task of a collective ``run`` started without one (with request ``req``, on
        persistent ``slot`` or not)."""
        lane = MpiLane(plan.recipe, call.send, call.recv, slot)
        lane.req = req
        task = self.Task(self.engine, self, plan, seq, None, lane, call.result)
        task.state = RUNNING
        task.t_start = task.t_issue
        task.posted = True
        return task

    def _check(self, value, rows, tag, direct=False):
        from ..engine.check import CheckLane
        return CheckLane(value, rows, self, self.data, tag + 1, direct)

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
        lane = plan.lane(self, call, tag, self.data)
        check = None
        if self.check != "off":      # keyed collectives may start in any order: direct rows
            fp = mismatch.with_seq(plan.fp, h)
            check = self._check(0, np.array([fp], np.int64), tag, direct=True)
        task = self.Task(self.engine, self, plan, None, key, lane, call.result, check)
        task.key_instance = self.key_uses[key] = self.key_uses.get(key, 0) + 1
        return task

    def pending(self) -> list:
        """The collectives issued here that have not finished."""
        engine = self.engine
        engine.adopt_loose()
        with engine.lock:
            return [t for t in engine.live() + list(engine.sq) if t.comm is self]

    def retire(self, task) -> None:
        """A keyed or checked task finished (the engine's lock is held)."""
        if task.key is not None:
            with self.lock:
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
        if self.shm:
            self.shm["area"].free()
            self.shm = None
        for pset in self.persist.values():
            self._free_slots(pset.slots)
        # what is still busy now (a collective a mismatch broke off) may not be freed
        # (MPI-4 6.13): it is left to MPI_Finalize
        self._free_slots(self.orphans)
        self.orphans = []
        self.plans = {}
        self.persist = {}
        for c in (self.data, self.mpi):
            if c is not None:
                try:
                    c.Free()
                except Exception:
                    pass


