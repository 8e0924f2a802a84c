"""Measure the calibration: every candidate of every collective at each size, on
communicators of this job's shapes, ordinary and registered buffers.

Candidates are the rows of ``hpccoll.algorithms.TABLE``, MPI's own nonblocking collective
among them; a communicator under measurement is told which one to plan
(``CommState.prefer``) and keeps one plan cache per candidate, so that switching costs no
planning.  Candidates take turns round by round (the machine's noise falls on all alike);
a round times enough back-to-back calls (issue, wait) to last ``round_s``, after a barrier.
A candidate's time is the median over rounds of the slowest rank's time per call (each
round after one untimed call of its own).  The
built-in choice keeps its size unless another candidate is more than ``MARGIN`` faster:
a table should not flip on noise (this VM's run-to-run spread is about that much).
Registered buffers are timed only at the sizes where they could take shared memory;
elsewhere they take the ordinary buffers' pick, so that every size has one.
"""
from __future__ import annotations

import time
from typing import Optional

import numpy as np
from mpi4py import MPI

from .. import algorithms
from ..algorithms.calibration import Calibration
from ..errors import ArgumentError
from ..transport.mpi import library_name

COLLECTIVES = ("allreduce", "reduce", "broadcast", "allgather", "reduce_scatter", "alltoall")
SIZES = (8, 1 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20)
QUICK_SIZES = (8, 16 << 10, 256 << 10, 4 << 20)      # calibration=init
MARGIN = 0.10
# shared memory takes registered buffers without a copy: worth a table of its own
REGISTERED = ("allreduce", "allgather", "reduce_scatter")


def _count(coll: str, nbytes: int, size: int, itemsize: int) -> int:
    per = size if coll in ("allgather", "reduce_scatter", "alltoall") else 1
    return max(1, nbytes // (itemsize * per))


def _issue(comm, coll, send, recv):
    if coll == "allreduce":
        return comm.allreduce(send, recv)
    if coll == "reduce":
        return comm.reduce(send, recv)
    if coll == "broadcast":
        return comm.broadcast(recv)
    if coll == "allgather":
        return comm.allgather(send, recv)
    if coll == "reduce_scatter":
        return comm.reduce_scatter(send, recv)
    return comm.alltoall(send, recv)


def _extents(coll, count, size) -> tuple:
    return (count * (size if coll in ("reduce_scatter", "alltoall") else 1),
            count * (size if coll in ("allgather", "alltoall") else 1))


def _buffers(coll, count, size, reg, rank):
    """Send and receive arrays; ``reg``: registered arrays to take the leading part of
    (the same offsets on every rank, as registered buffers must be)."""
    n_in, n_out = _extents(coll, count, size)
    if reg is not None:
        send, recv = reg[0][:n_in], reg[1][:n_out]
    else:
        send, recv = np.empty(n_in, np.float32), np.empty(n_out, np.float32)
    send[...] = rank + 1
    recv[...] = 0
    return send, recv


class _Timer:
    """One communicator under measurement: its plan caches per candidate."""

    def __init__(self, comm):
        self.comm, self.st = comm, comm._state
        self.caches: dict = {}
        self.builtin_plans = self.st.plans

    def use(self, coll: str, cand: Optional[str]) -> None:
        st = self.st
        st.prefer = {coll: cand} if cand else {}
        st.use_plans(self.caches.setdefault(cand, {}) if cand else self.builtin_plans)

    def algo(self, coll, send, recv) -> str:
        w = _issue(self.comm, coll, send, recv)
        w.wait()
        return w.counters["algo"]

    def time(self, coll, send, recv, iters: int) -> float:
        """Seconds per call of ``iters`` back-to-back calls, after one untimed call: the
        steady state of a size called again and again, not the first call after
        another candidate moved the data."""
        comm = self.comm
        _issue(comm, coll, send, recv).wait()
        self.st.mpi.Barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            _issue(comm, coll, send, recv).wait()
        return (time.perf_counter() - t0) / iters

    def close(self) -> None:
        """Hand every candidate's plans back to the communicator: freeing it frees their
        persistent requests."""
        st = self.st
        st.prefer = {}
        merged = dict(self.builtin_plans)
        for cand, plans in self.caches.items():
            merged.update({(cand,) + tuple(k): p for k, p in plans.items()})
        st.use_plans(merged)


def measure_comm(comm, sizes, collectives, buffers, rounds: int, round_s: float,
                 reg=None, log=None) -> tuple:
    """(picks, times) on ``comm`` (collective over it): see the module's docstring.
    ``reg``: registered float32 arrays (send, receive) large enough for every size, or
    None to measure ordinary buffers only."""
    size, rank = comm.size, comm.rank
    st = comm._state
    shape = st.shape
    sync = st.mpi          # hpccoll's collectives travel on its duplicates, not on this one
    timer = _Timer(comm)
    picks: dict = {}
    times: dict = {}
    host: dict = {}            # (collective, size) -> the ordinary buffers' pick
    try:
        for coll in collectives:
            for kind in buffers:
                if kind == "registered" and (coll not in REGISTERED or reg is None):
                    continue
                for nbytes in sizes:
                    # keyed by the size asked for (a message takes the nearest on a
                    # log scale): one column per size whatever the rank count
                    count = _count(coll, nbytes, size, 4)
                    msg = nbytes
                    send, recv = _buffers(coll, count, size,
                                          reg if kind == "registered" else None, rank)
                    timer.use(coll, None)
                    builtin = timer.algo(coll, send, recv)
                    key = shape + (coll, kind)
                    if kind == "registered" and builtin not in algorithms.SHM_ALGOS:
                        # registered buffers change nothing here (but single copy never
                        # takes them: peers read them in place already)
                        pick = host.get((coll, msg), builtin)
                        picks.setdefault(key, []).append((msg, builtin if pick == "cma" else pick))
                        timer.use(coll, None)
                        continue
                    cands = []
                    for name, _, _ in algorithms.TABLE[coll]:
                        timer.use(coll, name)
                        if timer.algo(coll, send, recv) == name:    # it can run here
                            cands.append(name)
                    one = []
                    for name in cands:      # warm, then one call's time sets the round
                        timer.use(coll, name)
                        one.append(timer.time(coll, send, recv, 1))
                    one = sync.allreduce(max(one), op=_max())
                    iters = int(min(1000, max(1, round_s / max(one, 1e-7))))
                    samples = np.zeros((rounds, len(cands)))
                    for r in range(rounds):
                        for i, name in enumerate(cands):
                            timer.use(coll, name)
                            samples[r, i] = timer.time(coll, send, recv, iters)
                    slowest = np.empty_like(samples)
                    sync.Allreduce(samples, slowest, op=_max())
                    med = np.median(slowest, axis=0)
                    best = cands[int(np.argmin(med))]
                    if builtin in cands and med[cands.index(best)] > (1 - MARGIN) * med[
                            cands.index(builtin)]:
                        best = builtin
                    picks.setdefault(key, []).append((msg, best))
                    if kind == "host":
                        host[(coll, msg)] = best
                    for name, t in zip(cands, med):
                        times[key + (msg, name)] = float(t)
                    if log is not None and rank == 0:
                        log(f"{size} ranks {coll:<15}{kind:<11}{msg:>10} B: {best:<10}"
                            + "  ".join(f"{n} {t * 1e6:.1f}us" for n, t in zip(cands, med)))
                    timer.use(coll, None)
                    del send, recv
    finally:
        timer.close()
    return picks, times


def _max():
    return MPI.MAX


def measure(ctx, sizes=SIZES, collectives=COLLECTIVES, buffers=("host", "registered"),
            ranks=None, rounds: int = 5, round_s: float = 2e-3, log=None) -> Calibration:
    """The calibration of this job (collective over ``ctx.world``): for each rank count
    in ``ranks`` (default: this job's), the first that many ranks measure.  Every rank
    returns the same table."""
    world = ctx.world
    picks: dict = {}
    times: dict = {}
    counts = sorted(set(ranks or (world.size,)))
    if counts[0] < 1 or counts[-1] > world.size:
        raise ArgumentError(f"ranks: expected counts from 1 to {world.size}, got {counts}")
    reg = None
    if "registered" in buffers:
        # registered memory is allocated over the world: once, for every size
        ext = [_extents(c, _count(c, n, world.size, 4), world.size)
               for c in collectives if c in REGISTERED for n in sizes]
        if ext:
            reg = (ctx.empty(max(e[0] for e in ext), np.float32),
                   ctx.empty(max(e[1] for e in ext), np.float32))
    for k in counts:
        sub = world.split(0 if world.rank < k else None, world.rank, name=f"calibrate{k}")
        if sub is not None:
            try:
                p, t = measure_comm(sub, sizes, collectives, buffers, rounds, round_s,
                                    reg if k == world.size else None, log)
            finally:
                sub.free()
            if world.rank == 0:
                picks.update(p)
                times.update(t)
        # ranks left out wait without taking the CPU the measured ones run on (MPICH's
        # blocking collectives spin)
        req = world._state.mpi.Ibarrier()
        while not req.Test():
            time.sleep(1e-3)
    got = ctx._ctl.bcast((picks, times) if world.rank == 0 else None, root=0)
    return Calibration(got[0], got[1], "measured", library_name())
