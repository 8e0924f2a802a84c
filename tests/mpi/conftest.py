"""Fixtures for tests that run under mpiexec (``mpiexec -n N python -m pytest --with-mpi tests/mpi``).

Every rank runs the same tests in the same order.  Expected values are computed from
the number of ranks and the MPI library's own collectives, never hard-coded.
"""
import os

import pytest

import hpccoll

POLICY = os.environ.get("HPCCOLL_TEST_POLICY") or None


@pytest.fixture(scope="session")
def ctx():
    c = hpccoll.init(policy=POLICY, timeout=60)
    yield c
    c.close()


@pytest.fixture(scope="session")
def mpi_world():
    from mpi4py import MPI
    return MPI.COMM_WORLD


@pytest.fixture(scope="module")
def adapter():
    """An mpi4py-compatible communicator on hpccoll (hpccoll.mpi.Comm), for the adapter tests."""
    import hpccoll.mpi
    from mpi4py import MPI
    comm = hpccoll.mpi.Comm(MPI.COMM_WORLD, policy=POLICY, timeout=60)
    yield comm
    comm.context.close()


@pytest.fixture(scope="module")
def world():
    """A private duplicate of MPI.COMM_WORLD: the mpi4py side of the adapter tests."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD.Dup()
    yield comm
    comm.Free()


@pytest.fixture
def comm(ctx):
    """A fresh duplicate per test, so that a test that breaks its communicator (mismatch)
    cannot affect the next one."""
    c = ctx.world.dup(name="test")
    yield c
    if c.broken is None:
        c.free()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """All ranks agree on each test's outcome: a test that failed on any rank fails on
    every rank, and rank 0's report quotes the other ranks' failures.  Keeps the ranks
    in step after a failure instead of drifting into a hang."""
    outcome = yield
    rep = outcome.get_result()
    if rep.when != "call":
        return
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    mine = rep.longreprtext[-3000:] if rep.failed else ""
    texts = world.allgather(mine)
    others = [(r, t) for r, t in enumerate(texts) if t and r != world.rank]
    if others:
        note = "\n".join(f"---- failed on rank {r} ----\n{t}" for r, t in others)
        if rep.failed:
            rep.sections.append(("other ranks", note))
        else:
            rep.outcome = "failed"
            rep.longrepr = note
