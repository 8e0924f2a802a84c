# The typed form of engine/task.py (hpccoll/_compiled.py).
cimport cython

from hpccoll.base.work cimport Work
from hpccoll.engine.lane cimport Lane


cdef class Task(Work):
    cdef public object comm, plan, seq, key, check, prev, state
    cdef public Lane lane
    cdef public object t_start, t_end, fault, doomed, gseq, yield_times
    cdef public double t_issue, last_progress
    cdef public bint gated, posted, retired, admitted, probed, made_progress, adopted
    cdef public long long key_instance, polls, tries, yields, yields_progress, spins
    cdef public long long threshold, consecutive

    @cython.locals(lane=Lane)
    cpdef bint poll(self) except -1
    cpdef start(self, now=*)
    cpdef fail(self, exc)


cpdef bint started(prev) except -1
cpdef Task setup(Task task, engine, comm, plan, seq, key, lane, result, check, prev, bint gated)
cpdef Task new(engine, comm, plan, seq, key, lane, result, check=*, prev=*, bint gated=*)
