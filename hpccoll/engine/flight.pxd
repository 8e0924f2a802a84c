# The typed form of engine/flight.py (hpccoll/_compiled.py).
cimport cython

from hpccoll.engine.task cimport Task


cdef class Recorder:
    cdef public list ring
    cdef public Py_ssize_t next

    @cython.locals(i=Py_ssize_t)
    cpdef append(self, Task task)
