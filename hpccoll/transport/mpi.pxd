# The typed form of transport/mpi.py (hpccoll/_compiled.py).
cdef class Recipe:
    cdef public object kind, mpi, post, mop, root, rank, divisor, inplace, persist
    cdef public bint scratch


cdef class Persistent:
    cdef public object send, recv, req, shapes
    cdef public bint busy


cpdef object start(Recipe r, object send, object recv, object scratch=*)
cpdef object start_slot(Recipe r, Persistent slot, object send)
cpdef finish_slot(Recipe r, Persistent slot, object recv)
