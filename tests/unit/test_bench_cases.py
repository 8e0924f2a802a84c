"""The benchmark's arithmetic without MPI: size sweeps, buffer shapes and bus bandwidth
factors as nccl-tests defines them, inputs and expectations, and the table layout."""
import numpy as np
import pytest

from hpccoll.bench import cases
from hpccoll.bench.table import float_str, footer, header, line
from tests import nccltests


def test_sweeps_match_nccl_tests():
    assert cases.sizes(8, 64 << 20, 1 << 20, 4) == [8 * 4 ** k for k in range(12)]
    assert list(cases.sizes(1 << 20, 4 << 20, 1 << 20, 1)) == [1 << 20, 2 << 20, 3 << 20, 4 << 20]
    assert list(cases.sizes(32 << 20, 32 << 20, 1 << 20, 1)) == [32 << 20]   # the defaults
    assert len(cases.sizes(8, 1 << 30, 8, 1)) == 1 << 27                     # lazy, instant


@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_busbw_factors(n):
    assert cases.busbw_factor("allreduce", n) == pytest.approx(2 * (n - 1) / n)
    for coll in ("reducescatter", "allgather", "alltoall"):
        assert cases.busbw_factor(coll, n) == pytest.approx((n - 1) / n)
    for coll in ("broadcast", "reduce"):
        assert cases.busbw_factor(coll, n) == 1.0


def test_shapes_follow_nccl_tests_byte_counts():
    # 1000 B of float on 3 ranks: 250 elements; per-rank collectives round to 3*83
    ar = cases.shape("allreduce", 1000, 4, 3)
    assert (ar.count, ar.send, ar.recv, ar.nbytes) == (250, 250, 250, 1000)
    ag = cases.shape("allgather", 1000, 4, 3)
    assert (ag.count, ag.send, ag.recv, ag.nbytes) == (83, 83, 249, 996)
    rs = cases.shape("reducescatter", 1000, 4, 3)
    assert (rs.count, rs.send, rs.recv, rs.nbytes) == (83, 249, 83, 996)
    a2a = cases.shape("alltoall", 1000, 4, 3)
    assert (a2a.count, a2a.send, a2a.recv, a2a.nbytes) == (83, 249, 249, 996)


def test_names_and_aliases():
    assert cases.canonical_collective("reduce_scatter") == "reducescatter"
    assert cases.canonical_collective("bcast") == "broadcast"
    assert cases.canonical_collective("gather") is None
    assert cases.canonical_type("half") == "half" and cases.canonical_type("float32") == "float"
    assert cases.numpy_dtype("double") == np.float64


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "float16", "float32", "float64"])
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
def test_expectation_is_the_elementwise_reduction_of_every_rank_input(dtype, op):
    n, m = 5, 37
    dt = np.dtype(dtype)
    ins = np.stack([cases.fill(r, m * n, dt, op, n) for r in range(n)])
    ref = {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max}[op](
        ins.astype(np.int64), axis=0)
    sh = cases.shape("allreduce", m * n * dt.itemsize, dt.itemsize, n)
    got = cases.expected("allreduce", sh, dt, op, 0, 2, n)
    # exact in every type: no element needed rounding (integers wrap as they do in MPI)
    assert np.array_equal(got, ref.astype(dt))
    rs = cases.shape("reducescatter", m * n * dt.itemsize, dt.itemsize, n)
    assert np.array_equal(cases.expected("reducescatter", rs, dt, op, 0, 3, n),
                          ref.astype(dt)[3 * m:4 * m])


def test_expectations_of_data_movement():
    n, m, dt = 4, 6, np.dtype("float32")
    ins = [cases.fill(r, n * m, dt, None, n) for r in range(n)]
    a2a = cases.shape("alltoall", n * m * 4, 4, n)
    for r in range(n):
        exp = np.concatenate([ins[k][r * m:(r + 1) * m] for k in range(n)])
        assert np.array_equal(cases.expected("alltoall", a2a, dt, None, 0, r, n), exp)
    ag = cases.shape("allgather", n * m * 4, 4, n)
    assert np.array_equal(cases.expected("allgather", ag, dt, None, 0, 1, n),
                          np.concatenate([cases.fill(k, m, dt, None, n) for k in range(n)]))
    bc = cases.shape("broadcast", 40, 4, n)
    assert np.array_equal(cases.expected("broadcast", bc, dt, None, 2, 0, n), cases.fill(2, 10, dt, None, n))
    assert cases.expected("reduce", bc, dt, "sum", 2, 0, n) is None     # unspecified off root


def test_inputs_differ_between_ranks_and_garbage_never_matches():
    dt = np.dtype("float32")
    a, b = cases.fill(0, 1000, dt, None, 16), cases.fill(9, 1000, dt, None, 16)
    assert np.mean(a != b) > 0.7
    assert np.isnan(cases.garbage(4, dt)).all()
    assert (cases.garbage(4, np.dtype("int8")) == -128).all()


def test_avg_expectation_divides_the_exact_sum():
    n, dt = 3, np.dtype("float32")
    sh = cases.shape("allreduce", 40, 4, n)
    total = sum(cases.fill(r, 10, dt, "avg", n).astype(np.float64) for r in range(n))
    assert np.array_equal(cases.expected("allreduce", sh, dt, "avg", 0, 0, n),
                          (total.astype(dt) / np.float32(n)).astype(dt))


def test_case_checks_count_wrong_elements():
    n, dt = 2, np.dtype("float32")
    sh = cases.shape("allreduce", 64, 4, n)
    c = cases.Case("allreduce", sh, dt, "sum", 0, False, 0, n)
    c.reset()
    assert c.wrong("hpccoll") == sh.count          # nothing ran: all garbage
    c.recv[...] = cases.expected("allreduce", sh, dt, "sum", 0, 0, n)
    c.recv[3] += 1
    assert c.wrong("hpccoll") == 1


def test_float_format_is_nccl_tests():
    assert float_str(0.0, 6) == "  0.00"
    assert float_str(12.345, 7) == "  12.35"
    assert float_str(12345.6, 7) == "12345.6"
    assert float_str(123456.7, 7) == " 123457"
    assert float_str(2.5e9, 7) == "2.5e+09"


def test_table_lines_parse_like_nccl_tests_output():
    text = "\n".join(header("mpi") + [
        line(1024, 256, "float", "sum", -1, [(10.0, 0.1024, 0.1536, 0), (20.0, 0.0512, 0.0768, None)],
             [(30.0, 0.05, 3.0), (10.0, 0.15, 0.5)])] + footer(0, 0.115, "allreduce", "mpi", 0.1, 1.22))
    t = nccltests.parse(text)
    (row,) = t["rows"]
    assert (row["size"], row["count"], row["type"], row["redop"], row["root"]) == (1024, 256, "float", "sum", -1)
    assert (row["oop_time"], row["oop_algbw"], row["oop_busbw"], row["oop_wrong"]) == (10.0, 0.10, 0.15, 0)
    assert row["ip_wrong"] is None                 # "N/A" when unchecked
    assert (row["oop_ratio"], row["ip_ratio"]) == (3.0, 0.5)
    assert t["oob"] == (0, "OK") and t["avg_busbw"] == 0.115
    # the 13 nccl-tests fields keep their positions; the header names them in order
    names = header()[2].lstrip("#").split()
    assert names == ["size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
                     "time", "algbw", "busbw", "#wrong"]
    assert footer(3, 1.5, "x")[0] == "# Out of bounds values : 3 FAILED"
