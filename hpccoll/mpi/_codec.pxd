# The typed form of mpi/_codec.py (hpccoll/_compiled.py): the lowercase methods' header
# of every call (a number's whole trip) is encoded and read here.
cimport cython

cdef class Encoded:
    cdef public object header, parts, error

cdef class Table:
    cdef public object raw, ints, extra
    cdef public Py_ssize_t n

cpdef object new_header()
@cython.locals(w=cython.longlong[::1], j=Py_ssize_t, n=Py_ssize_t)
cpdef object _ints(out, long long w0, long long m, long long length, rest=*)
cpdef Encoded encode(object obj, long long m, bint out_of_band=*, object out=*)

cdef class Rows:
    cdef public Py_ssize_t n
    cdef long long[::1] w
    cdef double[::1] f

    @cython.locals(n=Py_ssize_t, words=Py_ssize_t, i=Py_ssize_t, j=Py_ssize_t, b=Py_ssize_t,
                   k=Py_ssize_t, w0="long long", kind="long long", rows=list, row=list)
    cpdef tuple read(self, long long m)
