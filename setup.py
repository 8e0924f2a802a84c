"""The metadata lives in setup.cfg; this file only declares the optional C parts: the
executor of the shared-memory programs (hpccoll/engine/_native.c) and the per-call path
of collectives MPI runs itself (hpccoll/core/_express.c).  Where they cannot be built (no
C compiler), the install goes on without them and hpccoll runs that code in Python."""
from setuptools import Extension, setup

setup(ext_modules=[
    Extension("hpccoll.engine._native", ["hpccoll/engine/_native.c"],
              extra_compile_args=["-O3"], optional=True),
    Extension("hpccoll.core._express", ["hpccoll/core/_express.c"],
              extra_compile_args=["-O2"], optional=True),
])
