# The typed form of base/work.py (Cython compiles the .py with these declarations: see
# hpccoll/_compiled.py); the .py stays the one source of the behaviour.
cdef class Work:
    cdef public object _engine
    cdef public object _callbacks
    cdef public object error
    cdef public object result
    cdef public bint _done
    cdef object __weakref__

    cpdef wait(self, timeout=*)
    cpdef _finish(self)
