"""A loader's device opened on a helper thread while the load opens and plans
the checkpoint (hf2q.device.DeviceOpening, for ``device=None`` or a kind such
as ``"cuda"``): the same device as ``Device.default()`` / ``Device(kind)``,
its error raised on the caller's thread, and a device made by ``get()``
itself where the thread could not run (no thread started, a forked child).
A device of another type is a TypeError, an unknown kind a ValueError,
before any work."""

from __future__ import annotations

import os
import threading

import pytest

import hf2q
from hf2q import DeviceError
from hf2q.device import Device, DeviceOpening, as_device, resolve_device


def test_the_opening_gives_the_default_device() -> None:
    opening = as_device(None)
    dev = opening.get()
    assert dev == Device.default()
    assert opening.get() is dev  # made once
    assert resolve_device(opening) is dev
    assert resolve_device(dev) is dev


def test_its_error_is_raised_by_get() -> None:
    class Failing(Device):
        @classmethod
        def default(cls) -> Device:
            raise DeviceError("no device for this test")

    opening = DeviceOpening(Failing)
    with pytest.raises(DeviceError, match="no device for this test"):
        opening.get()


def test_no_thread_started_opens_on_get(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    opening = as_device(None)
    monkeypatch.undo()
    assert opening.get() == Device.default()


def test_a_thread_that_left_nothing_opens_on_get() -> None:
    # A child forked while the thread ran has no such thread: its join
    # returns at once and nothing was made; get() makes the device.
    class Idle(DeviceOpening):
        def _run(self) -> None:
            pass

    assert Idle(Device).get() == Device.default()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_forked_child_while_opening() -> None:
    # Fork right after the opening starts: parent and child each get a device.
    r, w = os.pipe()
    opening = as_device(None)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        code = 1
        try:
            os.close(r)
            code = 0 if opening.get() == Device.default() else 2
        finally:
            os.write(w, bytes([code]))
            os._exit(0)
    os.close(w)
    got = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    assert got == b"\x00"
    assert opening.get() == Device.default()


def test_a_load_with_no_device_or_a_kind_uses_an_opening(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from hf2q import device as device_module
    from hf2q.testing import make_qwen35_moe_checkpoint

    d = tmp_path / "q"
    make_qwen35_moe_checkpoint(d)
    made: list[DeviceOpening] = []

    class Spy(DeviceOpening):
        __slots__ = ()

        def __init__(self, cls: type[Device], kind: str | None = None) -> None:
            super().__init__(cls, kind)
            made.append(self)

    monkeypatch.setattr(device_module, "DeviceOpening", Spy)
    model = hf2q.load(d, progress=False)
    assert len(made) == 1
    assert model.summary.device == Device.default().kind
    del model
    model = hf2q.load(d, "host", progress=False)
    assert len(made) == 2 and model.summary.device == "host"
    del model
    # A device given is used as it is: no opening.
    model = hf2q.load(d, Device("host"), progress=False)
    assert len(made) == 2
    del model


def test_a_kind_opens_that_device() -> None:
    assert as_device("host").get() == Device("host")
    assert resolve_device("host") == Device("host")
    host = Device("host")
    assert as_device(host) is host and resolve_device(host) is host


def test_bad_devices_are_refused_before_any_work(tmp_path) -> None:
    missing = tmp_path / "nothing-here"  # never opened: the device argument is refused first
    with pytest.raises(TypeError, match="device must be an hf2q.Device, a kind"):
        hf2q.load(missing, 3, progress=False)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="bad device|unknown device"):
        hf2q.load(missing, "tpu", progress=False)
    with pytest.raises(TypeError):
        as_device(object())  # type: ignore[arg-type]


def test_the_thread_ends_after_a_failed_load(tmp_path) -> None:
    from hf2q import Hf2qError

    (tmp_path / "config.json").write_text('{"model_type": "qwen3_5_moe", "architectures": ["Qwen3_5MoeForCausalLM"]}')
    with pytest.raises(Hf2qError):
        hf2q.load(tmp_path, progress=False)
    for t in threading.enumerate():
        if t.name == "hf2q-device-open":
            t.join(timeout=30)
            assert not t.is_alive()


@pytest.mark.cuda
def test_cuda_opened_on_a_helper_thread_loads_the_same_bytes(tmp_path) -> None:
    # The context is made on the helper thread; every native call pushes it
    # on the calling thread, so the load runs as with a device made here.
    import numpy as np
    from _helpers import why_no_cuda
    from hf2q.testing import make_qwen35_moe_checkpoint

    why = why_no_cuda()
    if why:
        pytest.skip(f"no CUDA device: {why}")
    d = tmp_path / "q"
    make_qwen35_moe_checkpoint(d)
    ref = hf2q.load(d, Device("cuda"), progress=False)
    for device in ("cuda", None):
        m = hf2q.load(d, device, progress=False)
        assert m.summary.device == "cuda"
        assert sorted(m.names()) == sorted(ref.names())
        for n in m.names():
            assert m[n].to_host().view(np.uint8).tobytes() == ref[n].to_host().view(np.uint8).tobytes(), n
        del m
