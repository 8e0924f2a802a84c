"""The nccl-tests result table, column for column, so that tools that read nccl-tests
output read ours: the same widths, number formats, header and footer lines.  With a
baseline (--compare) three columns per placement are appended at the end of each line
(baseline time, baseline busbw, ratio), so the first 13 fields keep their meaning.  The
spread of the iterations is a block of its own after the table, every line of it a
'#' comment, which nccl-tests readers skip."""
from __future__ import annotations

from typing import Optional, Sequence

PLACEMENTS = ("out-of-place", "in-place")


def float_str(value: float, width: int) -> str:
    """nccl-tests' getFloatStr: as many decimals as fit the width."""
    power, v = 0, 1
    while value >= v:
        power += 1
        v *= 10
    if power < width - 2:
        return f"{value:{width}.2f}"
    if power < width - 1:
        return f"{value:{width}.1f}"
    if power < width + 1:
        return f"{value:{width}.0f}"
    return f"{value:{width}.1e}"


def header(baseline: Optional[str] = None) -> list[str]:
    pre = "# %10s  %12s  %8s  %6s  %6s"
    cols = "  %7s  %6s  %6s  %6s" * 2
    top = (pre % ("", "", "", "", "")) + "           out-of-place                       in-place          "
    names = pre % ("size", "count", "type", "redop", "root") + cols % (
        "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong")
    units = pre % ("(B)", "(elements)", "", "", "") + cols % (
        "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "")
    if baseline:
        extra = "  %7s  %6s  %6s" * 2
        top += f"  {baseline} out-of-place    {baseline} in-place"
        names += extra % ("time", "busbw", "ratio", "time", "busbw", "ratio")
        units += extra % ("(us)", "(GB/s)", "(x)", "(us)", "(GB/s)", "(x)")
    return ["#", top.rstrip(), names, units]


def line(size: int, count: int, type_name: str, redop: str, root: int,
         cols: Sequence[tuple], extra: Sequence[tuple] = ()) -> str:
    """cols: (time_us, algbw, busbw, wrong or None) per placement; extra: (time_us, busbw,
    ratio) per placement for the baseline."""
    out = "%12d  %12d  %8s  %6s  %6d" % (size, count, type_name, redop, root)
    for time_us, algbw, busbw, wrong in cols:
        out += "  %7s  %6s  %6s" % (float_str(time_us, 7), float_str(algbw, 6), float_str(busbw, 6))
        out += "    N/A" if wrong is None else "  %6g" % wrong
    for time_us, busbw, ratio in extra:
        out += "  %7s  %6s  %6s" % (float_str(time_us, 7), float_str(busbw, 6), float_str(ratio, 6))
    return out


def footer(wrong_total: int, avg_busbw: float, name: str, baseline: Optional[str] = None,
           baseline_busbw: float = 0.0, ratio: float = 0.0) -> list[str]:
    lines = ["# %-20s : %d %s" % ("Out of bounds values", wrong_total, "FAILED" if wrong_total else "OK"),
             "# %-20s : %g " % ("Avg bus bandwidth", avg_busbw)]
    if baseline:
        # worded so that a parser looking for "Avg bus bandwidth :" finds only ours
        lines.append(f"# Baseline {baseline} average bus bandwidth : {baseline_busbw:g}")
        lines.append(f"# Geometric mean of {baseline} time / time : {ratio:.3f}")
    lines += ["#", f"# Collective test concluded: {name}"]
    return lines


def spread_block(entries: Sequence[tuple], iters: int, bound: float) -> list[str]:
    """The spread of every measurement: entries are (size, type, redop, root, library,
    ((p10, median, p90) out of place, (p10, median, p90) in place)), times in us."""
    pre = "# %10s  %8s  %6s  %6s  %-8s"
    cols = "  %8s  %8s  %8s  %7s"
    lines = ["#", f"# Spread over the {iters} timed iterations: p10, median and p90 of the time "
                  f"(us), and p90/p10 (above {bound:g}: noisy)",
             (pre % ("", "", "", "", "") + "  " + "out-of-place".center(37) + "  "
              + "in-place".center(37)).rstrip(),
             pre % ("size", "type", "redop", "root", "library") + cols % (
                 "p10", "median", "p90", "p90/p10") * 2]
    for size, type_name, redop, root, library, placements in entries:
        text = "#%11d  %8s  %6s  %6d  %-8s" % (size, type_name, redop, root, library)
        noisy = False
        for p10, p50, p90 in placements:
            ratio = p90 / p10 if p10 > 0 else float("inf")
            noisy |= ratio > bound
            text += cols % (float_str(p10, 8), float_str(p50, 8), float_str(p90, 8),
                            float_str(ratio, 7) if ratio != float("inf") else "inf")
        lines.append(text + ("  noisy" if noisy else ""))
    return lines
