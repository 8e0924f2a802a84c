# The typed form of mpi/_calls.py (hpccoll/_compiled.py): a kept reading of the same
# arguments is looked at on every call of an adapter method.
cimport cython

cdef class Kept:
    cdef public tuple args, lists, arrays, flags, dtypes
    cdef public object call, run

    @cython.locals(mine=tuple, n=Py_ssize_t, i=Py_ssize_t, k=Py_ssize_t, items=tuple,
                   arrays=tuple, flags=tuple, dtypes=tuple)
    cpdef bint holds(self, tuple args) except -1
