"""The progress thread: one per rank, it drives the engine while the application does not.

A waiter drives the engine itself (Engine.wait), so the progress thread matters for what
nobody waits for: queued collectives, callbacks, collectives started at issue that their
caller has not waited for yet, the control plane (watchdog reports, mismatch probes, the
ordering token).  It stays out of the application's way: while the application issued
or waited within ``APP_GRACE`` it sleeps, and it steps aside while a waiter drives.

It never spins in pure Python holding the GIL (a Python thread that busy-polls lets any
other thread run only once per switch interval, 5 ms): after ``spin_polls`` passes
without progress it sleeps between polls (growing to ``poll_sleep_us``), and a new
submission cuts the sleep short.  With nothing pending it parks on an Event, waking
every ``PARK_SECONDS`` only to answer control messages and take old started
collectives.
"""
from __future__ import annotations

import ctypes
import os
import threading
import time

from ..errors import HpcCollError

PARK_SECONDS = 0.01     # parked engines look for work and control messages this often
FINE_SLACK_NS = 1000
# While the application itself issues and waits, the daemon's passes only compete with it
# for the GIL and the engine's lock: it stays away until the application has been quiet
# this long (seconds), unless a queued task, a report or the token needs it.
APP_GRACE = 0.002
# A collective started at issue joins the policy at its waiter's first poll; one nobody
# waits for is taken by the progress thread once it is this old (seconds).
LOOSE_AGE = APP_GRACE
_YIELD = getattr(os, "sched_yield", None)     # not on every platform


def _timer_slack():
    """Linux rounds a thread's sleeps up by its timer slack (50 us by default), which turns
    the engine's microsecond back-off into 60-110 us sleeps.  Returns set(ns) -> previous
    value, for the calling thread, or None where prctl is unavailable."""
    try:
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


def fine_slack():
    """Microsecond sleeps for the calling thread from now on; returns what to restore."""
    return _SET_SLACK(FINE_SLACK_NS) if _SET_SLACK else None


def restore_slack(old) -> None:
    if old is not None and _SET_SLACK:
        _SET_SLACK(old)


# a waiter's spin_polls, spin_us and yield_polls where spinning takes the core a peer
# needs: on a node whose ranks outnumber its cores (core/context.py) and on a crowded
# machine (Engine._look_around): no spin, 1,000 yields, then sleep.  (4 ranks on 2 cores,
# an 8 B allreduce: 1,000 yields and no cap were alike, 340-350 us; sleeping from the
# first fruitless poll, 730-850 us.)  The machine's load is looked at again at most every
# CROWD_EVERY_S, in waits that their first polls did not end
YIELDING = (0, 0.0, 1000)
CROWD_EVERY_S = 0.01


def crowded() -> bool:
    """Whether the machine has more runnable threads than CPUs right now (the kernel's
    count in /proc/loadavg: this thread included).  False where it cannot be read."""
    try:
        with open("/proc/loadavg", "rb") as f:
            running = int(f.read().split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return False
    return running > (os.cpu_count() or 1)


def backoff(engine, idle: int, event: threading.Event | None = None,
            waited: float = 1.0, mpi: bool = False) -> None:
    """After ``spin_polls`` fruitless passes, sleep (GIL released) for a time that grows
    to ``poll_sleep_us``, and for a waiter to at most an eighth of the ``waited``
    seconds so far (a collective that takes 1 ms is not found done 100 us late); a
    waiter polls without sleeping for its first ``spin_us`` anyway (MPI moves a large
    message while it is tested), and for the whole wait on a collective the MPI library
    runs itself (``mpi``: its data moves only while some call into MPI progresses it, and
    a peer may need this rank's progress for its own; MPI's own blocking calls spin
    likewise); ``event`` (new submissions) cuts the sleep short.  A waiter (no
    ``event``) first hands its CPU to another process ``yield_polls`` times: on an
    oversubscribed node that is usually the peer it waits for (the daemon never yields:
    nobody waits for it, and it would take the CPU from the application)."""
    s = engine          # (its spin_polls, spin_us, yield_polls follow the load)
    if idle <= s.spin_polls or (event is None and s.spin_us and (
            mpi or waited * 1e6 < s.spin_us)):
        return
    if engine.policy.hot:
        return   # a yield happened: walk the queue at full speed (sched_yield would hand
        #          the core to another process for a whole time slice on a busy node)
    idle -= s.spin_polls
    if event is None:
        if idle <= s.yield_polls and _YIELD is not None:
            _YIELD()
            return
        idle -= s.yield_polls
    delay = min(engine.settings.poll_sleep_us, 2.0 ** min(idle, 20)) * 1e-6
    if event is None:
        time.sleep(min(delay, waited * 0.125))
    else:
        sleep(engine, event, delay)


def sleep(engine, event: threading.Event, seconds: float) -> bool:
    """Daemon sleep that a submission interrupts.  ``_sleeping`` is raised before the
    queue is checked, so a submission either sees it and sets the event, or is seen."""
    engine._sleeping = True
    try:
        if engine.sq:
            return True
        return event.wait(seconds)
    finally:
        engine._sleeping = False
        event.clear()


def _started_old(engine) -> bool:
    """The oldest collective started at issue is older than LOOSE_AGE.  (A function: a
    local of the loop would keep the task, and so its result, alive while it parks.)"""
    try:
        oldest = next(iter(engine.started), None)
    except RuntimeError:    # an application thread changed it meanwhile: next time
        return False
    return oldest is not None and (oldest.fault is not None
                                   or time.monotonic() - oldest.t_issue > LOOSE_AGE)


def run(engine) -> None:
    """The progress thread's loop."""
    s = engine.settings
    idle = 0
    if _SET_SLACK:
        _SET_SLACK(FINE_SLACK_NS)
    me = threading.get_ident()
    try:
        while True:
            if engine._want:      # a waiter drives; stay out of its way
                engine._resume.wait(engine._park)
                idle = 0
                continue
            old = bool(engine.started) and _started_old(engine)
            now = time.monotonic()
            quiet = now - engine.app_active
            if (quiet < APP_GRACE and not engine.sq and not old
                    and engine.watchdog.report is None and not engine._stop):
                # the application drives; a policy with control messages (the
                # ordering token) still has them served every park interval
                if not engine._control_tags:
                    sleep(engine, engine.wake, APP_GRACE - quiet)
                    continue
                since = now - engine._served
                if since < engine._park:
                    sleep(engine, engine.wake, min(APP_GRACE - quiet, engine._park - since))
                    continue
            with engine.lock:
                if engine._want:
                    continue      # a waiter came while this thread reached for the lock
                engine.driver = me
                try:
                    # (collectives started at issue are their waiters' until LOOSE_AGE)
                    progressed = engine._pass(time.monotonic() - LOOSE_AGE)
                finally:
                    engine.driver = None
            if engine._callbacks:
                engine.run_callbacks()
            if engine._stop and (engine.idle() or engine.broken is not None):
                return
            if progressed:
                idle = 0
                continue
            idle += 1
            if engine.sq:
                continue
            if engine._live == 0 and engine.watchdog.report is None:
                # (collectives started at issue need no daemon: their waiters poll them,
                # and it takes old ones when it wakes)
                # no work: a few slow polls (idle_polls), then park until a submission;
                # a parked daemon still serves control messages every PARK_SECONDS
                if idle > s.idle_polls:
                    engine.parks += 1
                    if sleep(engine, engine.wake, engine._park):
                        engine.wakeups += 1
                        idle = 0
                else:
                    sleep(engine, engine.wake, s.poll_sleep_us * 1e-6)
                continue
            backoff(engine, idle, engine.wake)
    except BaseException as exc:  # a bug in hpccoll must not hang the application
        err = HpcCollError(f"hpccoll engine thread failed: {exc!r}")
        err.__cause__ = exc
        engine._break(err)
        with engine.lock:
            engine.take_started()
            for t in engine.live() + list(engine.sq):
                t.fail(err)
                engine.complete(t)
        engine.run_callbacks()
