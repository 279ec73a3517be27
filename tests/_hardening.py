"""Helpers for the hardening tests: every scenario that could hang or abort
runs in a child interpreter under a wall-clock limit, so a regression fails
the test instead of hanging the suite."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap

import pytest

from _helpers import hung_in_sanitizer_runtime, wait_child

UNDER_SANITIZER = os.environ.get("HF2Q_UNDER_SANITIZER") == "1"


def run_python(code: str, *, timeout: float = 60.0, env: dict[str, str] | None = None,
               args: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter; a timeout fails the calling test."""
    full_env = dict(os.environ)
    full_env.setdefault("PYTHONFAULTHANDLER", "1")
    if env:
        full_env.update(env)
    try:
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code), *(args or [])],
            capture_output=True, text=True, timeout=timeout, env=full_env,
        )
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        pytest.fail(f"child interpreter hung (> {timeout} s)\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}")


# Python source the fork scenarios share: fork, wait for the child with a
# deadline (kill it and report a hang past the deadline: _helpers.wait_child,
# its source), return its status. A child that hung on the sanitizer
# runtime's own lock (wait_child: that runtime is not fork-safe) is forked
# once more; any other hang, or a second such one, is the scenario's failure.
FORK_HELPERS = inspect.getsource(hung_in_sanitizer_runtime) + inspect.getsource(wait_child) + r'''
import os, sys, time

try:  # resolved here, not in a child (whose allocations may be what hangs)
    import ctypes
    _prctl = ctypes.CDLL(None).prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None

def allow_any_tracer():
    # Yama (ptrace_scope 1) lets only ancestors trace: wait_child's gdb is the child's sibling
    if _prctl is not None:
        _prctl(0x59616D61, ctypes.c_ulong(-1), 0, 0, 0)  # PR_SET_PTRACER, PR_SET_PTRACER_ANY

def fork_and_wait(child_fn, deadline=10.0):
    for attempt in (1, 2):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                allow_any_tracer()
                code = 0 if child_fn() else 3
            except BaseException as e:
                try:
                    sys.stderr.write(f"child error: {type(e).__name__}: {e}\n")
                finally:
                    code = 4
            os._exit(code)
        status = wait_child(pid, time.monotonic() + deadline)
        if status != "hang in the sanitizer runtime":
            return status
        sys.stderr.write("the child hung in the sanitizer runtime's lock (not fork-safe): forked again\n")
    return status
'''
