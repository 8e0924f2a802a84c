"""mpi4py's own collective tests, run through ``hpccoll.mpi.Comm``.

    python tests/mpi4py_suite.py fetch                 # mpi4py's test files, once (network)
    mpiexec -n N python tests/mpi4py_suite.py run      # run them through the adapter

``fetch`` downloads the sdist of the installed mpi4py version from PyPI (pip download) and
keeps its test files in .mpi4py-suite/ (ignored by git: nothing of mpi4py's is committed).
Exit status 0 when the files are there, 3 when they cannot be had (no network), except under
HPCCOLL_REQUIRE_MPI4PY_SUITE=1 (CI), where that is a failure (1): CI must run the suite.

``run`` runs test_cco_buf, test_cco_nb_buf, test_cco_vec and test_cco_nb_vec as mpi4py
wrote them, with mpi4py's arrayimpl (array.array, NumPy, DLPack and the GPU-like arrays that
expose ``__cuda_array_interface__`` over host memory), on every rank.  The only change: each
test's communicator is replaced, after the test's own setUp, by an ``hpccoll.mpi.Comm`` on
one hpccoll context (COMM_SELF and COMM_WORLD by one adapter each, a test's Dup by an adapter
over it, which the test's tearDown frees).  It prints the tests run, failures, errors and
skips summed over ranks, and how many calls ran natively and how many were forwarded
(``comm.stats``); exit status 1 on any failure or error on any rank, or when no call ran
natively (the substitution did not happen).  The first failure or error on any rank is
printed at once, naming the rank, and ends the job (MPI_Abort): the other ranks would go on
into collectives that rank left behind and wait there.
"""
from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import unittest
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".mpi4py-suite"
MODULES = ("test_cco_buf", "test_cco_nb_buf", "test_cco_vec", "test_cco_nb_vec")
# what those modules import from mpi4py's test directory
SUPPORT = ("arrayimpl.py", "dlpackimpl.py", "mpiunittest.py", "mpitestutil.py")
REQUIRE = "HPCCOLL_REQUIRE_MPI4PY_SUITE"
UNAVAILABLE = 3


def _version() -> str:
    import mpi4py
    return mpi4py.__version__


def test_dir(version: str) -> Path:
    return CACHE / f"mpi4py-{version}" / "test"


def fetch() -> int:
    version = _version()
    dest = test_dir(version)
    names = [f"{m}.py" for m in MODULES] + list(SUPPORT)
    if all((dest / n).is_file() for n in names):
        print(f"mpi4py {version} test files: {dest.relative_to(ROOT)} (cached)")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:",
               "--no-deps", "-d", tmp, f"mpi4py=={version}"]
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        sdists = list(Path(tmp).glob("mpi4py-*.tar.gz"))
        if done.returncode != 0 or not sdists:
            return _unavailable(f"pip download of the mpi4py {version} sdist failed "
                                f"(exit {done.returncode}):\n{done.stdout[-2000:]}")
        with tarfile.open(sdists[0]) as tar:
            members = {Path(m.name).name: m for m in tar.getmembers()
                       if m.isfile() and Path(m.name).parent.name == "test"
                       and Path(m.name).parent.parent.name == f"mpi4py-{version}"}
            missing = [n for n in names if n not in members]
            if missing:
                print(f"mpi4py {version} sdist lacks {', '.join(missing)}", file=sys.stderr)
                return 1
            # written under a temporary name first: an interrupted fetch leaves no half cache
            part = dest.with_name("test.part")
            shutil.rmtree(part, ignore_errors=True)
            part.mkdir(parents=True)
            for n in names:
                (part / n).write_bytes(tar.extractfile(members[n]).read())
            shutil.rmtree(dest, ignore_errors=True)
            part.rename(dest)
    print(f"mpi4py {version} test files: fetched into {dest.relative_to(ROOT)}")
    return 0


def _unavailable(why: str) -> int:
    if os.environ.get(REQUIRE) == "1":
        print(f"{REQUIRE}=1 but {why}", file=sys.stderr)
        return 1
    print(f"mpi4py's collective tests skipped: {why}", file=sys.stderr)
    return UNAVAILABLE


# -- run ---------------------------------------------------------------------------------

def _drop_real_gpu_backends(arrayimpl) -> list:
    """arrayimpl adds Numba's and CuPy's device arrays whenever those import.  They test
    the MPI library's CUDA support, not the adapter (which forwards device arrays to mpi4py
    as they are): without a GPU they fail in mpi4py alone (Numba's simulator has no
    default_stream), and with one they need a CUDA-aware MPI.  The GPU-like arrays over
    host memory stay."""
    arrayimpl.ArrayBackends[:] = [b for b in arrayimpl.ArrayBackends
                                  if b.backend not in ("numba", "cupy", "dlpack-cupy")]
    return [b.__name__ for b in arrayimpl.ArrayBackends]


class Substitution:
    """Replaces the communicator of every test by an adapter on one context."""

    def __init__(self, MPI, Comm, ctx):
        self.MPI, self.Comm, self.ctx = MPI, Comm, ctx
        self.shared = [(MPI.COMM_SELF, Comm(MPI.COMM_SELF, context=ctx)),
                       (MPI.COMM_WORLD, Comm(MPI.COMM_WORLD, context=ctx))]
        self.made = [a for _, a in self.shared]

    def adapter(self, comm):
        if isinstance(comm, self.Comm):
            return comm
        for mpi_comm, adapter in self.shared:
            if comm == mpi_comm:
                return adapter
        if not isinstance(comm, self.MPI.Intracomm) or comm == self.MPI.COMM_NULL:
            raise TypeError(f"no adapter for the test's communicator {comm!r}")
        adapter = self.Comm(comm, context=self.ctx)   # the test's Dup; its tearDown frees it
        self.made.append(adapter)
        return adapter

    def install(self, cls) -> None:
        setup = cls.setUp
        # TestReduceLocal has no communicator (Op.Reduce_local); a subclass that inherits
        # an installed setUp has it already
        if not hasattr(cls, "COMM") or getattr(setup, "_substitutes", False):
            return
        sub = self

        def setUp(test):
            setup(test)
            test.COMM = sub.adapter(test.COMM)
        setUp._substitutes = True
        cls.setUp = setUp

    def stats(self) -> Counter:
        total = Counter()
        for adapter in self.made:
            for method, counts in adapter.stats.items():
                for path, k in counts.items():
                    total[(method, path)] += k
        return total


class StopAtFirst(unittest.TextTestResult):
    """Prints a failure or error the moment it happens, naming the rank, then aborts the
    job: mpi4py's tests are collective, so a test that failed on one rank leaves the others
    in its collectives (they would wait until MPIEXEC_TIMEOUT, and say nothing of why)."""

    def _stop(self, test, err, what: str) -> None:
        from mpi4py import MPI
        rank = MPI.COMM_WORLD.Get_rank()
        sys.stderr.write(f"---- rank {rank}: {what} in {test.id()}\n"
                         f"{self._exc_info_to_string(err, test)}\n")
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._stop(test, err, "FAIL")

    def addError(self, test, err):
        super().addError(test, err)
        self._stop(test, err, "ERROR")

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            self._stop(subtest, err, "FAIL")


def _cases(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from _cases(t)
        else:
            yield t


def run() -> int:
    from mpi4py import MPI
    import hpccoll
    import hpccoll.mpi

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    tests = test_dir(_version())
    if not (tests / "arrayimpl.py").is_file():
        if rank == 0:
            print(f"{tests.relative_to(ROOT)} is missing: run `python tests/mpi4py_suite.py "
                  "fetch` first", file=sys.stderr)
        return 1
    sys.path.insert(0, str(tests))
    import arrayimpl
    backends = _drop_real_gpu_backends(arrayimpl)

    options = {} if "HPCCOLL_TIMEOUT" in os.environ else {"timeout": 120}
    ctx = hpccoll.init(world, **options)
    sub = Substitution(MPI, hpccoll.mpi.Comm, ctx)
    suite = unittest.TestLoader().loadTestsFromNames(MODULES)
    for case in _cases(suite):
        sub.install(type(case))

    out = sys.stdout if rank == 0 else io.StringIO()
    result = unittest.TextTestRunner(stream=out, verbosity=0,
                                     resultclass=StopAtFirst).run(suite)
    mine = (result.testsRun, len(result.failures), len(result.errors), len(result.skipped),
            len(result.unexpectedSuccesses))
    calls = sub.stats()
    everyone = world.allgather((mine, calls))
    failed = [r for r, ((_, f, e, _, u), _) in enumerate(everyone) if f or e or u]
    if rank in failed and rank != 0:
        sys.stderr.write(f"---- rank {rank} ----\n{out.getvalue()}")
    ctx.close()

    # the methods Comm and its mixins (hpccoll/mpi/_rooted.py, ...) define themselves
    runs = {name for cls in hpccoll.mpi.Comm.__mro__ if cls.__module__.startswith("hpccoll")
            for name in vars(cls)}
    if rank == 0 and not _report(everyone, size, backends, runs):
        return 1
    return 1 if failed else 0


def _report(everyone, size: int, backends: list, runs: set) -> bool:
    """Print the outcome summed over ranks; False when the run must fail."""
    ran = [m[0] for m, _ in everyone]
    failed = [r for r, (m, _) in enumerate(everyone) if any(m[1:3]) or m[4]]
    f, e, s = (sum(m[i] for m, _ in everyone) for i in (1, 2, 3))
    total = sum((c for _, c in everyone), Counter())
    native = sum(k for (_, path), k in total.items() if path == "native")
    own = sum(k for (m, path), k in total.items() if path == "forwarded" and m in runs)
    other = sum(k for (m, path), k in total.items() if path == "forwarded" and m not in runs)
    print(f"mpi4py {_version()}'s collective tests through hpccoll.mpi.Comm on {size} rank(s), "
          f"array types {', '.join(backends)}:\n"
          f"  tests: {ran[0]} run per rank; {f} failures, {e} errors, {s} skips (all ranks)\n"
          f"  calls (all ranks): {native} native, {own + other} forwarded ({own} by methods "
          f"hpccoll runs: device arrays, datatypes or ops it leaves to MPI; {other} by "
          f"methods it does not run)")
    for m in sorted({m for m, _ in total if m in runs}):
        print(f"    {m:22} native {total[(m, 'native')]:7}   forwarded {total[(m, 'forwarded')]:7}")
    if len(set(ran)) > 1:
        print(f"ranks ran different numbers of tests: {ran}", file=sys.stderr)
        return False
    if failed:
        print(f"FAILED on rank(s) {failed}", file=sys.stderr)
        return False
    if native == 0:
        print("no call ran natively: the adapter was not substituted", file=sys.stderr)
        return False
    return True


def main(argv) -> int:
    if argv[1:] == ["fetch"]:
        return fetch()
    if argv[1:] == ["run"]:
        return run()
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
