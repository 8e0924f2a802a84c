"""The flight recorder's ring, its rows, the standings a report prints, and the file
hpccoll-report reads (hpccoll/engine/flight.py), without MPI: the multi-rank cases are in
tests/unit/test_deadlock_timeout.py and tests/mpi/test_mismatch.py."""
import math
from types import SimpleNamespace

import numpy as np

from hpccoll import h5log
from hpccoll.engine import flight
from hpccoll.engine.task import new as new_task


def _task(comm, seq, state="done", key=None, coll="allreduce"):
    """A finished task as the recorder sees it (a real Task: the compiled recorder reads
    its fields directly)."""
    plan = SimpleNamespace(coll=coll, dtype=np.dtype(np.float32), count=4, algo="mpi")
    t = new_task(None, comm, plan, seq, key, None, None)
    t.state, t.t_issue, t.t_end = state, 1.0, 3.0
    t.t_start = 2.0 if state != "queued" else None
    return t


def test_the_ring_keeps_the_newest_entries_as_rows():
    a = SimpleNamespace(name="A")
    rec = flight.Recorder(3)
    for seq in range(5):
        rec.append(_task(a, seq))
    rec.append(_task(a, None, key="grad", state="failed"))
    rows = rec.rows(100.0)
    assert [r["ident"] for r in rows] == ["A#3", "A#4", "A['grad']"]
    assert rows[0]["t_issue"] == 101.0 and rows[0]["t_end"] == 103.0
    assert rows[-1]["seq"] == -1 and rows[-1]["key"] == "grad" and rows[-1]["state"] == "failed"
    assert rows[0]["dtype"] == "float32" and rows[0]["algo"] == "mpi"
    q = flight.Recorder(2)
    q.append(_task(a, 0, state="queued"))
    assert math.isnan(q.rows(0.0)[0]["t_start"])


def _snaps():
    a = SimpleNamespace(name="A")
    r0, r1 = flight.Recorder(8), flight.Recorder(8)
    for seq in range(3):
        r0.append(_task(a, seq))
    for seq in range(2):
        r1.append(_task(a, seq))
    pending = {"comm": "A", "ident": "A#3", "seq": 3, "key": None, "coll": "allreduce",
               "dtype": "float32", "count": 4, "state": "running", "algo": "ring",
               "waits_done": 1, "waits": 3, "age": 2.0, "idle": 2.0, "waiting_on": [1],
               "members": [0, 1], "sending_to": [], "root": 0, "op": "sum", "gseq": None,
               "bytes_moved": 0, "yields": 0}
    return {0: {"flight": r0.rows(0.0), "tasks": [pending]},
            1: {"flight": r1.rows(0.0), "tasks": []}}


def test_standings_show_where_the_ranks_diverged():
    (line,) = flight.standings(_snaps())
    assert line == ("  A (ranks differ): rank 0: done to #2, pending allreduce A#3 (running); "
                    "rank 1: done to #1")
    assert flight.last_entries(_snaps()[0], 2) == [
        "      done    allreduce A#1 float32 x4 [mpi]", "      done    allreduce A#2 float32 x4 [mpi]"]


def test_dump_writes_one_file_that_the_report_reads(tmp_path):
    path = flight.dump(str(tmp_path / "d"), "timeout", "allreduce A#3 float32 x4", _snaps(), 0)
    (run,) = h5log.read(path)
    assert run.kind == "flight"
    assert run.attrs["reason"] == "timeout" and list(run.attrs["ranks_answered"]) == [0, 1]
    assert len(run.tables["entries"]) == 5 and len(run.tables["pending"]) == 1
    text = "\n".join(flight.summary(run))
    assert text.startswith("flight record: timeout detected on rank 0: allreduce A#3")
    assert "running allreduce A#3 float32 x4 [ring] (pending)" in text
    assert "A (ranks differ): rank 0: done to #2" in text
    from hpccoll.report.kinds import summarize
    assert "flight record: timeout" in "\n".join(summarize(run))


def test_a_dump_that_cannot_be_written_says_so_and_returns_none(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert flight.dump(str(blocker / "sub"), "timeout", "t", _snaps(), 0) is None
    assert "could not write the flight record" in capsys.readouterr().err
