"""The mismatch guarantee: ranks that disagree about a collective (type, dtype, count,
root, op, buffers, algorithm) raise the same CollectiveMismatch on every rank, naming
the ranks, the collective's sequence number and the fields that differ.

Pure bookkeeping, no MPI calls (the engine moves the messages):

- a **fingerprint** is a tuple of ints, ``FP_FIELDS`` in order; a plan computes it once,
  the sequence number (or key) is the only per-call part;
- a communicator's **ledger** keeps the fingerprints of its last order-matched
  collectives and a rolling digest over all of them (one multiply and add per call);
- ``verdict`` compares every rank's rows and says who differs and how.

How the ledger is compared (check_mismatch="deferred", the default), each path raising
the same error everywhere:

1. every ``mismatch_every`` collectives the digest rides along with that collective: on
   the node-shared digest board where every member shares the node (each posts its digest
   and reads its peers'; a difference probes as in 3), else as an MPI allreduce of (d, -d)
   (min of both: all equal iff min == max), the ranks exchanging their rows only when
   digests differ (engine/check.py);
2. ``mismatch_ms`` after a communicator's last note, a rank sends its latest digest to
   the next member over the control plane; a member whose digest at that sequence
   differs probes: it asks every member for its rows, decides, and sends the verdict;
3. a wait that makes no progress for ``mismatch_ms``, or an MPI error, probes at once;
4. ``close()`` compares every communicator's digest one last time, and so does
   ``free()`` for its communicator; a context still open when the interpreter exits or
   when MPI finalizes (MPI.Finalize() called by the program, or mpi4py's at exit)
   closes first, so a mismatch in a program's last collectives is printed on every rank
   even where nothing was closed or freed.

So a mismatch surfaces at most ``mismatch_every`` collectives on its communicator, or
about ``2 x mismatch_ms`` after the mismatched call, whichever comes first (the second
once the later rank has issued it), and a hang it causes within ``mismatch_ms``.
check_mismatch="every" compares each call's fingerprint before the call completes
(debugging); "off" compares nothing.
"""
from __future__ import annotations

import hashlib
from functools import partial
from typing import Optional

import numpy as np

from .ops import COLLECTIVES, DTYPES, OPS

FP_FIELDS = ("collective", "dtype", "count", "root", "op", "sequence", "buffers", "algorithm")
SEQ = FP_FIELDS.index("sequence")
MASK = (1 << 62) - 1
_MIX = 1_000_003
# The fingerprint's "algorithm" field: every algorithm's number (ranks must agree on the
# algorithm).  hpccoll/algorithms checks at import that its table names no other.
ALGO_CODES = {name: i + 1 for i, name in enumerate((
    "binomial", "bruck", "chain", "cma", "direct", "dissemination", "doubling", "hier", "mpi",
    "pairwise", "ring", "shm", "linear", "cells"))}
_ALGO_NAMES = {v: k for k, v in ALGO_CODES.items()}


def with_seq(fp: tuple, seq: int) -> tuple:
    """The full fingerprint of one call from its plan's (whose sequence field is 0)."""
    return fp[:SEQ] + (seq,) + fp[SEQ + 1:]


def stable_hash(data: bytes) -> int:
    """A fingerprint field from bytes (a key, a list of counts): 63 bits, the same in
    every process (Python's own hash of bytes is salted per process)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


def fp_hash(fp: tuple) -> int:
    """The same in every process (only str and bytes hashes are salted per process)."""
    return hash(fp) & MASK


def call_hash(h: int, seq: int) -> int:
    """A hash of one call's full fingerprint from its plan's hash and its sequence number
    (no tuple to build: check_mismatch="every" computes one per call)."""
    return (h * _MIX + seq + 1) & MASK


class Ledger:
    """A communicator's order-matched fingerprints: the last ``window`` of them and the
    rolling digest of all of them, in sequence order (the same on every rank that
    issued the same collectives).  Collective s sits at s % window of two fixed lists,
    so recording one allocates nothing."""

    def __init__(self, every: int, window: int):
        self.every, self.window = every, window
        self.fps: list = [None] * window
        self.digests: list = [0] * window
        self.digest = 0
        self.seq = -1                 # the last recorded sequence number
        self.noted = -1               # the last sequence number sent in a note
        self.agreed = -1              # every member agreed up to here
        self.pending: list = []       # notes about sequence numbers not reached yet

    def record(self, seq: int, fp: tuple, h: int) -> Optional[int]:
        """Add collective ``seq`` (fingerprint ``fp``, hash ``h``); returns the digest if
        this collective carries the digest check (``due``), else None: one call on the
        per-call path."""
        d = self.digest = (self.digest * _MIX + h + 1) & MASK
        self.seq = seq
        i = seq % self.window
        self.fps[i] = fp
        self.digests[i] = d
        every = self.every
        return d if seq % every == every - 1 else None

    def due(self, seq: int) -> bool:
        """Whether collective ``seq`` carries the digest check."""
        return seq % self.every == self.every - 1

    def held(self, seq: int) -> bool:
        """Whether the window still holds collective ``seq``."""
        return 0 <= self.seq - seq < self.window and seq >= 0

    def digest_at(self, seq: int) -> Optional[int]:
        """The digest after collective ``seq``, if the window still holds it."""
        return self.digests[seq % self.window] if self.held(seq) else None

    def fp_at(self, seq: int) -> Optional[tuple]:
        return self.fps[seq % self.window] if self.held(seq) else None

    def rows(self, count: Optional[int] = None) -> list:
        """The last ``count`` (default: the window) recorded fingerprints with their
        sequence numbers filled in, oldest first."""
        count = min(count or self.window, self.window, self.seq + 1)
        first = self.seq - count + 1
        return [with_seq(self.fps[s % self.window], s) for s in range(first, self.seq + 1)]

    def padded(self, count: int) -> np.ndarray:
        """``rows(count)`` as a (count, len(FP_FIELDS)) int64 array, missing rows -1 (the
        same shape on every rank, for an allgather)."""
        return self.padded_later(count)()

    def padded_later(self, count: int):
        """A function that makes ``padded(count)`` as of now.  The digest check riding
        along with every ``every``-th collective needs the rows only when digests differ;
        taking them now is one slice of the ring (the array: 37 us, every 64th call)."""
        n = min(count, self.window, self.seq + 1)
        first = self.seq - n + 1
        w = self.window
        i, j = first % w, (self.seq + 1) % w
        if not n:
            fps = []
        elif i < j:
            fps = self.fps[i:j]
        else:               # the rows wrap around the ring's end (or fill all of it)
            fps = self.fps[i:] + self.fps[:j]
        return partial(_padded, fps, first, count)


def _padded(fps: list, first: int, count: int) -> np.ndarray:
    out = np.full((count, len(FP_FIELDS)), -1, np.int64)
    if fps:
        out[count - len(fps):] = fps
        out[count - len(fps):, SEQ] = np.arange(first, first + len(fps))
    return out


def verdict(rows_by_rank: dict) -> Optional[tuple]:
    """(sequence, fields, odd ranks) of the first collective on which the given ranks'
    fingerprints differ, or None.  ``rows_by_rank``: world rank -> iterable of full
    fingerprints (rows of -1 are absent); ``fields``: field -> {value text: [ranks]}."""
    by_seq: dict = {}
    for rank, rows in rows_by_rank.items():
        for row in rows:
            row = tuple(int(v) for v in row)
            if row[SEQ] >= 0:
                by_seq.setdefault(row[SEQ], {})[rank] = row
    for seq in sorted(by_seq):
        got = by_seq[seq]
        if len(set(got.values())) > 1:
            fields, odd = differences(got)
            return seq, fields, odd
    return None


def differences(got: dict) -> tuple:
    """fields -> {value text: [ranks]} and the ranks outside each field's majority."""
    fields, odd = {}, set()
    for i, name in enumerate(FP_FIELDS):
        values: dict = {}
        for r in sorted(got):
            values.setdefault(field_text(name, got[r][i]), []).append(r)
        if len(values) > 1:
            fields[name] = values
            majority = max(values.values(), key=len)
            odd.update(r for ranks in values.values() if ranks is not majority for r in ranks)
    return fields, sorted(odd)


def message(ident: str, comm_name: str, this_rank: int, mine: str, fields: dict) -> str:
    parts = ["{}: {}".format(name, "; ".join(
        f"rank{'s' if len(rs) > 1 else ''} {','.join(map(str, rs))} "
        f"{'have' if len(rs) > 1 else 'has'} {v}" for v, rs in vals.items()))
        for name, vals in fields.items()]
    return (f"ranks disagree about collective {ident} on communicator {comm_name!r} (this "
            f"rank {this_rank} issued {mine}): " + " | ".join(parts))


def field_text(field: str, value) -> str:
    value = int(value)
    if field == "buffers":
        return "ordinary arrays" if value == 0 else f"registered buffers (id {value:#x})"
    if field == "algorithm":
        return _ALGO_NAMES.get(value, str(value))
    names = {"collective": COLLECTIVES, "dtype": list(DTYPES), "op": ["none"] + list(OPS)}
    if field in names:
        table = names[field]
        idx = value if field == "op" else value - 1
        return table[idx] if 0 <= idx < len(table) else str(value)
    return str(value)


def describe_fp(fp) -> str:
    """'allreduce float32 x10' for a fingerprint row (what a rank issued)."""
    return (f"{field_text('collective', fp[0])} {field_text('dtype', fp[1])} x{int(fp[2])}")
