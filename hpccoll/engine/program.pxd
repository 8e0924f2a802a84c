# The typed form of engine/program.py (hpccoll/_compiled.py).
from hpccoll.engine.lane cimport Lane, lane_fields


cdef class ProgramLane(Lane):
    # (a waiter polls every started program on each pass: its fields are read in C)
    cdef public object program, code, native, bufs, _bytes, op, mpi, tag, ops
    cdef public object inflight, waiting, shm, pool, _pooled, addrs
    cdef public long long itemsize, pc, waits_done, bytes_moved, base

    cpdef start(self)
    cpdef bint run(self) except -1
    cpdef release(self)


cpdef ProgramLane program_setup(ProgramLane lane, program, code, bufs, op, mpi_comm, tag, ops,
                                shm, native)
cpdef ProgramLane program_lane(program, code, bufs, op, mpi_comm, tag, ops, shm=*, native=*)
