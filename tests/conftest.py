"""Session-wide setup for every test run.

GPU code paths run through Numba's CUDA simulator unless HPCCOLL_TEST_REAL_GPU=1
(scripts/device_check.sh sets it on a machine with a GPU).  Numba reads the variable
when it is first imported, so it is set here, before any test module imports numba.
"""
import os

if os.environ.get("HPCCOLL_TEST_REAL_GPU") != "1":
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

# The tests assert the built-in algorithm table: a calibration this machine's user saved
# (~/.cache/hpccoll/calibration.h5) must not change their algorithms.  Tests of the
# calibration name their file.
os.environ.setdefault("HPCCOLL_CALIBRATION", "off")
