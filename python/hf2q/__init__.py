"""hf2q: HuggingFace safetensors checkpoints to inference-ready weights in device memory."""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version as _pkg_version

from . import _core, formats, ops, reference
from .device import Buffer, Device, FileReadError, Residency, VerifyReport, register_weight_buffer
from .safetensors import open_checkpoint
from . import dflash, gemma4, qwen35, safetensors  # noqa: E402  (model loaders: hf2q.dflash.load, hf2q.qwen35.load, ...)
from .errors import (
    ConfigError,
    DeviceError,
    DtypeMismatchError,
    ExtraTensorError,
    Hf2qError,
    ManifestError,
    MissingTensorError,
    NonFiniteError,
    SafetensorsError,
    ScaleOverflowWarning,
    ShapeMismatchError,
)

try:
    __version__ = _pkg_version("hf2q")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+unknown"


def load(path: "str | os.PathLike[str]", device: Device | None = None, *, family: str | None = None,
         progress: bool = True, **options: object) -> object:
    """Load any checkpoint with the model family its ``config.json`` names
    (DFlash drafter, Qwen3.5/3.6 MoE, else ``generic``: its own tensor names);
    ``family`` forces one. ``options`` go to the family's loader: ``dtype``
    (generic: ``keep``/``f32``/``bf16``/``q8_0``), ``expert_dtype`` /
    ``dense_dtype`` / ``mtp`` (Qwen3.5 MoE). See :mod:`hf2q.models`."""
    from . import models

    return models.load(path, device, family=family, progress=progress, **options)


def get_num_threads() -> int:
    """Threads the native kernels use (the calling thread included)."""
    return int(_core.get_num_threads())


def set_num_threads(n: int) -> None:
    """Set the threads the native kernels use; ``n >= 1``. The default is the
    number of CPUs this process may run on, or ``HF2Q_NUM_THREADS``."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"number of threads must be an int, got {type(n).__name__}")
    if not 1 <= n <= 1024:
        raise ValueError(f"number of threads must be in [1, 1024], got {n}")
    _core.set_num_threads(n)


__all__ = [
    "__version__",
    "load",
    "formats",
    "ops",
    "reference",
    "Device",
    "Buffer",
    "Residency",
    "VerifyReport",
    "FileReadError",
    "register_weight_buffer",
    "open_checkpoint",
    "dflash",
    "gemma4",
    "qwen35",
    "safetensors",
    "get_num_threads",
    "set_num_threads",
    "Hf2qError",
    "NonFiniteError",
    "ScaleOverflowWarning",
    "SafetensorsError",
    "ConfigError",
    "ManifestError",
    "MissingTensorError",
    "ExtraTensorError",
    "DtypeMismatchError",
    "ShapeMismatchError",
    "DeviceError",
]
