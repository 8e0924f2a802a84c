"""A collective tool with a fault injected on one rank, to test that the other ranks
learn of it instead of waiting forever.

    mpiexec -n N python tests/scripts/tool_fault.py WHERE RANK [tool args]

WHERE: profile-early  hpccoll-tune profile; RANK fails before its first timed collective
                      (the others wait in it: the job must be aborted);
       profile-late   hpccoll-tune profile; RANK fails after measuring (every rank reaches
                      the agreement: all exit 2 with one message naming RANK);
       chaos          python -m hpccoll.chaos; RANK fails in iteration 1 of the scenario;
       demo           python -m hpccoll.demo; RANK fails setting up its second case.
"""
import sys

from mpi4py import MPI

where, target = sys.argv[1], int(sys.argv[2])
argv = sys.argv[3:]
me = MPI.COMM_WORLD.Get_rank()


def fail(*_args, **_kwargs):
    raise RuntimeError(f"injected fault on rank {me}")


if where.startswith("profile"):
    from hpccoll.tuning import cli, profiler
    if me == target and where == "profile-early":
        profiler.comm_times = fail
    if me == target and where == "profile-late":
        _measure = profiler.measure

        def measure(*args, **kwargs):
            _measure(*args, **kwargs)
            fail()
        profiler.measure = measure
    sys.exit(cli.main(["profile"] + argv))

if where == "chaos":
    from hpccoll import chaos
    _iteration = chaos.Abba.iteration

    def iteration(self, it):
        if me == target and it == 1:
            fail()
        return _iteration(self, it)
    chaos.Abba.iteration = iteration
    sys.exit(chaos.main(["abba"] + argv))

if where == "demo":
    from hpccoll import demo
    _case = demo._case
    made = [0]

    def case(*args, **kwargs):
        made[0] += 1
        if me == target and made[0] == 2:
            fail()
        return _case(*args, **kwargs)
    demo._case = case
    sys.exit(demo.main(argv))
sys.exit(f"unknown WHERE {where!r}")
