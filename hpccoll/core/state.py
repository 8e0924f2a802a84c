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

import hashlib
import threading
from typing import Optional

import numpy as np

from ..errors import ArgumentError, CollectiveMismatch, ContextClosed
from . import mismatch
from . import plan as plans
from .pool import BufferPool
from .work import Work


def key_hash(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") >> 1


class CommState:
    def __init__(self, ctx, mpi_comm, name: str, uid: str):
        MPI = ctx._MPI
        from ..engine.task import Task   # imports mpi4py.MPI: only once MPI is initialised
        self.Task = Task
        self.ctx = ctx
        self.engine = ctx._engine
        self.name, self.uid = name, uid
        self.lock = threading.Lock()
        self.broken: Optional[BaseException] = None
        self.unreported: Optional[BaseException] = None   # a verdict the caller has not seen
        self.freed = False
        self.seq = 0
        self.last = None               # the last order-matched task (start order)
        self.live_keys: dict = {}
        self.key_uses: dict = {}       # key -> how many times it was issued (ordered policy)
        self.plans: dict = {}
        self.inflight: set = set()     # tasks issued and not finished
        self.pool = BufferPool()       # scratch space, reused by the collectives
        self.noted_at = 0.0
        self.ledger = None
        self.shm = None
        self.data = self.keyed = None
        if mpi_comm == MPI.COMM_NULL:
            self.mpi = None
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
        # private duplicates: one for order-matched collectives, one for keyed ones
        self.data = mpi_comm.Dup()
        self.keyed = mpi_comm.Dup()
        from ..transport import shm
        self.shm = shm.create(mpi_comm, self.world_ranks, ctx.settings)
        ub = ctx._ctl.Get_attr(MPI.TAG_UB) or 32767
        self.tag_space = max(2, (int(ub) + 1) // 2)
        s = ctx.settings
        self.check = s.check_mismatch if self.size > 1 else "off"
        if self.check != "off":
            self.ledger = mismatch.Ledger(s.mismatch_every, max(64, 2 * s.mismatch_every))

    # -- the pipeline -------------------------------------------------------------------
    def usable(self) -> None:
        """Raise if no collective may be issued here (checked before anything is queued)."""
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

    def issue(self, call, key: Optional[str] = None, blocks: Optional[int] = None) -> Work:
        """Turn a validated call into a started or queued task; returns its Work."""
        if self.broken is not None or self.freed or self.ctx._closed:
            self.usable()
        keyed = key is not None
        reg = plans.registered(self.ctx, call) if self.shm and not keyed else None
        sig = (call.coll, call.send.dtype, call.count, call.op, call.root, call.inplace, keyed,
               blocks, call.device is None, call.layout, reg.key if reg is not None else None)
        plan = self.plans.get(sig)
        if plan is None:
            plan = self.plans[sig] = plans.make(self, call, keyed, blocks, reg)
        engine = self.engine
        work = Work(call.coll, engine)
        with self.lock:
            if keyed:
                task = self._keyed(work, plan, call, key)
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
                        fp = mismatch.with_seq(plan.fp, seq)
                        check = self._check(mismatch.fp_hash(fp), np.array([fp], np.int64), tag)
                        gated = plan.recipe is not None
                    elif ledger.due(seq):
                        check = self._check(digest, ledger.padded(ledger.every), tag)
                prev = self.last
                if prev is not None and (prev.t_start is not None or prev.state == "failed"):
                    prev = None
                task = self.Task(work, self, plan, seq, None, lane, call.result, check, prev,
                                 gated)
                self.last = task
                work._task = task
                self.inflight.add(task)
                if (plan.early and prev is None and engine.early and lane.startable()
                        and engine.start_now(task)):
                    return work
            work._task = task
            self.inflight.add(task)
            engine.submit(task, inline=plan.inline and engine.idle())
        return work

    def _check(self, value, rows, tag, direct=False):
        from ..engine.check import CheckLane
        return CheckLane(value, rows, self, self.keyed if direct else self.data, tag + 1, direct)

    def _keyed(self, work, plan, call, key):
        """A keyed collective: matched by its key's message tag on the keyed duplicate."""
        if key in self.live_keys:
            raise ArgumentError(f"key: {key!r} is already pending on communicator "
                                f"{self.name!r}; wait for it before reusing the key")
        h = key_hash(key)
        tag = (h % self.tag_space) * 2
        clash = [k for k, t in self.live_keys.items() if t == tag]
        if clash:
            raise ArgumentError(f"key: {key!r} and the pending key {clash[0]!r} map to the "
                                "same message tag on this communicator; rename one")
        self.live_keys[key] = tag
        lane = plan.lane(self, call, tag, self.keyed)
        check = None
        if self.check != "off":      # keyed collectives may start in any order: direct rows
            fp = mismatch.with_seq(plan.fp, h)
            check = self._check(0, np.array([fp], np.int64), tag, direct=True)
        task = self.Task(work, self, plan, None, key, lane, call.result, check)
        task.key_instance = self.key_uses[key] = self.key_uses.get(key, 0) + 1
        return task

    def pending(self) -> list:
        """The Works of the collectives issued here that have not finished."""
        with self.lock:
            return [t.work for t in self.inflight if t.work is not None]

    def retire(self, task) -> None:
        """A task finished (the engine's lock is held)."""
        self.inflight.discard(task)
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
        led = self.ledger
        if led is None:
            return None
        back = led.seq - seq
        if 0 <= back < len(led.ring):
            return led.ring[len(led.ring) - 1 - back][0]
        return None

    # -- lifetime ---------------------------------------------------------------------------
    def free_mpi(self) -> None:
        if self.shm:
            self.shm["area"].free()
            self.shm = None
        for plan in self.plans.values():
            for slot in (plan.recipe.slots if plan.recipe is not None else ()):
                if slot.req is not None:
                    try:
                        slot.req.Free()
                    except Exception:
                        pass
        self.plans = {}
        for c in (self.data, self.keyed, self.mpi):
            if c is not None:
                try:
                    c.Free()
                except Exception:
                    pass


