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
import time
from typing import Any

import pytest
from _helpers import wait_child

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


def _fail() -> Device:
    raise DeviceError("no device for this test")


def test_its_error_is_raised_by_get_and_dropped_by_close() -> None:
    with pytest.raises(DeviceError, match="no device for this test"):
        DeviceOpening(_fail).get()
    DeviceOpening(_fail).close()  # the caller failed first: its own error leaves, not this one


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
        __slots__ = ()

        def _run(self) -> None:
            pass

    assert Idle(Device.default).get() == Device.default()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_forked_child_while_opening() -> None:
    # Fork right after the opening starts: parent and child each get a device.
    opening = as_device(None)

    def child() -> tuple[int | str, bytes]:
        r, w = os.pipe()
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
        status = wait_child(pid, time.monotonic() + 30)  # (before the read: a hung child never writes)
        got = os.read(r, 1)
        os.close(r)
        return status, got

    status, got = child()
    if status == "hang in the sanitizer runtime":  # its own lock, not ours (_helpers.wait_child): once more
        status, got = child()
    assert status == 0
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

        def __init__(self, open_device: Any) -> None:
            super().__init__(open_device)
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


def test_no_opening_outlives_a_failed_load(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A load that fails after its opening began closes it: the thread is
    # done when the error leaves (a slow open, as a GPU's, waited for).
    from hf2q import Hf2qError

    def slow_default(cls: type[Device]) -> Device:
        time.sleep(0.3)
        return Device("host")

    monkeypatch.setattr(Device, "default", classmethod(slow_default))
    (tmp_path / "config.json").write_text('{"model_type": "qwen3_5_moe", "architectures": ["Qwen3_5MoeForCausalLM"]}')
    for load in (hf2q.load, hf2q.qwen35.load):
        with pytest.raises(Hf2qError):
            load(tmp_path, progress=False)
        assert "hf2q-device-open" not in {t.name for t in threading.enumerate()}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_fork_while_another_thread_configures_cuda_or_probes_the_driver(tmp_path) -> None:
    # A device opened on a helper thread takes hf2q._cuda's lock and the
    # native configuration and driver locks; a child forked meanwhile must
    # not inherit one held (it would wait forever at its first CUDA probe).
    # The native side holds them across fork(); Python's lock is renewed.
    import faulthandler
    from pathlib import Path

    from hf2q import _core, _cuda

    tmp = str(tmp_path)

    stop = False

    def churn() -> None:
        while not stop:
            _core.cuda_configure([], "")  # the native configuration lock
            try:
                resolve_device("cuda")  # an opening's thread: the driver probe (loaded once, under its lock)
            except Exception:  # noqa: BLE001 - no GPU here: the probe's error is expected
                pass

    # As a loader does: the backends' Python set-up (imports) on the calling
    # thread, before a helper opens (as_device); a thread importing while
    # another forks would leave the child its module's import lock held.
    as_device("cuda").close()
    t = threading.Thread(target=churn, daemon=True)
    t.start()
    def spawn() -> int:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child exits with its status
            code = 1
            try:
                # a hung child dumps where it waits (then exits 1), for the assertion below; under
                # ASan wait_child's native stacks instead, which tell the runtime's own lock apart
                if os.environ.get("HF2Q_UNDER_SANITIZER") != "1":
                    log = open(os.path.join(tmp, f"child-{os.getpid()}.txt"), "w")
                    faulthandler.dump_traceback_later(15, exit=True, file=log)
                _cuda.prepare()
                _core.cuda_configure([], "")
                Device.default()
                with pytest.raises(DeviceError):
                    Device("cuda")
                code = 0
            finally:
                os._exit(code)
        return pid

    try:
        pids = []
        for _ in range(20):
            time.sleep(0.002)
            pids.append(spawn())
        deadline = time.monotonic() + 30
        codes = [wait_child(pid, deadline) for pid in pids]
        # a child stuck on the sanitizer runtime's own lock (not fork-safe: _helpers.wait_child)
        # is forked once more, the churn still running
        codes = [wait_child(spawn(), time.monotonic() + 30) if c == "hang in the sanitizer runtime" else c
                 for c in codes]
        dumps = "".join(f.read_text() for f in Path(tmp).glob("child-*.txt"))
        assert codes == [0] * len(pids), (codes, dumps[-4000:])
    finally:
        stop = True
        t.join(10)
        _cuda._done = False
        _cuda.prepare()  # the configuration as it was (the churn's cuda_configure replaced it)


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


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_child_forked_while_cuda_is_being_prepared_can_prepare_it() -> None:
    # hf2q._cuda's lock held by another thread at the fork (that thread is
    # not in the child): the child gets a new lock, not one held forever.
    from hf2q import _cuda

    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with _cuda._lock:
            held.set()
            release.wait(30)

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    assert held.wait(10)
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child exits with its status
            code = 1
            try:
                _cuda._done = False
                _cuda.prepare()
                code = 0
            finally:
                os._exit(code)
        assert wait_child(pid, time.monotonic() + 30) == 0
    finally:
        release.set()
        t.join(10)
