"""The algorithm table is data (hpccoll/algorithms/__init__.py): per collective, candidates
in order, each with ``Row``s of capabilities and size bounds; a calibration's pick
overrides it where the pick can run."""
from hpccoll import algorithms
from hpccoll.algorithms import ALWAYS, TABLE, Choice, Row, capabilities, select

KNOWN = capabilities(Choice(1, shm="flat", registered=True, mpi_coll_bytes=1, native=True,
                            shm_c_bytes=1, cma=True, ranks=2, cell_bytes=1)) | {"hier"}


def test_every_row_is_data_naming_known_capabilities_and_settings():
    fields = set(Choice._fields)
    for coll, rows in TABLE.items():
        names = [name for name, _, _ in rows]
        assert len(names) == len(set(names)), coll       # one entry per candidate
        assert rows[-1][1] == ALWAYS, coll                # the last one always runs
        for name, regions, _ in rows:
            assert regions and all(isinstance(r, Row) for r in regions), (coll, name)
            for r in regions:
                assert r.needs <= KNOWN and r.lacks <= KNOWN, (coll, name, r)
                for bound in r.above + r.upto + r.from_ + r.below:
                    assert isinstance(bound, int) or bound in fields, (coll, name, bound)


def test_a_named_bound_is_the_setting_of_that_name():
    small = Choice(4096, small_msg_bytes=4096)
    assert select("allreduce", small) == "doubling"
    assert select("allreduce", small._replace(small_msg_bytes=4095)) == "ring"
    cells = Choice(8192, shm="flat", cell_bytes=8192)
    assert select("allreduce", cells) == "cells"
    assert select("allreduce", cells._replace(nbytes=8193)) != "cells"


def test_a_calibration_pick_overrides_the_table_where_it_can_run():
    c = Choice(8, shm="flat", native=True, mpi_coll_bytes=64 << 10, cell_bytes=8192)
    assert select("allreduce", c) == "cells"
    assert select("allreduce", c._replace(prefer="mpi")) == "mpi"
    assert select("allreduce", c._replace(prefer="ring")) == "ring"
    # a pick that cannot run here (cells above what a cell holds): the table decides
    big = c._replace(nbytes=1 << 20, prefer="cells")
    assert select("allreduce", big) == select("allreduce", big._replace(prefer=""))
    # single copy for broadcast only ever runs as a pick
    assert all(name != "cma" or all(r.picked for r in regions)
               for name, regions, _ in TABLE["broadcast"])
    assert "cma" in algorithms.candidates("broadcast", Choice(1 << 20, shm="flat", cma=True))


def test_the_config_printout_shows_what_runs(monkeypatch):
    """`python -m hpccoll config` prints the built-in table as it runs here: cells for
    tiny messages where C runs them, MPI's own where it does not."""
    from hpccoll.config import resolve
    from hpccoll.engine import code
    from hpccoll.show_config import algorithm_choice
    monkeypatch.setenv("HPCCOLL_CALIBRATION", "off")
    row = next(line for line in algorithm_choice(resolve()) if line.split()[:1] == ["allreduce"])
    assert row.split()[1] == ("cells" if code._native is not None else "mpi"), row
    monkeypatch.setenv("HPCCOLL_CELL_BYTES", "0")
    row = next(line for line in algorithm_choice(resolve()) if line.split()[:1] == ["allreduce"])
    assert row.split()[1] == "mpi", row
