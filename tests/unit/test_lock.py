"""engine/lane.py new_lock(): the per-call path's mutex (``_native.Lock`` where the C module
is built) behaves as threading.Lock does, whichever it is."""
import os
import threading
import time

import numpy as np
import pytest

from hpccoll.engine import code, lane


def need_native() -> None:
    """Skip where the C module is not built, fail where it must be (CI sets
    HPCCOLL_REQUIRE_NATIVE=1: there it cannot be skipped)."""
    if code._native is None:
        if os.environ.get("HPCCOLL_REQUIRE_NATIVE") == "1":
            pytest.fail("HPCCOLL_REQUIRE_NATIVE=1 but hpccoll.engine._native is not built")
        pytest.skip("hpccoll.engine._native is not built here (threading.Lock is used)")


def locks():
    """The lock the path uses, and threading.Lock as the reference."""
    return [lane.new_lock(), threading.Lock()]


@pytest.mark.parametrize("lock", locks(), ids=["new_lock", "threading"])
def test_acquire_release_and_with(lock):
    assert lock.acquire() is True and lock.locked()
    assert lock.acquire(False) is False
    assert lock.acquire(blocking=False) is False
    assert lock.acquire(timeout=0.01) is False
    lock.release()
    assert not lock.locked()
    with pytest.raises(RuntimeError):
        lock.release()
    with lock:
        assert lock.locked()
    assert not lock.locked()
    with pytest.raises(ValueError):
        lock.acquire(False, 1)
    with pytest.raises(ValueError):
        lock.acquire(timeout=-2)
    with pytest.raises(TypeError):
        lock.acquire(colour=1)


@pytest.mark.parametrize("lock", locks(), ids=["new_lock", "threading"])
def test_a_waiter_gets_the_lock_when_it_is_released(lock):
    lock.acquire()
    got = []
    t = threading.Thread(target=lambda: got.append(lock.acquire(timeout=5)))
    t.start()
    time.sleep(0.05)
    assert got == []           # it waits (without the GIL: this thread ran meanwhile)
    lock.release()
    t.join(5)
    assert got == [True] and lock.locked()
    lock.release()


@pytest.mark.parametrize("lock", locks(), ids=["new_lock", "threading"])
def test_a_timed_wait_ends_false_after_its_timeout(lock):
    lock.acquire()
    got = []
    t0 = time.monotonic()
    t = threading.Thread(target=lambda: got.append(lock.acquire(timeout=0.1)))
    t.start()
    t.join(5)
    assert got == [False] and 0.09 <= time.monotonic() - t0 < 2
    lock.release()


def test_mutual_exclusion_under_threads():
    lock, count = lane.new_lock(), [0]

    def work():
        for _ in range(20000):
            with lock:
                v = count[0]
                count[0] = v + 1
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert count[0] == 80000


def test_the_native_lock_is_the_one_used_where_the_c_module_is_built():
    need_native()
    assert type(lane.new_lock()) is code._native.Lock


def test_address_is_where_the_memory_starts_and_a_buffer_it_cannot_export_stays():
    need_native()
    a = np.arange(8, dtype=np.float32)
    assert code._native.address(a, True) == a.ctypes.data
    assert code._native.address(a[2:], False) == a.ctypes.data + 8
    ro = np.frombuffer(b"12345678", np.uint8)
    assert code._native.address(ro, True) is ro          # read-only, asked writable
    assert code._native.address(ro, False) == ro.ctypes.data
    assert code._native.address(None, False) is None
