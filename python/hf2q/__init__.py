"""hf2q: HuggingFace safetensors checkpoints to inference-ready weights in device memory.

``import hf2q`` is kept cheap (users run one load per process): the native
core, the readers and the model loaders are imported on first use
(``hf2q.Device``, ``hf2q.dflash``, ...), not at import (PEP 562).
"""

# No ``from __future__ import annotations``, no plain ``import os``/``typing``:
# every name bound here shows in ``dir(hf2q)``, so helpers are imported under
# an underscore name and annotations naming lazy classes are strings.
import importlib as _importlib
import typing as _typing

from ._env import EnvVarWarning, check_environment
from ._version import __version__
from .errors import (
    ConfigError,
    DeviceError,
    DtypeMismatchError,
    ExtraTensorError,
    Hf2qError,
    ManifestError,
    MissingTensorError,
    NonFiniteError,
    ResidencyWarning,
    SafetensorsError,
    ScaleOverflowWarning,
    ShapeMismatchError,
    ShardError,
)

if _typing.TYPE_CHECKING:  # the lazily imported names, for type checkers and IDEs
    import os

    from . import _core, dflash, formats, gemma4, hub, models, ops, qwen35, reference, safetensors, testing
    from . import torch, transformers  # (imported at run time only when used: they import torch)
    from .device import Buffer, Device, FileReadError, Residency, VerifyReport, register_weight_buffer
    from .hub import HubError, HubNetworkError, RepoNotCachedError
    from . import export
    from .export import ConvertError, OutputExistsError, UnsupportedModelError, convert
    from .model import LoadedModel
    from .safetensors import open_checkpoint
    from .shard import Shard

check_environment()

#: attribute -> (module, attribute in it or None for the module itself)
_LAZY: dict[str, tuple[str, str | None]] = {
    "_core": ("hf2q._core", None),
    "formats": ("hf2q.formats", None),
    "models": ("hf2q.models", None),
    "ops": ("hf2q.ops", None),
    "reference": ("hf2q.reference", None),
    "dflash": ("hf2q.dflash", None),
    "gemma4": ("hf2q.gemma4", None),
    "qwen35": ("hf2q.qwen35", None),
    "safetensors": ("hf2q.safetensors", None),
    "hub": ("hf2q.hub", None),
    "testing": ("hf2q.testing", None),
    "torch": ("hf2q.torch", None),  # imports torch: only when used
    "transformers": ("hf2q.transformers", None),  # imports torch and transformers: only when used
    "Device": ("hf2q.device", "Device"),
    "Buffer": ("hf2q.device", "Buffer"),
    "Residency": ("hf2q.device", "Residency"),
    "VerifyReport": ("hf2q.device", "VerifyReport"),
    "FileReadError": ("hf2q.errors", "FileReadError"),
    "register_weight_buffer": ("hf2q.device", "register_weight_buffer"),
    "open_checkpoint": ("hf2q.safetensors", "open_checkpoint"),
    "HubError": ("hf2q.hub", "HubError"),
    "RepoNotCachedError": ("hf2q.hub", "RepoNotCachedError"),
    "HubNetworkError": ("hf2q.hub", "HubNetworkError"),
    "Shard": ("hf2q.shard", "Shard"),
    "export": ("hf2q.export", None),
    "convert": ("hf2q.export", "convert"),
    "ConvertError": ("hf2q.export", "ConvertError"),
    "OutputExistsError": ("hf2q.export", "OutputExistsError"),
    "UnsupportedModelError": ("hf2q.export", "UnsupportedModelError"),
}


if not _typing.TYPE_CHECKING:  # hidden from type checkers: a misspelt name (hf2q.lod) is an error, not Any

    def __getattr__(name: str) -> _typing.Any:
        target = _LAZY.get(name)
        if target is None:
            raise AttributeError(f"module 'hf2q' has no attribute {name!r}")
        module = _importlib.import_module(target[0])
        value = module if target[1] is None else getattr(module, target[1])
        globals()[name] = value  # later lookups skip __getattr__
        return value


def __dir__() -> list[str]:
    """The public API (``__all__``) and the module's own dunder attributes;
    not the helpers this module imports."""
    return sorted(set(__all__) | {n for n in globals() if n.startswith("__") and n.endswith("__")})


def load(path: "str | os.PathLike[str]", device: "Device | str | None" = None, *, family: str | None = None,
         progress: bool = True, revision: str | None = None, download: bool = False, check_finite: bool = False,
         shard: "Shard | None" = None, **options: object) -> "LoadedModel":
    """Load any checkpoint with the model family its ``config.json`` names
    (DFlash drafter, Qwen3.5/3.6 MoE, Gemma 4, else ``generic``: its own tensor names);
    ``family`` forces one. ``device``: an :class:`hf2q.Device`, a kind
    (``"cuda"``, ``"cuda:1"``, ``"host"``, ...) or None (:meth:`Device.default`);
    one not given as a Device is opened while the checkpoint is opened and
    planned. ``options`` go to the family's loader: ``dtype``
    (generic: ``keep``/``f32``/``bf16``/``f16``/``q8_0``/``q4_0``/``q4_k``/``q5_k``/``q6_k``), ``expert_dtype`` /
    ``dense_dtype`` (Qwen3.5 MoE, Gemma 4: the same formats but ``keep``) / ``mtp`` (Qwen3.5 MoE), ``recipe`` (Qwen3.5 MoE, Gemma 4,
    generic: ``q4_k_m`` / ``q4_k_s`` / ``q5_k_m`` / ``q6_k`` / ``q8_0``, each
    tensor's format as llama-quantize chooses it, docs/KQUANTS.md). ``path`` may be a Hugging Face
    repo id in the local cache (``revision``, ``download``: see
    :func:`hf2q.hub.resolve`). ``check_finite=True``: a NaN/Inf weight kept
    as it is raises NonFiniteError. ``shard`` (:class:`hf2q.Shard`): only
    this rank's slice of each tensor is read and loaded (docs/SHARDING.md).
    Returns the family's
    :class:`~hf2q.model.LoadedModel` subclass (``hf2q.dflash.DFlashModelTensors``,
    ``hf2q.qwen35.Qwen35Model``, ...). See :mod:`hf2q.models`."""
    from . import models

    model: LoadedModel = models.load(path, device, family=family, progress=progress, revision=revision,
                                     download=download, check_finite=check_finite, shard=shard, **options)
    return model


def get_num_threads() -> int:
    """Threads the native kernels use (the calling thread included)."""
    from . import _core

    return int(_core.get_num_threads())


def set_num_threads(n: int) -> None:
    """Set the threads the native kernels use; ``n >= 1``. The default is the
    number of CPUs this process may run on, or ``HF2Q_NUM_THREADS``."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"number of threads must be an int, got {type(n).__name__}")
    if not 1 <= n <= 1024:
        raise ValueError(f"number of threads must be in [1, 1024], got {n}")
    from . import _core

    _core.set_num_threads(n)


__all__ = [
    "__version__",
    "load",
    "formats",
    "models",
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
    "hub",
    "testing",
    "get_num_threads",
    "set_num_threads",
    "Hf2qError",
    "NonFiniteError",
    "ScaleOverflowWarning",
    "ResidencyWarning",
    "SafetensorsError",
    "ConfigError",
    "ManifestError",
    "MissingTensorError",
    "ExtraTensorError",
    "DtypeMismatchError",
    "ShapeMismatchError",
    "DeviceError",
    "export",
    "convert",
    "ConvertError",
    "OutputExistsError",
    "UnsupportedModelError",
    "HubError",
    "RepoNotCachedError",
    "HubNetworkError",
    "EnvVarWarning",
    "Shard",
    "ShardError",
]
