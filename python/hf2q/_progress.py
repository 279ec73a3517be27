"""Progress bars and byte counts as people read them.

One unit convention everywhere (CLI summary, ``hf2q demo``, progress bars):
decimal SI units, as the Hugging Face Hub and ``tqdm`` use them — ``kB`` =
1000 bytes, ``MB`` = 10**6, ``GB`` = 10**9, three significant figures; rates
in ``GB/s``. Exact counts are printed beside them with thousands separators.

Bars appear only on a terminal (stderr is a TTY), and never when
``HF_HUB_DISABLE_PROGRESS_BARS`` is true (``huggingface_hub``'s switch, read
with its rule: ``1``/``ON``/``YES``/``TRUE``, any case) or ``HF2Q_NO_PROGRESS=1``.
``tqdm`` is imported only when a bar is shown.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from ._env import env_flag

__all__ = ["format_bytes", "progress_enabled", "progress_bar"]

_UNITS = ("B", "kB", "MB", "GB", "TB", "PB")
_HF_TRUE = {"1", "ON", "YES", "TRUE"}


def format_bytes(n: float) -> str:
    """``859378176`` -> ``"859 MB"``; ``165632`` -> ``"166 kB"``; ``74`` ->
    ``"74 B"``: the digits ``tqdm`` prints for the same count."""
    n = float(n)
    if abs(n) < 999.5:
        return f"{n:.0f} B"
    for unit in _UNITS[1:]:
        n /= 1000.0
        if abs(n) < 999.5 or unit == _UNITS[-1]:
            if abs(n) < 9.995:
                return f"{n:.2f} {unit}"
            if abs(n) < 99.95:
                return f"{n:.1f} {unit}"
            return f"{n:.0f} {unit}"
    raise AssertionError("unreachable")  # pragma: no cover


def progress_enabled(requested: bool = True, stream: Any = None) -> bool:
    """Whether to draw a bar: asked for, on a terminal, not switched off."""
    if not requested:
        return False
    if os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "").strip().upper() in _HF_TRUE:
        return False
    if env_flag("HF2Q_NO_PROGRESS"):
        return False
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError):  # closed or replaced stream
        return False


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass


def progress_bar(total_bytes: int, desc: str, enabled: bool = True) -> Any:
    """A byte-counting ``tqdm`` bar on stderr when :func:`progress_enabled`,
    else a no-op object with the same ``update``/``close``."""
    if not progress_enabled(enabled):
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total_bytes, desc=desc, unit="B", unit_scale=True, unit_divisor=1000, file=sys.stderr,
                leave=False, dynamic_ncols=True,
                bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}B/{total_fmt}B [{elapsed}<{remaining}, {rate_fmt}]")
