"""``python -m hpccoll config``: the effective settings, where each came from, and what
they choose (the tool; the registry itself is hpccoll/config.py)."""
from __future__ import annotations

import argparse
import sys
from typing import Optional

from . import algorithms
from .algorithms.calibration import load_setting
from .base.units import human_bytes
from .config import Settings, describe, markdown, resolve
from .engine import code
from .errors import ArgumentError
from .transport import cma

SHOWN_SIZES = (8, 1 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20)


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpccoll config", description=(
        "The effective settings (arguments aside): each one's value, where it came from "
        "(default or environment) and its environment variable; then which algorithm "
        "each collective takes at each size."))
    ap.add_argument("--all", action="store_true",
                    help="the internal settings too (algorithm thresholds, polling, ...)")
    ap.add_argument("--markdown", action="store_true",
                    help="print the reference table of docs/config.md instead")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    if args.markdown:
        sys.stdout.write(markdown(args.all))
        return 0
    settings = resolve()
    print(describe(settings, args.all))
    print()
    print("\n".join(algorithm_choice(settings)))
    return 0


def algorithm_choice(settings: Settings) -> list:
    """Which candidate each collective takes at each size: the calibration's picks, where
    the ``calibration`` setting names one, and the built-in table (on one node, float32
    sum, ordinary and registered buffers) for everything it leaves out."""
    lines = []
    value = settings.calibration
    try:
        cal, note = load_setting(value, None)
    except ArgumentError as exc:
        cal, note = None, f"unreadable: {exc}"
    if cal:
        libs = sorted({cal.library} - {""})
        lines.append(f"calibration: {note}" + (f" (measured with {', '.join(libs)})" if libs
                                                else ""))
        lines += cal.table()
        lines.append("")
    else:
        lines.append(f"calibration: {note}")
    in_c = settings.shm_in_c and code._native is not None
    c_bytes = settings.shm_c_bytes if in_c else 0
    where = ("in C" if in_c else "in Python: " + (
        "hpccoll/engine/_native.c is not built" if settings.shm_in_c else "shm_in_c is off"))
    # (between processes it is probed when a communicator is made; here: the call itself)
    single = settings.cma and bool(settings.shm) and cma.probe(*cma.token())
    where += ("; single copy (cma) where every rank may read its peers" if single else
              "; single copy off: " + ("the cma setting" if not settings.cma else
                                        "process_vm_readv or _writev refused here"))
    lines.append("built-in algorithm table (2 ranks on one node, float32 sum; registered in "
                 f"parentheses where it differs; shared-memory programs {where}):")
    lines.append(f"  {'collective':<15}" + "".join(f"{human_bytes(n):>12}" for n in SHOWN_SIZES))
    for coll in ("allreduce", "reduce", "broadcast", "allgather", "reduce_scatter", "alltoall"):
        cells = []
        for n in SHOWN_SIZES:
            picks = [algorithms.select(coll, algorithms.Choice(
                n, settings.small_msg_bytes, "flat" if settings.shm else "",
                settings.shm_min_bytes, reg, settings.mpi_coll_bytes, True, "",
                c_bytes if coll in algorithms.C_SHM_COLLECTIVES else 0, single, 2,
                # cells where C runs them (float32 sum: a reduction they have)
                settings.cell_bytes if in_c else 0))
                # (staged collectives never look at where their buffers live)
                for reg in ((False,) if coll in algorithms.STAGED else (False, True))]
            cells.append(picks[0] if picks[0] == picks[-1] else f"{picks[0]}({picks[1]})")
        lines.append(f"  {coll:<15}" + "".join(f"{c:>12}" for c in cells))
    return lines


if __name__ == "__main__":
    sys.exit(main())
