"""The engine ("daemon"): every collective of a rank, from issue to completion.

One path for every collective, whatever its size, kind, policy, trace or check:

    CommState.issue (core/state.py) --> Engine.issue: start it on the calling thread
        where the policy allows and nothing must go before it (``started``), or queue it
        (``sq``)
    Work.wait --> Engine.wait: the waiting thread takes the engine and drives it: its own
        task alone when nothing else is pending, else whole passes (policy.step)
    Engine.complete: the one completion (flight row, trace, gate, lane release, callbacks)

Whoever holds ``lock`` drives: the progress thread (engine/progress.py), or a thread in
``wait()`` or ``test()``.  Only the driver polls, starts, completes or moves tasks; an
issuing thread only appends to ``started`` or ``sq`` (both safe without the lock), so no
task is ever polled or completed by two threads.  A waiter needs no hand-off between
threads for its result: a hand-off costs a GIL switch interval when another thread is
busy, so the progress thread steps aside while the application issues and waits.

Failures: the first error of a task fails it, and one that only this rank knows (an MPI
error, a kernel error) is told to the communicator's other members (TAG_FAILED), which
fail it too instead of waiting for their watchdog.
"""
from __future__ import annotations

import os
import sys
import threading
from collections import deque
from threading import get_ident
from time import monotonic

from ..errors import CollectiveMismatch, CollectiveTimeout, ContextClosed, HpcCollError
from . import flight, policies, progress
from .control import (HOST, PID, TAG_CLOSING, TAG_FAILED, TAG_GONE, TAG_REPORT, TAG_REPORT_REQ,
                      Control)
from .crosscheck import CrossCheck
from .flight import Recorder
from .lane import new_lock
from .task import DONE, FAILED
from .watchdog import Watchdog

CTL_EVERY = 16          # polls of one task between control polls while it is alone
_YIELD = getattr(os, "sched_yield", None)     # not on every platform


class Engine:
    def __init__(self, ctx, settings, ctl_comm):
        self.ctx = ctx
        self.settings = settings
        self.policy = policies.make(settings)
        self.control = Control(ctl_comm)
        self.sq: deque = deque()          # queued: the driver starts them (policy.admit)
        # started on the calling thread at issue, not yet known to the policy (insertion
        # order: oldest first); their waiters, or the progress thread once they are
        # LOOSE_AGE old, hand them to the policy (policy.adopt)
        self.started: dict = {}
        self.wake = threading.Event()
        self.lock = new_lock()            # held by whoever drives progress
        # (its methods bound once: a method call looks the method up each time, ~110
        # instructions; issue, wait and test take the lock at every small collective)
        self._acquire, self._release = self.lock.acquire, self.lock.release
        self.driver = None                # the thread holding ``lock``
        self._callbacks: deque = deque()  # (work, fns) to run once the lock is released
        self._want = 0                    # waiters that want to drive
        self._want_lock = threading.Lock()
        self._resume = threading.Event()
        self.broken: BaseException | None = None
        self.forked = None                # the error of a child forked after init
        self._control_tags = self.policy.control_tags
        self._park = getattr(self.policy, "park_seconds", progress.PARK_SECONDS)
        self.policy.bind(self)
        # collectives MPI runs itself may start on the calling thread at issue ...
        self.early = settings.express and self.policy.early
        # ... and so may a shared-memory program, where the policy bounds nothing
        self.solo = self.early and self.policy.solo
        self.crosscheck = CrossCheck(self)
        self.watchdog = Watchdog(self)
        self._stop = False
        self._sleeping = False            # the daemon waits on ``wake`` (submit must set it)
        self.last_progress = monotonic()   # any task's progress, for the watchdog
        self.trace = deque(maxlen=1_000_000) if settings.trace else None
        self.flight = Recorder(settings.flight_entries) if settings.flight_entries else None
        self._live = 0                    # tasks the policy holds
        self._programs = 0                # of them, those hpccoll runs (lane.needs_slot)
        self.app_active = 0.0             # when the application last issued or waited
        self.unclaimed: dict = {}         # uid -> failure notice of a communicator not made yet
        self._served = 0.0                # when control messages were last served
        # counters (per daemon)
        self.passes = self.parks = self.wakeups = 0
        self._steps = 0                   # a waiter's steps (every CTL_EVERY-th: a pass)
        self.switches = 0
        # the waiter's spin (settings read once: attributes of a plain object per poll
        # would cost more than a poll), and whether it follows the machine's load: left
        # at their defaults, a waiter on a crowded machine (more runnable threads than
        # CPUs: another job's process beside this one) does not spin but yields, as on a
        # node whose ranks outnumber its cores (progress.crowded)
        self._calm = (settings.spin_polls, settings.spin_us, settings.yield_polls)
        self._adapt = all(settings.sources.get(n) == "default"
                          for n in ("spin_polls", "spin_us", "yield_polls"))
        self._crowd_at = -1.0
        self.crowded = False
        self._waiting(*self._calm)
        self.thread = threading.Thread(target=progress.run, args=(self,), daemon=True,
                                       name=f"hpccoll-engine-r{self.control.rank}")
        self.thread.start()

    # -- issue ------------------------------------------------------------------------
    def issue(self, task, inline: bool = False) -> None:
        """A task its communicator's state just made (the state's lock is held, so
        nothing of that communicator starts meanwhile).  It starts here, on the calling
        thread, where the policy allows that and the communicator's previous collective
        has posted its MPI calls: a collective MPI runs itself (no slot: it joins the
        policy at its waiter's first poll), or a program where the policy bounds nothing
        and its gate has room (it joins the policy here, under the engine's lock).
        Otherwise it is queued for whoever drives next.  ``inline``: a small collective
        whose waiter will drive it; the parked progress thread is not woken for it."""
        lane = task.lane
        if self.early and task.prev is None and lane.at_issue:
            if not lane.needs_slot:
                if lane.startable():
                    try:
                        task.start(task.t_issue)
                    except Exception as exc:    # MPI's error at post time: the driver
                        task.fault = exc        # fails the task (named, peers told)
                        self.wake.set()
                    else:
                        if lane.done and self._done_at_issue(task):
                            return
                    self.started[task] = None
                    return
            elif self.solo and (lane.holds is None or lane.holds.held < lane.holds.capacity):
                if self._acquire(False):
                    try:
                        if self.broken is None and (lane.holds is None
                                                    or lane.holds.held < lane.holds.capacity):
                            self.switches += 1
                            task.start(task.t_issue)    # (a program's start never raises)
                            self._admit(task, started=True)
                            return
                    finally:
                        self._release()
                    if self._callbacks:
                        self.run_callbacks()
        self.sq.append(task)
        if not inline and self._sleeping:
            self.wake.set()

    def _done_at_issue(self, task) -> bool:
        """A task whose lane finished as it started (a cell collective whose peers were
        there first, a broadcast's root) completes on the issuing thread, where nobody
        drives: its waiter then finds it done.  False: the driver completes it."""
        if task.check is not None or not self._acquire(False):
            return False
        try:
            if self.broken is not None or task.comm.broken is not None or not task.poll():
                return False
            self.retire(task)
        finally:
            self._release()
        if self._callbacks:
            self.run_callbacks()
        self.app_active = task.last_progress    # (its poll just now: the clock, read once)
        return True

    def _admit(self, task, started: bool) -> None:
        """``task`` joins the policy (the driver's lock is held): admitted to start in its
        order, or adopted, started already."""
        self._live += 1
        if task.lane.needs_slot:
            self._programs += 1
        task.admitted = True
        if self.trace is not None:
            task.yield_times = []
        if not started:
            self.policy.admit(task)
            return
        self.policy.adopt(task)
        self.app_active = monotonic()
        if task.fault is not None:
            self._failed_start(task, task.fault)
        elif not task.finished:
            error = self.broken or task.comm.broken
            if error is not None:
                task.fail(error)
        if task.finished:
            self.retire(task)

    def take_started(self, before: float | None = None) -> None:
        """Every task started at issue (``before``: issued before that time) joins the
        policy (the driver's lock is held)."""
        for task in list(self.started):     # (list(): issuers insert meanwhile)
            if before is not None and task.t_issue > before and task.fault is None:
                break                       # (oldest first: the rest are younger)
            del self.started[task]
            if not task.retired:
                self._admit(task, started=True)

    # -- waiting: the one wait ---------------------------------------------------------
    def wait(self, task, timeout: float | None = None) -> None:
        """Work.wait(): the waiting thread drives the engine itself until ``task``
        completed or ``timeout`` seconds passed.  First, where nobody drives, it polls
        right here (``spin_us`` of polls after the last that moved anything, then, where
        ranks outnumber cores, ``yield_polls`` polls with sched_yield between them);
        then it takes turns with other waiters and the progress thread, sleeping between
        fruitless passes."""
        if self.forked is not None:
            raise self.forked
        me = get_ident()
        if self.driver == me:
            raise HpcCollError(
                f"wait() on {task!r} from the thread that drives hpccoll's engine: it cannot "
                "make progress while it waits for itself; wait in a done-callback is fine, "
                "but not inside hpccoll's own calls")
        deadline = None if timeout is None else monotonic() + timeout
        if self._acquire(False):
            self.driver = me
            try:
                self._spin(task, deadline)
            finally:
                self.driver = None
                self._release()
            if self._callbacks:
                self.run_callbacks()
        if not task._done:
            self._drive(task, deadline)
        self.app_active = monotonic()

    def _spin(self, task, deadline) -> None:
        """The waiter's first polls (the driver's lock held), until ``task`` is done,
        callbacks wait to run, or the spin is over.  A task started at issue that is all
        the engine has is polled as it is, without joining the policy (it leaves
        ``started`` when it completes); anything else joins first.  While it is alone,
        with nothing but its data to wait for, the spin tests only what its lane says
        would let it move (``Lane.ready``: MPI's request), a batch of polls at a time:
        MPI progresses its own collective only inside such tests, so the time between
        two of them is latency."""
        if self.started and not self._alone(task):
            self.take_started()
        polls = self._spin_polls
        idle = 0
        end = None
        while True:
            moved = self._quick(task, polls)
            if moved:
                idle = 0
            for _ in range(polls):
                if self._step(task, idle):
                    idle = 0
                    moved = True
                else:
                    idle += 1
                if task._done or self._callbacks:
                    return
            now = monotonic()
            if end is None or moved:
                # the spin counts from the last step that moved anything: while the
                # peers keep up, their data is there at the next poll (yielding then,
                # oversubscribed, hands the core away mid-collective: 64 KiB
                # allreduces in a latin order at 4 ranks on 2 cores, 25% slower)
                if end is None and self._adapt \
                        and now - self._crowd_at > progress.CROWD_EVERY_S:
                    self._look_around(now)
                end = now + self._spin_s
                if deadline is not None and deadline < end:
                    end = deadline
            if now >= end:
                break
        if self._yield_polls and _YIELD is not None and deadline is None:
            # ranks outnumber cores (spinning is off): the peer this waits for is likely
            # ready to run on this core; hand it over between polls
            for _ in range(self._yield_polls):
                _YIELD()
                if self._step(task, idle):
                    idle = 0
                else:
                    idle += 1
                if task._done or self._callbacks:
                    return

    def _waiting(self, spin_polls: int, spin_us: float, yield_polls: int) -> None:
        self.spin_polls, self.spin_us, self.yield_polls = spin_polls, spin_us, yield_polls
        self._spin_polls = spin_polls or 1
        self._spin_s = spin_us * 1e-6
        self._yield_polls = yield_polls

    def _look_around(self, now: float) -> None:
        """Every CROWD_EVERY_S at most, in a wait that its first polls did not end: spin
        while the machine has a CPU for every runnable thread, yield while it has not.
        (Spinning beside another process, the peer this rank waits for sits in the run
        queue until a time slice ends: 1 MiB allreduces at 0.24x MPI with one CPU-bound
        process on a 2-core machine, 1.4x when yielding.)"""
        self._crowd_at = now
        crowded = progress.crowded()
        if crowded != self.crowded:
            self.crowded = crowded
            self._waiting(*(progress.YIELDING if crowded else self._calm))

    def _quick(self, task, polls: int) -> bool:
        """Up to ``polls`` tests of what ``task``'s lane waits on, where the task is alone
        and waits for nothing else (no check, no doom): True once one succeeded (its own
        poll then completes it)."""
        if task.check is not None or task.doomed is not None or not self._alone(task):
            return False
        ready = task.lane.ready()
        if ready is None:
            return False
        for _ in range(polls):
            if ready():
                task.lane.arrived()
                return True
        return False

    def _step(self, task, idle: int) -> bool:
        """One poll on behalf of a waiter (the driver's lock held): ``task`` alone when it
        is all the engine has to do, else (where that is all a pass would do) the
        started collectives, and a whole pass every CTL_EVERY-th step; True on progress.
        (Counted in steps, not in fruitless ones: a program moves every few polls, and a
        whole pass after each move cost a 64 KiB allreduce in an abba order at 4 ranks on
        2 cores two passes, ten polls' worth, an iteration.)"""
        if self._alone(task):
            progressed = task.poll()
            if task.state is DONE or task.state is FAILED:
                self.retire(task)          # (still pending in reports made meanwhile)
                if not task.admitted:
                    del self.started[task]
            elif not progressed and idle % CTL_EVERY == CTL_EVERY - 1:
                self._serve_control()
                self.crosscheck.tick()
                if self.settings.timeout is not None:
                    self.watchdog.check()
            return progressed
        steps = self._steps + 1
        self._steps = steps
        quiet = steps % CTL_EVERY != 0
        if quiet and not self._programs and task.admitted \
                and task.t_start is not None and not task.lane.needs_slot \
                and not task.finished:
            # MPI runs it, and everything else pending too: a test of its request
            # progresses every collective MPI runs, and a whole pass (every task, the
            # control plane) costs ten times more; every CTL_EVERY-th try is a whole pass,
            # so the control plane still moves.  (A program pending besides is hpccoll's
            # to run: a peer waiting for it would wait CTL_EVERY polls, which on a node
            # whose ranks outnumber its cores are CTL_EVERY turns of the CPU.)
            progressed = task.poll()
            if task.finished:
                self.retire(task)
            return progressed
        if quiet and not self.sq and not self.started and self.broken is None \
                and self.watchdog.report is None and not self._control_tags:
            # nothing waits to start: a pass would only poll the started collectives
            # (programs among them: each may be what a peer waits for), so poll just
            # those; the policy's step and the pass around it cost as much again
            # (oversubscribed, a waiter polls once per sched_yield: 64 KiB allreduces
            # in a latin order at 4 ranks on 2 cores)
            polled = self.policy.started_only()
            if polled is not None:
                if self.poll_each(polled):
                    self.last_progress = monotonic()
                    return True
                return False
        return self._pass(None, quiet)

    def _alone(self, task) -> bool:
        """The waited task is the only thing the engine has to do: nothing queued or
        started besides, no report or token to handle.  Then a poll of that task is a
        whole pass.  (Not yet admitted: the one task started at issue, a healthy one.)"""
        if (self.sq or task.t_start is None or self.watchdog.report is not None
                or self._control_tags or self.broken is not None):
            return False
        if task.admitted:
            return self._live == 1 and not self.started
        return self._live == 0 and task.fault is None and task in self.started

    def _drive(self, task, deadline) -> None:
        """wait() once the first spin did not finish ``task``: take turns at the lock
        with other waiters (the progress thread steps aside meanwhile), and back off
        between fruitless passes (engine/progress.py)."""
        me = get_ident()
        lock = self.lock
        with self._want_lock:
            self._want += 1
            self._resume.clear()
        old_slack = None
        began = monotonic()
        try:
            while not task._done:
                left = None if deadline is None else deadline - monotonic()
                if left is not None and left <= 0:
                    return
                # short timeouts: another waiter may drive and complete our task meanwhile
                if not lock.acquire(timeout=0.002 if left is None else min(left, 0.002)):
                    continue
                self.driver = me
                try:
                    if self.started:
                        self.take_started()
                    idle = 0
                    while not task._done:
                        if self._step(task, idle):
                            idle = 0
                        else:
                            idle += 1
                        if self._callbacks:
                            break          # run them, outside the lock, then go on
                        if idle == 0:
                            continue
                        if deadline is not None and monotonic() > deadline:
                            return
                        if (old_slack is None and idle > self.spin_polls
                                + self.yield_polls):
                            old_slack = progress.fine_slack()   # about to sleep
                        progress.backoff(self, idle, waited=monotonic() - began,
                                         mpi=not task.lane.needs_slot)
                finally:
                    self.driver = None
                    lock.release()
                self.run_callbacks()
        finally:
            self.app_active = monotonic()
            progress.restore_slack(old_slack)
            with self._want_lock:
                self._want -= 1
                if self._want == 0 and (not self.idle() or self.watchdog.report is not None):
                    self._resume.set()     # work is left: the progress thread takes over

    def poke(self, task=None) -> None:
        """Work.test(): one pass if nobody else is driving."""
        if self.forked is not None:
            raise self.forked
        if self._acquire(False):
            self.driver = get_ident()
            try:
                if task is not None and self._alone(task) and not self.started:
                    if task.poll() and task.finished:
                        self.retire(task)
                else:
                    self._pass()
            finally:
                self.driver = None
                self._release()
            self.run_callbacks()

    # -- one pass over everything ---------------------------------------------------------
    def _pass(self, before: float | None = None, quiet: bool = False) -> bool:
        """One pass: everything started at issue (``before``: issued before that time)
        and queued joins the policy, the policy steps, the control plane and the watchdog
        are served.  True if anything progressed.  ``quiet``: a waiter's pass, which
        serves the control plane every CTL_EVERY-th pass only, not after each fruitless
        one (a probe of the control communicator costs several polls of a program, and a
        waiter's passes are mostly fruitless until its peer's data is there)."""
        progressed = False
        if self.started:
            self.take_started(before)
        while self.sq:
            task = self.sq.popleft()
            progressed = True
            error = self.broken or task.comm.broken
            if error is not None:
                task.fail(error)
                self.complete(task)
                continue
            self._admit(task, started=False)
        if self._live and self.broken is None:
            if self.policy.step(self):
                progressed = True
                self.last_progress = monotonic()
        self.passes += 1
        if (not progressed and not quiet) or self._control_tags \
                or self.passes % CTL_EVERY == 0:
            self._served = monotonic()
            self._serve_control()
            self.crosscheck.tick()
        if self.settings.timeout is not None and self.broken is None:
            self.watchdog.check()
        if self.watchdog.report is not None:
            self.watchdog.progress()
        return progressed

    def poll_each(self, tasks) -> bool:
        """Poll each of ``tasks`` once (a snapshot: retiring changes the live lists) and
        retire those that finished; True if any progressed."""
        progressed = False
        for task in tuple(tasks):
            if task.poll():
                progressed = True
            if task.finished:
                self.retire(task)
        return progressed

    # -- task lifecycle (called by policies) ------------------------------------------------
    def launch(self, task) -> None:
        self.switches += 1
        try:
            task.start()
        except Exception as exc:
            self._failed_start(task, exc)

    @staticmethod
    def _failed_start(task, exc: Exception) -> None:
        """Starting ``task`` raised (an MPI error at post time, or hpccoll's own): the task
        fails with an error that names it."""
        if not isinstance(exc, HpcCollError):
            err = HpcCollError(f"{task.describe()}: {exc}")
            err.__cause__ = exc
            exc = err
        task.fail(exc)

    def retire(self, task) -> None:
        """A finished task leaves (the driver's lock is held); a failure only this rank
        knows breaks the communicator here and is told to its other members."""
        if task.state is FAILED and task.comm.broken is None:
            err = task.error
            if not (isinstance(err, CollectiveTimeout)
                    or isinstance(err, CollectiveMismatch) and not err.local):
                # every member saw the mismatch or will time out itself; a local failure
                # (an MPI error, a kernel error, a truncated message) only this rank
                # knows: tell the others
                text = str(err)
                payload = (task.comm.uid, task.ident, self.control.rank,
                           text.splitlines()[0] if text else "", type(err).__name__)
                self.control.broadcast(payload, task.comm.world_ranks, TAG_FAILED)
            self.break_comm(task.comm, task.error)
        self.complete(task)

    def complete(self, task) -> None:
        """The one completion: hand a finished task back to its Work, exactly once, with
        its flight row and trace record; the task keeps nothing of the caller's
        afterwards.  Its callbacks run once the driver let go of the lock."""
        if task.retired:
            return
        task.retired = True
        if task.admitted:
            self.policy.remove(task)
            self._live -= 1
            if task.lane.needs_slot:
                self._programs -= 1
        if self.trace is not None:
            self.trace.append(task.trace_record(self.control.rank))
        if self.flight is not None:
            self.flight.append(task)
        gate = task.lane.holds
        if gate is not None and task.t_start is not None:
            gate.held -= 1
        if task.state is FAILED:
            task.cancel_transfers()
        else:
            task.lane.release()   # a failed task's transfers may still write into its scratch
        if task.key is not None or task.check is not None:
            task.comm.retire(task)
        fns = task._finish()
        if fns:
            self._callbacks.append((task, fns))

    def break_comm(self, state, exc) -> None:
        """A communicator whose ranks disagreed is unusable (stray messages may remain on
        its tags): fail everything pending on it.  Every member saw the same fingerprints,
        so every member breaks it at the same collective."""
        if isinstance(exc, CollectiveMismatch) and state.broken is None:
            # every member detects it: each writes its own record
            flight.dump_own(self, "mismatch", exc)
        state.stop(exc)
        for other in self.live():
            if other.comm is state:
                other.fail(exc)
                self.complete(other)

    def _on_failed_notice(self, payload) -> None:
        uid = payload[0]
        state = self.ctx._state_by_uid(uid)
        if state is None:
            # not registered here yet: the peer failed its first collective while this
            # rank was still inside the dup()/split() that makes the communicator (its
            # last collective call returns at different times on different ranks).  Kept
            # for Context._register, which breaks it on arrival; looked up once more in
            # case it registered meanwhile (each side publishes, then looks)
            self.unclaimed[uid] = payload
            state = self.ctx._state_by_uid(uid)
            if state is None or self.unclaimed.pop(uid, None) is None:
                return
        if state.broken is None:
            exc = self.failure_notice(state, payload)
            if isinstance(exc, CollectiveMismatch) and not self.pending_on(state):
                state.unreported = exc     # nothing pending carries it: the next call does
            self.break_comm(state, exc)

    def on_closing(self, src: int, counts: dict, did: str) -> None:
        """Rank ``src`` closed its context or freed a communicator (``did``), having
        issued ``counts[uid]`` order-matched collectives on each communicator: one of this
        rank's beyond that on a communicator of ``src``'s will never be matched.  It fails
        now (the communicator is unusable: what it posted stays unmatched there), and so
        does issuing one later."""
        self.take_started()
        for state in self.ctx._states():
            count = counts.get(state.uid)
            if count is None or src not in state.world_ranks:
                continue
            err = ContextClosed(
                f"rank {src} {did} after {count} collective(s) on communicator "
                f"{state.name!r}: collective #{count} and later ones there would never "
                "complete")
            state.closed_at(count, err)
            late = [t for t in self.live() + list(self.sq)
                    if t.comm is state and t.key is None and t.seq >= count and not t.retired]
            if late and state.broken is None:
                state.stop(err)
            for t in late:
                t.fail(err)
                self.complete(t)

    @staticmethod
    def failure_notice(state, payload) -> HpcCollError:
        """The error a peer's failure notice (TAG_FAILED) makes of communicator ``state``:
        the same CollectiveMismatch where the peer found the ranks disagree."""
        _, ident, rank, text, kind = payload
        if kind == "CollectiveMismatch":
            return CollectiveMismatch(f"{text} (found by rank {rank}; communicator "
                                      f"{state.name!r} is unusable)", ranks=(rank,))
        return HpcCollError(f"collective {ident} failed on rank {rank} ({kind}: {text}); "
                            f"communicator {state.name!r} is unusable")

    # -- what is pending ---------------------------------------------------------------------
    def idle(self) -> bool:
        return self._live == 0 and not self.sq and not self.started

    def live(self) -> list:
        """Every admitted task that has not finished, in the policy's order."""
        return list(self.policy.live())

    def pending_on(self, state) -> bool:
        """Whether anything of communicator ``state`` is pending: admitted, queued or
        started at issue (each of those fails with its verdict, so the verdict is
        carried)."""
        # list() of a deque or dict runs in C under the GIL: safe beside an issuing thread
        return any(t.comm is state for t in self.live() + list(self.sq) + list(self.started))

    def pending_tasks(self, state=None) -> list:
        """The unfinished tasks (of communicator ``state``, or all)."""
        tasks = self.live() + list(self.sq) + list(self.started)
        return [t for t in tasks if not t.retired and (state is None or t.comm is state)]

    def pending(self) -> int:
        return self._live + len(self.sq) + len(self.started)

    def stop(self, wait: float = 10.0) -> None:
        self._stop = True
        self.wake.set()
        self._resume.set()
        if threading.current_thread() is not self.thread:
            self.thread.join(wait)

    def stats(self) -> dict:
        return {"passes": self.passes, "parks": self.parks, "wakeups": self.wakeups,
                "switches": self.switches, "policy": self.policy.name}

    def run_callbacks(self) -> None:
        """Done-callbacks of completed collectives, on the thread that completed them but
        outside the engine's lock: a callback may issue or wait for collectives."""
        while self._callbacks:
            try:
                work, fns = self._callbacks.popleft()
            except IndexError:
                return
            for fn in fns:
                try:
                    fn(work)
                except Exception as exc:  # like concurrent.futures: report, never kill the engine
                    print(f"hpccoll: exception in done-callback {fn!r}: {exc!r}", file=sys.stderr)

    # -- control plane -----------------------------------------------------------------
    def _serve_control(self) -> None:
        ctl = self.control
        for src, tag, obj in ctl.receive():
            if tag == TAG_REPORT_REQ:
                ctl.send((obj, self.snapshot()), src, TAG_REPORT)
            elif tag == TAG_REPORT:
                self.watchdog.on_report(src, obj)
            elif tag == TAG_FAILED:
                self._on_failed_notice(obj)
            elif tag == TAG_CLOSING:
                self.crosscheck.closed.add(src)
                self.on_closing(src, obj, "closed its hpccoll context")
            elif tag == TAG_GONE:
                self.crosscheck.closed.add(src)
                self.crosscheck.gone.add(src)
                self.on_closing(src, obj, "exited without closing its hpccoll context")
            elif tag in self.crosscheck.tags:
                self.crosscheck.on_message(src, tag, obj)
            elif tag in self._control_tags:
                self.policy.on_control(src, tag, obj)
        ctl.reap()

    def snapshot(self) -> dict:
        status = "ok" if self.broken is None else f"failed: {type(self.broken).__name__}"
        # a rank whose own watchdog already fired reports what was pending when it did
        last = self.watchdog.last_tasks
        tasks = last if self.broken is not None and last is not None \
            else [t.snapshot() for t in self.pending_tasks()]
        return {"rank": self.control.rank, "host": HOST, "pid": PID, "status": status,
                "policy": self.policy.name, "tasks": tasks,
                "flight": self.flight.rows(self.ctx._epoch) if self.flight is not None else []}

    def _break(self, exc: BaseException) -> None:
        if self.broken is None:
            self.broken = exc
            for state in self.ctx._states():
                state.stop()
