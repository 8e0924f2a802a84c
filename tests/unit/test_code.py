"""Shared-memory programs run by both executors of engine/code.py's instructions (Python's
``code.run`` and the C executor) against the step simulator and NumPy.

Every rank's ProgramLane runs in this one process over one real node-shared area (a file
in /dev/shm, mapped once per simulated rank, as transport/shm.py maps it), in random
interleavings of ``run()`` calls: either executor must leave the same bits as the step
simulator (tests/stepsim.py: the primitives' reference semantics), integers exact against
NumPy, whatever the order the ranks move in."""
import contextlib
import os
import tempfile

import numpy as np
import pytest

from hpccoll.algorithms import shm
from hpccoll.algorithms.primitives import (CONSUMED, READY, RECV, REDUCED, SEND, WaitFlags,
                                           scratch_extent)
from hpccoll.algorithms.spec import Spec
from hpccoll.engine import code
from hpccoll.engine.program import ProgramLane, Shm
from hpccoll.transport.reduction import HostOps
from tests import stepsim
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


NATIVE_REQUIRED = os.environ.get("HPCCOLL_REQUIRE_NATIVE") == "1"


def need_native() -> None:
    """Skip where the C executor is not built, fail where it must be (CI builds it and
    sets HPCCOLL_REQUIRE_NATIVE=1, so there it cannot be skipped)."""
    if code._native is None:
        if NATIVE_REQUIRED:
            pytest.fail("HPCCOLL_REQUIRE_NATIVE=1 but hpccoll.engine._native is not built")
        pytest.skip("the C executor is not built here (no C compiler at install)")


# (stream_bytes, slot_stream_bytes, slot_stream_limit) of each way the C executor copies
STREAMING = {"streamed": (0, -1, -1), "slots streamed": (-1, 0, -1),
             "slots streamed below 4 KiB": (-1, 0, 4096)}


@contextlib.contextmanager
def streaming(how: str):
    """The C executor's copies into the receive buffer ("streamed": as from a 4 MiB
    result on, _native.c's stream_bytes lowered to 0) or into node-shared memory ("slots
    streamed": as from a 32 KiB copy on, slot_stream_bytes lowered to 0; "... below
    4 KiB": larger ones cached, as code.stream_slots sets where cores share caches)
    streamed past the caches, or neither (anything else), then as before."""
    values = STREAMING.get(how, (-1, -1, -1))
    setters = (code._native.set_stream_bytes, code._native.set_slot_stream_bytes,
               code._native.set_slot_stream_limit)
    old = [set_(v) for set_, v in zip(setters, values)]
    try:
        yield
    finally:
        for set_, v in zip(setters, old):
            set_(v)


@pytest.fixture(params=["python", "native", *STREAMING])
def executor(request):
    """Who runs the compiled programs: code.run's Python, or the C executor (_native.c),
    its copies cached, streamed into the receive buffer or streamed into slots."""
    if request.param == "python":
        yield "python"
        return
    need_native()
    with streaming(request.param):
        yield "native"


def test_the_c_executor_is_built_where_required():
    if not NATIVE_REQUIRED:
        pytest.skip("HPCCOLL_REQUIRE_NATIVE is not set")
    assert code._native is not None


def run_all(fn, specs, bufs, op, dtype, executor, seed, base=0, registered=False):
    """Every rank's lane to its end, in a random interleaving; returns the lanes.
    ``executor``: "python" (code.run) or "native" (the C executor where it has the
    program's reduction; Python otherwise)."""
    n = len(specs)
    slots = specs[0].slots
    made = areas(n, slots)
    for r, area in enumerate(made):     # as the collectives before this one left them
        for flag in (READY, REDUCED, CONSUMED):
            area.flags[r][flag * FLAG_STRIDE] = base
    lanes = []
    dt = np.dtype(dtype)
    for r, spec in enumerate(specs):
        program = Program(fn(spec))
        peer_send = [b[SEND] for b in bufs] if registered else None
        peer_recv = [b[RECV] for b in bufs] if registered else None
        rt = Shm(made[r], tuple(range(n)), peer_send, peer_recv)
        instructions = code.build(program, rt, dt, op)
        native = None
        if executor == "native":
            native = code.native(instructions, dt, op)
            has = (op in code.NATIVE_OPS and dt in code.NATIVE_DTYPES
                   and not (dt.kind == "f" and op in ("max", "min")))
            kinds = {ins[0] for ins in instructions}
            takes = kinds <= {code.WAIT, code.SIGNAL, code.COPY} or (
                has and kinds <= {code.WAIT, code.SIGNAL, code.COPY, code.UFUNC})
            assert (native is not None) == takes, "the C executor takes what it has"
        scratch = np.empty(program.scratch, dtype)
        lane = ProgramLane(program, instructions, [bufs[r][SEND], bufs[r][RECV], scratch], op,
                           None, 0, HostOps, rt, native)
        lane.base = base
        lanes.append(lane)
    rng = np.random.default_rng(seed)
    for _ in range(100_000):
        left = [lane for lane in lanes if not lane.done]
        if not left:
            return lanes
        left[rng.integers(len(left))].run()
    raise AssertionError("the lanes did not finish: a wait that never holds")


def simulated(fn, specs, bufs, op, dtype, seed, base=0):
    """The same collective on the step simulator (its own flags and slots): the
    reference every executor must match bit for bit."""
    slots = specs[0].slots
    typed = [[np.zeros(SLOT_BYTES // np.dtype(dtype).itemsize, dtype) for _ in range(slots)]
             for _ in specs]
    programs = [Program(fn(spec)) for spec in specs]
    for r, p in enumerate(programs):
        bufs[r][2] = np.empty(p.scratch, dtype)
    stepsim.run(programs, bufs, op or "sum", seed, slots=typed, base=base)


def both(fn, make_specs, make_bufs, op, dtype, seed, executor="python", **kw):
    """(buffers ``executor`` left, buffers the step simulator left) of the same
    collective and inputs."""
    bufs = make_bufs()
    lanes = run_all(fn, make_specs(), bufs, op, dtype, executor, seed, **kw)
    waits = sum(isinstance(p, WaitFlags) for p in lanes[0].program.steps)
    assert lanes[0].waits_done == waits          # every flag wait passed once
    ref = make_bufs()
    simulated(fn, make_specs(), ref, op, dtype, seed, kw.get("base", 0))
    return bufs, ref


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("op,dtype", [("sum", np.int64), ("max", np.int32),
                                      ("sum", np.float16), ("avg", np.float32)])
@pytest.mark.parametrize("registered", [False, True])
def test_allreduce(n, op, dtype, registered, executor):
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
        mine, ref = both(shm.allreduce, specs, bufs, op, dtype, seed, executor, base=4,
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
def test_reduce_broadcast_allgather_reduce_scatter(n, executor):
    rng = np.random.default_rng(n)
    count, chunk = 50, 8
    xs = [rng.integers(-5, 6, n * count).astype(np.int64) for _ in range(n)]
    for root in range(n):
        specs = lambda: [Spec("reduce", r, n, count, chunk=chunk, root=root) for r in range(n)]
        bufs = lambda: [[x[:count].copy(), np.full(count, 99, np.int64), None] for x in xs]
        mine, ref = both(shm.reduce, specs, bufs, "sum", np.int64, root, executor)
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
        mine, _ = both(shm.broadcast, specs, bcast_bufs, None, np.int64, root, executor)
        for r in range(n):
            np.testing.assert_array_equal(mine[r][RECV], xs[root][:count])

    for registered in (False, True):
        specs = lambda: [Spec("allgather", r, n, count, chunk=chunk, registered=registered)
                         for r in range(n)]
        bufs = lambda: [[x[:count].copy(), np.full(n * count, 99, np.int64), None] for x in xs]
        mine, _ = both(shm.allgather, specs, bufs, None, np.int64, 3, executor,
                       registered=registered)
        for r in range(n):
            np.testing.assert_array_equal(mine[r][RECV], np.concatenate([x[:count] for x in xs]))

        specs = lambda: [Spec("reduce_scatter", r, n, count, chunk=chunk, registered=registered)
                         for r in range(n)]
        bufs = lambda: [[x.copy(), np.full(count, 99, np.int64), None] for x in xs]
        mine, _ = both(shm.reduce_scatter, specs, bufs, "sum", np.int64, 4, executor,
                       registered=registered)
        total = np.sum(xs, axis=0)
        for r in range(n):
            np.testing.assert_array_equal(mine[r][RECV], total[r * count:(r + 1) * count])

    specs = lambda: [Spec("alltoall", r, n, count, chunk=chunk) for r in range(n)]
    bufs = lambda: [[x.copy(), np.full(n * count, 99, np.int64), None] for x in xs]
    mine, _ = both(shm.alltoall, specs, bufs, None, np.int64, 5, executor)
    for r in range(n):
        np.testing.assert_array_equal(
            mine[r][RECV], np.concatenate([x[r * count:(r + 1) * count] for x in xs]))


def test_programs_with_mpi_transfers_run_in_python():
    """A hierarchical program posts MPI transfers between nodes: it compiles (POST and
    WAITREQ instructions), and the C executor, which has no MPI, leaves it to Python."""
    spec = Spec("allreduce", 0, 4, 64, chunk=16, local=(0, 1), cross=(0, 2))
    made = areas(2, 2)
    program = Program(shm.allreduce_hier(spec))
    instructions = code.build(program, Shm(made[0], (0, 1)), np.dtype(np.int64), "sum")
    assert {code.POST, code.WAITREQ} <= {ins[0] for ins in instructions}
    assert code.native(instructions, np.dtype(np.int64), "sum") is None


def test_an_unknown_step_is_an_error():
    """A step the instruction set has no form for is refused when the plan compiles it,
    never skipped at run time."""
    class Strange:
        pass
    with pytest.raises(ValueError, match="has no instruction"):
        code.build(Program([Strange()]), None, np.dtype(np.int64), "sum")


def test_the_c_executors_tables_are_checked_at_import():
    """_native.c's opcodes, dtypes and ops are engine/code.py's, or it is refused."""
    need_native()
    assert code._checked(code._native) is code._native

    class Stale:
        OPCODES = dict(code.NATIVE_OPCODES, COPY=9)
        DTYPES = code._native.DTYPES
        OPS = code._native.OPS
        NFNS = code._native.NFNS
        CELL_KINDS = code._native.CELL_KINDS
        CELL_FIELDS = code._native.CELL_FIELDS
    with pytest.raises(ImportError, match="rebuild"):
        code._checked(Stale)

    class StaleCells(Stale):    # the cells' layout words in another order
        OPCODES = code._native.OPCODES
        CELL_FIELDS = code._native.CELL_FIELDS[::-1]
    with pytest.raises(ImportError, match="rebuild"):
        code._checked(StaleCells)


WIDE = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
        np.float32, np.float64]


@pytest.mark.parametrize("dtype", WIDE)
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
def test_every_reduction_the_c_executor_has_matches_numpy_bit_for_bit(dtype, op, executor):
    """Integers at their limits (sum and prod wrap as NumPy's do), floats with NaN,
    infinities and signed zeros: the same bits from either executor (float max and min
    stay NumPy's: native() leaves them to it)."""
    n, count = 3, 40
    rng = np.random.default_rng(7)
    info = np.iinfo(dtype) if np.issubdtype(dtype, np.integer) else None
    if info is not None:
        special = np.array([info.min, info.max, info.max - 1, 0, 1], dtype)
        xs = [rng.integers(info.min, info.max, count, dtype=dtype, endpoint=True)
              for _ in range(n)]
    else:
        special = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0], dtype)
        xs = [(rng.standard_normal(count) * 1e3).astype(dtype) for _ in range(n)]
    for x in xs:
        x[rng.choice(count, len(special), replace=False)] = special
    specs = lambda: [Spec("allreduce", r, n, count, chunk=16, slots=2) for r in range(n)]
    bufs = lambda: [[x.copy(), np.zeros(count, dtype), None] for x in xs]
    with np.errstate(all="ignore"):
        mine, ref = both(shm.allreduce, specs, bufs, op, dtype, 11, executor)
    for r in range(n):
        assert mine[r][RECV].tobytes() == ref[r][RECV].tobytes()


def test_the_c_executor_refuses_buffers_smaller_than_its_program():
    """An encoding says how many bytes of each buffer it touches; a call with less is an
    error, never a write past the end."""
    need_native()
    n, count = 2, 40
    made = areas(n, 2)
    spec = Spec("allreduce", 0, n, count, chunk=16, slots=2)
    program = Program(shm.allreduce(spec))
    rt = Shm(made[0], tuple(range(n)))
    rows = code.native(code.build(program, rt, np.dtype(np.int32), "sum"), np.dtype(np.int32),
                       "sum")
    ok = np.zeros(count, np.int32)
    with pytest.raises(ValueError, match="buffer 1 holds"):
        code._native.run(rows, 0, 0, ok, np.zeros(count - 1, np.int32), np.empty(0, np.uint8))
    with pytest.raises(ValueError, match="pc out of range"):
        code._native.run(rows, len(program.steps) + 1, 0, ok, ok.copy(), np.empty(0, np.uint8))
    with pytest.raises(ValueError, match="not an encoded program"):
        code._native.run(np.zeros((2, code._native.NROW), np.int64), 0, 0, ok, ok, ok)


def test_a_poll_of_a_program_still_waiting_exports_no_buffer_and_changes_nothing():
    """Most polls of a waiter find its program waiting on the peers' flags: past the
    first call (pc 0, which checks the buffers), the C executor answers None before it
    exports a buffer (None buffers pass), and the lane stays as it was; once the peer has
    run, the same lane goes on to the right result."""
    need_native()
    n, count = 2, 40
    dt = np.dtype(np.int32)
    made = areas(n, 2)
    lanes = []
    for r in range(n):
        program = Program(shm.allreduce(Spec("allreduce", r, n, count, chunk=16, slots=2)))
        rt = Shm(made[r], tuple(range(n)))
        instructions = code.build(program, rt, dt, "sum")
        rows = code.native(instructions, dt, "sum")
        assert rows is not None
        bufs = [np.arange(count, dtype=dt) * (r + 1), np.zeros(count, dt),
                np.empty(program.scratch, dt)]
        lanes.append(ProgramLane(program, instructions, bufs, "sum", None, 0, HostOps, rt,
                                 rows))
    first = lanes[0]
    first.start()
    pc, waiting = first.pc, first.waiting
    assert 0 < pc < len(first.code) and first.code[pc][0] == code.WAIT
    assert code._native.run(first.native, pc, first.base, None, None, None) is None
    for _ in range(3):
        assert first.run() is False
        assert (first.pc, first.waiting, first.done) == (pc, waiting, False)
    lanes[1].start()
    for _ in range(100):
        if all(lane.done for lane in lanes):
            break
        for lane in lanes:
            lane.run()
    for lane in lanes:
        assert lane.bufs[1].tolist() == (np.arange(count) * 3).tolist()


@pytest.fixture(params=["cached", "streamed", "slots streamed"])
def stream(request):
    """Copies into the receive buffer as in a small collective, or streamed past the
    caches as in one of 4 MiB and up, or copies into node-shared memory (an address)
    streamed as from 32 KiB."""
    need_native()
    with streaming(request.param):
        yield request.param


@pytest.mark.parametrize("nbytes", [1, 31, 127, 128, 129, 2111, 2112, 4133, 262147,
                                    (1 << 20) + 129])
def test_the_c_executor_copies_and_reduces_long_unaligned_runs_exactly(nbytes, stream):
    """The C executor's own copy loops (128 bytes a step, or 64 streamed after an
    unaligned head, a tail after) and its vectorized reductions, on lengths around every
    boundary and at unaligned offsets, against NumPy: the programs above move a few
    hundred bytes, a real chunk 512 KiB."""
    copy_op, reduce_op = 2, 3         # _native.c's OP_COPY, OP_REDUCE
    send_kind, recv_kind = 0, 1
    nrow = code._native.NROW
    rng = np.random.default_rng(nbytes)
    room = nbytes + 64
    for dst_off, src_off in ((0, 0), (1, 3), (61, 7)):
        send = rng.integers(0, 256, room, dtype=np.uint8)
        recv = np.zeros(room, np.uint8)
        rows = np.zeros((2, nrow), np.int64)
        rows[0, :4] = code._native.MAGIC, room, room, 0
        if stream == "slots streamed":      # into an address, as into a slot
            at = recv.__array_interface__["data"][0] + dst_off
            rows[1, :6] = copy_op, 3, at, send_kind, src_off, nbytes
        else:
            rows[1, :6] = copy_op, recv_kind, dst_off, send_kind, src_off, nbytes
        assert code._native.run(rows, 0, 0, send, recv, None)[0] == 1
        want = np.zeros(room, np.uint8)
        want[dst_off:dst_off + nbytes] = send[src_off:src_off + nbytes]
        assert recv.tobytes() == want.tobytes(), (dst_off, src_off)
    fn = code.NATIVE_DTYPES.index(np.dtype(np.float32)) * len(code.NATIVE_OPS)  # float32 sum
    count = max(1, nbytes // 4)
    xs = [(rng.standard_normal(count) * 1e3).astype(np.float32) for _ in range(3)]
    send = np.concatenate(xs[1:]).view(np.uint8).copy()
    recv = np.zeros(count * 4 + 8, np.uint8)
    recv[4:4 + count * 4] = xs[0].view(np.uint8)
    rows = np.zeros((2, nrow), np.int64)
    rows[0, :4] = code._native.MAGIC, send.nbytes, recv.nbytes, 0
    # recv[4:] = recv[4:] + send[:count] + send[count:], unaligned, the destination its
    # first source (as a rank's own part is reduced in place, three ranks)
    rows[1, :12] = (reduce_op, recv_kind, 4, count, fn, 3, recv_kind, 4, send_kind, 0,
                    send_kind, count * 4)
    code._native.run(rows, 0, 0, send, recv, None)
    want = (xs[0] + xs[1]) + xs[2]
    assert recv[4:4 + count * 4].tobytes() == want.tobytes()


def test_which_slot_copies_stream_follows_the_handoff_table():
    need_native()
    setters = (code._native.set_slot_stream_bytes, code._native.set_slot_stream_limit)
    old = [set_(-1) for set_ in setters]

    def executor_has():
        got = tuple(set_(-1) for set_ in setters)
        for set_, v in zip(setters, got):
            set_(v)
        return got
    try:
        near, far = code.SLOT_STREAMING[0], code.SLOT_STREAMING[-1]
        assert code.stream_slots(near[0] / 2) == near[1:] == executor_has()
        assert near[2] > near[1] > 0                          # a bound above where it starts
        assert code.stream_slots(near[0] * 4) == far[1:] == executor_has()
        assert far[0] == float("inf") and far[2] == -1
        assert code.stream_slots(float("nan")) == code.NOT_MEASURED == executor_has()
    finally:
        for set_, v in zip(setters, old):
            set_(v)
