# The typed form of core/state.py (hpccoll/_compiled.py).
cimport cython

from hpccoll.base.mismatch cimport Ledger
from hpccoll.core.plan cimport Plan, PersistentSet
from hpccoll.engine.engine cimport Engine
from hpccoll.core.validate cimport Call
from hpccoll.engine.lane cimport buffer_addresses, cell_lane, mpi_lane
from hpccoll.engine.program cimport program_lane
from hpccoll.engine.task cimport Task, new as new_task, started


cpdef object addresses(Call call)


cdef class CommState:
    cdef public Engine engine
    cdef public object ctx, name, uid, lock, broken, unreported, last, limit_error
    cdef public object live_keys, key_uses, plans, persist, orphans, prefer, pool
    cdef public Ledger ledger
    cdef public object shm, gate, data, mpi, world_ranks, shape, check, plans_token
    cdef public object _acquire, _release
    cdef public bint freed, ok, failed_child
    cdef public long long seq, rank, size, tag_space, limit, cell_seq
    cdef public double noted_at

    @cython.locals(seq="long long", tag="long long", gated=bint, task=Task)
    cpdef Task issue(self, Call call, key=*, blocks=*)
    cpdef Plan _plan(self, Call call, bint keyed, blocks)
    @cython.locals(pset=PersistentSet)
    cpdef object _lane(self, Plan plan, Call call, long long tag)
