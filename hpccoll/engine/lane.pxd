# The typed form of engine/lane.py (hpccoll/_compiled.py).
cdef class Lane:
    pass


cdef class MpiLane(Lane):
    cdef public object recipe, send, recv, req, slot
    cdef public bint done
