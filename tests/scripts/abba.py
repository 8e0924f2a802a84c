"""Two communicators, opposite issue order on alternating ranks.  Under fifo this is a
circular wait; with a timeout it must end in CollectiveTimeout on every rank.
Prints one line per rank: RESULT <rank> <outcome> <seconds>."""
import sys
import time

import numpy as np

import hpccoll

policy = sys.argv[1] if len(sys.argv) > 1 else "fifo"
timeout = float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
count = int(sys.argv[3]) if len(sys.argv) > 3 else 4

ctx = hpccoll.init(policy=policy, timeout=timeout)
a = ctx.world.dup(name="A")
b = ctx.world.dup(name="B")
first, second = (a, b) if ctx.rank % 2 == 0 else (b, a)
t0 = time.monotonic()
try:
    w1 = first.allreduce(np.ones(count, np.float32))
    w2 = second.allreduce(np.ones(count, np.float32))
    r1, r2 = w1.wait(), w2.wait()
    assert (r1 == ctx.size).all() and (r2 == ctx.size).all()
    outcome = "completed"
except hpccoll.CollectiveTimeout as exc:
    outcome = "timeout"
    report = exc.report
    assert "circular wait" in report, report
    try:
        a.allreduce(np.ones(1))
    except hpccoll.ContextClosed as exc2:
        assert "unusable" in str(exc2)
    else:
        raise AssertionError("context still usable after a timeout")
# one write: with PYTHONUNBUFFERED, print() writes the newline separately, and mpiexec
# may put another rank's line in between
sys.stdout.write(f"RESULT {ctx.rank} {outcome} {time.monotonic() - t0:.2f}\n")
sys.stdout.flush()
ctx.close()
