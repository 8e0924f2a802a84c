"""The deadlock workloads' runs in result files (hpccoll/results.py) and the Slurm helpers
the templates use (hpccoll/slurm.py), under real mpiexec jobs."""
import importlib.metadata
import os
import subprocess
import sys

import h5py
import pytest

from hpccoll import h5log, slurm
from tests import launch


def chaos(n, tmp_path, *extra, env=None):
    out = tmp_path / "sub" / "chaos.h5"
    proc = launch.run(n, ["-m", "hpccoll.chaos", "abba", "--policy", "all", "--iters", "2",
                          "--timeout", "3", "--out", str(out), *extra], timeout=120, env=env)
    return proc, out


def test_chaos_out_table_and_attributes(tmp_path):
    proc, out = chaos(2, tmp_path, env={"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "2"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run,) = h5log.read(out)
    rows, attrs = run.tables["outcomes"], run.attrs
    assert (run.kind, run.name, attrs["status"]) == ("chaos", "0000_abba", "complete")
    assert sorted((r["rank"], r["policy"]) for r in rows) == sorted(
        (rank, p) for rank in range(2) for p in ("preemptive", "ordered", "fifo"))
    for r in rows:
        want = "timeout" if r["policy"] == "fifo" else "complete"
        assert r["outcome"] == r["expected"] == want
        assert r["n_wrong"] == 0
        if want == "complete":
            assert r["iters"] == 2
        else:
            assert "circular wait" in r["detail"]
    assert attrs["tool"] == "hpccoll.chaos" and attrs["scenario"] == "abba"
    assert attrs["ok"] is True and attrs["nranks"] == 2 and len(attrs["rank_hosts"]) == 2
    assert attrs["SLURM_JOB_ID"] == "4242" and attrs["SLURM_NTASKS"] == "2"
    assert "MPI" in attrs["mpi_library_version"] and attrs["hpccoll_version"]
    assert "-m hpccoll.chaos abba --policy all" in attrs["command_line"]
    assert [p.name for p in out.parent.iterdir()] == ["chaos.h5"]     # no temporary left
    # and what every hpccoll run records, under the same names (docs/results.md)
    assert "git_revision" in attrs and attrs["start_time"] < attrs["end_time"]
    assert attrs["settings"]["timeout"] == 3.0 and attrs["settings_sources"]["timeout"] == "argument"
    assert "policy" not in attrs                       # one per row of the table
    assert attrs["environment"]["SLURM_JOB_ID"] == "4242"
    # the summary hpccoll-report prints from the file is the one the job printed
    from hpccoll.results import summary
    printed = proc.stdout[proc.stdout.index("chaos abba:"):].splitlines()
    assert summary(attrs, rows) == printed[:len(summary(attrs, rows))]


def test_chaos_out_when_the_check_fails(tmp_path):
    """--expect timeout cannot be met by preemptive: exit 1, and the run says why."""
    proc, out = chaos(2, tmp_path, "--expect", "timeout")
    assert proc.returncode != 0
    (run,) = h5log.read(out)
    assert run.attrs["ok"] is False and run.attrs["status"] == "wrong-results"
    got = {r["policy"]: r["outcome"] for r in run.tables["outcomes"]}
    assert got == {"preemptive": "complete", "ordered": "complete", "fifo": "timeout"}


def test_chaos_runs_append_and_the_watchdog_is_required(tmp_path):
    proc, out = chaos(2, tmp_path, "--policy", "preemptive")
    assert proc.returncode == 0, proc.stderr
    (run,) = h5log.read(out)
    assert [r["policy"] for r in run.tables["outcomes"]] == ["preemptive"] * 2
    assert len(h5log.read(out)) == 1
    proc = launch.run(2, ["-m", "hpccoll.chaos", "latin", "--iters", "1", "--out", str(out)],
                      timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert [r.name for r in h5log.read(out)] == ["0000_abba", "0001_latin"]
    for bad in ("0", "nan", "-1"):
        proc = subprocess.run([sys.executable, "-m", "hpccoll.chaos", "abba", "--timeout", bad],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and "--timeout: expected seconds > 0" in proc.stderr


def test_stamp_adds_slurm_variables_without_overwriting(tmp_path):
    path = tmp_path / "r.h5"
    with h5py.File(path, "w") as f:
        f.attrs["SLURM_JOB_ID"] = "1"
    env = {"SLURM_JOB_ID": "2", "SLURM_JOB_NODELIST": "n[1-2]", "HOME": "/root"}
    assert slurm.stamp([str(path), str(tmp_path / "missing.h5")], env) == 1
    with h5py.File(path) as f:     # h5log's attribute convention (docs/results.md)
        assert h5log.read_attrs(f) == {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n[1-2]"}


def test_check_accepts_one_job_of_n_ranks():
    proc = launch.run(2, ["-m", "hpccoll.slurm", "check", "--ranks", "2"], timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 ranks in one MPI job" in proc.stdout


def test_check_names_the_launcher_when_ranks_are_singletons():
    """What srun --mpi=none (or a plugin the MPI lacks) produces: rank 0 of 1, N times."""
    proc = subprocess.run([sys.executable, "-m", "hpccoll.slurm", "check", "--ranks", "4"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "HPCCOLL_SRUN_MPI" in proc.stderr and "HPCCOLL_LAUNCHER=mpiexec" in proc.stderr


WHEEL = ("MPICH Version:      5.0.2\nMPICH Release date: Fri Sep 25 2026\n"
         "MPICH configure:    --with-device=ch4:ucx,ofi --with-pm=hydra:gforker\n")
SLURM_MPICH = WHEEL.replace("--with-pm=hydra:gforker", "--with-pmi=pmi2/simple --with-slurm")
OPEN_MPI = "Open MPI v5.0.3, package: Open MPI builder Distribution, ident: 5.0.3"
INTEL = "Intel(R) MPI Library 2021.12 for Linux* OS\n"


@pytest.mark.parametrize("want, nodes, library, hydra, expected", [
    ("auto", 2, WHEEL, True, "mpiexec"),         # srun's pmi2 would lose its long requests
    ("auto", 1, WHEEL, True, "srun"),            # one node: no address exchange through PMI
    ("auto", 2, WHEEL, False, "srun"),           # no hydra on PATH: srun is all there is
    ("auto", 4, SLURM_MPICH, True, "srun"),      # built against Slurm's PMI-2
    ("auto", 4, OPEN_MPI, True, "srun"),
    ("auto", 4, INTEL, True, "srun"),
    ("srun", 2, WHEEL, True, "srun"),            # asked for: it runs, with a warning
    ("mpiexec", 1, OPEN_MPI, False, "mpiexec"),
])
def test_launcher_choice(want, nodes, library, hydra, expected):
    name, note = slurm.pick_launcher(want, nodes, library, hydra)
    assert name == expected
    if want == "auto" and expected == "mpiexec":
        assert note.startswith("auto:") and "1024 bytes" in note and "hydra" in note
    elif want == "srun" and nodes > 1 and library is WHEEL:
        assert note.startswith("warning:") and "HPCCOLL_LAUNCHER=auto" in note
    else:
        assert note == ""


def test_launcher_cli_reads_this_mpi_and_the_job(tmp_path):
    """This venv's MPI: the pip MPICH wheel is its own PMI-1 client with its hydra
    beside it (two nodes: mpiexec); Open MPI's and Intel MPI's wheels talk to srun."""
    wheel = has_dist("mpich")
    assert slurm.own_pmi1_client(slurm.library_version()) == wheel
    def launcher(*argv, **env):
        return subprocess.run([sys.executable, "-m", "hpccoll.slurm", "launcher", *argv],
                              capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, **env))
    two = launcher(SLURM_JOB_NUM_NODES="2")
    if wheel:
        assert (two.returncode, two.stdout) == (0, "mpiexec\n"), two.stderr
        assert "srun --mpi=pmi2 reads" in two.stderr
    else:
        assert (two.returncode, two.stdout, two.stderr) == (0, "srun\n", "")
    one = launcher(SLURM_JOB_NUM_NODES="1")
    assert (one.returncode, one.stdout, one.stderr) == (0, "srun\n", "")
    bad = launcher("--want", "mpirun")
    assert bad.returncode == 2 and bad.stdout == ""
    assert "HPCCOLL_LAUNCHER must be auto, srun or mpiexec, not 'mpirun'" in bad.stderr


def has_dist(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.parametrize("argv", [["check"], ["stamp"], []])
def test_cli_usage_errors(argv):
    proc = subprocess.run([sys.executable, "-m", "hpccoll.slurm", *argv],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "usage" in proc.stderr


@pytest.mark.parametrize("page", ["results.md", "slurm.md"])
def test_reading_example_in_docs_runs(tmp_path, page):
    """docs/results.md and docs/slurm.md show how to read a chaos run: run it on a real one."""
    import re
    from pathlib import Path
    doc = (Path(__file__).resolve().parents[2] / "docs" / page).read_text()
    [snippet] = [s for s in re.findall(r"```python\n(.*?)```", doc, re.S) if "outcomes" in s]
    proc, out = chaos(2, tmp_path, env={"SLURM_JOB_ID": "77"})
    assert proc.returncode == 0, proc.stderr
    run = subprocess.run([sys.executable, "-c", snippet.replace("results/1234-chaos-3d.h5",
                                                                str(out))],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "77 2 ok" and len(lines) == 1 + 2 * 3
    assert "1 fifo timeout 0" in lines


def test_an_out_file_runs_cannot_join_is_refused_before_the_run(tmp_path):
    """A chaos file of an earlier hpccoll: refused at the start (exit 2, naming --out),
    not after the run, whose outcome would then be lost; the file is left as it was."""
    old = tmp_path / "old.h5"
    with h5py.File(old, "w") as f:
        f.attrs["schema"] = "hpccoll.chaos/1"
    before = old.read_bytes()
    proc = launch.run(2, ["-m", "hpccoll.chaos", "abba", "--iters", "1", "--out", str(old)],
                      timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("argument --out:") == 1 and "earlier hpccoll" in proc.stderr
    assert "chaos abba" not in proc.stdout and old.read_bytes() == before
