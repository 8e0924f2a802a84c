"""One run appended to a result file by its own process, closed when the test says so.
Prints "OPEN <temporary file>" once the run holds its rows, waits for a line on stdin,
closes (lands) the run and prints "LANDED <file> <run name>".
    python tests/scripts/h5_append.py OUT.h5 LABEL ROWS"""
import sys

import numpy as np

from hpccoll import h5log

out, label, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
run = h5log.RunWriter(out, label, {"tool": "test", "writer": label}, kind="test")
run.table("t").append([{"writer": label, "i": i, "x": np.arange(3.0) + i} for i in range(rows)])
run.array("m", np.full((2, 3), rows))
print("OPEN", run.tmp_path, flush=True)
sys.stdin.readline()
path = run.close()
print("LANDED", path, run.name, flush=True)
