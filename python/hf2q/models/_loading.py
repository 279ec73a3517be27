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
    #: What ``seconds`` was spent on, from ``getrusage`` over the load (all
    #: of the process's threads; None where unavailable): CPU time (user +
    #: kernel), the kernel's part of it, and page faults. The kernel's part
    #: is the file's pages copied in and every page of fresh memory zeroed
    #: (on some machines compacted) on first touch: most of a first load in a
    #: fresh process. Wall time beyond the CPU time was spent waiting: for
    #: the disk (a cold page cache) or for cores other processes held.
    cpu_seconds: float | None = None
    system_seconds: float | None = None
    page_faults: int | None = None

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
            **({} if self.cpu_seconds is None else {"cpu_seconds": round(self.cpu_seconds, 3),
                                                    "system_seconds": round(self.system_seconds or 0.0, 3),
                                                    "page_faults": self.page_faults}),
            "residency": self.residency,
            **self.extra,
        }


def process_usage() -> tuple[float, float, int] | None:
    """(CPU seconds, of them in the kernel, page faults) of this process so
    far, all threads (the native readers' included); None without
    ``resource`` (not POSIX)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Linux and macOS have it
        return None
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime, ru.ru_stime, ru.ru_minflt + ru.ru_majflt


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
