"""Shared helpers for the benchmarks: timing, peak RSS, table printing."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable


def best_of(fn: Callable[[], Any], repeat: int = 3, warmup: int = 1) -> float:
    """Best wall time of `repeat` runs after `warmup` runs, in seconds."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r if sys.platform == "darwin" else r * 1024)


def print_table(title: str, rows: list[dict[str, Any]], columns: list[str]) -> None:
    print(f"\n{title}")
    widths = [max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).ljust(w) for c, w in zip(columns, widths)))


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if v < 100 else f"{v:.1f}"
    return str(v)


def dump_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2))


def warm_page_cache(f: "Path") -> float:
    """Read ``f`` once (16 MiB at a time) so that timed loads hit the page
    cache; returns the seconds it took."""
    t0 = time.perf_counter()
    mv = memoryview(bytearray(16 << 20))
    with open(f, "rb", buffering=0) as fh:
        while fh.readinto(mv):
            pass
    return time.perf_counter() - t0


# Python source for child processes that report their own peak RSS.
CHILD_HWM = """
def hwm():
    try:
        with open("/proc/self/status") as f:
            return int(next(l for l in f if l.startswith("VmHWM:")).split()[1]) * 1024
    except (OSError, StopIteration):
        return None
"""
CHILD_BASELINE = CHILD_HWM + """
import json, resource, sys
import numpy, hf2q
k = 1 if sys.platform == "darwin" else 1024
print(json.dumps({"maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * k, "vmhwm": hwm()}))
"""


def subprocess_json(code: str, *args: str) -> dict:
    """``python -c code args`` through a small shell, last output line parsed
    as JSON. ``sh -c '...; :'``: a child spawned straight from this process
    starts with this process's RSS (fork) or peak RSS (vfork, kept across
    exec) as its ru_maxrss; a grandchild forked from the small shell does not."""
    if os.name == "posix" and Path("/bin/sh").exists():
        argv = ["/bin/sh", "-c", 'c="$1"; shift; "$0" -c "$c" "$@"; :', sys.executable, code, *args]
    else:  # pragma: no cover
        argv = [sys.executable, "-c", code, *args]
    out = subprocess.run(argv, check=True, capture_output=True, text=True)
    lines = out.stdout.strip().splitlines()
    if not lines:  # the shell's ':' hides the child's status: its stderr says what went wrong
        raise RuntimeError(f"the child process printed no result; its stderr ends:\n{out.stderr[-4000:]}")
    return json.loads(lines[-1])
