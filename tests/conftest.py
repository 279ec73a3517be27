"""Suite-wide pytest hooks."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Skips fold by reason: pytest folds equal skips by (file, line,
    reason), and a module-level ``skipif`` mark (the CUDA tests without a
    GPU) reports each test's own line, which gave one line per test (35
    identical CUDA lines). The line number is dropped from skip reports; the
    file and the reason stay (:func:`pytest_terminal_summary` then folds
    files that share a reason)."""
    outcome = yield
    rep = outcome.get_result()
    if rep.skipped and isinstance(rep.longrepr, tuple) and len(rep.longrepr) == 3:
        path, _line, reason = rep.longrepr
        rep.longrepr = (path, None, reason)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """One ``-ra`` summary line per skip reason, across files: pytest folds
    skips by (file, reason), so the CUDA reason of three files printed three
    times. Runs before pytest's short summary (its own hook wraps the
    others'): skips that share a reason get one path naming every file that
    has them (``tests/test_cuda.py, test_fp8_cuda.py, test_kquants_cuda.py``),
    so pytest folds them into one line with the total count."""
    import os

    skipped = terminalreporter.stats.get("skipped", [])
    files: dict[str, set[str]] = {}
    for rep in skipped:
        if isinstance(rep.longrepr, tuple) and len(rep.longrepr) == 3 and rep.longrepr[1] is None:
            files.setdefault(rep.longrepr[2], set()).add(os.path.abspath(str(rep.longrepr[0])))
    joined: dict[str, str] = {}
    for reason, paths in files.items():
        if len(paths) > 1:
            ordered = sorted(paths)
            base = os.path.dirname(os.path.commonpath(ordered)) if len(set(map(os.path.dirname, ordered))) > 1 \
                else os.path.dirname(ordered[0])
            names = [os.path.relpath(p, base) for p in ordered]
            shown = names if len(names) <= 5 else [*names[:4], f"{len(names) - 4} more files"]
            joined[reason] = os.path.join(base, ", ".join(shown))
    for rep in skipped:
        if isinstance(rep.longrepr, tuple) and len(rep.longrepr) == 3 and rep.longrepr[2] in joined:
            rep.longrepr = (joined[rep.longrepr[2]], rep.longrepr[1], rep.longrepr[2])


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
