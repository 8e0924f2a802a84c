# The typed form of core/plan.py (hpccoll/_compiled.py).
cdef class PersistentSet:
    cdef public tuple slots
    cdef public long long uses
    cdef public bint live


cdef class Plan:
    cdef public object coll, dtype, count, op, root, inplace, algo, program, spec, nbytes
    cdef public object fp, fp_hash, recipe, registered, backend, blocks, ops, rt, detour
    cdef public object code, native, pset, cells
    cdef public bint shared, device, inline, reg_matters
    cdef object __weakref__
