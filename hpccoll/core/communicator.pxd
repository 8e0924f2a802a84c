# The typed form of core/communicator.py (hpccoll/_compiled.py).
from hpccoll.core.state cimport CommState
from hpccoll.core.validate cimport Recent
from hpccoll.engine.task cimport Task


cpdef Task collective(CommState st, Recent recent, default_blocks, check, tuple args, send,
                      recv, a, b, key, blocks)
