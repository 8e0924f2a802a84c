"""Compiled shared-memory programs (engine/code.py) against the interpreter and NumPy.

Every rank's ProgramLane runs in this one process over one real node-shared area (a file
in /dev/shm, mapped once per simulated rank, as transport/shm.py maps it), in random
interleavings of ``run()`` calls: a compiled lane must leave the same bits as the
interpreted one, integers exact against NumPy, whatever the order the ranks move in."""
import os
import tempfile

import numpy as np
import pytest

from hpccoll.algorithms import shm
from hpccoll.algorithms.primitives import CONSUMED, READY, RECV, REDUCED, SEND, scratch_extent
from hpccoll.algorithms.spec import Spec
from hpccoll.engine import code
from hpccoll.engine.lane import ProgramLane, Shm
from hpccoll.engine.reduction import HostOps
from hpccoll.transport.shm import FLAG_STRIDE, ShmArea, segment_bytes

SLOT_BYTES = 256


class Program:
    def __init__(self, steps):
        self.steps = tuple(steps)
        self.scratch = scratch_extent(self.steps)


def areas(n, slots):
    fd, path = tempfile.mkstemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        os.ftruncate(fd, segment_bytes(SLOT_BYTES, slots) * n)
        made = [ShmArea(path, None, r, n, SLOT_BYTES, slots, lambda: None) for r in range(n)]
    finally:
        os.close(fd)
        os.unlink(path)
    for a in made:      # garbage in the slots: a result that reads stale data is wrong
        for q in range(n):
            for i in range(slots):
                a.slot(q, i)[:] = 0x5A
    return made


def run_all(fn, specs, bufs, op, dtype, compiled, seed, base=0, registered=False):
    """Every rank's lane to its end, in a random interleaving; returns the lanes."""
    n = len(specs)
    slots = specs[0].slots
    made = areas(n, slots)
    for r, area in enumerate(made):     # as the collectives before this one left them
        for flag in (READY, REDUCED, CONSUMED):
            area.flags[r][flag * FLAG_STRIDE] = base
    lanes = []
    for r, spec in enumerate(specs):
        program = Program(fn(spec))
        peer_send = [b[SEND] for b in bufs] if registered else None
        peer_recv = [b[RECV] for b in bufs] if registered else None
        rt = Shm(made[r], tuple(range(n)), peer_send, peer_recv)
        scratch = np.empty(program.scratch, dtype)
        lane = ProgramLane(program, [bufs[r][SEND], bufs[r][RECV], scratch], op, None, 0,
                           HostOps)
        lane.shm, lane.base = rt, base
        if compiled:
            lane.code = code.build(program, rt, np.dtype(dtype), op)
            assert lane.code is not None
        lanes.append(lane)
    rng = np.random.default_rng(seed)
    for _ in range(100_000):
        left = [lane for lane in lanes if not lane.done]
        if not left:
            return lanes
        left[rng.integers(len(left))].run()
    raise AssertionError("the lanes did not finish: a wait that never holds")


def both(fn, make_specs, make_bufs, op, dtype, seed, **kw):
    """(compiled buffers, interpreted buffers) of the same collective and inputs."""
    out = []
    for compiled in (True, False):
        bufs = make_bufs()
        run_all(fn, make_specs(), bufs, op, dtype, compiled, seed, **kw)
        out.append(bufs)
    return out


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("op,dtype", [("sum", np.int64), ("max", np.int32),
                                      ("sum", np.float16), ("avg", np.float32)])
@pytest.mark.parametrize("registered", [False, True])
def test_allreduce(n, op, dtype, registered):
    """One chunk and more chunks than slots; the float16 sum and avg take the generic
    reduction (accumulator, divisor), the others the ufunc chain."""
    itemsize = np.dtype(dtype).itemsize
    for count, seed in [(1, 0), (23, 1), (9 * SLOT_BYTES // itemsize + 5, 2)]:
        chunk = SLOT_BYTES // itemsize
        rng = np.random.default_rng(seed)
        xs = [rng.integers(-5, 6, count).astype(dtype) for _ in range(n)]
        specs = lambda: [Spec("allreduce", r, n, count, chunk=chunk, slots=2, avg=op == "avg",
                              registered=registered) for r in range(n)]
        bufs = lambda: [[x.copy(), np.full(count, 99, dtype), None] for x in xs]
        mine, ref = both(shm.allreduce, specs, bufs, op, dtype, seed, base=4,
                         registered=registered)
        for r in range(n):
            assert mine[r][RECV].tobytes() == ref[r][RECV].tobytes()
            assert mine[r][RECV].tobytes() == mine[0][RECV].tobytes()
            np.testing.assert_array_equal(mine[r][SEND], xs[r])
        if np.issubdtype(dtype, np.integer):
            want = np.sum(xs, axis=0) if op == "sum" else np.max(xs, axis=0)
            np.testing.assert_array_equal(mine[0][RECV], want)
        else:
            want = np.mean(xs, axis=0) if op == "avg" else np.sum(xs, axis=0)
            np.testing.assert_allclose(mine[0][RECV].astype(np.float64), want, rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_reduce_broadcast_allgather_reduce_scatter(n):
    rng = np.random.default_rng(n)
    count, chunk = 50, 8
    xs = [rng.integers(-5, 6, n * count).astype(np.int64) for _ in range(n)]
    for root in range(n):
        specs = lambda: [Spec("reduce", r, n, count, chunk=chunk, root=root) for r in range(n)]
        bufs = lambda: [[x[:count].copy(), np.full(count, 99, np.int64), None] for x in xs]
        mine, ref = both(shm.reduce, specs, bufs, "sum", np.int64, root)
        np.testing.assert_array_equal(mine[root][RECV], np.sum([x[:count] for x in xs], axis=0))
        np.testing.assert_array_equal(mine[root][RECV], ref[root][RECV])

        specs = lambda: [Spec("broadcast", r, n, count, chunk=chunk, root=root)
                         for r in range(n)]

        def bcast_bufs():
            out = []
            for r, x in enumerate(xs):
                b = x[:count].copy() if r == root else np.full(count, 99, np.int64)
                out.append([b, b, None])
            return out
        mine, _ = both(shm.broadcast, specs, bcast_bufs, None, np.int64, root)
        for r in range(n):
            np.testing.assert_array_equal(mine[r][RECV], xs[root][:count])

    for registered in (False, True):
        specs = lambda: [Spec("allgather", r, n, count, chunk=chunk, registered=registered)
                         for r in range(n)]
        bufs = lambda: [[x[:count].copy(), np.full(n * count, 99, np.int64), None] for x in xs]
        mine, _ = both(shm.allgather, specs, bufs, None, np.int64, 3, registered=registered)
        for r in range(n):
            np.testing.assert_array_equal(mine[r][RECV], np.concatenate([x[:count] for x in xs]))

        specs = lambda: [Spec("reduce_scatter", r, n, count, chunk=chunk, registered=registered)
                         for r in range(n)]
        bufs = lambda: [[x.copy(), np.full(count, 99, np.int64), None] for x in xs]
        mine, _ = both(shm.reduce_scatter, specs, bufs, "sum", np.int64, 4,
                       registered=registered)
        total = np.sum(xs, axis=0)
        for r in range(n):
            np.testing.assert_array_equal(mine[r][RECV], total[r * count:(r + 1) * count])


def test_programs_with_mpi_transfers_are_interpreted():
    """A hierarchical program posts MPI transfers between nodes: build() leaves it to the
    interpreter."""
    spec = Spec("allreduce", 0, 4, 64, chunk=16, local=(0, 1), cross=(0, 2))
    made = areas(2, 2)
    program = Program(shm.allreduce_hier(spec))
    assert code.build(program, Shm(made[0], (0, 1)), np.dtype(np.int64), "sum") is None
