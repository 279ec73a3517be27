"""The native thread pool when two threads start parallel loops at once
(on a GPU the loader's batch runs on a helper thread while the loading
thread fills small tensors). By default a loop that finds the pool busy
runs inline on its own thread; a loop that asks to wait for the pool (a
batch upload, gigabytes) gets every thread once the other loop ends."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from hf2q import _core


@pytest.fixture
def two_threads() -> Iterator[None]:
    before = _core.get_num_threads()
    if before < 2:
        _core.set_num_threads(2)
    yield
    _core.set_num_threads(before)


@pytest.mark.parametrize("wait", [False, True])
def test_a_loop_started_while_another_holds_the_pool(wait: bool, two_threads: None) -> None:
    threads = _core.get_num_threads()
    # Each try: a loop that holds the pool for about 0.3 s, and meanwhile the
    # probe. A try counts only where the holder ran on the pool's threads and
    # the probe was called while the holder's loop ran (a busy machine may
    # start the holder late); the probe's chunks take long enough (20 ms)
    # that a woken worker takes one.
    for _ in range(5):
        held: list[tuple[int, float, float]] = []
        t = threading.Thread(target=lambda: held.append(_core._parallel_probe(2 * threads, 0.15, False)))
        t.start()
        time.sleep(0.05)
        called = time.monotonic()
        used, begin, end = _core._parallel_probe(4 * threads, 0.02, wait)
        t.join()
        h_used, h_begin, h_end = held[0]
        if not (h_used > 1 and h_begin < called < h_end):
            continue
        if wait:
            assert used > 1, "it waited for the pool, then ran on its threads"
            assert begin >= h_end - 0.01, (begin, h_end)  # not before the holder's loop ended
        else:
            assert used == 1, "inline on this thread while the pool was busy"
            assert begin < h_end, (begin, h_end)
        return
    pytest.fail("the holding loop never held the pool while the probe was called")
