"""The report and diagnosis are pure functions of the ranks' snapshots."""
from hpccoll.engine.watchdog import diagnose, find_cycle, format_report


def task(ident, state, waiting_on=(), members=(0, 1), coll="allreduce"):
    return {"comm": ident.split("#")[0], "members": list(members), "seq": 0, "key": None,
            "ident": ident, "coll": coll, "dtype": "float32", "count": 4, "root": 0, "op": "sum",
            "state": state, "algo": "doubling", "waits_done": 0, "waits": 1, "bytes_moved": 0,
            "waiting_on": list(waiting_on), "sending_to": [], "age": 3.0, "idle": 3.0,
            "yields": 0, "gseq": None}


def snap(rank, *tasks):
    return {"rank": rank, "host": "h", "pid": 100 + rank, "status": "ok", "policy": "fifo",
            "tasks": list(tasks)}


def test_cycle_is_found_and_explained():
    snaps = {0: snap(0, task("A#0", "running", [1]), task("B#0", "queued")),
             1: snap(1, task("B#0", "running", [0]), task("A#0", "queued"))}
    cycle = find_cycle(snaps)
    assert [(r, t["ident"], p) for r, t, p in cycle] == [(0, "A#0", 1), (1, "B#0", 0)]
    text = diagnose(snaps)
    assert "circular wait" in text
    assert "rank 0 runs A#0 and waits for rank 1, which has A#0 queued behind B#0" in text


def test_three_communicator_cycle():
    snaps = {0: snap(0, task("A#0", "running", [1], (0, 1)), task("C#0", "queued", [], (0, 2))),
             1: snap(1, task("B#0", "running", [2], (1, 2)), task("A#0", "queued", [], (0, 1))),
             2: snap(2, task("C#0", "running", [0], (0, 2)), task("B#0", "queued", [], (1, 2)))}
    cycle = find_cycle(snaps)
    assert len(cycle) == 3


def test_a_cycle_is_found_past_a_rank_that_did_not_answer():
    """On a crowded node some ranks may not answer in time: the cycle among those that did
    is still named (first tried: a peer that answered)."""
    snaps = {0: snap(0, task("A#0", "running", [2, 1], (0, 1, 2)), task("B#0", "queued", [],
                                                                     (0, 1, 2))),
             1: snap(1, task("B#0", "running", [2, 0], (0, 1, 2)), task("A#0", "queued", [],
                                                                     (0, 1, 2)))}
    assert "circular wait" in diagnose(snaps)


def test_missing_rank_and_silent_rank():
    snaps = {0: snap(0, task("A#0", "running", [1], (0, 1, 2))), 2: snap(2)}
    text = diagnose(snaps)
    # (rank 1 did not answer: it may have A#0 pending, so it is not said to lack it)
    assert "not on rank(s) 2 (rank(s) 1 did not answer)" in text
    report = format_report({"rank": 0, "what": "allreduce A#0", "idle": 3.2, "timeout": 3,
                            "policy": "fifo"}, snaps, 3, 1.0)
    assert "rank 1: did not answer within 1.0 s" in report
    assert "rank 2 (h, pid 102): no pending collectives" in report
    assert "A#0: 0: running, 1: no answer, 2: not pending" in report
