# The typed form of base/mismatch.py (hpccoll/_compiled.py).
# the digest's constants as C integers: one record is C arithmetic (wrapping at 2**64 and
# masked to 62 bits, which is what Python's exact arithmetic masked to 62 bits gives)
cdef unsigned long long MASK, _MIX


cdef class Ledger:
    cdef public list fps, digests
    cdef public object pending
    cdef public unsigned long long digest
    cdef public long long every, window, seq, noted, agreed

    cpdef object record(self, long long seq, object fp, unsigned long long h)
