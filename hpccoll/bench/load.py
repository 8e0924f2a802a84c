"""Does the machine look loaded?  hpccoll-bench's numbers mean little when another
process shares the job's CPUs (on a 2-core VM one CPU-bound process made a 1 MiB
allreduce 6x slower for a whole run), so the benchmark says so, naming what it saw.

Two signs, each with its bound:
- CPU time that is not the job's on the job's CPUs: per host, the busy time of the CPUs
  the ranks may run on (/proc/stat), less the CPU time of the ranks themselves, over the
  measurement; above OTHER_CPU_BOUND CPUs on average, while those CPUs had less than
  IDLE_BOUND of a CPU idle (others on a big node with room to spare take nothing from the
  job), it warns, naming the processes that ran there the most (/proc/PID/stat).  Time
  the hypervisor took from a VM (steal) counts alike and is named apart;
- the spread of the iterations: p90/p10 of a measurement above SPREAD_BOUND.

Readings come from /proc (Linux); where it cannot be read the CPU check is skipped.
``assess`` is the verdict alone, on readings given to it (tests inject them).
"""
from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

SPREAD_BOUND = 2.0        # p90/p10 of one measurement's iterations
OTHER_CPU_BOUND = 0.25    # CPUs (average over the measurement) busy with what is not the job
IDLE_BOUND = 0.5          # ... counts while the job's CPUs had less than this idle
MIN_OTHER_SECONDS = 0.05  # below this, the clock ticks of /proc are too coarse to tell
SHOW_PROCESS_CPU = 0.05   # processes named in a warning: at least this share of a CPU
_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def spread(times_us) -> tuple[float, float, float]:
    """(p10, median, p90) of one measurement's iteration times."""
    t = np.asarray(times_us, dtype=np.float64)
    p10, p50, p90 = np.percentile(t, (10, 50, 90))
    return float(p10), float(p50), float(p90)


def spread_ratio(p10: float, p90: float) -> float:
    return p90 / p10 if p10 > 0 else float("inf") if p90 > 0 else 1.0


# -- readings -----------------------------------------------------------------------------
def _cpu_times(cpus) -> Optional[tuple[float, float]]:
    """(busy, steal) seconds so far of the CPUs ``cpus``, from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            lines = f.readlines()
    except OSError:
        return None
    busy = steal = 0
    for ln in lines:
        name, *vals = ln.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        v = [int(x) for x in vals] + [0] * 8
        # user nice system idle iowait irq softirq steal (guest time is inside user)
        busy += v[0] + v[1] + v[2] + v[5] + v[6]
        steal += v[7]
    return busy / _HZ, steal / _HZ


def _processes() -> dict:
    """{pid: (name, CPU seconds, the CPU it last ran on)} of every process readable."""
    out = {}
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return out
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                text = f.read()
        except OSError:
            continue          # gone meanwhile
        head, _, rest = text.rpartition(")")
        name = head.partition("(")[2]
        fields = rest.split()
        # after the name: state is field 3 of the man page; utime 14, stime 15, processor 39
        try:
            out[pid] = (name, (int(fields[11]) + int(fields[12])) / _HZ, int(fields[36]))
        except (IndexError, ValueError):
            continue
    return out


@dataclass
class Snapshot:
    """One rank's readings at one moment; ``host`` readings (CPU times, processes) only
    on the rank that reads them for its host."""
    t: float
    own: float                              # this process's CPU seconds (all threads)
    cpu: Optional[tuple] = None             # (busy, steal) seconds of the job's CPUs
    procs: dict = field(default_factory=dict)


def snapshot(cpus, host_reader: bool) -> Snapshot:
    t = os.times()
    snap = Snapshot(time.monotonic(), t.user + t.system)
    if host_reader:
        snap.cpu = _cpu_times(cpus)
        snap.procs = _processes()
    return snap


class Probe:
    """Readings over one measurement on every rank: ``start()`` and ``stop()`` on every
    rank (both collective over ``mpi``); ``stop`` returns, on rank 0, the readings per
    host (HostLoad list), None elsewhere."""

    def __init__(self, mpi):
        self.mpi = mpi
        try:
            cpus = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = []
        me = (socket.gethostname(), os.getpid(), cpus)
        everyone = mpi.allgather(me)
        rank = mpi.Get_rank()
        self.host = me[0]
        self.job_pids = {pid for host, pid, _ in everyone if host == me[0]}
        self.cpus = sorted({c for host, _, cs in everyone if host == me[0] for c in cs})
        # the lowest rank of each host reads the host's CPU times and processes
        self.reader = next(r for r, e in enumerate(everyone) if e[0] == me[0]) == rank
        self._start: Optional[Snapshot] = None

    def start(self) -> None:
        self.mpi.Barrier()
        self._start = snapshot(set(self.cpus), self.reader)

    def stop(self):
        end = snapshot(set(self.cpus), self.reader)
        a = self._start
        own = end.own - a.own
        host = None
        if self.reader and a.cpu is not None and end.cpu is not None:
            others = []
            for pid, (name, secs, cpu) in end.procs.items():
                if pid in self.job_pids or cpu not in self.cpus:
                    continue
                before = a.procs.get(pid, (name, 0.0, cpu))[1]
                others.append((pid, name, secs - before))
            host = dict(busy=end.cpu[0] - a.cpu[0], steal=end.cpu[1] - a.cpu[1], others=others)
        gathered = self.mpi.gather((self.host, len(self.cpus), end.t - a.t, own, host), root=0)
        if gathered is None:
            return None
        loads = {}
        for name, ncpus, wall, own_s, h in gathered:
            load = loads.setdefault(name, HostLoad(name, ncpus))
            load.wall = max(load.wall, wall)
            load.job += own_s
            if h is not None:
                load.busy, load.steal, load.others = h["busy"], h["steal"], h["others"]
                load.read = True
        return list(loads.values())


@dataclass
class HostLoad:
    """What one host's CPUs did during the measurement, in CPU seconds."""
    host: str
    ncpus: int
    wall: float = 0.0
    job: float = 0.0                        # the ranks' own CPU time
    busy: float = 0.0                       # the job's CPUs, busy
    steal: float = 0.0                      # the job's CPUs, taken by the hypervisor
    others: list = field(default_factory=list)   # (pid, name, CPU seconds) ran there
    read: bool = False                      # /proc was read (else nothing is known)

    @property
    def other(self) -> float:
        """CPU seconds on the job's CPUs that were not the job's."""
        return max(0.0, self.busy - self.job)

    @property
    def idle(self) -> float:
        """CPUs of the job's left idle, on average over the measurement."""
        return max(0.0, self.ncpus - (self.busy + self.steal) / self.wall) if self.wall > 0 else 0.0

    def as_dict(self) -> dict:
        wall = self.wall or 1.0
        busiest = sorted(self.others, key=lambda o: -o[2])
        return {"host": self.host, "ncpus": self.ncpus, "wall_s": round(self.wall, 3),
                "job_cpus": round(self.job / wall, 3), "other_cpus": round(self.other / wall, 3),
                "steal_cpus": round(self.steal / wall, 3), "idle_cpus": round(self.idle, 3),
                "read": self.read,
                "busiest": [[pid, name, round(s / wall, 3)] for pid, name, s in busiest[:8]
                            if s / wall >= SHOW_PROCESS_CPU]}


# -- the verdict --------------------------------------------------------------------------
def assess(hosts: list, spreads: list, spread_bound: float = SPREAD_BOUND,
           other_bound: float = OTHER_CPU_BOUND) -> list[str]:
    """Warnings (empty: nothing seen).  ``hosts``: HostLoad per host; ``spreads``: (what,
    p10, p90) per measurement, ``what`` naming it (size, placement, library)."""
    out = []
    many = len(hosts) > 1
    for h in hosts:
        if not h.read or h.wall <= 0:
            continue
        where = f" on {h.host}" if many else ""
        other, steal = h.other / h.wall, h.steal / h.wall
        saturated = h.idle < IDLE_BOUND
        if other >= other_bound and h.other >= MIN_OTHER_SECONDS and saturated:
            named = [f"pid {pid} ({name}) {s / h.wall:.2f}" for pid, name, s in
                     sorted(h.others, key=lambda o: -o[2])[:3] if s / h.wall >= SHOW_PROCESS_CPU]
            out.append(f"the machine looks loaded{where}: other processes kept {other:.2f} of "
                       f"the job's {h.ncpus} CPUs busy during the measurement (the job itself "
                       f"{h.job / h.wall:.2f}, idle {h.idle:.2f})"
                       + (f"; busiest: {', '.join(named)} CPUs" if named else ""))
        if steal >= other_bound and h.steal >= MIN_OTHER_SECONDS and saturated:
            out.append(f"the machine looks loaded{where}: the hypervisor took {steal:.2f} of "
                       f"the job's {h.ncpus} CPUs (steal time) during the measurement")
    noisy = [(spread_ratio(p10, p90), what) for what, p10, p90 in spreads
             if spread_ratio(p10, p90) > spread_bound]
    if noisy:
        worst = max(noisy)
        out.append(f"noisy: p90/p10 above {spread_bound:g} in {len(noisy)} of {len(spreads)} "
                   f"measurements (largest {worst[0]:.1f}, {worst[1]})")
    return out
