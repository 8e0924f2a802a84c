# The typed form of engine/engine.py (hpccoll/_compiled.py).
from hpccoll.engine.flight cimport Recorder
from hpccoll.engine.task cimport Task
from hpccoll.engine.lane cimport Lane
cimport cython


cdef class Engine:
    cdef public object ctx, settings, policy, control, sq, started, wake, lock, driver
    cdef public object _callbacks, _want_lock, _resume, broken, _control_tags, _park
    cdef public object crosscheck, watchdog, trace, unclaimed, thread, forked
    cdef public Recorder flight
    cdef public bint early, solo, _stop, _sleeping
    cdef public long long _want, _live, _programs, passes, parks, wakeups, switches, _steps
    cdef public long long _spin_polls, _yield_polls, spin_polls, yield_polls
    cdef public double last_progress, app_active, _served, _spin_s, spin_us, _crowd_at
    cdef public bint _adapt, crowded
    cdef public object _calm, _acquire, _release

    @cython.locals(lane=Lane)
    cpdef issue(self, Task task, bint inline=*)
    cpdef bint _done_at_issue(self, Task task) except -1
    cpdef _admit(self, Task task, bint started)
    cpdef take_started(self, before=*)
    cpdef wait(self, Task task, timeout=*)
    cpdef _spin(self, Task task, deadline)
    cpdef bint _quick(self, Task task, long long polls) except -1
    @cython.locals(steps="long long", quiet=bint)
    cpdef bint _step(self, Task task, long long idle) except -1
    cpdef bint _alone(self, Task task) except -1
    cpdef bint _pass(self, before=*, bint quiet=*) except -1
    @cython.locals(task=Task)
    cpdef bint poll_each(self, tasks) except -1
    cpdef retire(self, Task task)
    cpdef complete(self, Task task)
