"""Helpers shared by the model loaders: progress, partial-load cleanup,
file-read errors mapped to SafetensorsError, load summaries."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..device import Buffer, Device, FileReadError
from ..device import _detached as detached  # noqa: F401  (re-exported for the loaders)
from ..errors import SafetensorsError
from .._progress import progress_bar  # noqa: F401  (re-exported for the loaders)


def file_read_error(e: FileReadError, path: Any, tensor: str) -> SafetensorsError:
    """The native read error as a SafetensorsError naming file and tensor; its
    code (``FileTruncated`` / ``Io``) is the one the native reader set."""
    reason = getattr(e, "reason", str(e))
    code = getattr(e, "code", "Io")
    return SafetensorsError(f"{path}: tensor '{tensor}': {reason}", code=code, path=path, tensor=tensor)


def gguf_names_by_source(pairs: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """Checkpoint tensor -> the GGUF tensors it feeds, in plan order, from
    ``(checkpoint name, GGUF name)`` pairs (``hf2q inspect``'s listing; a
    fused ``gate_up_proj`` feeds two: its gate and up halves)."""
    out: dict[str, list[str]] = {}
    for src, gguf in pairs:
        names = out.setdefault(src, [])
        if gguf not in names:
            names.append(gguf)
    return out


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
            "seconds": round(self.seconds, 3),
            "gb_per_s": round(self.gb_per_s, 2),
            "residency": self.residency,
            **self.extra,
        }


def residency_state(device: Device, buffers: Iterable[Buffer]) -> dict[str, Any]:
    """Residency of one model's ``buffers`` (not of everything else on the
    device): how many are in a residency set, their page-rounded bytes, how
    many of those bytes are locked, and bytes left out over the wired budget."""
    enabled = bool(device.residency_enabled)
    count = allocated = locked = unwired = 0
    for b in buffers:
        if b.registered:
            count += 1
            allocated += b.alloc_len
            if b.locked:
                locked += b.alloc_len
        elif enabled:
            unwired += b.alloc_len
    return {
        "enabled": enabled,
        "buffers": count,
        "allocated_bytes": allocated,
        "locked_bytes": locked,
        "unwired_bytes": unwired,
    }
