"""The waiter follows the machine's load (engine/progress.py crowded, Engine._look_around):
with more runnable threads than CPUs it yields instead of spinning, as on a node whose
ranks outnumber its cores; back to spinning once the machine is calm; settings set
explicitly are left alone.  (Speed under load: scripts/bench_load.py.)"""
import time

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
from hpccoll.engine import progress


def late_allreduce(ctx, n=4):
    """A collective the first polls cannot end on rank 0: rank 1 comes 20 ms late."""
    if ctx.rank == 1:
        time.sleep(0.02)
    x = np.arange(n, dtype=np.int64) + ctx.rank
    want = ctx.size * np.arange(n, dtype=np.int64) + sum(range(ctx.size))
    np.testing.assert_array_equal(ctx.world.allreduce(x).wait(timeout=30), want)


@pytest.mark.mpi(min_size=2)
def test_a_crowded_machine_turns_spinning_into_yielding_and_back(monkeypatch):
    with hpccoll.init(timeout=30) as ctx:
        engine = ctx._engine
        if ctx.oversubscribed:
            pytest.skip("ranks outnumber cores here: the waiter yields from the start")
        calm = (engine.spin_polls, engine.spin_us, engine.yield_polls)
        assert calm == (ctx.settings.spin_polls, ctx.settings.spin_us,
                        ctx.settings.yield_polls)
        monkeypatch.setattr(progress, "crowded", lambda: True)
        time.sleep(progress.CROWD_EVERY_S)
        for _ in range(3):
            late_allreduce(ctx)
        if ctx.rank == 0:
            assert engine.crowded
            assert (engine.spin_polls, engine.spin_us, engine.yield_polls) == progress.YIELDING
        monkeypatch.setattr(progress, "crowded", lambda: False)
        time.sleep(progress.CROWD_EVERY_S)
        for n in (4, 70_001):
            late_allreduce(ctx, n)
        if ctx.rank == 0:
            assert not engine.crowded
            assert (engine.spin_polls, engine.spin_us, engine.yield_polls) == calm


@pytest.mark.mpi(min_size=2)
def test_waiting_set_explicitly_does_not_follow_the_load(monkeypatch):
    monkeypatch.setattr(progress, "crowded", lambda: True)
    with hpccoll.init(timeout=30, spin_us=300.0) as ctx:
        for _ in range(3):
            late_allreduce(ctx)
        assert not ctx._engine.crowded and ctx._engine.spin_us == 300.0


def test_crowded_reads_the_kernels_run_queue():
    """More CPU-bound processes than CPUs: the machine is crowded."""
    import os
    import subprocess
    import sys
    if MPI.COMM_WORLD.Get_size() > 1:
        pytest.skip("one rank is enough (and the others would crowd it too)")
    n = (os.cpu_count() or 1) + 2
    burners = [subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()+5\n"
                                 "while time.time() < t: pass"]) for _ in range(n)]
    try:
        deadline = time.monotonic() + 4
        while not progress.crowded():
            assert time.monotonic() < deadline, "never crowded with CPUs + 2 burners"
            time.sleep(0.01)
    finally:
        for b in burners:
            b.kill()
            b.wait()
