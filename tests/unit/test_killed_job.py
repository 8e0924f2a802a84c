"""A job killed (SIGKILL) at any moment, inside dup() too, leaves nothing in /dev/shm:
a communicator's node-shared memory is anonymous (transport/shm.py), so nothing of it
has a name to outlive the ranks (a file there, unlinked once every rank had mapped it,
stayed behind in 1 to 3 of 7 kills)."""
import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import launch

SCRIPT = str(Path(__file__).resolve().parents[1] / "scripts" / "dup_loop.py")


def ours() -> set:
    return set(glob.glob("/dev/shm/hpccoll-*"))


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm on this system")
@pytest.mark.parametrize("delay_ms", [0, 3, 7, 13, 29])
def test_a_job_killed_inside_dup_leaves_nothing_in_dev_shm(delay_ms):
    before = ours()
    env = dict(os.environ, MPIEXEC_TIMEOUT="120")
    proc = subprocess.Popen(launch.mpiexec_args(3) + [sys.executable, SCRIPT],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env, start_new_session=True)
    try:
        ready = proc.stdout.readline()
        assert ready.startswith("READY"), ready
        time.sleep(delay_ms / 1000)     # somewhere in the loop of dup() and free()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    time.sleep(0.2)                     # (the killed ranks' exits)
    assert ours() - before == set()
