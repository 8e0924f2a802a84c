"""Deadlock workloads: collectives issued in rank-divergent orders, every result checked.

    mpiexec -n 4 python -m hpccoll.chaos SCENARIO [--policy P|all] [--iters N] [--bytes B] [--out F.h5] ...

Scenarios (each a class with the same shape: make communicators, issue one iteration):

- abba:  two communicators over the same ranks, opposite issue order on alternating ranks;
- latin: n communicators over the same n ranks; rank r issues its allreduces in the order
         of row r of a seeded n x n Latin square (DFCCL's deadlock test);
- 3d:    data x tensor x pipeline groups (2x2x2 on 8 ranks, 1x2x2 on 4), a phase of
         collectives per step issued in rank-dependent seeded orders, and random
         synchronization points between phases (a rank waits on earlier collectives
         before issuing more, as an implicit device sync does);
- mixed: alltoall on one communicator against allreduce on another, divergent order,
         then a synchronization on both (the production hang).

Under preemptive and ordered every scenario must complete with correct results; under fifo
the divergent ones must end in CollectiveTimeout with a report, on every rank.  The exit
code says whether the outcome was the expected one (--expect; default: complete, or
timeout for fifo on a divergent scenario).
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass, field

import numpy as np

import hpccoll
from .errors import CollectiveTimeout, HpcCollError
from .timing import parse_bytes

POLICIES = ("preemptive", "ordered", "fifo")


@dataclass
class Check:
    work: object
    expected: np.ndarray
    label: str


class Scenario:
    """Base: ``comms`` made in __init__ (collective, same order everywhere), ``iteration``
    issues one step and returns what to check once everything completed."""
    name = ""

    def __init__(self, ctx, args):
        self.ctx, self.args = ctx, args
        self.rank, self.size = ctx.rank, ctx.size
        self.count = max(1, args.bytes // 4)
        self.comms: list = []

    @classmethod
    def divergent(cls, n: int) -> bool:
        return n > 1

    def value(self, comm, it: int, salt: int = 0) -> np.ndarray:
        """This rank's contribution: integral float32 values, so sums are exact."""
        base = (comm.rank + 1) * 3 + it % 7 + salt
        return np.full(self.count, base, dtype=np.float32)

    def allreduce(self, comm, it: int, salt: int = 0) -> Check:
        x = self.value(comm, it, salt)
        total = sum((r + 1) * 3 + it % 7 + salt for r in range(comm.size))
        return Check(comm.allreduce(x), np.full(self.count, total, np.float32),
                     f"allreduce on {comm.name}")

    def free(self) -> None:
        for c in self.comms:
            c.free()


class Abba(Scenario):
    name = "abba"

    def __init__(self, ctx, args):
        super().__init__(ctx, args)
        self.comms = [ctx.world.dup(name="A"), ctx.world.dup(name="B")]

    def iteration(self, it):
        order = self.comms if self.rank % 2 == 0 else self.comms[::-1]
        return [self.allreduce(c, it, salt=self.comms.index(c)) for c in order]


def latin_square(n: int, seed: int) -> list[list[int]]:
    """A seeded random n x n Latin square: the cyclic one with rows, columns and symbols
    permuted."""
    rng = random.Random(seed)
    rows, cols, syms = list(range(n)), list(range(n)), list(range(n))
    rng.shuffle(rows), rng.shuffle(cols), rng.shuffle(syms)
    return [[syms[(rows[r] + cols[c]) % n] for c in range(n)] for r in range(n)]


class Latin(Scenario):
    name = "latin"

    def __init__(self, ctx, args):
        super().__init__(ctx, args)
        self.comms = [ctx.world.dup(name=f"L{i}") for i in range(self.size)]
        self.square = latin_square(self.size, args.seed)

    def iteration(self, it):
        return [self.allreduce(self.comms[c], it, salt=c) for c in self.square[self.rank]]


def grid_dims(n: int) -> tuple[int, int, int]:
    """(dp, tp, pp) with dp * tp * pp = n, tp and pp as large as possible and balanced:
    8 -> (2, 2, 2), 4 -> (1, 2, 2), 2 -> (1, 1, 2)."""
    best = (n, 1, 1)
    for pp in range(1, n + 1):
        for tp in range(1, n // pp + 1):
            if n % (pp * tp) == 0:
                dp = n // (pp * tp)
                key = (dp <= tp <= pp, -max(dp, tp, pp), pp, tp)
                bkey = (best[0] <= best[1] <= best[2], -max(best), best[2], best[1])
                if key > bkey:
                    best = (dp, tp, pp)
    return best


def interleave(ops: list, rng: random.Random) -> list:
    """A random interleaving of ``(comm, make)`` ops that keeps each communicator's own
    order: on one communicator, collectives match by issue order (MPI semantics), so only
    the order *across* communicators may differ between ranks."""
    queues: dict = {}
    for op in ops:
        queues.setdefault(op[0], []).append(op)
    out = []
    while queues:
        comm = rng.choice(sorted(queues))
        out.append(queues[comm].pop(0))
        if not queues[comm]:
            del queues[comm]
    return out


class ThreeD(Scenario):
    """Each step: phase 1 (tensor-parallel allreduce + allgather, pipeline broadcast, data-
    parallel allreduce), a synchronization point, phase 2 (pipeline allreduce, data-parallel
    reduce_scatter, tensor-parallel allreduce), a synchronization point.  Within a phase the
    issue order depends on the rank; in step 0 ranks whose grid parity is even issue tensor-
    parallel work first and the others last, which closes a cycle in every tp x dp or
    tp x pp plane (a guaranteed circular wait under fifo)."""
    name = "3d"

    def __init__(self, ctx, args):
        super().__init__(ctx, args)
        self.dims = grid_dims(self.size)
        dp, tp, pp = self.dims
        d, rest = divmod(self.rank, tp * pp)
        t, p = divmod(rest, pp)
        self.coord = (d, t, p)
        w = ctx.world
        # split in a fixed order on every rank: collective calls
        self.dp = w.split(t * pp + p, key=d, name=f"dp(t{t},p{p})")
        self.tp = w.split(d * pp + p, key=t, name=f"tp(d{d},p{p})")
        self.pp = w.split(d * tp + t, key=p, name=f"pp(d{d},t{t})")
        self.comms = [self.dp, self.tp, self.pp]

    @classmethod
    def divergent(cls, n: int) -> bool:
        dp, tp, pp = grid_dims(n)
        return sum(x > 1 for x in (dp, tp, pp)) >= 2

    def _gather(self, comm, it, salt):
        x = self.value(comm, it, salt)[: max(1, self.count // max(1, comm.size))]
        want = np.concatenate([np.full(x.size, (r + 1) * 3 + it % 7 + salt, np.float32)
                               for r in range(comm.size)])
        return Check(comm.allgather(x), want, f"allgather on {comm.name}")

    def _bcast(self, comm, it, salt):
        buf = self.value(comm, it, salt) if comm.rank == 0 else np.zeros(self.count, np.float32)
        return Check(comm.broadcast(buf, root=0), np.full(self.count, 3 + it % 7 + salt, np.float32),
                     f"broadcast on {comm.name}")

    def _rs(self, comm, it, salt):
        m = max(1, self.count // comm.size)
        x = np.full(m * comm.size, (comm.rank + 1) * 3 + it % 7 + salt, np.float32)
        total = sum((r + 1) * 3 + it % 7 + salt for r in range(comm.size))
        return Check(comm.reduce_scatter(x), np.full(m, total, np.float32),
                     f"reduce_scatter on {comm.name}")

    def iteration(self, it):
        rng = random.Random(hash((self.args.seed, self.rank, it)) & 0xFFFFFFFF)
        d, t, p = self.coord
        phase1 = [("tp", lambda: self.allreduce(self.tp, it, 1)),
                  ("tp", lambda: self._gather(self.tp, it, 2)),
                  ("pp", lambda: self._bcast(self.pp, it, 3)),
                  ("dp", lambda: self.allreduce(self.dp, it, 4))]
        phase2 = [("pp", lambda: self.allreduce(self.pp, it, 5)),
                  ("dp", lambda: self._rs(self.dp, it, 6)),
                  ("tp", lambda: self.allreduce(self.tp, it, 7))]
        checks = []
        for phase in (phase1, phase2):
            if it == 0:
                tp_first = (d + t + p) % 2 == 0
                phase = sorted(phase, key=lambda op: (op[0] != "tp") if tp_first else (op[0] == "tp"))
            else:
                phase = interleave(phase, rng)
            issued = [make() for _, make in phase]
            checks += issued
            # synchronization point: wait on a random subset of this phase's collectives
            for c in issued:
                if rng.random() < 0.5:
                    c.work.wait()
        return checks


class Mixed(Scenario):
    name = "mixed"

    def __init__(self, ctx, args):
        super().__init__(ctx, args)
        self.a2a = ctx.world.dup(name="ep")      # expert parallel: alltoall
        self.ar = ctx.world.dup(name="dp")       # data parallel: allreduce
        self.comms = [self.a2a, self.ar]

    def iteration(self, it):
        n, r = self.size, self.rank
        m = max(1, self.count // n)
        x = np.concatenate([np.full(m, r * 1000 + q + it % 5, np.float32) for q in range(n)])
        want = np.concatenate([np.full(m, q * 1000 + r + it % 5, np.float32) for q in range(n)])
        make = [lambda: Check(self.a2a.alltoall(x), want, "alltoall on ep"),
                lambda: self.allreduce(self.ar, it)]
        checks = [f() for f in (make if r % 2 == 0 else make[::-1])]
        for c in checks:          # the implicit device synchronization
            c.work.wait()
        return checks


SCENARIOS = {cls.name: cls for cls in (Abba, Latin, ThreeD, Mixed)}


@dataclass
class Outcome:
    policy: str
    outcome: str = "complete"          # complete | timeout | wrong | error
    iters: int = 0
    seconds: float = 0.0
    yields: int = 0
    tries: int = 0
    switches: int = 0
    parks: int = 0
    detail: str = ""
    wrong: list = field(default_factory=list)


def run_policy(name: str, policy: str, args) -> Outcome:
    out = Outcome(policy)
    # fifo stays the one-at-a-time NCCL-like baseline whatever bound the others get
    slots = None if policy == "fifo" else args.max_active
    ctx = hpccoll.init(policy=policy, timeout=args.timeout, max_active=slots,
                       print_report=args.verbose)
    # An error other than hpccoll's may be this rank's alone: it skips close(), which would
    # wait for ranks stuck in a collective with this one, and main() aborts the job.
    scenario = SCENARIOS[name](ctx, args)
    t0 = time.perf_counter()
    try:
        for it in range(args.iters):
            checks = scenario.iteration(it)
            for c in checks:
                got = c.work.wait()
                if not np.array_equal(got.reshape(-1), c.expected):
                    out.wrong.append(f"iteration {it}: {c.label}")
                k = c.work.counters
                out.yields += k.get("yields", 0)
                out.tries += k.get("tries", 0)
            out.iters = it + 1
        out.outcome = "wrong" if out.wrong else "complete"
    except CollectiveTimeout as exc:
        out.outcome = "timeout"
        out.detail = exc.report
    except HpcCollError as exc:
        out.outcome = "error"
        out.detail = str(exc)
    out.seconds = time.perf_counter() - t0
    stats = ctx.stats()
    out.switches, out.parks = stats["switches"], stats["parks"]
    if out.outcome in ("complete", "wrong"):
        scenario.free()
    ctx.close()
    return out


def expected_outcome(name: str, policy: str, n: int, expect: str) -> str:
    if expect != "auto":
        return expect
    return "timeout" if policy == "fifo" and SCENARIOS[name].divergent(n) else "complete"


def _row(name: str, res: Outcome, args, n: int) -> dict:
    """One rank's outcome under one policy, as a row of the chaos record (results.py)."""
    from .results import diagnosis
    return dict(policy=res.policy, outcome=res.outcome, iters=res.iters, seconds=res.seconds,
                expected=expected_outcome(name, res.policy, n, args.expect), yields=res.yields,
                tries=res.tries, switches=res.switches, parks=res.parks, n_wrong=len(res.wrong),
                detail=res.wrong[0] if res.wrong else diagnosis(res.detail)[:400])


def run_scenario(name: str, policies, args, mpi_world) -> bool:
    """Run ``name`` under each policy in turn; rank 0 prints the summary table (and with
    ``args.out`` writes the run).  True on every rank if every policy behaved as expected."""
    from mpi4py import MPI
    from . import results
    out = getattr(args, "out", None)
    attrs = {"scenario": name, "nranks": mpi_world.size, "iters": args.iters,
             "bytes": args.bytes, "max_active": args.max_active or 0, "timeout": args.timeout}
    if out:      # collective, and the start time is the run's
        attrs = results.run_attrs(mpi_world, name, args, getattr(args, "argv", sys.argv))
    outcomes = [run_policy(name, pol, args) for pol in policies]
    ok = all(r.outcome == expected_outcome(name, r.policy, mpi_world.size, args.expect)
             for r in outcomes)
    ok = mpi_world.allreduce(ok, op=MPI.LAND)
    host = MPI.Get_processor_name()
    mine = [dict(_row(name, r, args, mpi_world.size), rank=mpi_world.rank, host=host)
            for r in outcomes]
    gathered = mpi_world.gather(mine, root=0)
    if mpi_world.rank == 0:
        rows = [r for rs in gathered for r in rs]
        print("\n".join(results.summary(attrs, rows, ok)), flush=True)
        if out:
            from .h5log import WriteFailed
            try:
                results.write_chaos(out, attrs, ok, rows)
            except WriteFailed as exc:      # (after every collective: nobody waits on it)
                print(f"python -m hpccoll.chaos: error: {exc}", file=sys.stderr, flush=True)
                return False
    return ok


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hpccoll.chaos", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", choices=sorted(SCENARIOS))
    p.add_argument("--policy", default="preemptive", choices=POLICIES + ("all",),
                   help="scheduling policy; 'all' runs each in turn (default: preemptive)")
    p.add_argument("--iters", type=int, default=20, help="iterations (default 20)")
    p.add_argument("--bytes", type=parse_bytes, default=4096,
                   help="message size per collective, K/M suffixes (default 4K)")
    p.add_argument("--timeout", type=_seconds, default=10.0,
                   help="watchdog timeout in seconds (default 10; the workloads need one)")
    p.add_argument("--max-active", type=_slots, default=None,
                   help="execution slot bound of preemptive and ordered (default: none "
                        "beyond what collectives hold; 1 models a GPU one collective fills); "
                        "fifo always runs one collective at a time")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--expect", choices=("auto", "complete", "timeout"), default="auto",
                   help="outcome that makes the exit code 0 (auto: timeout for fifo on a "
                        "divergent scenario, complete otherwise)")
    p.add_argument("--verbose", action="store_true", help="print full watchdog reports")
    p.add_argument("--out", metavar="FILE.h5",
                   help="append the run (every rank's outcome per policy) to this HDF5 "
                        "result file (docs/results.md)")
    return p


def _slots(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number of slots >= 1, got {text!r}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):     # NaN too: the watchdog must be on
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r} (fifo ends in "
                                         "the watchdog's timeout)")
    return value


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    args.argv = [sys.executable, "-m", "hpccoll.chaos", *(sys.argv[1:] if argv is None else argv)]
    if args.out:
        from .results import require_h5py
        require_h5py()
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    if args.out:     # known before the run, on every rank: not lost at its end
        from .h5log import append_problem
        problem = world.bcast(append_problem(args.out) if world.rank == 0 else None, root=0)
        if problem:
            if world.rank == 0:
                print(f"python -m hpccoll.chaos: error: argument --out: {problem}", file=sys.stderr)
            return 2
    try:
        policies = POLICIES if args.policy == "all" else (args.policy,)
        ok = run_scenario(args.scenario, policies, args, world)
    except BaseException as exc:
        from .jobs import abort_job   # (the job's end: MPI only then)
        return abort_job(exc, "hpccoll.chaos")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
