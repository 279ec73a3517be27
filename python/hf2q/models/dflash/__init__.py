"""DFlash drafters (docs/DFLASH.md): config (:mod:`.config`), manifest and
weight validation (:mod:`.manifest`), the tensor plan (:mod:`.plan`) and the
device view (:mod:`.model`). ``hf2q.dflash`` re-exports this package."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...device import Device
from ...errors import ConfigError
from ...safetensors import Checkpoint
from . import config as _config, manifest as _manifest, model as _model, plan as _plan
from .config import *  # noqa: F403
from .manifest import *  # noqa: F403
from .model import *  # noqa: F403
from .plan import plan_dflash
from .config import DFlashConfig
from .manifest import DFlashWeights
from .model import DFlashModelTensors

__all__ = [*_config.__all__, *_manifest.__all__, *_model.__all__, *_plan.__all__]

# ============================================================================ family interface
# (hf2q.models.FAMILIES: how the registry recognises, loads and inspects a drafter)

NAME = "dflash"
OPTIONS: tuple[str, ...] = ()


def recognises(config: Mapping[str, Any] | None) -> bool:
    """A drafter's ``config.json``: ``DFlashDraftModel`` or a ``dflash_config``."""
    if config is None:
        return False
    archs = config.get("architectures") or []
    archs = [archs] if isinstance(archs, str) else (archs if isinstance(archs, list) else [])
    return "DFlashDraftModel" in archs or "dflash_config" in config


def _config_of(ckpt: Checkpoint, config: Mapping[str, Any] | None) -> DFlashConfig:
    if config is None:
        return DFlashConfig.from_file(ckpt.directory / "config.json")
    try:
        return DFlashConfig.from_dict(config)
    except ConfigError as e:
        raise ConfigError(f"{ckpt.directory / 'config.json'}: {e}", key=e.key, rule=e.rule) from None


def load_checkpoint(ckpt: Checkpoint, device: Device, *, config: Mapping[str, Any] | None,
                    progress: bool, check_finite: bool = False) -> DFlashModelTensors:
    weights = DFlashWeights.load(ckpt, _config_of(ckpt, config))
    return DFlashModelTensors.upload(device, weights.config, weights, progress=progress, check_finite=check_finite)


def inspect_checkpoint(ckpt: Checkpoint, *, config: Mapping[str, Any] | None) -> dict[str, Any]:
    weights = DFlashWeights.load(ckpt, _config_of(ckpt, config))
    return {"gpu_resident_bytes": weights.gpu_resident_bytes(),
            "device_dtypes": {t.entry.name: t.entry.device_dtype for t in weights}}

