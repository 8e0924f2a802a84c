"""The engine ("daemon"): one progress thread per rank; it, or a thread in ``wait()``,
makes every data-path MPI call.

    issue (core/state.py) --start now--> adopt ----------------+
          |                                                     v
          +--> SQ (deque) --> policy.admit --> policy.step: poll, start, switch
                                                                |
    Work.wait() <-- completion; callbacks, outside the lock <-- retire()

Whoever holds ``lock`` drives: the daemon thread, or a thread in ``wait()`` (which then
needs no hand-off between threads for its result: a hand-off costs a GIL switch interval
when another thread is busy).  The daemon steps aside while a waiter drives.

The daemon never spins in pure Python holding the GIL: after ``spin_polls`` passes
without progress it sleeps between polls (growing to ``poll_sleep_us``), and a new
submission cuts the sleep short.  With nothing pending it parks on an Event, waking
every ``PARK_SECONDS`` only to answer control messages (watchdog reports, mismatch
probes, the ordering token).
"""
from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque

from . import flight, policies
from .control import HOST, PID, TAG_FAILED, TAG_REPORT, TAG_REPORT_REQ, Control
from .crosscheck import CrossCheck
from .flight import Recorder
from .task import DONE, FAILED, RUNNING
from .watchdog import format_report
from ..errors import CollectiveMismatch, CollectiveTimeout, HpcCollError

from ..core.state import _express   # (None where the install did not build it)

PARK_SECONDS = 0.01     # parked engines look for work and control messages this often


def _timer_slack():
    """Linux rounds a thread's sleeps up by its timer slack (50 us by default), which turns
    the engine's microsecond back-off into 60-110 us sleeps.  Returns set(ns) -> previous
    value, for the calling thread, or None where prctl is unavailable."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None

    def set_slack(ns: int) -> int:
        old = prctl(30, 0, 0, 0, 0)           # PR_GET_TIMERSLACK
        prctl(29, ctypes.c_ulong(ns), 0, 0, 0)  # PR_SET_TIMERSLACK
        return old
    return set_slack


_SET_SLACK = _timer_slack()
_YIELD = getattr(os, "sched_yield", None)     # not on every platform
FINE_SLACK_NS = 1000
CTL_EVERY = 16          # passes between control polls while busy
TIMEOUT_LOOK = 0.005    # seconds between the watchdog's looks at every pending collective
LOCK_WAIT = 0.001       # seconds start_now waits for the daemon's pass (longer than one)
# While the application itself issues and waits, the daemon's passes only compete with it
# for the GIL and the engine's lock: it stays away until the application has been quiet
# this long (seconds), unless a queued task, a report or the token needs it.
APP_GRACE = 0.002
# A collective MPI runs itself that started at issue stays "loose" (engine.loose): the
# engine does not know it until its waiter spins out, somebody needs the engine's whole
# view, or it is this old (seconds) with nobody waiting; then the engine adopts it.  So
# does a shared-memory program started at issue while the engine had nothing else to do
# (``solo``): its waiter runs it.
LOOSE_AGE = APP_GRACE


class Engine:
    def __init__(self, ctx, settings, ctl_comm):
        self.ctx = ctx
        self.settings = settings
        self.policy = policies.make(settings)
        self.control = Control(ctl_comm)
        self.sq: deque = deque()
        self.wake = threading.Event()
        self.lock = threading.Lock()      # held by whoever drives progress
        self.driver = None                # the thread holding ``lock``
        self._callbacks: deque = deque()  # (work, fns) to run once the lock is released
        self._want = 0                    # waiters that want to drive
        self._want_lock = threading.Lock()
        self._resume = threading.Event()
        self.broken: BaseException | None = None
        self._control_tags = self.policy.control_tags
        self._park = getattr(self.policy, "park_seconds", PARK_SECONDS)
        self.policy.bind(self)
        # collectives MPI runs itself may start on the calling thread (core/state.py)
        self.early = settings.express and self.policy.early
        # ... and so may a shared-memory program, while the engine has nothing else
        self.solo = self.early and self.policy.solo
        self.crosscheck = CrossCheck(self)
        self._stop = False
        self._sleeping = False            # the daemon waits on ``wake`` (submit must set it)
        self._report = None
        self._timeout_look = 0.0          # when _check_timeout looks at the tasks next
        self._report_id = 0
        self._last_tasks = None
        self.last_progress = time.monotonic()   # any task's progress, for the watchdog
        self.trace = deque(maxlen=1_000_000) if settings.trace else None
        self.flight = Recorder(settings.flight_entries) if settings.flight_entries else None
        self._live = 0
        self.app_active = 0.0             # when the application last issued or waited
        self.unclaimed: dict = {}         # uid -> failure notice of a communicator not made yet
        self._served = 0.0                # when control messages were last served
        # started collectives MPI runs itself that no engine pass polls yet (insertion
        # order: oldest first); only application threads holding ``xlock`` touch them, and
        # ``xlock`` is always taken before ``lock``, never inside it
        self.loose: dict = {}
        # the loose shared-memory programs among them (a dict, not a count: application
        # threads add to it without xlock, and a dict's insertion is atomic)
        self.loose_programs: dict = {}
        self._loose_moves = 0             # steps loose programs made, for waiters' spin
        self.xlock = threading.Lock()
        self.cwait = _express.wait if settings.calls_in_c and _express is not None else None
        self.cx = None                    # what _express.c reads of the engine, gathered there
        # counters (per daemon)
        self.passes = self.parks = self.wakeups = 0
        self.switches = 0
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"hpccoll-engine-r{self.control.rank}")
        self.thread.start()

    # -- application side -------------------------------------------------------------
    def submit(self, task, inline: bool = False) -> None:
        """Queue a task.  ``inline``: a small collective on an idle engine is left for the
        caller's wait()/test() to drive, without waking the daemon (the wake-up and the
        GIL hand-off would cost more than the collective); the parked daemon still picks
        it up within PARK_SECONDS if nobody waits."""
        self.sq.append(task)
        if not inline and self._sleeping:
            self.wake.set()

    def start_now(self, task) -> bool:
        """Start a startable task on the calling thread if nobody drives the engine at this
        moment (the caller holds its communicator's lock, so nothing of that communicator
        starts meanwhile); False: queue it instead."""
        lock = self.lock
        # only the daemon holds the lock when nobody waits, and only for one pass; a thread
        # in wait() may hold it for long: then queue at once
        if self._want or not (lock.acquire(False) or lock.acquire(timeout=LOCK_WAIT)):
            return False
        try:
            if self.broken is not None:
                return False
            self.switches += 1
            error = None
            try:
                task.start(task.t_issue)
            except Exception as exc:    # MPI errors at post time fail the collective
                error = exc
            self.adopt(task, start_error=error, now=task.t_issue)
        finally:
            lock.release()
        if self._callbacks:
            self.run_callbacks()
        return True

    def adopt(self, task, start_error=None, poll_error=None, now=None) -> None:
        """A task started by the application (start_now, or CommState.run without the
        engine) joins it; ``start_error``/``poll_error``: what MPI raised, for the task to
        deal with as if the engine had started or polled it; ``now``: when the
        application was last active.  The caller holds ``lock``."""
        self._live += 1
        if self.trace is not None:
            task.yield_times = []
        self.policy.adopt(task)
        self.app_active = now or time.monotonic()
        if start_error is not None:
            self._failed_start(task, start_error)
        elif poll_error is not None:
            task.fail_from(poll_error)
        if task.finished:
            self.retire(task)

    # -- loose collectives -------------------------------------------------------------
    # A collective MPI runs itself, started at issue on the calling thread, is polled by
    # its own waiter with no engine lock, no policy and no pass: a small collective's
    # per-call cost is then MPI's own plus the naming (core/state.py, issue).  A
    # shared-memory program started at issue on an idle engine is run by its waiter the
    # same way (its steps are the polls); while several are loose, a waiter runs them all
    # (the peers may need this rank's progress on another one first, as they would from
    # the engine's pass).  The engine takes a loose collective over (adopt) where it must
    # see it: a waiter that spun out, a callback, a timeout report's view, close(), free().
    def wait_loose(self, task, timeout: float | None) -> None:
        """Work.wait() on a loose task: poll it (with a program loose besides it, every
        loose collective) right here for ``spin_us`` (programs: since the last step any
        of them made; for ``spin_polls`` polls where spinning is off, and never past
        ``timeout``), then, where ranks outnumber cores, for ``yield_polls`` polls with
        ``sched_yield`` between them; if it is not done by then, or the engine has other
        work, the engine adopts it, and the waiter drives as for any task."""
        xlock = self.xlock
        xlock.acquire()
        try:
            if not task.loose:
                return
            lane = task.lane
            if self._live or self.sq:
                # the engine has other work, which may be what the peers need from this
                # rank before they can complete this one: drive it all while waiting
                self._adopt_loose(task)
                return
            group = len(self.loose) > 1 and (lane.needs_slot or self.programs_loose())
            if group:
                def test():
                    self._step_loose()
                    return not task.loose      # done (or adopted: it failed)

                def mark():
                    return self._loose_moves
            elif lane.needs_slot:
                test = lane.test if task.check is None else task.poll_loose

                def mark():
                    return lane.pc
            else:
                test, mark = (lane.req.Test if task.check is None else task.poll_loose), None
            s = self.settings
            polls = s.spin_polls or 1
            deadline = seen = None   # (looked up only if the first polls do not suffice)
            try:
                while True:
                    for _ in range(polls):
                        if test():
                            if not group:
                                self._done_loose(task)
                            return
                    now = time.monotonic()
                    if deadline is None or (mark is not None and timeout is None
                                            and mark() != seen):
                        seen = mark and mark()
                        spin = s.spin_us * 1e-6
                        deadline = now + (spin if timeout is None else min(spin, timeout))
                    elif now >= deadline:
                        break
                if s.yield_polls and _YIELD is not None and timeout is None:
                    # ranks outnumber cores (spinning is off): the peer this waits for is
                    # likely ready to run on this core; hand it over between polls, as
                    # drive() does, before the engine takes the task over
                    for _ in range(s.yield_polls):
                        _YIELD()
                        if test():
                            if not group:
                                self._done_loose(task)
                            return
            except Exception as exc:       # MPI's error: the engine explains it
                self._adopt_loose(task, poll_error=exc)
                return
            self._adopt_loose(task)
        finally:
            xlock.release()

    def _poll_loose(self, task) -> None:
        """One poll of a loose task (Work.test(); xlock held), of every loose one where
        programs are among them."""
        if len(self.loose) > 1 and self.programs_loose():
            self._step_loose()
            return
        try:
            if task.lane.test() if task.check is None else task.poll_loose():
                self._done_loose(task)
        except Exception as exc:
            self._adopt_loose(task, poll_error=exc)

    def programs_loose(self) -> bool:
        """Whether a shared-memory program is among the loose collectives."""
        return bool(self.loose_programs)

    def _step_loose(self) -> None:
        """Poll every loose collective once (xlock held): each program runs as far as it
        can, those done complete, one that fails goes to the engine with its error."""
        try:
            tasks = list(self.loose)
        except RuntimeError:       # an application thread issued meanwhile: next time
            return
        for t in tasks:
            if not t.loose:
                continue
            lane = t.lane
            try:
                if lane.needs_slot:
                    pc = lane.pc
                    done = lane.test() if t.check is None else t.poll_loose()
                    if lane.pc != pc:
                        self._loose_moves += 1
                else:
                    done = lane.req.Test() if t.check is None else t.poll_loose()
            except Exception as exc:
                self._adopt_loose(t, poll_error=exc)
                continue
            if done:
                self._loose_moves += 1
                self._done_loose(t)

    def _done_loose(self, task) -> None:
        """MPI completed a loose task's request, or its program ran to its end (xlock
        held): the task completes here."""
        lane = task.lane
        if lane.needs_slot:
            lane.holds.held -= 1       # (nothing else starts while it is held)
        else:
            lane.finish()
        task.state = DONE
        task.t_end = self.app_active = time.monotonic()
        del self.loose[task]
        self.loose_programs.pop(task, None)
        task.loose = False
        task.retired = True
        if self.flight is not None:
            self.flight.append(task)
        task.lane.release()
        if task.check is not None:       # the digest agreed up to here (close() skips it)
            task.comm.retire(task)
        task._done = True       # no callbacks: add_done_callback adopts the task first

    def adopt_loose(self, blocking: bool = True) -> None:
        """The engine takes every loose task (``blocking`` False: unless an application
        thread is polling one right now)."""
        if not self.loose or not self.xlock.acquire(blocking):
            return
        try:
            for task in list(self.loose):
                self._adopt_loose(task)
        finally:
            self.xlock.release()
        if self._callbacks:
            self.run_callbacks()

    def _adopt_loose(self, task, poll_error=None) -> None:
        """(xlock held) ``task`` joins the engine, failed at once if its communicator or
        the engine broke meanwhile (nothing would complete it otherwise)."""
        with self.lock:
            if task not in self.loose:
                return
            del self.loose[task]
            self.loose_programs.pop(task, None)
            task.loose = False
            error = self.broken or task.comm.broken
            if error is not None and poll_error is None:
                task.fail(error)
                self._live += 1
                self.policy.adopt(task)
                self._complete(task)
                return
            self.adopt(task, poll_error=poll_error, now=self.app_active)

    def idle(self) -> bool:
        return self._live == 0 and not self.sq and not self.loose

    def live(self) -> list:
        """Every admitted task that has not finished, in the policy's order."""
        return list(self.policy.live())

    def poke(self, work=None) -> None:
        """One pass if nobody else is driving (Work.test()); a loose ``work`` is polled
        once by itself."""
        if work is not None and work.loose:
            if self.xlock.acquire(False):
                try:
                    if work.loose:
                        self._poll_loose(work)
                finally:
                    self.xlock.release()
            return
        if self.lock.acquire(blocking=False):
            self.driver = threading.get_ident()
            try:
                self._pass()
            finally:
                self.driver = None
                self.lock.release()
            self.run_callbacks()

    def pending_on(self, state) -> bool:
        """Whether anything of communicator ``state`` is pending: admitted, still queued,
        or loose (each of those fails with its verdict, so the verdict is carried)."""
        # list() of a deque or dict runs in C under the GIL: safe beside an issuing thread
        return any(t.comm is state for t in self.live() + list(self.sq) + list(self.loose))

    def pending(self) -> int:
        return self._live + len(self.sq) + len(self.loose)

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

    # -- driving progress ----------------------------------------------------------------
    def _backoff(self, idle: int, event: threading.Event | None = None,
                 waited: float = 1.0, mpi: bool = False) -> None:
        """After ``spin_polls`` fruitless passes, sleep (GIL released) for a time that grows
        to ``poll_sleep_us``, and for a waiter to at most an eighth of the ``waited``
        seconds so far (a collective that takes 1 ms is not found done 100 us late); a
        waiter polls without sleeping for its first ``spin_us`` anyway (MPI moves a large
        message while it is tested), and for the whole wait on a collective the MPI library
        runs itself (``mpi``: its data moves only while some call into MPI progresses it, and
        a peer may need this rank's progress for its own; MPI's own blocking calls spin
        likewise); ``event`` (new submissions) cuts the sleep short.  A waiter (no ``event``) first hands
        its CPU to another process ``yield_polls`` times: on an oversubscribed node that
        is usually the peer it waits for (the daemon never yields: nobody waits for it,
        and it would take the CPU from the application)."""
        s = self.settings
        if idle <= s.spin_polls or (event is None and s.spin_us and (
                mpi or waited * 1e6 < s.spin_us)):
            return
        if self.policy.hot:
            return   # a yield happened: walk the queue at full speed (sched_yield would hand
            #          the core to another process for a whole time slice on a busy node)
        idle -= s.spin_polls
        if event is None:
            if idle <= s.yield_polls and _YIELD is not None:
                _YIELD()
                return
            idle -= s.yield_polls
        delay = min(s.poll_sleep_us, 2.0 ** min(idle, 20)) * 1e-6
        if event is None:
            time.sleep(min(delay, waited * 0.125))
        else:
            self._sleep(event, delay)

    def _sleep(self, event: threading.Event, seconds: float) -> bool:
        """Daemon sleep that a submission interrupts.  ``_sleeping`` is raised before the
        queue is checked, so a submission either sees it and sets the event, or is seen."""
        self._sleeping = True
        try:
            if self.sq:
                return True
            return event.wait(seconds)
        finally:
            self._sleeping = False
            event.clear()

    def drive(self, work, timeout: float | None) -> None:
        """Called by Work.wait(): the waiting thread drives the engine itself, so the result
        needs no hand-off between threads.  The daemon steps aside meanwhile."""
        me = threading.get_ident()
        if self.driver == me:
            raise HpcCollError(
                f"wait() on {work!r} from the thread that drives hpccoll's engine: it cannot "
                "make progress while it waits for itself; wait in a done-callback is fine, "
                "but not inside hpccoll's own calls")
        task = work
        if self.loose:
            self.adopt_loose()       # the engine sees everything while it is driven
        lock = self.lock
        if timeout is None and task.t_start is not None and lock.acquire(False):
            # a started collective usually ends within a few polls: poll it right away,
            # without the hand-over from the daemon (it waits for the lock meanwhile)
            self.driver = me
            try:
                for _ in range(self.settings.spin_polls):
                    task.poll()
                    if task.finished:
                        self.retire(task)
                        break
            finally:
                self.driver = None
                lock.release()
            if self._callbacks:
                self.run_callbacks()
            if work._done:
                self.app_active = time.monotonic()
                return
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._want_lock:
            self._want += 1
            self._resume.clear()
        old_slack = None
        began = time.monotonic()
        try:
            while not work._done:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return
                # short timeouts: another waiter may drive and complete our work meanwhile
                if not lock.acquire(timeout=0.002 if left is None else min(left, 0.002)):
                    continue
                self.driver = me
                try:
                    idle = 0
                    while not work._done:
                        if self._alone(task):
                            progressed = self._poll_alone(task, idle)
                        elif idle % CTL_EVERY and task.t_start is not None \
                                and not task.lane.needs_slot:
                            # MPI runs it: a test of its request progresses every
                            # collective MPI runs, and a whole pass (every task, the
                            # control plane) costs ten times more; every CTL_EVERY-th
                            # try is a whole pass, so everything else still moves
                            progressed = task.poll()
                            if task.finished:
                                self.retire(task)
                        else:
                            progressed = self._pass()
                        if self._callbacks:
                            break          # run them, outside the lock, then go on
                        if progressed:
                            idle = 0
                            continue
                        idle += 1
                        if deadline is not None and time.monotonic() > deadline:
                            return
                        if (old_slack is None and _SET_SLACK and idle > self.settings.spin_polls
                                + self.settings.yield_polls):
                            old_slack = _SET_SLACK(FINE_SLACK_NS)   # about to sleep
                        self._backoff(idle, waited=time.monotonic() - began,
                                      mpi=not task.lane.needs_slot)
                finally:
                    self.driver = None
                    lock.release()
                self.run_callbacks()
        finally:
            self.app_active = time.monotonic()
            if old_slack is not None:
                _SET_SLACK(old_slack)
            with self._want_lock:
                self._want -= 1
                if self._want == 0 and (not self.idle() or self._report is not None):
                    self._resume.set()     # work is left: the daemon takes over

    def _alone(self, task) -> bool:
        """The waited task is the only thing the engine has to do: nothing queued, nothing
        else live, no report or token to handle.  Then a poll of that task is a whole pass."""
        return (self._live == 1 and not self.sq and task.t_start is not None
                and self._report is None and not self._control_tags and self.broken is None)

    def _poll_alone(self, task, idle: int) -> bool:
        progressed = task.poll()
        if task.finished:
            self.retire(task)
        elif not progressed and idle % CTL_EVERY == 0:
            self._serve_control()
            self.crosscheck.tick()
            if self.settings.timeout is not None:
                self._check_timeout()
        return progressed

    def _run(self) -> None:
        s = self.settings
        idle = 0
        if _SET_SLACK:
            _SET_SLACK(FINE_SLACK_NS)
        me = threading.get_ident()
        try:
            while True:
                if self._want:      # a waiter drives; stay out of its way
                    self._resume.wait(self._park)
                    idle = 0
                    continue
                if self.loose and self._loose_old():
                    self.adopt_loose(blocking=False)   # nobody waits for it: take it
                now = time.monotonic()
                quiet = now - self.app_active
                if quiet < APP_GRACE and not self.sq and self._report is None and not self._stop:
                    # the application drives; a policy with control messages (the
                    # ordering token) still has them served every park interval
                    if not self._control_tags:
                        self._sleep(self.wake, APP_GRACE - quiet)
                        continue
                    since = now - self._served
                    if since < self._park:
                        self._sleep(self.wake, min(APP_GRACE - quiet, self._park - since))
                        continue
                with self.lock:
                    self.driver = me
                    try:
                        progressed = self._pass()
                    finally:
                        self.driver = None
                if self._callbacks:
                    self.run_callbacks()
                if self._stop and (self.idle() or self.broken is not None):
                    return
                if progressed:
                    idle = 0
                    continue
                idle += 1
                if self.sq:
                    continue
                if self._live == 0 and not self.sq and self._report is None:
                    # (loose collectives need no daemon: their waiters poll them, and it
                    # adopts old ones when it wakes)
                    # no work: a few slow polls (idle_polls), then park until a submission;
                    # a parked daemon still serves control messages every PARK_SECONDS
                    if idle > s.idle_polls:
                        self.parks += 1
                        if self._sleep(self.wake, self._park):
                            self.wakeups += 1
                            idle = 0
                    else:
                        self._sleep(self.wake, s.poll_sleep_us * 1e-6)
                    continue
                self._backoff(idle, self.wake)
        except BaseException as exc:  # a bug in hpccoll must not hang the application
            err = HpcCollError(f"hpccoll engine thread failed: {exc!r}")
            err.__cause__ = exc
            self._break(err)
            with self.lock:
                for t in self.live() + list(self.sq):
                    t.fail(err)
                    self._complete(t, admitted=t in self.policy.live())
            self.run_callbacks()

    def _loose_old(self) -> bool:
        """The oldest loose collective is older than LOOSE_AGE.  (A method: a local of
        the daemon's loop would keep the task, and so its result, alive while it parks.)"""
        try:
            oldest = next(iter(self.loose), None)
        except RuntimeError:    # an application thread changed it meanwhile: next time
            return False
        return oldest is not None and time.monotonic() - oldest.t_issue > LOOSE_AGE

    def _pass(self) -> bool:
        progressed = False
        while self.sq:
            task = self.sq.popleft()
            progressed = True
            error = self.broken or task.comm.broken
            if error is not None:
                task.fail(error)
                self._complete(task, admitted=False)
                continue
            self._live += 1
            if self.trace is not None:
                task.yield_times = []
            self.policy.admit(task)
        if self._live and self.broken is None:
            if self.policy.step(self):
                progressed = True
                self.last_progress = time.monotonic()
        self.passes += 1
        if not progressed or self._control_tags or self.passes % CTL_EVERY == 0:
            self._served = time.monotonic()
            self._serve_control()
            self.crosscheck.tick()
        if self.settings.timeout is not None and self._report is None and self.broken is None:
            self._check_timeout()
        if self._report is not None:
            self._report_progress()
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
        if task.state == FAILED and task.comm.broken is None:
            if not isinstance(task.error, (CollectiveMismatch, CollectiveTimeout)):
                # every member saw the mismatch or will time out itself; a local failure
                # (an MPI error, a kernel error) only this rank knows: tell the others
                me = self.control.rank
                payload = (task.comm.uid, task.ident, me, f"{type(task.error).__name__}: "
                           f"{str(task.error).splitlines()[0] if str(task.error) else ''}")
                self.control.broadcast(payload, task.comm.world_ranks, TAG_FAILED)
            self.break_comm(task.comm, task.error)
        self._complete(task)

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
            self.break_comm(state, self.failure_notice(state, payload))

    @staticmethod
    def failure_notice(state, payload) -> HpcCollError:
        """The error a peer's failure notice (TAG_FAILED) makes of communicator ``state``."""
        _, ident, rank, text = payload
        return HpcCollError(f"collective {ident} failed on rank {rank} ({text}); communicator "
                            f"{state.name!r} is unusable")

    def _complete(self, task, admitted: bool = True) -> None:
        """Hand a finished task back to its Work, exactly once; the task keeps nothing of
        the caller's afterwards."""
        if task.retired:
            return
        task.retired = True
        if admitted:
            self.policy.remove(task)
            self._live -= 1
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
                self._complete(other)

    # -- control plane -----------------------------------------------------------------
    def _serve_control(self) -> None:
        ctl = self.control
        for src, tag, obj in ctl.receive():
            if tag == TAG_REPORT_REQ:
                ctl.send((obj, self.snapshot()), src, TAG_REPORT)
            elif tag == TAG_REPORT:
                rid, snap = obj
                if self._report is not None and rid == self._report["id"]:
                    self._report["snaps"][src] = snap
            elif tag == TAG_FAILED:
                self._on_failed_notice(obj)
            elif tag in self.crosscheck.tags:
                self.crosscheck.on_message(src, tag, obj)
            elif tag in self._control_tags:
                self.policy.on_control(src, tag, obj)
        ctl.reap()

    def snapshot(self) -> dict:
        status = "ok" if self.broken is None else f"failed: {type(self.broken).__name__}"
        # a rank whose own watchdog already fired reports what was pending when it did
        tasks = self._last_tasks if self.broken is not None and self._last_tasks is not None \
            else [t.snapshot() for t in self.live()]
        return {"rank": self.control.rank, "host": HOST, "pid": PID, "status": status,
                "policy": self.policy.name, "tasks": tasks,
                "flight": self.flight.rows(self.ctx._epoch) if self.flight is not None else []}

    # -- watchdog ------------------------------------------------------------------------
    def _check_timeout(self) -> None:
        """A running collective without progress for ``timeout`` fires; so does a queued
        one (waiting for a slot, or for its global order) issued that long ago, when
        nothing at all progressed on this rank meanwhile."""
        now = time.monotonic()
        if now < self._timeout_look:
            return
        limit = self.settings.timeout
        # (every pass would build the list of everything pending: with a thousand
        # collectives in flight that is most of a pass; a timeout is seconds)
        self._timeout_look = now + min(TIMEOUT_LOOK, limit / 10)
        stalled = now - self.last_progress > limit
        for t in self.live():
            if t.state == RUNNING and now - t.last_progress > limit:
                self._start_report(t, now - t.last_progress)
                return
            if t.state != RUNNING and stalled and now - t.t_issue > limit:
                self._start_report(t, now - max(t.t_issue, self.last_progress))
                return

    def _start_report(self, task, idle: float) -> None:
        self._report_id += 1
        rid = (self.control.rank, self._report_id)
        self._report = {
            "id": rid, "deadline": time.monotonic() + self.settings.report_wait,
            "snaps": {self.control.rank: self.snapshot()},
            "trigger": {"rank": self.control.rank, "what": task.describe(), "idle": idle,
                        "timeout": self.settings.timeout, "policy": self.policy.name},
        }
        self.control.broadcast(rid, range(self.control.size), TAG_REPORT_REQ)

    def _report_progress(self) -> None:
        rep = self._report
        if len(rep["snaps"]) < self.control.size and time.monotonic() < rep["deadline"]:
            return
        self._report = None
        self._last_tasks = rep["snaps"][self.control.rank]["tasks"]
        text = format_report(rep["trigger"], rep["snaps"], self.control.size,
                             self.settings.report_wait)
        if self.settings.dump_dir:
            path = flight.dump(self.settings.dump_dir, "timeout", rep["trigger"]["what"],
                               rep["snaps"], self.control.rank)
            if path:
                text += f"\nFlight record of every rank that answered: {path}"
        if self.settings.print_report:
            print(text, file=sys.stderr, flush=True)
        exc = CollectiveTimeout(
            f"rank {self.control.rank}: {rep['trigger']['what']} made no progress for "
            f"{rep['trigger']['idle']:.1f} s (timeout={self.settings.timeout:g})", text)
        self._break(exc)
        for t in self.live():
            t.fail(exc)
            self._complete(t)

    def _break(self, exc: BaseException) -> None:
        if self.broken is None:
            self.broken = exc
            for state in self.ctx._states():
                state.stop()
