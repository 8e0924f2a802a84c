# The typed form of mpi/_codec.py (hpccoll/_compiled.py): the lowercase methods' header
# of every call (a number's whole trip) is encoded and read here.
cdef class Encoded:
    cdef public object header, parts, error

cdef class Table:
    cdef public object raw, ints, extra
    cdef public Py_ssize_t n

cpdef object floats(Py_ssize_t n)
cpdef object new_header()
cpdef Encoded encode(object obj, long long m, bint out_of_band=*, object out=*)
cpdef object same_kind(long long w0, list ints, object raw, Py_ssize_t n)
