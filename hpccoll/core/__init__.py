"""hpccoll's core: one pipeline for every collective.

    Communicator.allreduce(x) -> validate (once) -> plan (cached per signature)
        -> issue (the communicator's state: name, fingerprint, lane, task)
        -> start now on the calling thread, or queue for the engine
        -> progress (hpccoll/engine) -> complete (Work)

Modules: ``context`` (Context, init), ``communicator`` (the public methods), ``state``
(a communicator's matching state, one owner), ``validate`` (arguments -> Call),
``plan`` (algorithm, program, fingerprint, lane kind, cached), ``ops`` (the one table of
dtypes and reduction ops), ``mismatch`` (fingerprints, the ledger, verdicts), ``work``,
``device`` (device arrays), ``pool`` (scratch buffers).
"""
