"""The ordered policy on two nodes of a running Slurm (scripts/slurm-local runs two
slurmd; CI starts it), 2 nodes x 4 tasks, with every collective of a multi-rank
communicator taking the launch order (``mpi_coll_bytes=0``: hpccoll's own algorithms;
one execution slot):

- every deadlock workload through the chaos template, each completing with checked
  results on every rank;
- ordered_job.py: the negotiation tree has one node per Slurm node, one edge between
  them, and every rank's launch log agrees with every other's.

slurm-local's nodes share one host, so MPI sees one node; HPCCOLL_NODE_SIZE=4 makes
hpccoll (the tree, and node-shared memory) see the two the job was given."""
import subprocess
from pathlib import Path

import h5py
import pytest

from hpccoll import h5log

from .cluster import find_cluster, job_env, need_nodes, show_job, submit

ORDER_EVERYTHING = dict(HPCCOLL_MPI_COLL_BYTES=0, HPCCOLL_NODE_SIZE=4)


@pytest.fixture(scope="module")
def conf():
    conf = find_cluster()
    need_nodes(conf)
    return conf


@pytest.mark.slurm
@pytest.mark.timeout(600)
def test_every_deadlock_workload_under_ordered_on_two_nodes(conf, tmp_path):
    scenarios = ("abba", "latin", "3d", "mixed")
    job = submit("chaos.sbatch", tmp_path, job_env(
        conf, HPCCOLL_CHAOS_SCENARIOS=" ".join(scenarios),
        HPCCOLL_CHAOS_ARGS="--policy ordered --max-active 1 --iters 5 --timeout 60",
        **ORDER_EVERYTHING), "--nodes=2", "--ntasks-per-node=4", minutes=8, timeout=540)
    assert job.returncode == 0 and job.state == "COMPLETED", str(job)
    assert "8 ranks on 2 node(s)" in job.err, str(job)
    assert job.out.count("OK: every policy behaved as expected") == len(scenarios), str(job)
    assert [p.name for p in job.results()] == sorted(f"{job.id}-chaos-{s}.h5" for s in scenarios)
    for path in job.results():
        with h5py.File(path) as f:
            assert f.attrs.get("SLURM_JOB_NUM_NODES") in ("2", b"2"), path.name
        (run,) = h5log.read(path)
        rows = run.tables["outcomes"]
        assert sorted(r["rank"] for r in rows) == list(range(8)), path.name
        for r in rows:
            assert (r["policy"], r["outcome"], r["n_wrong"]) == ("ordered", "complete", 0), r
            assert r["iters"] == 5


@pytest.mark.slurm
@pytest.mark.timeout(600)
def test_the_order_spans_both_nodes_and_every_rank_agrees(conf, tmp_path):
    script = Path(__file__).with_name("ordered_job.py")
    cmd = ["sbatch", "--wait", "--parsable", "--time=5", "--nodes=2", "--ntasks-per-node=4",
           "--output=ordered-%j.out", "--error=ordered-%j.err",
           f"--wrap=mpiexec -n 8 -ppn 4 python {script}"]
    env = job_env(conf, **ORDER_EVERYTHING)
    env["PATH"] = f"{env['HPCCOLL_ENV']}/bin:{env['PATH']}"     # the tests' venv
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=420)
    job_id = proc.stdout.strip().split(";")[0]
    assert job_id.isdigit(), proc.stdout + proc.stderr
    out = (tmp_path / f"ordered-{job_id}.out").read_text()
    err = (tmp_path / f"ordered-{job_id}.err").read_text()
    info = show_job(job_id, env)
    assert proc.returncode == 0 and info.get("JobState") == "COMPLETED", out + err
    assert "FAILED" not in out and out.count("ok: ") == 6, out + err
    assert "640 launches on 8 ranks" in out, out
