"""The MPI's own collectives timed from C (hpccoll/bench/floor.py): built and run with the
MPI at hand, from a job of its own and from inside one."""
import math
import subprocess
import sys

from hpccoll import launch
from hpccoll.bench import floor
from tests import launch as tests_launch

CASES = [floor.case("allreduce", 2), floor.case("broadcast", 2, root=1), floor.case("barrier", 0),
         floor.case("alltoall", 1024), floor.case("reduce_scatter", 256, "float32", "avg")]


def expected_source() -> str:
    return "C (mpicc)" if launch.tool("mpicc") else "IMB-MPI1"


def test_cases_are_normalized():
    assert floor.case("barrier", 64, "int8", "max", 3) == ("barrier", 0, "int8", "sum", 0)
    assert floor.case("reduce_scatter", 8, op="avg") == ("reduce_scatter", 8, "float32", "sum", 0)
    assert floor.case("reduce", 8, "int32", "max", 1) == ("reduce", 8, "int32", "max", 1)


def test_measured_at_both_thread_levels():
    got = floor.measure(2, CASES, iters=20, warmup=2, timeout=120)
    assert got.source == expected_source(), got.note
    for level in floor.LEVELS:
        for c in CASES:
            t = got.get(c, level)
            assert math.isfinite(t) and 0 < t < 1e5, (level, c, t)


def test_from_inside_a_job_every_rank_gets_it():
    """Rank 0 starts the floor job while the others wait; the command line tool prints it."""
    proc = tests_launch.run(2, ["-c", (
        "from mpi4py import MPI\n"
        "from hpccoll.bench import floor\n"
        "got = floor.in_job(MPI.COMM_WORLD, [floor.case('allreduce', 4)], iters=10, warmup=1)\n"
        "assert got.source, got.note\n"
        "print('rank', MPI.COMM_WORLD.rank, got.source, got.get(floor.case('allreduce', 4)))\n")],
        timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = sorted(ln for ln in proc.stdout.splitlines() if ln.startswith("rank"))
    assert len(lines) == 2 and lines[0].split()[2:] == lines[1].split()[2:], proc.stdout


def test_command_line():
    out = subprocess.run([sys.executable, "-m", "hpccoll.bench.floor", "2", "allreduce:8"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"from C: {expected_source()}" in out.stdout
    row = out.stdout.splitlines()[-1].split()
    assert row[:5] == ["allreduce", "8", "float32", "sum", "0"] and len(row) == 7


IMB_TEXT = """\
#----------------------------------------------------------------
# Benchmarking Allreduce
# #processes = 2
#----------------------------------------------------------------
       #bytes #repetitions  t_min[usec]  t_max[usec]  t_avg[usec]
            8          200         0.24         0.26         0.25
        65536          200         8.10         8.90         8.50

#---------------------------------------------------
# Benchmarking Barrier
# #processes = 2
#---------------------------------------------------
 #repetitions  t_min[usec]  t_max[usec]  t_avg[usec]
          200         0.18         0.21         0.19
"""


def test_imb_tables_are_read_as_the_slowest_rank():
    assert floor._parse_imb(IMB_TEXT) == {("Allreduce", 8): 0.26, ("Allreduce", 65536): 8.90,
                                          ("Barrier", None): 0.21}
    # IMB's reduce_scatter size is the whole vector
    assert floor._imb_bytes(floor.case("reduce_scatter", 256), 4) == 256 * 4 * 4


def test_no_compiler_wrapper_nor_imb_is_a_note(monkeypatch):
    monkeypatch.setattr(launch, "tool", lambda name: None)
    got = floor.measure(2, CASES[:1])
    assert not got.source and "no mpicc" in got.note and "IMB-MPI1" in got.note
    assert math.isnan(got.get(CASES[0]))


def test_every_collective_runs():
    every = [floor.case(coll, 16, root=1) for coll in floor.COLLS]
    got = floor.measure(2, every, iters=5, warmup=1, timeout=120)
    assert all(math.isfinite(got.get(c, level)) for c in every for level in floor.LEVELS), got
