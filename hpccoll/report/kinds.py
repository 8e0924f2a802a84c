"""What hpccoll-report prints for a run that is not a benchmark (benchmarks get the
comparison tables of tables.py): one summary per record kind, in one table below.  A kind
without one is listed (its tables, arrays and attributes), so every file reads."""
from __future__ import annotations

from .tables import run_header


def _chaos(run) -> list[str]:
    from ..results import summary
    return summary(run.attrs, run.tables.get("outcomes", []))


def _profile(run) -> list[str]:
    from ..tuning.profile import Profile
    return Profile.from_run(run).table()


def _simulate(run) -> list[str]:
    from ..tuning import report
    return report.table(report.from_run(run)).splitlines()


def _flight(run) -> list[str]:
    from ..engine.flight import summary
    return summary(run)


def _calibration(run) -> list[str]:
    from ..algorithms.calibration import Calibration
    return Calibration.from_run(run).table()


def listing(run) -> list[str]:
    """Any run: its tables and traces (rows, columns), arrays (shape, dtype), attributes."""
    lines = []
    for group in ("tables", "traces"):
        for name, rows in getattr(run, group).items():
            cols = ", ".join(rows[0]) if rows else ""
            lines.append(f"{group}/{name}: {len(rows)} rows ({cols})")
    for name, arr in run.arrays.items():
        lines.append(f"arrays/{name}: {arr.dtype} {'x'.join(map(str, arr.shape)) or 'scalar'}")
    skip = {"argv", "environment", "settings", "settings_sources", "rank_hosts", "label",
            "status", "error", "kind", "schema_version"}
    shown = [f"{k}={v}" for k, v in run.attrs.items() if k not in skip and len(str(v)) <= 60]
    if shown:
        lines.append("attributes: " + ", ".join(shown))
    return lines


# kind -> summary; any kind to come adds its own here
SUMMARIES = {"chaos": _chaos, "tuning.profile": _profile, "tuning.simulate": _simulate,
             "flight": _flight, "tuning.calibration": _calibration}


def summarize(run) -> list[str]:
    """The run's header line, then its kind's summary (a listing for unknown kinds)."""
    return run_header(run) + SUMMARIES.get(run.kind, listing)(run)
