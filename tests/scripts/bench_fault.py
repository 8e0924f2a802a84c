"""hpccoll-bench with an injected fault, to test how the benchmark handles one.

    mpiexec -n N python tests/scripts/bench_fault.py corrupt|raise RANK [hpccoll-bench args]

corrupt: on RANK, every hpccoll result gets one element off by one after the collective,
         so the checker must count one wrong element per checked collective;
raise:   on RANK, measuring the third size raises RuntimeError, so the job must abort
         (MPI_Abort) instead of leaving the other ranks waiting.
"""
import sys

from mpi4py import MPI

from hpccoll.bench import cases, cli

mode, target = sys.argv[1], int(sys.argv[2])
me = MPI.COMM_WORLD.Get_rank()
made = [0]

if mode == "corrupt" and me == target:
    _call = cases.Case.call

    def call(self, library, comm):
        run = _call(self, library, comm)
        if library != "hpccoll":
            return run

        def broken():
            run()
            out = self.output(library)
            if out is not None and out.size:
                out[0] += 1
        return broken
    cases.Case.call = call

if mode == "raise" and me == target:
    _init = cases.Case.__init__

    def init(self, *args, **kwargs):
        made[0] += 1
        if made[0] == 5:          # two cases (out of place, in place) per size
            raise RuntimeError(f"injected fault on rank {me}")
        _init(self, *args, **kwargs)
    cases.Case.__init__ = init

sys.exit(cli.main(sys.argv[3:]))
