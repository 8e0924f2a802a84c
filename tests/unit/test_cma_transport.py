"""transport/cma.py on its own: single-copy reads and writes (of this process: the
kernel's checks are the same call), their errors, the probe, and the Yama exception each
rank makes."""
import os

import numpy as np
import pytest

from hpccoll.transport import cma


def address(a):
    return a.__array_interface__["data"][0]


@pytest.mark.parametrize("move", [cma.read, cma.write])
@pytest.mark.parametrize("n", [1, 4095, 4096, 3 * 4096 + 17, 5 << 20])
def test_read_and_write_copy_exactly(move, n):
    """(dst, src) in this process both ways: read takes dst here, write takes it there"""
    src = (np.arange(n) % 251).astype(np.uint8)
    dst = np.zeros(n + 2, np.uint8)
    move(os.getpid(), address(dst) + 1, address(src), n)
    np.testing.assert_array_equal(dst[1:-1], src)
    assert dst[0] == 0 and dst[-1] == 0          # nothing past the range
    np.testing.assert_array_equal(src, np.arange(n) % 251)


@pytest.mark.parametrize("move,name", [(cma.read, "process_vm_readv"),
                                       (cma.write, "process_vm_writev")])
def test_a_refused_copy_names_the_call_and_the_process(move, name):
    dst = np.zeros(8, np.uint8)
    gone = 2 ** 22 + 12_345                       # above any pid_max default: no such process
    with pytest.raises(OSError, match=f"{name} with process {gone}"):
        move(gone, address(dst), address(dst), 8)
    assert not cma.probe(gone, 0)


def test_probe_reads_the_token_and_writes_it_back_unchanged():
    before = cma._TOKEN.raw
    assert cma.probe(*cma.token())
    assert cma._TOKEN.raw == before


def test_probe_fails_where_writes_are_refused(monkeypatch):
    """(a seccomp filter may allow process_vm_readv and not process_vm_writev)"""
    def refused(*args):
        raise OSError(1, "process_vm_writev: Operation not permitted")
    monkeypatch.setattr(cma, "write", refused)
    assert not cma.probe(*cma.token())


def test_allow_peers_names_any_process_once(monkeypatch):
    calls = []

    class Libc:
        def prctl(self, *args):
            calls.append(tuple(a.value for a in args))
            return -1                              # (EINVAL without Yama: ignored)

    monkeypatch.setattr(cma, "_LIBC", Libc())
    monkeypatch.setattr(cma, "_allowed", False)
    cma.allow_peers()
    cma.allow_peers()
    assert calls == [(cma.PR_SET_PTRACER, cma.PR_SET_PTRACER_ANY, 0, 0, 0)]
