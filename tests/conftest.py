"""Suite-wide pytest hooks."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """One ``-ra`` summary line per skip reason and file: pytest folds equal
    skips by (file, line, reason), and a module-level ``skipif`` mark (the
    CUDA tests without a GPU) reports each test's own line, which gave one
    line per test (35 identical CUDA lines). The line number is dropped from
    skip reports; the file and the reason stay."""
    outcome = yield
    rep = outcome.get_result()
    if rep.skipped and isinstance(rep.longrepr, tuple) and len(rep.longrepr) == 3:
        path, _line, reason = rep.longrepr
        rep.longrepr = (path, None, reason)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files holding ``slow`` tests run first, the rest after them, each
    group in the usual order (tests keep their order inside a file).
    pytest-xdist (``--dist loadfile --no-loadscope-reorder`` in pyproject.toml)
    hands files out in this order to whichever worker is nearly done: the long
    files start at once and the short ones fill in at the end. xdist's own
    order (most tests first) started the wheel build, a 5-test file and the
    longest of all, last, with the other worker nearly done."""
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    if slow:
        items.sort(key=lambda item: item.path not in slow)  # stable: the order inside each group stays


# ``HF2Q_TEST_TIMES=FILE``: one JSON line per test appended to FILE (each
# xdist worker appends its own lines): the test id, its file, the worker, wall
# seconds and the CPU seconds it used in this process and in the child
# processes it waited for (setup, call and teardown together). For finding
# where the suite's time goes on a machine whose wall clock is noisy
# (README, "Tests"); nothing is written without the variable.
_TIMES = __import__("os").environ.get("HF2Q_TEST_TIMES")

if _TIMES:
    import json as _json
    import os as _os
    import time as _time

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        t0, c0 = _time.perf_counter(), _os.times()
        yield
        t1, c1 = _time.perf_counter(), _os.times()
        row = {
            "id": item.nodeid,
            "file": item.nodeid.split("::", 1)[0],
            "worker": _os.environ.get("PYTEST_XDIST_WORKER", "main"),
            "start": t0,
            "wall": t1 - t0,
            "cpu": (c1.user - c0.user) + (c1.system - c0.system),
            "children_cpu": (c1.children_user - c0.children_user) + (c1.children_system - c0.children_system),
        }
        with open(_TIMES, "a") as f:
            f.write(_json.dumps(row) + "\n")
