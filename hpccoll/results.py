"""The deadlock workloads' record: a run of kind ``chaos`` in hpccoll's result files
(``python -m hpccoll.chaos ... --out F.h5``; the layout is in docs/results.md), and its
summary table, which the workload prints live and ``hpccoll-report`` prints from a file.

- table ``outcomes``: one row per (rank, policy), columns FIELDS: ``rank``, ``host``,
  ``policy``, ``outcome`` (complete | timeout | wrong | error), ``expected``, ``iters``
  (iterations completed), ``seconds``, ``yields``, ``tries``, ``switches``, ``parks``,
  ``n_wrong`` (wrong results seen), ``detail`` (first wrong result, or the watchdog's
  diagnosis line, or the error);
- run attributes: ``tool``, ``scenario``, ``ok`` (every policy behaved as expected on
  every rank: the job's exit status), the options (``iters``, ``bytes``, ``timeout``,
  ``max_active``, ``seed``, ``expect``), rank 0's SLURM_* variables under their own
  names, and what every run records (h5log.environment_attrs), except ``policy``, which
  is per row.
"""
from __future__ import annotations

from typing import Optional

KIND = "chaos"
FIELDS = ("rank", "host", "policy", "outcome", "expected", "iters", "seconds", "yields",
          "tries", "switches", "parks", "n_wrong", "detail")


def require_h5py(option: str = "--out") -> None:
    try:
        import h5py  # noqa: F401
    except ImportError as exc:
        raise SystemExit(f"{option} needs h5py, which is not installed here ({exc}): "
                         f"pip install h5py (it comes with `pip install -e .`)") from None


def run_attrs(world, scenario: str, args, argv: list) -> dict:
    """The run's attributes before it starts (collective over ``world``: it gathers every
    rank's host); ``ok`` is added when it ends."""
    from . import config, h5log
    from .slurm import slurm_env
    attrs = h5log.environment_attrs(world, argv=argv, settings=config.resolve(
        {"timeout": args.timeout, "max_active": args.max_active}))
    del attrs["policy"]                      # one per row of the table
    attrs.update(tool="hpccoll.chaos", scenario=scenario, iters=args.iters, bytes=args.bytes,
                 timeout=args.timeout, max_active=args.max_active or 0, seed=args.seed,
                 expect=args.expect, **slurm_env())
    return attrs


def write_chaos(path: str, attrs: dict, ok: bool, rows: list[dict]):
    """Rank 0: land the run (every rank's ``rows``, dicts with FIELDS); returns the writer
    (``final_path``, ``name``)."""
    from . import h5log
    return h5log.write_record(path, KIND, attrs["scenario"], dict(attrs, ok=bool(ok)),
                              tables={"outcomes": [{k: row[k] for k in FIELDS} for row in rows]},
                              status="complete" if ok else "wrong-results")


def diagnosis(detail: str) -> str:
    return next((ln for ln in detail.splitlines() if ln.startswith("Diagnosis:")),
                detail.splitlines()[0] if detail else "")


def summary(attrs: dict, rows: list[dict], ok: Optional[bool] = None) -> list[str]:
    """The summary table of one chaos run: a line per policy (outcomes over ranks, fewest
    iterations, slowest rank's time, yields and switches summed) and the verdict."""
    ok = attrs.get("ok") if ok is None else ok
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    lines = [f"chaos {attrs.get('scenario', '?')}: {attrs.get('nranks', '?')} ranks, "
             f"{attrs.get('iters', '?')} iterations, {attrs.get('bytes', '?')} B per collective, "
             f"max_active {attrs.get('max_active') or 'unbounded'}, timeout {attrs.get('timeout', 0):g} s",
             f"{'policy':<11}{'outcome':<10}{'iters':>6}{'time (s)':>10}{'it/s':>9}"
             f"{'yields':>8}{'switches':>10}  expected"]
    for policy in policies:
        mine = [r for r in rows if r["policy"] == policy]
        outcomes = sorted({r["outcome"] for r in mine})
        iters = min(r["iters"] for r in mine)
        secs = max(r["seconds"] for r in mine)
        rate = iters / secs if secs > 0 and iters else 0.0
        want = mine[0]["expected"]
        lines.append(f"{policy:<11}{'/'.join(outcomes):<10}{iters:>6}{secs:>10.2f}{rate:>9.1f}"
                     f"{sum(r['yields'] for r in mine):>8}{sum(r['switches'] for r in mine):>10}"
                     f"  {want}{'' if outcomes == [want] else '  <-- UNEXPECTED'}")
        wrong = [f"rank {r['rank']}: {r['detail']}" for r in mine if r["outcome"] == "wrong"]
        if wrong:
            lines.append(f"    wrong results: {wrong[:3]}")
        bad = next((r for r in mine if r["outcome"] in ("timeout", "error") and r["detail"]), None)
        if bad is not None:
            text = diagnosis(bad["detail"]) if bad["outcome"] == "timeout" else bad["detail"]
            lines.append(f"    {text[:400]}")
    lines.append("OK: every policy behaved as expected" if ok else "FAILED: unexpected outcome")
    return lines
