# The typed form of mpi/_calls.py (hpccoll/_compiled.py): a kept reading of the same
# arguments is looked at on every call of an adapter method.
cimport cython

from hpccoll.core.state cimport CommState

cdef class Kept:
    cdef public tuple args, lists, arrays, flags, dtypes
    cdef public object call, counts

    @cython.locals(mine=tuple, n=Py_ssize_t, i=Py_ssize_t, k=Py_ssize_t, items=tuple,
                   arrays=tuple, flags=tuple, dtypes=tuple)
    cpdef bint holds(self, tuple args) except -1


cdef class Runner:
    cdef public object hc, mpi, stats, blocks
    cdef public CommState st
    cdef public dict kept
    cdef public bint freed

    @cython.locals(kept=Kept)
    cpdef Kept read(self, str name, read, tuple args)
    cpdef forward(self, str name, tuple args)
    @cython.locals(kept=Kept)
    cpdef blocking(self, str name, read, tuple args)
    cpdef again(self, call, dict counts)
    @cython.locals(kept=Kept)
    cpdef tuple start(self, str name, read, tuple args)
