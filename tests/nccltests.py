"""Read nccl-tests output the way the usual scripts do: data lines are the lines that do
not start with '#', split on whitespace; the summary is in the '# ... : value' footer."""
from __future__ import annotations

import re

PLACEMENT_FIELDS = ("time", "algbw", "busbw", "wrong")


def _num(text: str):
    if text == "N/A":
        return None
    return float(text)


def parse(text: str) -> dict:
    rows = []
    for ln in text.splitlines():
        if not ln.strip() or ln.startswith("#"):
            continue
        f = ln.split()
        row = {"size": int(f[0]), "count": int(f[1]), "type": f[2], "redop": f[3],
               "root": int(f[4])}
        for k, place in enumerate(("oop", "ip")):
            for j, name in enumerate(PLACEMENT_FIELDS):
                row[f"{place}_{name}"] = _num(f[5 + 4 * k + j])
        extra = f[13:]
        if extra:
            assert len(extra) == 6, ln
            for k, place in enumerate(("oop", "ip")):
                row[f"{place}_base_time"], row[f"{place}_base_busbw"], row[f"{place}_ratio"] = \
                    map(float, extra[3 * k:3 * k + 3])
        rows.append(row)
    out = {"rows": rows}
    m = re.search(r"^# Out of bounds values\s*:\s*(\d+)\s+(OK|FAILED)", text, re.M)
    out["oob"] = (int(m.group(1)), m.group(2)) if m else None
    m = re.search(r"^# Avg bus bandwidth\s*:\s*(\S+)", text, re.M)
    out["avg_busbw"] = float(m.group(1)) if m else None
    return out
