"""Shared helpers for the benchmarks: timing, peak RSS, table printing."""

from __future__ import annotations

import json
import resource
import sys
import time
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
