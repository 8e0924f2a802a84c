"""The metadata lives in setup.cfg; this file declares the compiled parts, all optional:

- the C executor of the shared-memory programs (hpccoll/engine/_native.c: fences, the
  reductions and copies, process_vm_readv);
- the per-call path, compiled by Cython from its own Python source (the modules
  hpccoll/_compiled.py lists, typed where a .pxd sits beside them).

Where they cannot be built (no C compiler, no Cython), or with HPCCOLL_COMPILED=0, the
install goes on without them and the same Python source runs interpreted."""
import os
import runpy

from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))
_COMPILED = runpy.run_path(os.path.join(HERE, "hpccoll", "_compiled.py"))
MODULES = _COMPILED["MODULES"]

extensions = [Extension("hpccoll.engine._native", ["hpccoll/engine/_native.c"],
                        extra_compile_args=["-O3"], optional=True)]
try:
    from Cython.Build import cythonize
except ImportError:       # no Cython: the per-call path runs interpreted
    pass
else:
    compiled = cythonize(
        [Extension(name, [name.replace(".", "/") + ".py"], extra_compile_args=["-O2"])
         for name in MODULES],
        build_dir="build/cython", quiet=True, nthreads=os.cpu_count() or 1,
        compiler_directives={"language_level": 3, "binding": True,
                             # Python's annotations stay documentation: an ``int``
                             # parameter must still take a NumPy integer
                             "annotation_typing": False, "embedsignature": True})
    for ext in compiled:      # (cythonize makes new Extensions: optional is set here)
        ext.optional = True
    extensions += compiled

if not _COMPILED["wanted"]():
    # HPCCOLL_COMPILED=0: build nothing (what an editable install of this Python built in
    # the tree before still serves, as in a second venv for another MPI)
    extensions = []

# one compiler per core: the per-call path is some twenty modules
setup(ext_modules=extensions, options={"build_ext": {"parallel": os.cpu_count() or 1}})
