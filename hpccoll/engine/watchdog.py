"""Turning a hang into a report that names ranks.

``Watchdog`` (driven by whoever holds the engine): a running collective without
progress for ``timeout`` seconds, or a queued one issued that long ago while nothing at
all progressed on this rank, fires: this rank asks every rank for a snapshot of its
pending collectives and flight record (control plane), waits ``report_wait`` for the
answers, and fails everything pending with a CollectiveTimeout whose report names
ranks.  Every stuck rank fires on its own, so every one raises.

The rest are pure functions over the snapshots the ranks send each other: which
collectives each rank has pending, which are missing where, and, when the ranks wait on
each other in a circle, the cycle and why it formed.
"""
from __future__ import annotations

import sys
import time
from typing import Optional

from ..errors import CollectiveTimeout
from . import flight
from .control import TAG_REPORT_REQ
from .task import RUNNING

TIMEOUT_LOOK = 0.005    # seconds between the watchdog's looks at every pending collective


class Watchdog:
    """One rank's watchdog (its state: the report under way, if any)."""

    def __init__(self, engine):
        self.engine = engine
        self.report = None        # the report this rank collects, while it does
        self.last_tasks = None    # this rank's pending collectives when its watchdog fired
        self._look = 0.0          # when ``check`` looks at the tasks next
        self._id = 0

    def check(self) -> None:
        """A running collective without progress for ``timeout`` fires; so does a queued
        one (waiting for a slot, or for its global order) issued that long ago, when
        nothing at all progressed on this rank meanwhile."""
        if self.report is not None:
            return
        now = time.monotonic()
        if now < self._look:
            return
        engine = self.engine
        limit = engine.settings.timeout
        # (every pass would build the list of everything pending: with a thousand
        # collectives in flight that is most of a pass; a timeout is seconds)
        self._look = now + min(TIMEOUT_LOOK, limit / 10)
        stalled = now - engine.last_progress > limit
        for t in engine.live():
            if t.state == RUNNING and now - t.last_progress > limit:
                self._start(t, now - t.last_progress)
                return
            if t.state != RUNNING and stalled and now - t.t_issue > limit:
                self._start(t, now - max(t.t_issue, engine.last_progress))
                return

    def _start(self, task, idle: float) -> None:
        engine = self.engine
        ctl = engine.control
        self._id += 1
        rid = (ctl.rank, self._id)
        s = engine.settings
        self.report = {
            "id": rid, "deadline": time.monotonic() + s.report_wait,
            "snaps": {ctl.rank: engine.snapshot()},
            "trigger": {"rank": ctl.rank, "what": task.describe(), "idle": idle,
                        "timeout": s.timeout, "policy": engine.policy.name},
        }
        ctl.broadcast(rid, range(ctl.size), TAG_REPORT_REQ)

    def on_report(self, src: int, obj) -> None:
        """A rank's answer (TAG_REPORT) to a report request."""
        rid, snap = obj
        if self.report is not None and rid == self.report["id"]:
            self.report["snaps"][src] = snap

    def progress(self) -> None:
        """Once every rank answered, or ``report_wait`` passed: fail everything pending
        with the report."""
        rep = self.report
        engine = self.engine
        ctl = engine.control
        s = engine.settings
        if len(rep["snaps"]) < ctl.size and time.monotonic() < rep["deadline"]:
            return
        self.report = None
        self.last_tasks = rep["snaps"][ctl.rank]["tasks"]
        text = format_report(rep["trigger"], rep["snaps"], ctl.size, s.report_wait)
        if s.dump_dir:
            path = flight.dump(s.dump_dir, "timeout", rep["trigger"]["what"], rep["snaps"],
                               ctl.rank)
            if path:
                text += f"\nFlight record of every rank that answered: {path}"
        if s.print_report:
            print(text, file=sys.stderr, flush=True)
        exc = CollectiveTimeout(
            f"rank {ctl.rank}: {rep['trigger']['what']} made no progress for "
            f"{rep['trigger']['idle']:.1f} s (timeout={s.timeout:g})", text)
        engine._break(exc)
        for t in engine.live():
            t.fail(exc)
            engine.complete(t)


def _task_line(t: dict) -> str:
    where = f"{t['algo']}, wait {t['waits_done']}/{t['waits']}"
    if t["state"] == "running":
        extra = f"idle {t['idle']:.1f} s"
        if t["waiting_on"]:
            extra += f", waiting on rank(s) {', '.join(map(str, t['waiting_on']))}"
        if t.get("yields"):
            extra += f", yielded {t['yields']}x"
    else:
        extra = f"issued {t['age']:.1f} s ago"
    gseq = f" gseq {t['gseq']}" if t.get("gseq") is not None else ""
    return (f"    {t['state']:<8} {t['coll']} {t['ident']} {t['dtype']} x{t['count']}"
            f"{gseq} [{where}; {extra}]")


def collective_table(snaps: dict) -> dict:
    """ident -> {"coll", "members", "where": {rank: state}} over every pending collective."""
    table: dict = {}
    for rank, snap in snaps.items():
        for t in snap.get("tasks", []):
            row = table.setdefault(t["ident"], {"coll": t["coll"], "members": t["members"], "where": {}})
            row["where"][rank] = t["state"]
    return table


def _running(snaps: dict, rank: int) -> list:
    return [t for t in snaps.get(rank, {}).get("tasks", []) if t["state"] == "running"]


def find_cycle(snaps: dict) -> Optional[list]:
    """A circular wait among ranks: [(rank, task waited on, peer), ...] or None."""
    edges: dict = {}
    for rank in snaps:
        for t in _running(snaps, rank):
            for peer in t["waiting_on"]:
                if peer != rank:
                    edges.setdefault(rank, []).append((peer, t))
    # follow, first, peers that answered and do not run the collective themselves: they
    # are the ones holding it up (an MPI collective waits on every member, most of whom
    # are fine; a rank that did not answer, starved of CPU on a crowded node, says nothing)
    for rank, out in edges.items():
        out.sort(key=lambda pt: (pt[0] not in snaps,
                                 _state_of(snaps, pt[0], pt[1]["ident"]).endswith("too")))
    for start in sorted(edges):
        path, seen = [], {}
        node = start
        while node in edges and node not in seen:
            seen[node] = len(path)
            peer, t = edges[node][0]
            path.append((node, t, peer))
            node = peer
        if node in seen:
            return path[seen[node]:]
    return None


def _state_of(snaps: dict, rank: int, ident: str) -> str:
    if rank not in snaps:
        return f"rank {rank} did not answer"
    tasks = snaps[rank].get("tasks", [])
    mine = [t for t in tasks if t["ident"] == ident]
    if not mine:
        return f"rank {rank} has not issued {ident} (or has finished it)"
    t = mine[0]
    if t["state"] == "queued":
        ahead = [x["ident"] for x in tasks if x["state"] == "running"]
        behind = f" behind {', '.join(ahead)}" if ahead else ""
        return f"rank {rank} has {ident} queued{behind}"
    return f"rank {rank} runs {ident} too"


def diagnose(snaps: dict) -> str:
    cycle = find_cycle(snaps)
    if cycle:
        parts = [f"rank {rank} runs {t['ident']} and waits for rank {peer}, "
                 f"{_state_of(snaps, peer, t['ident']).replace(f'rank {peer} ', 'which ', 1)}"
                 for rank, t, peer in cycle]
        return ("circular wait: " + "; ".join(parts) + ". The ranks launched these collectives in "
                "different orders; use policy 'preemptive' or 'ordered', or issue collectives in one "
                "order on every rank.")
    missing = []
    for ident, row in sorted(collective_table(snaps).items()):
        # (a rank that did not answer may well have it pending: not counted as absent)
        absent = [m for m in row["members"] if m not in row["where"] and m in snaps]
        silent = [m for m in row["members"] if m not in snaps]
        if absent:
            missing.append(f"{ident} is pending on rank(s) {', '.join(map(str, sorted(row['where'])))}"
                           f" but not on rank(s) {', '.join(map(str, absent))}"
                           + (f" (rank(s) {', '.join(map(str, silent))} did not answer)"
                              if silent else ""))
    if missing:
        return ("ranks never arrived: " + "; ".join(missing) + ". A rank skipped a collective, "
                "issued a different one, or is busy elsewhere.")
    return "no circular wait found; a peer may be slow or blocked outside hpccoll."


def format_report(trigger: dict, snaps: dict, world_size: int, waited: float) -> str:
    lines = [f"hpccoll watchdog on rank {trigger['rank']}: {trigger['what']} made no progress for "
             f"{trigger['idle']:.1f} s (timeout {trigger['timeout']:g} s, policy {trigger['policy']})",
             "Pending collectives per rank:"]
    for rank in range(world_size):
        snap = snaps.get(rank)
        if snap is None:
            lines.append(f"  rank {rank}: did not answer within {waited:.1f} s")
            continue
        head = f"  rank {rank} ({snap.get('host', '?')}, pid {snap.get('pid', '?')})"
        if snap.get("status", "ok") != "ok":
            head += f" [{snap['status']}]"
        tasks = snap.get("tasks", [])
        lines.append(head + (":" if tasks else ": no pending collectives"))
        lines += [_task_line(t) for t in tasks]
    table = collective_table(snaps)
    if table:
        lines.append("Per collective (members: state):")
        for ident, row in sorted(table.items()):
            states = [f"{m}: {row['where'].get(m, 'not pending' if m in snaps else 'no answer')}"
                      for m in row["members"]]
            lines.append(f"  {row['coll']} {ident}: " + ", ".join(states))
    if any(snap.get("flight") for snap in snaps.values()):
        last_entries, standings = flight.last_entries, flight.standings
        lines.append("Last collectives per rank (flight recorder, newest last):")
        for rank in sorted(snaps):
            lines.append(f"  rank {rank}:")
            lines += last_entries(snaps[rank]) or ["      nothing recorded"]
        lines.append("Where each rank stands, per communicator:")
        lines += standings(snaps)
    lines.append("Diagnosis: " + diagnose(snaps))
    return "\n".join(lines)
