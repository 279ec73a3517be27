"""The collector paused during opening, planning and loading (hf2q._gc): off
inside, back as it was after (also after an error, across threads and
nesting, in a child forked mid-step), and a load really runs with it off."""

from __future__ import annotations

import gc
import os
import sys
import threading
from pathlib import Path

import pytest

import hf2q
from hf2q import _gc, loader, qwen35
from hf2q.models.qwen35 import FAMILY
from hf2q.safetensors import open_checkpoint
from hf2q.testing import make_qwen35_moe_checkpoint


@pytest.fixture(autouse=True)
def collector_on() -> object:
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_off_inside_and_back_after_also_after_an_error() -> None:
    with _gc.paused():
        assert not gc.isenabled()
        with _gc.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer step still runs
    assert gc.isenabled()
    with pytest.raises(KeyError), _gc.paused():
        raise KeyError("x")
    assert gc.isenabled()


def test_left_off_when_the_caller_had_turned_it_off() -> None:
    gc.disable()
    with _gc.paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def _step_in_another_thread() -> tuple[threading.Thread, threading.Event]:
    """A thread inside a paused step until the returned event is set."""
    inside, release = threading.Event(), threading.Event()

    def step() -> None:
        with _gc.paused():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=step)
    t.start()
    assert inside.wait(10)
    return t, release


def test_back_on_only_when_the_last_thread_is_done() -> None:
    t, release = _step_in_another_thread()
    with _gc.paused():
        pass
    assert not gc.isenabled()  # the other thread's step is still running
    release.set()
    t.join(10)
    assert gc.isenabled()


def _child_status(pid: int, r: int) -> bytes:
    _, status = os.waitpid(pid, 0)
    out = os.read(r, 16)
    os.close(r)
    assert status == 0
    return out


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_child_forked_during_another_threads_step_gets_the_collector_back() -> None:
    t, release = _step_in_another_thread()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the other thread's step never ends here
        ok = gc.isenabled()
        with _gc.paused():
            ok = ok and not gc.isenabled()
        ok = ok and gc.isenabled()
        os.write(w, b"1" if ok else b"0")
        os._exit(0)
    os.close(w)
    assert not gc.isenabled()  # the parent's step still runs
    release.set()
    t.join(10)
    assert _child_status(pid, r) == b"1"
    assert gc.isenabled()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_child_forked_by_the_steps_own_thread_ends_the_step_there() -> None:
    r, w = os.pipe()
    with _gc.paused():
        pid = os.fork()
    if pid == 0:  # child: the step it inherited ended as in the parent
        os.write(w, b"1" if gc.isenabled() else b"0")
        os._exit(0)
    os.close(w)
    assert _child_status(pid, r) == b"1" and gc.isenabled()


def test_an_interrupt_on_the_way_in_or_out_leaves_no_step_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C (a signal's exception) can arrive between any two steps of
    the bookkeeping: the collector still comes back on."""
    for fail_at in ("append", "remove"):
        calls = {"n": 0}
        real = _gc._steps

        class Flaky(list):  # raises once, where a signal could arrive
            def append(self, x: object) -> None:
                if fail_at == "append" and calls["n"] == 0:
                    calls["n"] += 1
                    raise KeyboardInterrupt
                super().append(x)

            def remove(self, x: object) -> None:
                if fail_at == "remove" and calls["n"] == 0:
                    calls["n"] += 1
                    raise KeyboardInterrupt
                super().remove(x)

        monkeypatch.setattr(_gc, "_steps", Flaky())
        with pytest.raises(KeyboardInterrupt), _gc.paused():
            pass
        assert calls["n"] == 1 and gc.isenabled() and not _gc._steps, fail_at
        with _gc.paused():
            assert not gc.isenabled()
        assert gc.isenabled()
        monkeypatch.setattr(_gc, "_steps", real)


def test_an_interrupt_at_any_line_of_a_step_leaves_no_step_behind() -> None:
    """A Ctrl-C at any line of the bookkeeping (a line tracer raises it, as
    tests/test_fault_injection.py does across a load), the finally's first
    line included: once the exception is gone, no step is left counted and
    the collector is back on."""
    code = _gc.paused.__wrapped__.__code__
    lines = sorted({ln for _, _, ln in code.co_lines() if ln is not None and ln > code.co_firstlineno})
    hit = []
    for target in lines:
        fired = []

        def tracer(frame, event, arg):  # type: ignore[no-untyped-def]  (paused()'s frame only)
            if event == "line" and frame.f_lineno == target and not fired:
                fired.append(target)
                raise KeyboardInterrupt(f"injected at line {target}")
            return tracer

        def step() -> None:
            with _gc.paused():
                assert not gc.isenabled()

        sys.settrace(lambda f, e, a: tracer if f.f_code is code else None)
        try:
            step()
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)
        hit += fired
        assert not _gc._steps and gc.isenabled(), f"line {target}"
    assert len(hit) >= 8  # (every line the step runs)


def test_open_plan_and_load_run_with_the_collector_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = make_qwen35_moe_checkpoint(tmp_path / "ckpt", "tiny", seed=3, sharded=True)
    seen: dict[str, bool] = {}
    fam = FAMILY
    real_plan, real_fill = type(fam).plan, loader._fill_batch

    def plan(self: object, *a: object, **k: object) -> object:
        seen["plan"] = gc.isenabled()
        return real_plan(self, *a, **k)  # type: ignore[arg-type]

    def fill(*a: object, **k: object) -> object:
        seen["execute"] = gc.isenabled()
        return real_fill(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(type(fam), "plan", plan)
    monkeypatch.setattr(loader, "_fill_batch", fill)
    real_open = hf2q.safetensors.open

    def open_(p: object) -> object:
        seen["open"] = gc.isenabled()
        return real_open(p)  # type: ignore[arg-type]

    monkeypatch.setattr(hf2q.safetensors, "open", open_)
    model = qwen35.load(path, hf2q.Device("host"), progress=False)
    assert seen == {"open": False, "plan": False, "execute": False}
    assert gc.isenabled() and len(model) > 0
    with open_checkpoint(path):
        assert gc.isenabled()  # only the opening is paused, not the caller's use of the checkpoint
