# The typed form of engine/task.py (hpccoll/_compiled.py).
from hpccoll.base.work cimport Work


cdef class Task(Work):
    cdef public object comm, plan, seq, key, lane, check, prev, state
    cdef public object t_start, t_end, fault, doomed, gseq, yield_times
    cdef public double t_issue, last_progress
    cdef public bint gated, posted, retired, admitted, probed, made_progress, adopted
    cdef public long long key_instance, polls, tries, yields, yields_progress, spins
    cdef public long long threshold, consecutive

    cpdef bint poll(self) except -1
    cpdef start(self, now=*)
    cpdef fail(self, exc)


cpdef bint started(prev) except -1
