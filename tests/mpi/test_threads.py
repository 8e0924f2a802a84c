"""Two application threads, each looping blocking collectives on a communicator of its own
(MPI_THREAD_MULTIPLE: how real programs overlap communicators): every result exact, no
completion lost, on the native API and through the mpi4py adapter.  (A completion was
lost in one run of three of 3,000 iterations, and nearly always through the adapter,
before the per-call path had one driver: docs/path.md, "Who touches what".)
``scripts/threads.py`` runs the same loops longer and many times."""
import threading

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
import hpccoll.mpi

pytestmark = pytest.mark.mpi

ITERS = 1500


def _run_threads(bodies) -> None:
    errors = []

    def guarded(body):
        try:
            body()
        except BaseException as exc:     # reported on the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a thread never finished"
    assert not errors, errors


@pytest.mark.parametrize("count", [1, 3000])
def test_two_threads_two_communicators_native(count):
    with hpccoll.init(timeout=30) as ctx:
        comms = [ctx.world.dup(name=f"t{i}") for i in range(2)]
        n = ctx.size

        def body(i):
            def loop():
                x = np.full(count, i + 1, np.int64)
                out = np.empty_like(x)
                for k in range(ITERS):
                    comms[i].allreduce(x, out).wait()
                    if out[0] != (i + 1) * n or out[-1] != (i + 1) * n:
                        raise AssertionError(f"thread {i} iteration {k}: {out[:3]}")
            return loop
        _run_threads([body(0), body(1)])
        for c in comms:
            c.free()


def test_two_threads_two_communicators_adapter():
    comm = hpccoll.mpi.Comm(MPI.COMM_WORLD, timeout=30)
    try:
        dups = [comm.Dup() for _ in range(2)]
        n = comm.size

        def body(i):
            def loop():
                x = np.full(1, i + 1, np.int64)
                out = np.empty_like(x)
                for k in range(ITERS):
                    dups[i].Allreduce(x, out, op=MPI.SUM)
                    if out[0] != (i + 1) * n:
                        raise AssertionError(f"thread {i} iteration {k}: {out}")
            return loop
        _run_threads([body(0), body(1)])
        for d in dups:
            d.Free()
    finally:
        comm.context.close()
