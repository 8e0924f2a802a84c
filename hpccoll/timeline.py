"""Engine traces as a timeline: Chrome trace-event JSON, which Perfetto
(ui.perfetto.dev) and chrome://tracing open.

    events = chrome_trace(ctx.trace())             # or rows read back from an HDF5 log
    json.dump(events, open("trace.json", "w"))

Layout: one process per rank ("rank N"), one slice per collective from its start to its
end (name: the collective; args: communicator, algorithm, bytes, tries, yields, the time
it was queued between issue and start, ...), and an instant event "yield" at each time
it yielded (DFCCL's preemption points).  Collectives
that overlap on one rank are put on separate tracks of its process, because trace
viewers draw slices of one track only if they nest.
"""
from __future__ import annotations

import math
from typing import Iterable, Optional

_ARGS = ("comm", "ident", "algo", "dtype", "count", "bytes", "state", "tries", "yields",
         "yields_progress", "polls", "gseq", "phase", "row")


def _us(t: float, t0: float) -> float:
    return round((t - t0) * 1e6, 3)


def _valid(rec: dict) -> bool:
    ts = (rec.get("t_start"), rec.get("t_end"))
    return all(t is not None and not (isinstance(t, float) and math.isnan(t)) for t in ts)


def _issue(rec: dict) -> float:
    t = rec.get("t_issue")
    if t is None or (isinstance(t, float) and math.isnan(t)):
        return rec["t_start"]
    return min(t, rec["t_start"])


def first_time(records: Iterable[dict]) -> float:
    """The earliest issue time of the records (the origin of a timeline)."""
    return min((_issue(r) for r in records if _valid(r)), default=0.0)


def chrome_trace(records: Iterable[dict], label: str = "", pid_base: int = 0,
                 t0: Optional[float] = None) -> dict:
    """Trace records (dicts with rank, coll, t_issue, t_start, t_end in seconds, and
    optionally yield_times and counters) -> a Chrome trace-event JSON object.
    ``pid_base`` offsets process ids, so several runs can share one file."""
    recs = [r for r in records if _valid(r)]
    if t0 is None:
        t0 = first_time(recs)
    events: list[dict] = []
    by_rank: dict[int, list] = {}
    for r in recs:
        by_rank.setdefault(int(r["rank"]), []).append(r)
    for rank in sorted(by_rank):
        pid = pid_base + rank
        name = f"{label} rank {rank}".strip()
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": name}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                       "args": {"sort_index": pid}})
        lanes: list[float] = []       # end time of the last slice on each track
        for r in sorted(by_rank[rank], key=lambda r: r["t_start"]):
            begin = r["t_start"]
            tid = next((i for i, end in enumerate(lanes) if end <= begin), len(lanes))
            if tid == len(lanes):
                lanes.append(0.0)
                events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                               "args": {"name": "collectives" if tid == 0 else f"collectives {tid + 1}"}})
            lanes[tid] = r["t_end"]
            args = {k: _plain(r[k]) for k in _ARGS if k in r}
            args["queued_us"] = _us(r["t_start"], _issue(r))
            events.append({"ph": "X", "name": str(r["coll"]), "cat": str(r.get("algo", "")),
                           "ts": _us(begin, t0), "dur": _us(r["t_end"], begin),
                           "pid": pid, "tid": tid, "args": args})
            ys = r.get("yield_times")
            for ty in (() if ys is None else ys):
                events.append({"ph": "i", "s": "t", "name": "yield", "cat": "yield",
                               "ts": _us(float(ty), t0), "pid": pid, "tid": tid,
                               "args": {"coll": str(r["coll"]), "ident": _plain(r.get("ident"))}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"source": "hpccoll engine trace", "t0_unix_s": t0, "label": label}}


def _plain(v):
    """JSON-safe scalars (numpy values, NaN) for trace args."""
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and math.isnan(v):
        return None
    return v
