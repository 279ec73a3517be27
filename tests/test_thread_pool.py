"""The native thread pool when two threads start parallel loops at once
(on a GPU the loader's batch runs on a helper thread while the loading
thread fills small tensors). By default a loop that finds the pool busy
runs inline on its own thread; a loop that asks to wait for the pool (a
batch upload, gigabytes) gets every thread once the other loop ends."""

from __future__ import annotations

import threading
import time

import pytest

from hf2q import _core


@pytest.fixture
def two_threads() -> None:
    before = _core.get_num_threads()
    if before < 2:
        _core.set_num_threads(2)
    yield
    _core.set_num_threads(before)


@pytest.mark.parametrize("wait", [False, True])
def test_a_loop_started_while_another_holds_the_pool(wait: bool, two_threads: None) -> None:
    threads = _core.get_num_threads()
    assert _core._parallel_probe(4 * threads, 0.001, False) > 1  # alone: the pool's threads
    started = threading.Event()
    holder: list[int] = []

    def hold() -> None:
        started.set()
        holder.append(_core._parallel_probe(2 * threads, 0.15, False))

    t = threading.Thread(target=hold)
    t.start()
    started.wait()
    time.sleep(0.05)  # the holder's loop has begun (each of its chunks sleeps 0.15 s)
    used = _core._parallel_probe(4 * threads, 0.001, wait)
    t.join()
    assert holder and holder[0] > 1
    if wait:
        assert used > 1  # it waited for the pool, then ran on its threads
    else:
        assert used == 1  # inline on this thread while the pool was busy
