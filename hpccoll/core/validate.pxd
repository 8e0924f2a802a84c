# The typed form of core/validate.py (hpccoll/_compiled.py).
cdef class Call:
    cdef public object coll, send, recv, count, op, root, inplace, result, device, layout
    cdef public object fp_count, plan, plan_in, addrs


cdef class Recent:
    cdef public object send, recv, a, b, sflags, rflags, dtype, call, weak

    cpdef Call read(self, check, tuple args, send, recv, a=*, b=*)
    cpdef Call keep(self, Call call, send, recv, a=*, b=*)
