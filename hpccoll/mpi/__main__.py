"""``python -m hpccoll.mpi --coverage``: which of mpi4py's collective methods the adapter
runs on hpccoll and which it forwards to mpi4py, and what its constructors return, as
the markdown tables docs/mpi4py.md shows (generated from the adapter classes:
``_coverage.py``).  ``--update-docs FILE`` rewrites the tables in FILE instead."""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from . import Cartcomm, Comm, _coverage

BEGIN, END = "<!-- coverage: begin (python -m hpccoll.mpi --coverage) -->", "<!-- coverage: end -->"


def table() -> str:
    return _coverage.markdown(Comm, Cartcomm)


def update(path: Path) -> bool:
    """Put the tables between the markers of ``path``; True when it changed."""
    text = path.read_text()
    block = f"{BEGIN}\n{table()}{END}"
    new, found = re.subn(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, text,
                         flags=re.S)
    if not found:
        raise SystemExit(f"{path}: no '{BEGIN}' ... '{END}' block")
    if new != text:
        path.write_text(new)
    return new != text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpccoll.mpi", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--coverage", action="store_true", help="print the coverage tables")
    ap.add_argument("--update-docs", metavar="FILE", type=Path,
                    help="rewrite the tables between the coverage markers of FILE")
    args = ap.parse_args(argv)
    if args.update_docs:
        print(f"{args.update_docs}: {'updated' if update(args.update_docs) else 'up to date'}")
        return 0
    if args.coverage:
        sys.stdout.write(table())
        return 0
    ap.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
