"""The flight recorder: every rank's last collectives, for the hangs and mismatches users
debug after the fact (what torch.distributed's flight recorder gives NCCL users).

The engine appends one entry per collective it retires, done or failed, into a ring of
the ``flight_entries`` newest: a tuple of references it holds anyway (the communicator's
state and the plan, never the caller's arrays), so that recording costs a tuple and an
append per call.  Everything else happens only when something went wrong:

- ``rows`` turns the ring into plain rows (wall-clock times); every rank's snapshot for a
  timeout report carries them (engine.snapshot);
- ``standings`` says, per communicator, how far each rank got: the last order-matched
  collective it completed and the ones it has pending.  Where ranks differ is where they
  diverged;
- ``dump`` writes a report's snapshots (every rank that answered: its ring and its pending
  collectives) to one HDF5 file under ``dump_dir``, a run of kind ``flight``;
- ``summary`` is what ``hpccoll-report`` prints for such a file.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Optional

from .. import h5log
from ..base.ops import dtype_name

KIND = "flight"
SHOWN = 4          # newest entries per rank in a timeout report


class Recorder:

    def __init__(self, entries: int):
        # a list written round (a deque's append is a method call; this is a store)
        self.ring = [None] * entries
        self.next = 0       # where the next entry goes (the oldest one, once full)

    def append(self, task) -> None:
        i = self.next
        self.ring[i] = (task.comm, task.seq, task.key, task.plan, task.state, task.t_issue,
                        task.t_start, task.t_end)
        i += 1
        self.next = 0 if i == len(self.ring) else i

    def entries(self) -> list:
        """The ring's entries, oldest first."""
        i = self.next
        return [e for e in self.ring[i:] + self.ring[:i] if e is not None]

    def rows(self, epoch: float) -> list:
        """The ring, oldest first, as plain rows; ``epoch`` turns monotonic into wall-clock
        seconds (Context._epoch)."""
        out = []
        for comm, seq, key, plan, state, t_issue, t_start, t_end in self.entries():
            out.append({
                "comm": comm.name, "seq": -1 if seq is None else seq,
                "key": "" if key is None else str(key),
                "ident": f"{comm.name}#{seq}" if key is None else f"{comm.name}[{key!r}]",
                "coll": plan.coll, "dtype": dtype_name(plan.dtype), "count": plan.count,
                "algo": plan.algo, "state": state,
                "t_issue": t_issue + epoch,
                "t_start": (t_start + epoch) if t_start is not None else float("nan"),
                "t_end": (t_end + epoch) if t_end is not None else float("nan")})
        return out


def standings(snaps: dict) -> list:
    """Text lines: per communicator, each rank's last completed order-matched collective
    and its pending ones, from the snapshots (rank -> snapshot with "flight" and "tasks")."""
    comms: dict = {}
    for rank, snap in sorted(snaps.items()):
        for row in snap.get("flight", ()):
            if row["key"] == "" and row["state"] == "done":
                mine = comms.setdefault(row["comm"], {}).setdefault(rank, [None, []])
                mine[0] = row["seq"] if mine[0] is None else max(mine[0], row["seq"])
        for t in snap.get("tasks", ()):
            comms.setdefault(t["comm"], {}).setdefault(rank, [None, []])[1].append(
                f"{t['coll']} {t['ident']} ({t['state']})")
    lines = []
    for name, ranks in sorted(comms.items()):
        lasts = {r: v[0] for r, v in ranks.items()}
        parts = []
        for r, (last, pending) in sorted(ranks.items()):
            text = f"rank {r}: " + ("nothing recorded done" if last is None
                                    else f"done to #{last}")
            if pending:
                text += ", pending " + ", ".join(pending)
            parts.append(text)
        split = len({v for v in lasts.values()}) > 1
        lines.append(f"  {name}{' (ranks differ)' if split else ''}: " + "; ".join(parts))
    return lines


def last_entries(snap: dict, n: int = SHOWN) -> list:
    return [f"      {r['state']:<7} {r['coll']} {r['ident']} {r['dtype']} x{r['count']} "
            f"[{r['algo']}]" for r in snap.get("flight", ())[-n:]]


def dump(directory: str, reason: str, trigger: str, snaps: dict, rank: int) -> Optional[str]:
    """Write ``snaps`` (rank -> snapshot) to a new HDF5 file in ``directory``; returns its
    path, or None with the reason printed when it cannot be written (an error path must
    not fail on its diagnostics)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = os.path.join(directory, f"hpccoll-flight-{stamp}-rank{rank}-{os.getpid()}.h5")
    try:
        os.makedirs(directory, exist_ok=True)
        attrs = {"reason": reason, "trigger": trigger, "detected_on": rank,
                 "ranks_answered": sorted(snaps)}
        with h5log.RunWriter(path, "flight", attrs, kind=KIND) as run:
            entries = [dict(row, rank=r) for r, snap in sorted(snaps.items())
                       for row in snap.get("flight", ())]
            if entries:
                run.table("entries").append([_flat(e) for e in entries])
            pending = [dict(_flat(t), rank=r) for r, snap in sorted(snaps.items())
                       for t in snap.get("tasks", ())]
            if pending:
                run.table("pending").append(pending)
        return str(run.final_path)
    except Exception as exc:        # noqa: BLE001 - diagnostics only
        print(f"hpccoll: could not write the flight record to {path}: {exc}", file=sys.stderr)
        return None


def dump_own(engine, reason: str, exc: BaseException) -> Optional[str]:
    """``dump`` of this rank's own record (a mismatch each member detects, a job a tool
    aborts), where ``dump_dir`` is set; the caller holds the engine's lock."""
    directory = engine.settings.dump_dir
    if not directory or engine.flight is None:
        return None
    first = (str(exc).splitlines() or [""])[0]
    rank = engine.control.rank
    return dump(directory, reason, f"{type(exc).__name__}: {first}",
                {rank: engine.snapshot()}, rank)


_PENDING = ("comm", "ident", "seq", "key", "coll", "dtype", "count", "state", "algo",
            "waits_done", "waits", "age", "idle", "waiting_on")


def _flat(row: dict) -> dict:
    """A row HDF5 can hold: scalars and strings (lists as text)."""
    out = {}
    for k, v in row.items():
        if k in ("members", "sending_to", "root", "op", "gseq", "bytes_moved", "yields"):
            continue
        if isinstance(v, (list, tuple, set)):
            v = ",".join(map(str, v))
        elif v is None:
            v = -1 if k in ("seq",) else ""
        out[k] = v
    if "waiting_on" in row or "age" in row:     # a pending task: fixed columns
        out = {k: out.get(k, "") for k in _PENDING}
        out["seq"] = -1 if out["seq"] in ("", None) else out["seq"]
        out["key"] = "" if out["key"] in (None, -1) else str(out["key"])
    return out


def summary(run) -> list:
    """hpccoll-report's lines for a flight record: why it was written, each rank's last
    entries, and where the ranks stand on each communicator."""
    attrs = run.attrs
    lines = [f"flight record: {attrs.get('reason', '?')} detected on rank "
             f"{attrs.get('detected_on', '?')}: {attrs.get('trigger', '')}"]
    snaps: dict = {}
    for row in run.tables.get("entries", []):
        snaps.setdefault(int(row["rank"]), {"flight": [], "tasks": []})["flight"].append(
            {k: _text(v) for k, v in row.items()})
    for row in run.tables.get("pending", []):
        snaps.setdefault(int(row["rank"]), {"flight": [], "tasks": []})["tasks"].append(
            {k: _text(v) for k, v in row.items()})
    for rank in sorted(snaps):
        lines.append(f"  rank {rank}, newest last:")
        lines += last_entries(snaps[rank], n=len(snaps[rank]["flight"]))
        for t in snaps[rank]["tasks"]:
            lines.append(f"      {t['state']:<7} {t['coll']} {t['ident']} {t['dtype']} "
                         f"x{t['count']} [{t['algo']}] (pending)")
    lines.append("Where each rank stands, per communicator:")
    lines += standings(snaps)
    return lines


def _text(v):
    return v.decode() if isinstance(v, bytes) else (v.item() if hasattr(v, "item") else v)
