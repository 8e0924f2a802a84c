"""Write one run of ROWS rows (4 KiB each) into PATH with hpccoll.h5log, as a tool does,
so that tests can run it under a file-size limit (ulimit -f) and see what it leaves.

    python tests/scripts/h5_fill.py PATH ROWS [--default-sigxfsz]

Exit status 0 and "DONE path run" when the run landed; 1 and the WriteFailed message
on stderr (and "KEPT path-or-None" on stdout) when it could not be written.
--default-sigxfsz restores SIGXFSZ's default action (killing the process), which
CPython ignores at start but a program embedding Python may not.
"""
import signal
import sys

import numpy as np

from hpccoll import h5log

path, rows = sys.argv[1], int(sys.argv[2])
if "--default-sigxfsz" in sys.argv[3:]:
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
try:
    with h5log.RunWriter(path, "fill", {"tool": "h5_fill"}, kind="test") as run:
        for i in range(rows):
            run.table("t").append([{"i": i, "data": np.full(512, float(i))}])
except h5log.WriteFailed as exc:
    print(f"h5_fill: error: {exc}", file=sys.stderr)
    print("KEPT", exc.kept)
    sys.exit(1)
print("DONE", run.final_path, run.name)
