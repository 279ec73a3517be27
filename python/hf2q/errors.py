"""The exception hierarchy. Every error hf2q raises on bad input is an
:class:`Hf2qError`; the subclasses say which stage refused it."""

from __future__ import annotations

__all__ = [
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


class Hf2qError(Exception):
    """Base class of every hf2q error."""


class NonFiniteError(Hf2qError, ValueError):
    """A NaN or +-Inf element in data that was to be quantized.

    ``index`` is the smallest flat (row-major) element index, ``multi_index`` the
    same position in the input's shape, ``value_class`` one of ``"nan"``,
    ``"+inf"``, ``"-inf"`` and ``tensor`` the tensor's name when known.
    """

    def __init__(
        self,
        message: str,
        *,
        index: int,
        multi_index: tuple[int, ...] | None = None,
        value_class: str = "nan",
        tensor: str | None = None,
    ) -> None:
        super().__init__(message)
        self.index = index
        self.multi_index = multi_index
        self.value_class = value_class
        self.tensor = tensor


class ScaleOverflowWarning(UserWarning):
    """A Q8_0 block scale overflowed float16 (amax >= 8,321,040): it is stored
    as +Inf, exactly as ggml's reference quantizer does, and dequantizes to
    +-Inf/NaN."""


class SafetensorsError(Hf2qError):
    """A safetensors file or checkpoint broke a rule of the format."""


class ConfigError(Hf2qError, ValueError):
    """A model config.json is missing a field or is inconsistent."""


class ManifestError(Hf2qError):
    """A checkpoint's tensors do not match the model's expected manifest."""


class ExtraTensorError(ManifestError):
    """The checkpoint holds tensors the manifest does not name."""


class MissingTensorError(ManifestError):
    """The manifest names tensors the checkpoint does not hold."""


class DtypeMismatchError(ManifestError):
    """A tensor's on-disk dtype is not the expected one."""


class ShapeMismatchError(ManifestError):
    """A tensor's shape is not the expected one."""


class DeviceError(Hf2qError):
    """A device could not be opened, or memory could not be allocated or made resident."""
