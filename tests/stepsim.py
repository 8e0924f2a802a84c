"""Run step machines of n ranks inside one process, for unit tests of the algorithms.

This is not MPI and does not pretend to be: it executes the primitives of n
programs, matches sends to receives per (source, destination) in posting order
(MPI's non-overtaking rule), and delivers each matched transfer at a random
moment before both sides' Wait, so that data hazards a real transport could
expose (reading a region before it arrived, overwriting one still being sent)
show up as wrong results.
"""
from __future__ import annotations

import random
from collections import defaultdict, deque

import numpy as np

from hpccoll.algorithms.primitives import (PEER, PSEND, RECV, SEND, SLOT, Copy, Post, Publish,
                                           Reduce, ReduceN, Scale, Signal, Wait, WaitFlags)
from hpccoll.transport.reduction import HostOps


class Deadlock(AssertionError):
    pass


class Steps:
    """What ``run`` needs of a Program: its steps."""

    def __init__(self, steps):
        self.steps = tuple(steps)


def programs(fn, coll, n, count, **spec):
    """Every rank's program of step machine ``fn`` (further Spec fields as keywords)."""
    from hpccoll.algorithms.spec import Spec
    return [Steps(fn(Spec(coll, r, n, count, **spec))) for r in range(n)]


def data(n, length, seed, dtype=np.int64):
    """n ranks' inputs of small integers (exact whatever the reduction order)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(-5, 6, length).astype(dtype) for _ in range(n)]


def allgather_buffers(xs, m, inplace):
    """[send, recv, scratch] of each rank of an allgather of blocks ``xs`` (m each),
    garbage in the receive buffers; in place, each input is its block of the output."""
    n = len(xs)
    bufs = []
    for r, x in enumerate(xs):
        recv = np.full(n * m, 99, x.dtype)
        if inplace:
            recv[r * m:(r + 1) * m] = x
            bufs.append([recv[r * m:(r + 1) * m], recv, None])
        else:
            bufs.append([x.copy(), recv, None])
    return bufs


class _Op:
    __slots__ = ("rank", "region", "done", "snapshot")

    def __init__(self, rank, region):
        self.rank, self.region, self.done, self.snapshot = rank, region, False, None


def run(programs, bufs, op="sum", seed=0, max_events=10_000_000, slots=None, base=0):
    """programs[r]: Program; bufs[r]: [send, recv, scratch] flat arrays (modified in place).
    Shared-memory programs: ``slots[r]`` is rank r's list of staging slots (arrays), and
    ``base`` the epoch the collective starts after (flags start there)."""
    rng = random.Random(seed)
    n = len(programs)
    pc = [0] * n
    inflight = [dict() for _ in range(n)]
    sendq, recvq = defaultdict(deque), defaultdict(deque)
    matched = []
    flags = [[base, base, base] for _ in range(n)]
    published = [set() for _ in range(n)]

    def arr(r, reg):
        b = reg.buf
        if isinstance(b, tuple):
            if b[0] == SLOT:
                slot = slots[b[1]][(base + b[2]) % len(slots[b[1]])]
                return slot[reg.off:reg.off + reg.n]
            q = b[1]
            if b[0] == PEER:
                # what q published, while q's program still runs (it returns its buffers)
                assert b[2] in published[q], f"rank {r} reads rank {q}'s unpublished buffer"
                assert pc[q] < len(programs[q].steps), f"rank {r} reads rank {q}'s returned buffer"
                return bufs[q][b[2]][reg.off:reg.off + reg.n]
            return bufs[q][SEND if b[0] == PSEND else RECV][reg.off:reg.off + reg.n]
        return bufs[r][b][reg.off:reg.off + reg.n]

    def post(r, p):
        ops = []
        for peer, reg in p.recvs:
            o = _Op(r, reg)
            ops.append(o)
            q = sendq[(peer, r)]
            if q:
                matched.append((q.popleft(), o))
            else:
                recvq[(peer, r)].append(o)
        for peer, reg in p.sends:
            o = _Op(r, reg)
            ops.append(o)
            q = recvq[(r, peer)]
            if q:
                matched.append((o, q.popleft()))
            else:
                sendq[(r, peer)].append(o)
        inflight[r][p.h] = ops

    def advance(r):
        steps = programs[r].steps
        moved = False
        while pc[r] < len(steps):
            p = steps[pc[r]]
            if isinstance(p, Wait):
                if not all(o.done for o in inflight[r][p.h]):
                    return moved
                del inflight[r][p.h]
            elif isinstance(p, WaitFlags):
                if not all(flags[q][p.flag] >= base + p.epoch for q in p.peers):
                    return moved
            elif isinstance(p, Publish):
                published[r].add(p.buf)
            elif isinstance(p, Signal):
                assert flags[r][p.flag] < base + p.epoch, "flags only grow"
                flags[r][p.flag] = base + p.epoch
            elif isinstance(p, ReduceN):
                dst = arr(r, p.dst)
                srcs = [arr(r, s) for s in p.srcs]
                for s in srcs[1:]:
                    assert not np.shares_memory(dst, s), "ReduceN: dst may alias srcs[0] only"
                HostOps.reduce_n(op, dst, srcs, p.divisor)
            elif isinstance(p, Post):
                post(r, p)
            elif isinstance(p, Reduce):
                HostOps.reduce(op, arr(r, p.dst), arr(r, p.a), arr(r, p.b))
            elif isinstance(p, Copy):
                np.copyto(arr(r, p.dst), arr(r, p.src))
            elif isinstance(p, Scale):
                HostOps.scale(arr(r, p.dst), arr(r, p.src), p.divisor)
            pc[r] += 1
            moved = True
            if rng.random() < 0.3:  # let other ranks and deliveries interleave
                return moved
        return moved

    def deliver(i):
        s, d = matched.pop(i)
        assert s.region.n == d.region.n, f"size mismatch: rank {s.rank} sends {s.region}, " \
                                         f"rank {d.rank} receives {d.region}"
        np.copyto(arr(d.rank, d.region), arr(s.rank, s.region))
        s.done = d.done = True

    for _ in range(max_events):
        if all(pc[r] >= len(programs[r].steps) for r in range(n)) and not matched:
            break
        choices = [("rank", r) for r in range(n) if pc[r] < len(programs[r].steps)]
        choices += [("msg", i) for i in range(len(matched))]
        rng.shuffle(choices)
        progressed = False
        for kind, x in choices:
            if kind == "msg":
                deliver(x)
                progressed = True
                break
            if advance(x):
                progressed = True
                break
        if not progressed:
            raise Deadlock(f"no rank can move: pcs={pc}, unmatched sends="
                           f"{ {k: len(v) for k, v in sendq.items() if v} }, recvs="
                           f"{ {k: len(v) for k, v in recvq.items() if v} }")
    leftovers = [k for k, v in list(sendq.items()) + list(recvq.items()) if v]
    assert not leftovers, f"unmatched transfers left on channels {leftovers}"
