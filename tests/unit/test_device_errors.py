"""A device array where CUDA cannot take it (no driver or GPU, outside Numba's simulator)
is an ArgumentTypeError naming the argument, raised before anything is queued, not
Numba's own CudaSupportError (issue 32, finding 6).  Run in a process of its own: the
simulator, which the other tests use, must be off there."""
import os
import subprocess
import sys

import pytest

SCRIPT = """
import numpy as np, hpccoll
from numba import cuda
from tests.devarrays import InstanceCAI, HostCAI
if cuda.is_available():
    print("a GPU is here")
    raise SystemExit(0)
with hpccoll.init() as ctx:
    for kind in (InstanceCAI, HostCAI):
        try:
            ctx.world.allreduce(kind(np.ones(4, np.float32)))
        except hpccoll.ArgumentTypeError as exc:
            print("ArgumentTypeError", exc)
        else:
            print("accepted")
    print("still usable", ctx.world.allreduce(np.ones(2)).wait())
"""


def test_a_device_array_cuda_cannot_take_is_an_argument_error():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if proc.stdout.startswith("a GPU is here"):
        pytest.skip("a GPU and its driver are here: CUDA takes these arrays")
    lines = proc.stdout.splitlines()
    assert len(lines) == 3 and all(ln.startswith("ArgumentTypeError sendbuf:") for ln in lines[:2]), \
        proc.stdout
    assert "CUDA cannot take it" in lines[0] and lines[2].startswith("still usable")
