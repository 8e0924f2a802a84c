"""A result writer that never finishes: one row per 20 ms, each flushed, until killed.
Prints "TMP <path>" once the temporary file holds rows.
    python tests/scripts/h5_writer.py OUT.h5"""
import sys
import time

import numpy as np

from hpccoll import h5log

with h5log.RunWriter(sys.argv[1], "forever", {"tool": "test"}) as run:
    table = run.table("allreduce")
    for i in range(10 ** 9):
        table.append([{"size": i, "time_us": 1.0 * i, "times_us": np.arange(4.0)}])
        if i == 2:
            print("TMP", run.tmp_path, flush=True)
        time.sleep(0.02)
