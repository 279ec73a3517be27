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
