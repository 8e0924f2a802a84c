"""Every kind of lane carries the fields the engine and a task read at every call
(engine/lane.py: ``lane_fields``; fields of the compiled Lane, so a lane made without
them reads False and None there, and fails with AttributeError interpreted), each with
its kind's values, however it is made."""
import numpy as np
import pytest

from hpccoll.engine import check, lane, program

X = np.zeros(4, np.float32)

# kind -> (maker, needs_slot, at_issue, late_post)
KINDS = {
    "mpi_lane": (lambda: lane.mpi_lane(None, X, X), False, True, False),
    "MpiLane": (lambda: lane.MpiLane(None, X, X), False, True, False),
    "cell_lane": (lambda: lane.cell_lane(None, 1, X, X), False, True, False),
    "CellLane": (lambda: lane.CellLane(None, 1, X, X), False, True, False),
    "DetourLane": (lambda: lane.DetourLane(None, X, X, (None, None), False, None, None),
                   False, False, True),
    "program_lane": (lambda: program.program_lane(None, [None], [X, X, X], None, None, 0,
                                                  None), True, True, False),
    "ProgramLane": (lambda: program.ProgramLane(None, [None], [X, X, X], None, None, 0, None),
                    True, True, False),
    "DeviceLane": (lambda: program.DeviceLane(None, [None], [X, X, X], None, None, 0, None,
                                              False), True, False, False),
    "CheckLane": (lambda: check.CheckLane(0, None, None, None, None), True, False, False),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_kind_sets_the_fields_read_at_every_call(kind):
    make, needs_slot, at_issue, late_post = KINDS[kind]
    made = make()
    assert (made.needs_slot, made.at_issue, made.late_post) == (needs_slot, at_issue, late_post)
    assert made.done is False and made.mpi_posted is False
    assert made.holds is (lane.GPU if kind == "DeviceLane" else None)


def test_a_program_with_no_instructions_is_done_when_made():
    # (a ProgramLane's ``done`` is set where its pc reaches the end; an empty program
    # never runs an instruction)
    made = program.program_lane(None, [], [X, X, X], None, None, 0, None)
    assert made.done is True
