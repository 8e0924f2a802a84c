# The typed form of base/mismatch.py (hpccoll/_compiled.py).
cdef class Ledger:
    cdef public object fps, digests, digest, pending
    cdef public long long every, window, seq, noted, agreed

    cpdef object record(self, long long seq, object fp, object h)
