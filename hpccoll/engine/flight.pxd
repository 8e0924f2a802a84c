# The typed form of engine/flight.py (hpccoll/_compiled.py).
from hpccoll.engine.task cimport Task


cdef class Recorder:
    cdef public object ring

    cpdef append(self, Task task)
