"""Comparison tables: per (collective, type, op, root, placement), one line per size with
every series' time and busbw, and the ratio to its baseline."""
from __future__ import annotations

import math

from ..bench.table import float_str
from .data import GROUP, group_key


def run_header(run) -> list[str]:
    """One run's provenance line, with what it records (and a note when it did not
    complete)."""
    a = run.attrs
    head = f"{a.get('tool') or run.kind or '?'} {run.label}"
    if "nranks" in a:
        hosts = a.get("hostnames") or []
        head += (f", {a['nranks']} ranks on {len(hosts)} host(s) {','.join(hosts[:4])}"
                 f"{'...' if len(hosts) > 4 else ''}")
    parts = [head]
    if "hpccoll_version" in a:
        parts.append(f"hpccoll {a['hpccoll_version']} (git {a.get('git_revision') or '?'})")
    if a.get("mpi_library_version"):
        parts.append(" ".join(a["mpi_library_version"].splitlines()[0].split()))
    if "device" in a:
        parts.append(f"device {a['device']}")
    parts += [a[k] for k in ("start_time",) if k in a] + [f"status {a.get('status', '?')}"]
    lines = [f"# {run.file} run {run.name}: " + "; ".join(parts)]
    if a.get("status") not in ("complete", None):
        lines.append(f"#   note: this run ended as {a.get('status')!r}: {a.get('error') or 'wrong results'}")
    return lines


def run_summary(series: list) -> list[str]:
    lines, seen = [], set()
    for s in series:
        if id(s.run) not in seen:
            seen.add(id(s.run))
            lines += run_header(s.run)
    return lines


def compare(series: list, baseline_of, stat: str = "mean") -> list[str]:
    """The comparison tables as text lines."""
    points = {id(s): s.points(stat) for s in series}
    groups: list = []
    for s in series:
        for r in s.rows:
            g = group_key(r)
            if g not in groups:
                groups.append(g)
    out = run_summary(series)
    for g in groups:
        members = [s for s in series if any(k[0] == g for k in points[id(s)])]
        sizes = sorted({k[1] for s in members for k in points[id(s)] if k[0] == g})
        idx = {id(s): i + 1 for i, s in enumerate(members)}
        fields = dict(zip(GROUP, g))
        root = f" root {fields['root']}" if fields["root"] >= 0 else ""
        op = f" {fields['op']}" if fields["op"] != "none" else ""
        out += ["#", f"# {fields['coll']} {fields['type']}{op}{root}, {fields['placement']}: time "
                f"({stat} over iterations, us), busbw (GB/s), ratio = baseline time / time "
                "(> 1: faster than the baseline)"]
        for s in members:
            b = baseline_of(s)
            note = f"  (baseline [{idx[id(b)]}])" if b is not None and id(b) in idx else \
                f"  (baseline: {b.name})" if b is not None else ""
            out.append(f"#   [{idx[id(s)]}] {s.name}{note}")
        head = "# %10s" % "size(B)"
        for s in members:
            head += "  %9s  %6s" % (f"[{idx[id(s)]}] time", "busbw")
            if baseline_of(s) is not None:
                head += "  %6s" % "ratio"
        out.append(head)
        logs: dict = {id(s): [] for s in members}
        for size in sizes:
            text = "%12d" % size
            for s in members:
                p = points[id(s)].get((g, size))
                b = baseline_of(s)
                bp = points.get(id(b), {}).get((g, size)) if b is not None else None
                text += "  %9s  %6s" % ((float_str(p[0], 9), float_str(p[1], 6)) if p else ("-", "-"))
                if b is not None:
                    if p and bp and p[0] > 0:
                        ratio = bp[0] / p[0]
                        logs[id(s)].append(math.log(ratio))
                        text += "  %6s" % float_str(ratio, 6)
                    else:
                        text += "  %6s" % "-"
            out.append(text)
        geo = [f"[{idx[i]}] {math.exp(sum(v) / len(v)):.3f}" for i, v in logs.items() if v]
        if geo:
            out.append("# geometric mean ratio: " + ", ".join(geo))
    return out


def ratio_curves(series: list, baseline_of, stat: str = "mean") -> dict:
    """{(group, series name): ([sizes], [ratios])} for every series with a baseline."""
    curves = {}
    for s in series:
        b = baseline_of(s)
        if b is None:
            continue
        mine, theirs = s.points(stat), b.points(stat)
        for (g, size), (t, _) in sorted(mine.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
            if (g, size) in theirs and t > 0:
                xs, ys = curves.setdefault((g, s.name), ([], []))
                xs.append(size)
                ys.append(theirs[(g, size)][0] / t)
    return curves
