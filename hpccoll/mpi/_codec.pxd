# The typed form of mpi/_codec.py (hpccoll/_compiled.py): the lowercase methods' header
# of every call (a number's whole trip) is encoded and read here.
cimport cython

cdef class Encoded:
    cdef public object header, parts, error

cdef class Table:
    cdef public object raw, ints, extra
    cdef public Py_ssize_t n

cpdef object new_header()
cpdef Encoded encode(object obj, long long m, bint out_of_band=*, object out=*)

cdef class Rows:
    cdef public Py_ssize_t n
    cdef public object lead
    cdef public list words

    @cython.locals(n=Py_ssize_t, lead=tuple, flat=tuple, k=Py_ssize_t, i=Py_ssize_t,
                   kind=cython.longlong, w0=object)
    cpdef tuple read(self, raw, m)
    cpdef object _words(self, Py_ssize_t k)
