"""The one settings registry.

Every knob is declared once in ``SETTINGS`` with its type, default, choices and
documentation.  Each has an environment twin ``HPCCOLL_<NAME>``.  Precedence:
explicit argument > environment variable > default.  Unknown names are rejected.

``python -m hpccoll config`` prints the effective settings and where each came
from; ``python -m hpccoll config --markdown`` writes docs/config.md.
"""
from __future__ import annotations

import difflib
import math
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .base.units import parse_size
from .errors import ArgumentError


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected one of 1/0/true/false/yes/no/on/off, got {text!r}")


def _parse_optional_float(text: str) -> Optional[float]:
    if text.strip().lower() in ("", "none", "off", "0"):
        return None
    return float(text)


def _parse_optional_int(text: str) -> Optional[int]:
    return None if text.strip().lower() in ("", "none") else int(text)


def _mismatch_mode(value: Any) -> Any:
    """check_mismatch was a bool: True is today's default mode, False "off"."""
    if isinstance(value, (bool, int)) and not isinstance(value, str):
        return "deferred" if value else "off"
    if isinstance(value, str):
        low = value.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return "deferred"
        if low in ("0", "false", "no"):
            return "off"
        return low
    return value


_parse_size = parse_size


@dataclass(frozen=True)
class Setting:
    name: str
    type: type
    default: Any
    doc: str
    choices: tuple = ()
    minimum: Optional[float] = None
    parse: Optional[Callable[[str], Any]] = None
    allow_none: bool = False
    convert: Optional[Callable[[Any], Any]] = None   # older spellings of a value
    maximum: Optional[float] = None
    rule: Optional[Callable[[Any], Optional[str]]] = None   # what else is wrong, or None
    public: bool = False      # documented for users; the others: `config --all` only
    agree: bool = False       # every rank must have the same value (checked at init)

    @property
    def env(self) -> str:
        return "HPCCOLL_" + self.name.upper()

    def from_text(self, text: str) -> Any:
        if self.parse is not None:
            return self.parse(text)
        if self.type is bool:
            return _parse_bool(text)
        if self.type is int:
            try:
                return int(text)
            except ValueError:
                value = float(text)      # 1e6; inf and 1.5 are refused by check()
                return int(value) if value.is_integer() else value
        return self.type(text)

    def expected(self) -> str:
        """What a value must be, in words (for errors)."""
        if self.type is bool:
            return "a bool (1/0, true/false, yes/no, on/off)"
        if self.type in (int, float):
            kind = "an integer" if self.type is int else "a number"
            lo, hi = self.minimum, self.maximum
            lo, hi = (None if b is None else int(b) if float(b).is_integer() else b
                      for b in (lo, hi))
            bounds = (f" from {lo} to {hi}" if lo is not None and hi is not None else
                      f" >= {lo}" if lo is not None else f" <= {hi}" if hi is not None else "")
            return kind + bounds + (" or none" if self.allow_none else "")
        if self.choices:
            return "one of " + ", ".join(map(repr, self.choices))
        return self.type.__name__

    def check(self, value: Any, where: str) -> Any:
        if value is None and self.allow_none:
            return None
        if self.convert is not None:
            value = self.convert(value)
        if self.type is bool:
            if not isinstance(value, (bool, int)):
                raise ArgumentError(f"{where}: expected a bool, got {value!r}")
            return bool(value)
        if self.type in (int, float):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ArgumentError(f"{where}: expected a number, got {value!r}")
            if math.isnan(value):       # it compares false with everything: no bound holds
                raise ArgumentError(f"{where}: expected a number, got nan")
            if math.isinf(value) and (self.type is int or self.maximum is not None):
                raise ArgumentError(f"{where}: expected a finite number, got {value!r}")
            if self.type is int and isinstance(value, float) and not value.is_integer():
                raise ArgumentError(f"{where}: expected {self.expected()}, got {value!r}")
            value = self.type(value)
            if self.minimum is not None and value < self.minimum:
                raise ArgumentError(f"{where}: expected a value >= {self.minimum}, got {value!r}")
            if self.maximum is not None and value > self.maximum:
                raise ArgumentError(f"{where}: expected a value <= {self.maximum}, got {value!r}")
            wrong = self.rule(value) if self.rule is not None else None
            if wrong:
                raise ArgumentError(f"{where}: expected {wrong}, got {value!r}")
            return value
        if not isinstance(value, self.type):
            raise ArgumentError(f"{where}: expected {self.type.__name__}, got {value!r}")
        if self.choices and value not in self.choices:
            raise ArgumentError(f"{where}: expected one of {', '.join(map(repr, self.choices))}, got {value!r}")
        return value


def _whole_warps(value: int) -> Optional[str]:
    if value % 32 and os.environ.get("NUMBA_ENABLE_CUDASIM", "0") in ("", "0"):
        return "a multiple of 32 (whole warps)"
    return None


# Reduction workers of one collective: CUDA blocks, or CPU threads for host arrays.  More
# than this is a mistake (a kernel launch of millions of blocks, or as many threads).
MAX_BLOCKS = 65536

SETTINGS: tuple[Setting, ...] = (
    Setting("policy", str, "preemptive",
            "Scheduling policy of the engine: 'preemptive' (DFCCL: waiting collectives yield), "
            "'ordered' (token-passing global launch order) or 'fifo' (NCCL-like: issue order, run to "
            "completion; may deadlock when ranks issue in different orders).",
            choices=("preemptive", "ordered", "fifo"),
            public=True, agree=True),
    Setting("timeout", float, None,
            "Seconds without progress after which a pending collective raises CollectiveTimeout on "
            "every stuck rank, with a report of all ranks' pending collectives. None/0 = off.",
            minimum=0.0, parse=_parse_optional_float, allow_none=True, public=True),
    Setting("max_active", int, None,
            "Collectives hpccoll drives that may hold an execution slot at once, on top of what "
            "they hold (docs/preemption.md). None: no bound beyond real resources -- a "
            "communicator's node-shared slots serve one collective at a time, a GPU one "
            "collective's kernels and staging -- so host collectives on different "
            "communicators progress concurrently, as MPI's own nonblocking ones do. 1 models a "
            "GPU whose resources one collective fills (DFCCL): waiting collectives then yield "
            "the slot. fifo runs one at a time unless a bound is given.",
            minimum=1, allow_none=True, parse=_parse_optional_int,
            maximum=1 << 20, public=True, agree=True),
    Setting("spin_threshold", int, 80,
            "Preemptive: base number of polls a waiting collective spins before it yields; the "
            "threshold is spin_threshold x min(consecutive tries, head_tries).", minimum=1,
            maximum=1 << 30),
    Setting("stickiness", int, 5,
            "Preemptive: after a wait succeeds after k polls, threshold = max(threshold, "
            "stickiness x k), so a collective whose peers are active holds on longer.", minimum=0,
            maximum=1 << 20),
    Setting("head_tries", int, 5,
            "Preemptive: tries the head of the task queue gets before the daemon moves on.",
            minimum=1,
            maximum=1 << 20),
    Setting("idle_polls", int, 16,
            "Polls with no work after which the daemon parks (sleeps until a submission wakes "
            "it). Polls with no work are spaced by poll_sleep_us.", minimum=0,
            maximum=1 << 30),
    Setting("chunk_bytes", int, 1 << 20,
            "Pipeline chunk of the large-message algorithms; every chunk boundary is a point where "
            "a collective can be suspended and resumed.", minimum=1, parse=_parse_size,
            maximum=1 << 30, agree=True),
    Setting("small_msg_bytes", int, 64 << 10,
            "Messages up to this many bytes use latency-optimal algorithms (recursive doubling, "
            "binomial trees, Bruck); larger ones use pipelined rings and chains.",
            minimum=0, parse=_parse_size,
            maximum=1 << 40, agree=True),
    Setting("pipeline_depth", int, 2,
            "Chunks a pipelined algorithm keeps in flight.", minimum=1,
            maximum=64, agree=True),
    Setting("blocks", int, None,
            "Reduction workers per collective when the call passes no blocks=: CUDA thread "
            "blocks for device arrays (None: a size-based rule, at most max_blocks), CPU threads "
            "of the Numba kernels for host arrays (None: NumPy ufuncs, one thread).",
            minimum=1, allow_none=True, parse=_parse_optional_int, maximum=MAX_BLOCKS,
            public=True, agree=True),
    Setting("threads_per_block", int, 256,
            "CUDA threads per block of the reduction and copy kernels: a multiple of 32 (a "
            "warp; any size under Numba's CUDA simulator, whose threads are Python's), at most "
            "1024 (CUDA's limit).", minimum=1, maximum=1024, rule=_whole_warps),
    Setting("max_blocks", int, None,
            "Cap of the size-based block rule for device arrays (None: 2 x the GPU's "
            "multiprocessors).", minimum=1, allow_none=True,
            parse=_parse_optional_int, maximum=MAX_BLOCKS),
    Setting("cuda_aware", str, "auto",
            "Hand device memory to MPI directly ('yes'), stage it through pinned host buffers "
            "('no'), or ask the MPI library (MPIX_Query_cuda_support) ('auto').",
            choices=("auto", "yes", "no"),
            public=True),
    Setting("device_host_bytes", int, 64 << 10,
            "Collectives over device arrays up to this size (the whole result), with a dtype "
            "and op the MPI library runs, take one copy to host, the MPI library's own "
            "nonblocking collective on pinned host buffers and one copy back, instead of "
            "hpccoll's own algorithms with a copy per step; 0: never.",
            minimum=0, parse=_parse_size,
            maximum=1 << 40, agree=True),
    Setting("mpi_coll_bytes", int, 64 << 10,
            "Order-matched allreduces, reduces, reduce_scatters and barriers (no key) up "
            "to this size (the whole result) on host arrays, with an MPI dtype and op, run as "
            "the MPI library's own nonblocking collective (lowest "
            "latency; 2 ranks: 2-4x faster than hpccoll's own point-to-point algorithms from "
            "4 to 60 KiB); broadcasts do outside shm_c_bytes to 128 KiB where shared memory "
            "runs in C (every size elsewhere), alltoalls above 64 KiB there, allgathers "
            "outside shm_c_bytes to 512 KiB there (on registered buffers up to 2 MiB). A "
            "calibration (see calibration) replaces these "
            "sizes with measured ones; 0 disables MPI's own collectives altogether.",
            minimum=0, parse=_parse_size,
            maximum=1 << 40, agree=True),
    Setting("calibration", str, "auto",
            "Which algorithm each collective uses at each size, measured on this machine by "
            "`hpccoll-tune calibrate`: the calibration file to load (rank 0 reads it, every "
            "rank uses rank 0's table), 'auto' (the default file, "
            "$XDG_CACHE_HOME/hpccoll/calibration.h5 or ~/.cache/hpccoll/calibration.h5, when it "
            "exists), 'init' (measure at init: a few seconds, nothing saved) or 'off' (the "
            "built-in table). Tables measured with another MPI library, or for another number "
            "of ranks or ranks per node, are not used.",
            public=True),
    Setting("shm", bool, True,
            "Let ranks of a communicator that share a node exchange through node-shared memory "
            "(anonymous memory per communicator and node, or a file in shm_dir, its space "
            "reserved when the communicator is made: where it cannot be had, that "
            "communicator runs on MPI, with a warning) for allreduce, reduce_scatter and "
            "allgather.",
            public=True, agree=True),
    Setting("shm_dir", str, "",
            "Directory of the node-shared files (empty: none, anonymous memory (memfd) that "
            "leaves nothing behind, else /dev/shm where Linux has it or the temporary "
            "directory where a rank cannot open another's).  Each file's space is reserved "
            "when its communicator is made; where the directory cannot hold it, that "
            "communicator exchanges through MPI only (with a warning) instead of failing "
            "later."),
    Setting("cma", bool, True,
            "Let ranks of one node read each other's ordinary buffers in place (and a "
            "gather's peers write into its root's), one copy made by the kernel (Linux "
            "Cross Memory Attach, process_vm_readv and process_vm_writev, as MPICH does), "
            "for the collectives and sizes where that beats staging through node-shared "
            "memory and the MPI library's own collective (docs/performance.md).  Probed "
            "when a communicator is made: used only where every rank of the node may read "
            "and write every other (same user, ptrace allowed; containers often forbid "
            "it).  Where Yama's "
            "ptrace_scope is 1 (Ubuntu's default) each rank lets processes of its user read "
            "it (prctl PR_SET_PTRACER_ANY, as Open MPI does); off: it does not.",
            public=True, agree=True),
    Setting("shm_slot_bytes", int, 512 << 10,
            "Size of each staging slot in a rank's shared segment; a message moves one slot per "
            "step (every step is a point where the collective can be suspended).  Chunks "
            "this size stay in the cores' caches between the copy in, the reduction and the "
            "copy out (2 ranks, 16 MiB allreduce on ordinary buffers: 3.3-3.5 ms against "
            "3.8-4.0 with 4 MiB slots; registered buffers and 1 MiB alike).",
            minimum=4096, parse=_parse_size,
            maximum=1 << 30, agree=True),
    Setting("shm_slots", int, 2,
            "Staging slots per rank and communicator (memory: shm_slots x shm_slot_bytes per "
            "rank per communicator, allocated when the communicator is made).", minimum=1,
            maximum=64, agree=True),
    Setting("shm_min_bytes", int, 64 << 10,
            "Messages from this size on use shared memory (registered buffers always do); "
            "smaller ones use MPI point-to-point.", minimum=0, parse=_parse_size,
            maximum=1 << 40, agree=True),
    Setting("shm_in_c", bool, True,
            "Run node-shared-memory programs on host arrays in C (hpccoll/engine/_native.c, "
            "built at install where a C compiler is present) where it has their reduction: "
            "sum and prod on integer, float32 and float64 data, max and min on integers, "
            "or none; the others run in Python with NumPy, bit for bit alike.  Used only "
            "when every rank has it built (agreed at init)."),
    Setting("shm_c_bytes", int, 8 << 10,
            "Where shm_in_c runs them, allreduce, reduce and reduce_scatter on one node take "
            "node-shared memory instead of the MPI library's own collective above this "
            "size, even below mpi_coll_bytes and shm_min_bytes, and so do allgather up to "
            "512 KiB, broadcast up to 128 KiB, alltoall at every size up to 64 KiB (2 ranks: "
            "16-64 KiB 0.8-1.8x MPI's own "
            "blocking collective, against 0.5-0.8x through MPI's own nonblocking one; 8 KiB "
            "and below MPI's own stays faster); 0: never.",
            minimum=0, parse=_parse_size,
            maximum=1 << 40, agree=True),
    Setting("cell_bytes", int, 8 << 10,
            "Where shm_in_c runs them, allreduce, reduce, broadcast, allgather, "
            "reduce_scatter, alltoall, gather, scatter and barrier of up to this many bytes "
            "(the whole "
            "result) on one node complete in one handoff through node-shared cells: each "
            "rank publishes its input with a sequence number in a ring of cells of its "
            "own, and reads its peers' (no MPI call, no system call); 0: never.  Larger "
            "broadcasts, gathers and scatters, where the ranks may read each other's memory "
            "(cma), publish where their input is instead, read in place (docs/performance.md"
            ", Cells).  Memory: 8 cells of this size per rank per communicator.",
            minimum=0, parse=_parse_size, maximum=1 << 20, agree=True),
    Setting("node_size", int, None,
            "Pretend every node_size consecutive world ranks form a node (tests of the "
            "hierarchical algorithms on one machine); None: nodes as MPI reports them.",
            minimum=1, allow_none=True,
            parse=_parse_optional_int,
            maximum=1 << 20, agree=True),
    Setting("check_mismatch", str, "deferred",
            "Ranks that disagree about a collective (type, dtype, count, root, op, buffers, "
            "algorithm) raise the same CollectiveMismatch on every rank, naming ranks, the "
            "sequence number and the fields. 'deferred': each communicator keeps a digest of "
            "its collectives' fingerprints, compared every mismatch_every collectives (riding "
            "along with one), mismatch_ms after the last comparison, when a wait stalls for "
            "mismatch_ms, and at close: a mismatch surfaces within those bounds, at almost no "
            "cost per call. 'every': each collective's fingerprint is compared before it "
            "completes (debugging; one more MPI collective per call). 'off': no check. "
            "True/False mean 'deferred'/'off'.",
            choices=("deferred", "every", "off"), parse=_mismatch_mode, convert=_mismatch_mode,
            public=True, agree=True),
    Setting("mismatch_every", int, 64,
            "check_mismatch='deferred': the digest rides along with every this-many-th "
            "order-matched collective of a communicator.", minimum=1,
            maximum=1_000_000, agree=True),
    Setting("mismatch_ms", float, 100.0,
            "check_mismatch='deferred': milliseconds after which a communicator's digest is "
            "compared over the control plane, and after which a wait without progress probes "
            "for a mismatch.", minimum=1.0),
    Setting("flight_entries", int, 64,
            "The flight recorder: each rank remembers its last this-many collectives (done or "
            "failed: communicator, sequence number or key, collective, dtype, count, algorithm, "
            "issue, start and end times). Timeout reports show every rank's newest and how far "
            "each rank got on each communicator; dump_dir writes them to a file. 0: off.",
            minimum=0,
            maximum=1_000_000),
    Setting("dump_dir", str, None,
            "Directory where a rank that detects a CollectiveTimeout writes one HDF5 file with "
            "every rank's flight record and pending collectives (a mismatch, or a tool that "
            "aborts the job: this rank's own); "
            "`hpccoll-report FILE` prints where the ranks diverged. None: no file.",
            allow_none=True, parse=lambda text: text.strip() or None,
            public=True),
    Setting("report_wait", float, 1.0,
            "Seconds a rank that hit the timeout waits for the other ranks' reports.", minimum=0.0),
    Setting("trace", bool, False,
            "Record one entry per completed collective (issue, start and end times, yields with "
            "their times, counters) for ctx.trace(): HDF5 logs and timeline exports.",
            public=True),
    Setting("print_report", bool, True,
            "Print the watchdog report to stderr on every rank whose timeout fires (it is also "
            "in CollectiveTimeout.report)."),
    Setting("spin_polls", int, 32,
            "Engine passes without progress before the engine starts to sleep between polls "
            "(sleeping releases the GIL for the application).  Left at its default, it is 0 "
            "on a node whose ranks outnumber the CPUs they may run on (spinning there takes "
            "the core a peer needs).", minimum=0,
            maximum=1 << 30),
    Setting("spin_us", float, 500.0,
            "Microseconds a thread in wait() keeps polling without sleeping, however many "
            "polls find nothing (MPI moves a large message while it is tested; a sleep there "
            "only adds latency).  Left at its default, it is 0 on a node whose ranks "
            "outnumber the CPUs they may run on.", minimum=0.0),
    Setting("yield_polls", int, 0,
            "Fruitless polls after spin_polls in which a thread waiting in wait() hands its CPU "
            "to another process (sched_yield) before it starts to sleep.  Left at its default, it "
            "is 1000 on a node whose ranks outnumber the CPUs they may run on: there the peer "
            "a wait needs is usually ready to run on this CPU, and a yield runs it at once where "
            "a sleep leaves the CPU until the timer fires.  With spin_polls, spin_us and "
            "yield_polls all left at their defaults, waiting also follows the machine's load: "
            "while it has more runnable threads than CPUs (another job's process beside this "
            "one), a waiter does not spin but yields, as on such a node (looked at every 10 ms "
            "at most, in waits that their first polls did not end).", minimum=0,
            maximum=1 << 30),
    Setting("poll_sleep_us", float, 100.0,
            "Longest sleep in microseconds between polls while collectives are pending (the sleep "
            "grows from 0 to this; new submissions cut it short).", minimum=0.0),
    Setting("close_timeout", float, 60.0,
            "Seconds close() waits for the other ranks to close before giving up with a warning.",
            minimum=0.0, public=True),
    Setting("express", bool, True,
            "Start a collective on the calling thread when it is issued, where the policy "
            "allows (preemptive and ordered: those the MPI library runs; preemptive with no "
            "max_active: shared-memory programs too) and its communicator's previous "
            "collective has started; off: every collective is queued for the engine."),
    Setting("persistent_bytes", int, 4096,
            "Collectives that run as the MPI library's own (mpi_coll_bytes) up to this many "
            "bytes reuse persistent requests (MPI-4 *_init, started again each call) on staging "
            "buffers of their plan, where MPI has them; 0 disables.", minimum=0,
            parse=_parse_size,
            maximum=1 << 30, agree=True),
    Setting("inline_bytes", int, 4096,
            "Collectives up to this size are driven by the calling thread when the engine is idle, "
            "avoiding the thread hand-off (0 disables).", minimum=0, parse=_parse_size,
            maximum=1 << 40),
)

_BY_NAME = {s.name: s for s in SETTINGS}
_ENV_NAMES = {s.env: s for s in SETTINGS}
# HPCCOLL_ variables of the scripts, templates and tests, not settings
TOOL_VARIABLES = frozenset(
    "HPCCOLL_" + n for n in (
        "ENV", "LAUNCHER", "SRUN_MPI", "BENCH_ARGS", "BENCH_COLLS", "RESULTS", "VENV", "ROOT",
        "CHAOS_ARGS", "CHAOS_SCENARIOS", "TRAIN_ARGS", "SITE_MPI", "SLURM_DIR", "SLURM_NODES",
        "SLURM_PORT", "REQUIRE_SLURM", "REQUIRE_NATIVE", "REQUIRE_MPI4PY_SUITE", "TEST_REAL_GPU",
        "TEST_RANKS", "TEST_PARTS", "TEST_UNIT", "MPI", "MPIEXEC",
        "TEST_POLICY", "TEST_POLICIES", "DTYPES", "SLOW", "COMPILED"))
_WARNED: set = set()


def unknown_variables(environ) -> list:
    """(name, closest setting's variable or None) for each HPCCOLL_ variable in
    ``environ`` that is neither a setting nor one of the tools' own."""
    out = []
    for name in sorted(environ):
        if name.startswith("HPCCOLL_") and name not in _ENV_NAMES and name not in TOOL_VARIABLES:
            close = difflib.get_close_matches(name, list(_ENV_NAMES), n=1, cutoff=0.75)
            out.append((name, close[0] if close else None))
    return out


def _warn_unknown(environ) -> None:
    """A misspelt setting is otherwise ignored without a word: say so, once per name."""
    for name, close in unknown_variables(environ):
        if name in _WARNED:
            continue
        _WARNED.add(name)
        hint = f"; did you mean {close}?" if close else \
            "; `python -m hpccoll config` lists the settings"
        warnings.warn(f"environment variable {name} is not an hpccoll setting and is "
                      f"ignored{hint}", stacklevel=3)


class Settings:
    """Resolved values as attributes, plus ``sources``: where each came from
    ('argument', 'environment' or 'default')."""

    def __init__(self, values: dict, sources: dict):
        self.__dict__.update(values)
        self.values = dict(values)
        self.sources = dict(sources)

    def as_dict(self) -> dict:
        return dict(self.values)

    def __repr__(self) -> str:
        return f"Settings({self.values!r})"


def resolve(overrides: Optional[dict] = None, environ: Optional[dict] = None) -> Settings:
    """Explicit overrides > HPCCOLL_<NAME> environment > defaults.  Unknown names raise."""
    overrides = dict(overrides or {})
    environ = os.environ if environ is None else environ
    unknown = sorted(set(overrides) - set(_BY_NAME))
    if unknown:
        raise ArgumentError(
            f"unknown option(s) {', '.join(unknown)}; known options: {', '.join(sorted(_BY_NAME))}")
    _warn_unknown(environ)
    values, sources = {}, {}
    for s in SETTINGS:
        if s.name in overrides and overrides[s.name] is not None:
            values[s.name] = s.check(overrides[s.name], f"argument {s.name}")
            sources[s.name] = "argument"
        elif s.env in environ:
            try:
                raw = s.from_text(environ[s.env])
            except (ValueError, OverflowError, TypeError) as exc:
                raise ArgumentError(f"environment variable {s.env}: expected {s.expected()}, "
                                    f"got {environ[s.env]!r}") from exc
            values[s.name] = s.check(raw, f"environment variable {s.env}")
            sources[s.name] = "environment"
        else:
            values[s.name] = s.default
            sources[s.name] = "default"
    if values["timeout"] == 0:
        values["timeout"] = None
    return Settings(values, sources)


def describe(settings: Optional[Settings] = None, everything: bool = False) -> str:
    """The effective settings, one per line: value, where it came from, its environment
    variable; the internal ones too with ``everything``."""
    settings = settings or resolve()
    shown = [s for s in SETTINGS if s.public or everything]
    width = max(len(s.name) for s in shown)
    lines = [f"{'setting':<{width}}  {'value':<12} source       environment variable"]
    for s in shown:
        lines.append(f"{s.name:<{width}}  {settings.values[s.name]!s:<12} "
                     f"{settings.sources[s.name]:<12} {s.env}")
    return "\n".join(lines)


def _row(s: Setting) -> str:
    typ = s.type.__name__ + (" or None" if s.allow_none else "")
    doc = s.doc + (f" Choices: {', '.join(s.choices)}." if s.choices else "")
    if s.agree:
        doc += " The same on every rank."
    return f"| `{s.name}` | `{s.env}` | {typ} | `{s.default!r}` | {doc} |"


def markdown(everything: bool = False) -> str:
    """docs/config.md: the public settings (``everything``: the internal ones after them)."""
    lines = [
        "# Settings",
        "",
        "Generated from `hpccoll/config.py` by `python -m hpccoll config --markdown`; do not edit.",
        "",
        "Pass them to `hpccoll.init(name=value)` or set `HPCCOLL_<NAME>` in the environment; an",
        "explicit argument wins over the environment, which wins over the default.",
        "`python -m hpccoll config` prints the effective values and where each came from.",
        "An `HPCCOLL_` variable that is neither a setting nor one of the scripts' own warns once,",
        "naming the closest setting.  Settings marked \"the same on every rank\" are compared",
        "when `init` runs: ranks that differ all raise the same error naming the setting.",
        "",
        "Internal settings (algorithm thresholds, the engine's polling, the mismatch check's",
        "period, ...) tune what the table below does not; `python -m hpccoll config --all`",
        "lists them with their documentation, and they are passed the same way.",
        "",
        "| name | environment | type | default | description |",
        "|---|---|---|---|---|",
    ]
    lines += [_row(s) for s in SETTINGS if s.public]
    if everything:
        lines += ["", "## Internal settings", "",
                  "| name | environment | type | default | description |", "|---|---|---|---|---|"]
        lines += [_row(s) for s in SETTINGS if not s.public]
    return "\n".join(lines) + "\n"


def agreed(settings: Settings) -> tuple:
    """The values every rank must share (compared at init), in registry order."""
    return tuple((s.name, settings.values[s.name]) for s in SETTINGS if s.agree)


def disagreement(values_by_rank: list) -> Optional[str]:
    """Where ranks' ``agreed`` values differ: the first setting, each value and its ranks;
    None if they all agree."""
    first = values_by_rank[0]
    for i, (name, _) in enumerate(first):
        seen: dict = {}
        for rank, values in enumerate(values_by_rank):
            seen.setdefault(repr(values[i][1]), []).append(rank)
        if len(seen) > 1:
            parts = "; ".join(f"rank{'s' if len(r) > 1 else ''} {_ranks(r)}: {v}"
                              for v, r in seen.items())
            return (f"setting {name} (HPCCOLL_{name.upper()}) must be the same on every rank, "
                    f"got {parts}")
    return None


def _ranks(ranks: list) -> str:
    return ", ".join(map(str, ranks[:8])) + (" ..." if len(ranks) > 8 else "")
