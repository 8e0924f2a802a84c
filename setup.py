"""The metadata lives in setup.cfg; this file only declares the optional C part: the
executor of the shared-memory programs (hpccoll/engine/_native.c).  Where it cannot be
built (no C compiler), the install goes on without it and hpccoll runs those programs in
Python."""
from setuptools import Extension, setup

setup(ext_modules=[
    Extension("hpccoll.engine._native", ["hpccoll/engine/_native.c"],
              extra_compile_args=["-O3"], optional=True),
])
