"""Every template of slurm/ submitted with real sbatch to a running Slurm cluster
(scripts/slurm-local start), at 2 or 4 tasks and small sizes: the job state, its exit
code, and the content of its HDF5 results.  Without a cluster these tests skip (fail
under HPCCOLL_REQUIRE_SLURM=1, as in CI).  The bench and training entry points are part of
this checkout: a broken one fails its template's test, never skips it."""
import os
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpccoll import h5log

from .cluster import ROOT, find_cluster, job_env, need_nodes, submit

TEMPLATES = ("chaos.sbatch", "bench.sbatch", "bench-multinode.sbatch", "train.sbatch")
SETUP = re.compile(r"# ---- hpccoll job setup.*# ---- end of the hpccoll job setup -+\n", re.S)


@pytest.fixture(scope="module")
def conf():
    return find_cluster()


def text(x):
    return x.decode() if isinstance(x, bytes) else str(x)


def all_attrs(f: h5py.File) -> dict:
    """Attributes of the file and of every group and dataset in it, by name."""
    found = dict(f.attrs)
    f.visititems(lambda name, obj: found.update(obj.attrs))
    return {k: text(v) if isinstance(v, (bytes, str)) else v for k, v in found.items()}


def wrong_counts(f: h5py.File) -> list:
    """Every value of every '#wrong' column in the file: a field of a table (compound
    dataset) or a dataset, whose name contains 'wrong'."""
    values = []

    def visit(name, obj):
        if not isinstance(obj, h5py.Dataset):
            return
        if obj.dtype.names:
            for field in obj.dtype.names:
                if "wrong" in field.lower():
                    values.extend(np.asarray(obj[field]).ravel().tolist())
        elif "wrong" in name.rsplit("/", 1)[-1].lower() and obj.dtype.kind in "iuf":
            values.extend(np.asarray(obj[()]).ravel().tolist())
    f.visititems(visit)
    return values


def check_recorded(path: Path, job) -> dict:
    with h5py.File(path) as f:
        attrs = all_attrs(f)
    assert attrs.get("SLURM_JOB_ID") == job.id, f"{path.name}: SLURM_JOB_ID not recorded"
    assert "SLURM_JOB_NODELIST" in attrs and "SLURM_NTASKS" in attrs, sorted(attrs)
    return attrs


# ---- the templates as files ----------------------------------------------------------

@pytest.mark.parametrize("template", TEMPLATES)
def test_template_is_valid_bash_with_a_documented_header(template):
    path = ROOT / "slurm" / template
    subprocess.run(["bash", "-n", str(path)], check=True, timeout=30)
    body = path.read_text()
    for option in ("--nodes", "--ntasks-per-node", "--cpus-per-task", "--time", "--output",
                   "--error"):
        assert re.search(rf"^#SBATCH {option}=", body, re.M), f"{template}: no {option}"
    assert re.search(r"^##SBATCH --gpus-per-task=", body, re.M), template
    assert "srun --mpi=\"${HPCCOLL_SRUN_MPI:-pmi2}\"" in body


def test_setup_block_is_the_same_in_every_template():
    blocks = {t: SETUP.findall((ROOT / "slurm" / t).read_text()) for t in TEMPLATES}
    assert all(len(b) == 1 for b in blocks.values()), {t: len(b) for t, b in blocks.items()}
    first = blocks[TEMPLATES[0]][0]
    assert [t for t, b in blocks.items() if b[0] != first] == []


# ---- chaos.sbatch: runs now ------------------------------------------------------------

@pytest.mark.parametrize("launcher", ["srun", "mpiexec"])
@pytest.mark.slurm
@pytest.mark.timeout(600)
def test_chaos_template(conf, tmp_path, launcher):
    """4 ranks on one node; preemptive and ordered complete, fifo times out, per rank."""
    job = submit("chaos.sbatch", tmp_path, job_env(
        conf, HPCCOLL_LAUNCHER=launcher, HPCCOLL_CHAOS_SCENARIOS="abba 3d",
        HPCCOLL_CHAOS_ARGS="--iters 3 --timeout 3"))
    assert job.returncode == 0 and job.state == "COMPLETED", str(job)
    assert job.info["ExitCode"] == "0:0", str(job)
    assert [p.name for p in job.results()] == [f"{job.id}-chaos-3d.h5", f"{job.id}-chaos-abba.h5"]
    assert job.out.count("OK: every policy behaved as expected") == 2, str(job)
    for path in job.results():
        attrs = check_recorded(path, job)
        assert attrs["nranks"] == 4 and bool(attrs["ok"])
        # rank 0's environment: under mpiexec, that of hydra's proxy step (1 task per node)
        assert attrs["SLURM_NTASKS"] == ("4" if launcher == "srun" else "1")
        (run,) = h5log.read(path)
        rows = run.tables["outcomes"]
        assert run.kind == "chaos" and len(rows) == 4 * 3
        for r in rows:
            want = "timeout" if r["policy"] == "fifo" else "complete"
            assert (r["outcome"], r["expected"]) == (want, want), (path.name, r)
            assert r["n_wrong"] == 0
        assert sorted({r["rank"] for r in rows}) == [0, 1, 2, 3]


@pytest.mark.slurm
@pytest.mark.timeout(600)
def test_chaos_template_fails_when_its_check_fails(conf, tmp_path):
    """--expect timeout cannot be met (preemptive completes): the job must fail, and its
    result file must still say what happened."""
    env = job_env(conf, HPCCOLL_CHAOS_SCENARIOS="abba",
                  HPCCOLL_CHAOS_ARGS="--iters 2 --timeout 2 --expect timeout")
    # and the default environment: the venv active at sbatch time, found from VIRTUAL_ENV
    # alone (its bin/ taken off PATH, so that only activating it finds hpccoll)
    del env["HPCCOLL_ENV"]
    env["VIRTUAL_ENV"] = sys.prefix
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep)
                                  if os.path.realpath(p) != os.path.realpath(f"{sys.prefix}/bin"))
    job = submit("chaos.sbatch", tmp_path, env, "--ntasks-per-node=2")
    assert job.returncode == 1 and job.state == "FAILED", str(job)
    assert job.info["ExitCode"] == "1:0", str(job)
    assert "FAILED: unexpected outcome" in job.out and "some checks FAILED" in job.err, str(job)
    assert f"{sys.prefix}/bin/python" in job.err, str(job)
    [path] = job.results()
    check_recorded(path, job)
    (run,) = h5log.read(path)
    assert run.attrs["ok"] is False and run.attrs["nranks"] == 2
    got = {r["policy"]: r["outcome"] for r in run.tables["outcomes"]}
    assert got == {"preemptive": "complete", "ordered": "complete", "fifo": "timeout"}


@pytest.mark.slurm
@pytest.mark.timeout(600)
def test_launcher_that_starts_singletons_fails_the_job_with_the_fix(conf, tmp_path):
    """srun --mpi=none starts the wheel's MPICH as 2 singletons, each 'rank 0 of 1'."""
    job = submit("chaos.sbatch", tmp_path, job_env(conf, HPCCOLL_SRUN_MPI="none"),
                 "--ntasks-per-node=2")
    assert job.returncode == 2 and job.state == "FAILED", str(job)
    assert "expected one MPI job of 2 ranks" in job.err and "HPCCOLL_SRUN_MPI" in job.err, str(job)
    assert job.results() == []


# ---- bench, multi-node bench, training: run once their entry points exist ---------------

def need_bench():
    """The benchmark's entry point imports: an import error fails the test (importorskip
    turned it into a skip, even under HPCCOLL_REQUIRE_SLURM=1)."""
    import hpccoll.bench.cli  # noqa: F401


def check_bench_file(path: Path, job) -> dict:
    attrs = check_recorded(path, job)
    with h5py.File(path) as f:
        wrong = wrong_counts(f)
    assert wrong, f"{path.name}: no #wrong column found"
    assert all(w == 0 for w in wrong), f"{path.name}: #wrong = {wrong}"
    return attrs


@pytest.mark.slurm
@pytest.mark.timeout(600)
def test_bench_template(conf, tmp_path):
    need_bench()
    colls = ("allreduce", "alltoall")
    job = submit("bench.sbatch", tmp_path, job_env(
        conf, HPCCOLL_BENCH_COLLS=" ".join(colls), HPCCOLL_BENCH_ARGS="-e 64K -f 8 -n 2 -w 1"))
    assert job.returncode == 0 and job.state == "COMPLETED", str(job)
    assert [p.name for p in job.results()] == sorted(f"{job.id}-bench-{c}.h5" for c in colls)
    for path in job.results():
        assert check_bench_file(path, job)["SLURM_NTASKS"] == "4"


@pytest.mark.slurm
@pytest.mark.timeout(600)
def test_bench_multinode_template(conf, tmp_path):
    """2 nodes x 2 tasks (slurm-local runs 2 slurmd by default): one rank per node, then all.
    HPCCOLL_LAUNCHER=auto starts them with hydra (test_launchers.py says why)."""
    need_bench()
    need_nodes(conf)
    job = submit("bench-multinode.sbatch", tmp_path, job_env(
        conf, HPCCOLL_BENCH_COLLS="allreduce", HPCCOLL_BENCH_ARGS="-e 64K -f 8 -n 2 -w 1"),
        "--nodes=2", "--ntasks-per-node=2")
    assert job.returncode == 0 and job.state == "COMPLETED", str(job)
    assert re.search(r"on 2 node\(s\) \(\S+\), mpiexec,", job.err), str(job)
    assert [p.name for p in job.results()] == [f"{job.id}-bench-1pernode-allreduce.h5",
                                               f"{job.id}-bench-allreduce.h5"]
    for path in job.results():
        assert check_bench_file(path, job)["SLURM_JOB_NUM_NODES"] == "2"


@pytest.mark.slurm
@pytest.mark.timeout(600)
def test_train_template(conf, tmp_path):
    assert (ROOT / "examples" / "train_dp.py").exists(), "examples/train_dp.py is missing"
    job = submit("train.sbatch", tmp_path, job_env(conf), "--ntasks-per-node=2")
    assert job.returncode == 0 and job.state == "COMPLETED", str(job)
    [path] = job.results()
    assert path.name == f"{job.id}-train.h5"
    check_recorded(path, job)
    with h5py.File(path) as f:
        datasets = []
        f.visititems(lambda n, o: datasets.append(n) if isinstance(o, h5py.Dataset) else None)
    assert datasets, f"{path.name} holds no dataset"
