"""core/device.order_after, the submit path's stream ordering, against a recording
stand-in for numba.cuda (the simulator has no external streams or stream waits): an
event recorded on the array's stream and waited on by hpccoll's, no synchronize."""
import pytest

from hpccoll.core import device


class Recorder:
    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            return self if name == "event" else (name, args)
        return call


@pytest.mark.parametrize("handle, source", [
    (1, ("legacy_default_stream", ())),
    (2, ("per_thread_default_stream", ())),
    (0x7f00beef, ("external_stream", (0x7f00beef,))),
])
def test_order_after_records_on_the_arrays_stream_and_waits_on_the_device(
        monkeypatch, handle, source):
    cuda = Recorder()
    monkeypatch.setattr(device, "simulated", lambda: False)
    monkeypatch.setattr(device, "_cuda", lambda: cuda)
    device.order_after(handle, "engine-stream")
    names = [c[0] for c in cuda.calls]
    assert names == [source[0], "event", "record", "wait"]
    assert cuda.calls[0][1] == source[1]
    assert cuda.calls[1][2] == {"timing": False}
    assert cuda.calls[2][2] == {"stream": source}
    assert cuda.calls[3][2] == {"stream": "engine-stream"}
    assert not any("synchronize" in n for n in names)


@pytest.mark.parametrize("handle", [None, 0])
def test_no_stream_named_no_ordering(monkeypatch, handle):
    cuda = Recorder()
    monkeypatch.setattr(device, "simulated", lambda: False)
    monkeypatch.setattr(device, "_cuda", lambda: cuda)
    device.order_after(handle, "engine-stream")
    assert cuda.calls == []
