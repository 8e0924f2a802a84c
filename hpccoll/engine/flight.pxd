# The typed form of engine/flight.py (hpccoll/_compiled.py).
cdef class Recorder:
    cdef public object ring

    cpdef append(self, task)
