"""Helpers shared by the model loaders: progress, partial-load cleanup,
file-read errors mapped to SafetensorsError, load summaries."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from ..device import Device, FileReadError
from ..device import _detached as detached  # noqa: F401  (re-exported for the loaders)
from ..errors import SafetensorsError


def progress_bar(total_bytes: int, desc: str, enabled: bool) -> Any:
    """A tqdm byte counter on stderr, or a no-op object when disabled."""
    if enabled:
        try:
            from tqdm import tqdm

            return tqdm(total=total_bytes, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                        file=sys.stderr, leave=True, dynamic_ncols=True)
        except ImportError:  # pragma: no cover - tqdm is a dependency
            pass
    return _NoBar()


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass


def file_read_error(e: FileReadError, path: Any, tensor: str) -> SafetensorsError:
    """The native read error as a SafetensorsError naming file and tensor; its
    code (``FileTruncated`` / ``Io``) is the one the native reader set."""
    reason = getattr(e, "reason", str(e))
    code = getattr(e, "code", "Io")
    return SafetensorsError(f"{path}: tensor '{tensor}': {reason}", code=code, path=path, tensor=tensor)


@dataclass
class LoadSummary:
    """What a load did, for the CLI and benchmarks."""

    model: str
    device: str
    tensors: int
    resident_bytes: int
    data_bytes: int
    seconds: float
    residency: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def gb_per_s(self) -> float:
        return self.data_bytes / self.seconds / 1e9 if self.seconds > 0 else float("inf")

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "device": self.device,
            "tensors": self.tensors,
            "resident_bytes": self.resident_bytes,
            "data_bytes": self.data_bytes,
            "seconds": round(self.seconds, 4),
            "gb_per_s": round(self.gb_per_s, 3),
            "residency": self.residency,
            **self.extra,
        }


def residency_state(device: Device) -> dict[str, Any]:
    st = device.residency.stats()
    return {
        "enabled": bool(st["enabled"]),
        "buffers": int(st["count"]),
        "allocated_size": int(st["allocated_size"]),
        "locked_bytes": int(st["locked_bytes"]),
        "unwired_bytes": int(st["unwired_bytes"]),
        "sets": int(st["sets"]),
    }
