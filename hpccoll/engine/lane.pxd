# The typed form of engine/lane.py (hpccoll/_compiled.py).


cdef class Lane:
    # what the engine and a task read of every lane at every call: fields, not class
    # attributes (each of those a generic attribute lookup, ~100 instructions)
    cdef public bint needs_slot, at_issue, late_post, mpi_posted, done
    cdef public object holds

    # the calls every collective makes of its lane, dispatched in C (a Python subclass,
    # ProgramLane or CheckLane, overrides them as usual)
    cpdef bint startable(self) except -1
    cpdef start(self)
    cpdef bint run(self) except -1
    cpdef release(self)


cdef class OneWait(Lane):
    pass


cdef class MpiLane(OneWait):
    cdef public object recipe, send, recv, req, slot, scratch
    cdef public bint tested

    cpdef bint startable(self) except -1
    cpdef start(self)
    cpdef bint run(self) except -1
    cpdef release(self)


cdef class CellLane(OneWait):
    cdef public object layout, seq, send, recv, src, dst
    cdef public bint posted

    cpdef start(self)
    cpdef bint finish(self) except -1
    cpdef bint run(self) except -1
    cpdef release(self)


cpdef lane_fields(Lane lane, bint needs_slot, bint at_issue, bint late_post=*)
cpdef MpiLane mpi_setup(MpiLane lane, recipe, send, recv, slot)
cpdef MpiLane mpi_lane(recipe, send, recv, slot=*)
cpdef CellLane cell_setup(CellLane lane, layout, seq, send, recv, addrs)
cpdef CellLane cell_lane(layout, seq, send, recv, addrs=*)
cpdef tuple buffer_addresses(send, recv)
