"""hpccoll-bench's spread and load warnings (hpccoll/bench/load.py): the spread of the
iterations, the verdict on injected readings (a quiet machine cannot be guaranteed on a
shared one), the readings of /proc beside a CPU-bound process this test starts, and the
warning the benchmark prints and records under mpiexec with that process running."""
import contextlib
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from hpccoll import h5log
from hpccoll.bench import load
from hpccoll.bench.load import OTHER_CPU_BOUND, HostLoad, assess
from hpccoll.bench.table import float_str, spread_block
from tests import launch


@contextlib.contextmanager
def burner(seconds: float = 90):
    """A CPU-bound process beside the test, killed when the block ends (and ending by
    itself after ``seconds`` if this process is killed first)."""
    proc = subprocess.Popen([sys.executable, "-c",
                             f"import time\nend = time.time() + {seconds}\n"
                             "while time.time() < end:\n    pass\n"])
    try:
        time.sleep(0.2)                   # running, not starting up
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_spread_is_p10_median_p90():
    t = np.array([5.0, 1.0, 4.0, 2.0, 3.0, 10.0, 6.0, 7.0, 8.0, 9.0])
    assert load.spread(t) == tuple(float(x) for x in np.percentile(t, (10, 50, 90)))
    assert load.spread([3.0]) == (3.0, 3.0, 3.0)
    assert load.spread_ratio(2.0, 5.0) == 2.5 and load.spread_ratio(0.0, 0.0) == 1.0


def quiet_host(**kw):
    base = dict(host="n1", ncpus=2, wall=2.0, job=3.9, busy=4.0, steal=0.0, read=True,
                others=[(77, "sshd", 0.01)])
    base.update(kw)
    return HostLoad(**base)


def test_a_quiet_machine_gets_no_warning():
    spreads = [("hpccoll 8 B out-of-place", 4.0, 5.0), ("hpccoll 1 MiB in-place", 100.0, 180.0)]
    assert assess([quiet_host()], spreads) == []
    assert assess([quiet_host(busy=0.5, job=0.5)], []) == []           # idle ranks, idle CPUs
    assert assess([], []) == []


def test_another_process_on_the_jobs_cpus_is_named():
    h = quiet_host(busy=4.0, job=2.2, others=[(77, "sshd", 0.01), (4242, "stress", 1.7),
                                              (99, "python3", 0.3)])
    (w,) = assess([h], [])
    assert w.startswith("the machine looks loaded: other processes kept 0.90 of the job's 2 "
                        "CPUs busy during the measurement (the job itself 1.10, idle 0.00)")
    assert w.endswith("busiest: pid 4242 (stress) 0.85, pid 99 (python3) 0.15 CPUs")
    assert "sshd" not in w                                              # below 5% of a CPU
    d = h.as_dict()
    assert d["other_cpus"] == 0.9 and d["job_cpus"] == 1.1 and d["ncpus"] == 2
    assert d["idle_cpus"] == 0.0
    assert d["busiest"] == [[4242, "stress", 0.85], [99, "python3", 0.15]]


def test_bounds_and_what_is_not_known():
    just_below = quiet_host(busy=3.9, job=3.41)                          # 0.245 CPUs
    assert assess([just_below], []) == []
    assert len(assess([quiet_host(busy=3.9, job=3.4)], [])) == 1        # 0.25: warns
    # others on a big node with room to spare: 8 CPUs busy, 54 of 64 idle
    assert assess([quiet_host(ncpus=64, busy=20.0, job=4.0)], []) == []
    # ... and on the 2 CPUs of this job, with one of them idle
    assert assess([quiet_host(busy=2.0, job=1.0)], []) == []
    # too short to tell from /proc's 10 ms ticks
    assert assess([quiet_host(wall=0.1, busy=0.2, job=0.16)], []) == []
    # /proc unreadable: nothing is claimed
    assert assess([quiet_host(read=False, busy=4.0, job=0.0)], []) == []


def test_steal_time_and_several_hosts():
    hosts = [quiet_host(), quiet_host(host="n2", busy=3.0, steal=1.0)]
    (w,) = assess(hosts, [])
    assert w == ("the machine looks loaded on n2: the hypervisor took 0.50 of the job's 2 CPUs "
                 "(steal time) during the measurement")


def test_a_noisy_spread_warns_with_the_worst_measurement():
    spreads = [("hpccoll 8 B out-of-place", 4.0, 5.0), ("mpi 8 B out-of-place", 1.0, 7.5),
               ("hpccoll 1 MiB in-place", 100.0, 250.0)]
    (w,) = assess([quiet_host()], spreads)
    assert w == "noisy: p90/p10 above 2 in 2 of 3 measurements (largest 7.5, mpi 8 B out-of-place)"
    assert assess([], spreads, spread_bound=10) == []


def test_spread_block_is_comments_with_the_numbers():
    lines = spread_block([(8, "float", "sum", -1, "hpccoll", [(4.0, 4.5, 5.0), (3.0, 6.0, 9.5)]),
                          (1 << 20, "float", "sum", -1, "mpi", [(100.0, 110.0, 150.0)] * 2)],
                         20, 2.0)
    assert all(ln.startswith("#") for ln in lines)
    assert "Spread over the 20 timed iterations" in lines[1]
    first, second = lines[-2], lines[-1]
    assert first.split() == ["#", "8", "float", "sum", "-1", "hpccoll", "4.00", "4.50", "5.00",
                             "1.25", "3.00", "6.00", "9.50", "3.17", "noisy"]
    assert second.split()[1:6] == ["1048576", "float", "sum", "-1", "mpi"] and "noisy" not in second


class OneRank:
    """The communicator calls Probe makes, for a job of one rank (this process)."""

    def allgather(self, x):
        return [x]

    def gather(self, x, root=0):
        return [x]

    def Barrier(self):
        pass

    def Get_rank(self):
        return 0


def others_besides(host: dict, pid: int) -> float:
    """CPUs other processes than ``pid`` kept busy (the shared machine's other users)."""
    return host["other_cpus"] - sum(c for p, _, c in host["busiest"] if p == pid)


def test_the_probe_sees_a_cpu_bound_process():
    """This process plays a one-rank job that computes (spins) beside the burner: the
    job's CPU is its own, the burner's is other load, and the CPUs are saturated."""
    probe = load.Probe(OneRank())
    with burner() as proc:
        probe.start()
        end = time.process_time() + 1.0
        while time.process_time() < end:
            pass
        (host,) = probe.stop()
    assert host.read and host.ncpus >= 1 and host.wall >= 1.0
    mine = {pid: secs for pid, _, secs in host.others}
    assert mine.get(proc.pid, 0) > 0, host.others           # the burner is other load
    assert 0.9 <= host.job <= host.wall + 0.05               # this process is the job
    (w, *_) = assess([host], [])
    assert w.startswith("the machine looks loaded: other processes kept"), w
    d = host.as_dict()
    if others_besides(d, proc.pid) < OTHER_CPU_BOUND:        # the burner is the load
        assert f"pid {proc.pid} (" in w, w


def test_the_benchmark_warns_beside_a_cpu_bound_process(tmp_path):
    out = tmp_path / "r.h5"
    with burner() as proc:
        # (60 iterations: about half a second measured, 50 of /proc's clock ticks)
        run = launch.run(2, ["-m", "hpccoll.bench", "allreduce", "-b", "8", "-e", "1M", "-f", "4",
                             "-n", "60", "-w", "2", "--compare", "mpi", "--out", str(out)],
                         timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    seen = h5log.read(out)[0].attrs["load"] if out.exists() else None
    assert "# WARNING: the machine looks loaded: other processes kept" in run.stdout, seen
    ranks = {int(p) for p in re.findall(r"^#  Rank +\d+ Group +\d+ Pid +(\d+)", run.stdout, re.M)}
    assert len(ranks) == 2
    (r,) = h5log.read(out)
    (host,) = r.attrs["load"]
    busiest = [pid for pid, _, _ in host["busiest"]]
    assert not ranks & set(busiest), host                   # the ranks are the job
    assert host["other_cpus"] >= 0.25 and host["read"] is True
    if others_besides(host, proc.pid) < OTHER_CPU_BOUND:     # else the machine's other users
        assert proc.pid in busiest, host                     # may outrank the burner
    assert r.attrs["spread_bound"] == 2.0
    assert any(w.startswith("the machine looks loaded") for w in r.attrs["load_warnings"])
    # the warning is printed where nccl-tests readers skip it
    assert all(ln.startswith("#") for ln in run.stdout.splitlines() if "WARNING" in ln)


def test_printed_spread_matches_the_log(tmp_path):
    out = tmp_path / "r.h5"
    run = launch.run(2, ["-m", "hpccoll.bench", "allreduce", "-b", "1K", "-e", "64K", "-f", "8",
                         "-n", "7", "-w", "1", "--compare", "mpi", "--out", str(out)], timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    (r,) = h5log.read(out)
    rows = r.tables["allreduce"]
    start = run.stdout.index("# Spread over the 7 timed iterations")
    block = run.stdout[start:run.stdout.index("# The MPI's own", start)].splitlines()
    printed = [ln.split() for ln in block if re.match(r"#\s+\d+\s", ln)]
    assert len(printed) == 3 * 2                      # sizes x libraries
    for fields in printed:
        size, lib = int(fields[1]), fields[5]
        for k, placement in enumerate(("out-of-place", "in-place")):
            (row,) = [x for x in rows if (x["size"], x["library"], x["placement"]) ==
                      (size, lib, placement)]
            p10, p50, p90 = np.percentile(row["times_us"], (10, 50, 90))
            assert row["p10_us"] == pytest.approx(p10) and row["p90_us"] == pytest.approx(p90)
            assert row["median_us"] == pytest.approx(p50)
            got = fields[6 + 4 * k:10 + 4 * k]
            assert got[:3] == [float_str(v, 8).strip() for v in (p10, p50, p90)]
            assert got[3] == float_str(p90 / p10, 7).strip()
