"""DFlash drafters (docs/DFLASH.md): config (:mod:`.config`), manifest and
weight validation (:mod:`.manifest`), the tensor plan (:mod:`.plan`) and the
device view (:mod:`.model`). ``hf2q.dflash`` re-exports this package."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...device import Buffer, Device
from ...errors import ConfigError
from ...plan import LoadPlan
from ...safetensors import Checkpoint
from ..base import ModelFamily
from . import config as _config, manifest as _manifest, model as _model, plan as _plan
from .config import *  # noqa: F403
from .manifest import *  # noqa: F403
from .model import *  # noqa: F403
from .plan import plan_dflash
from .load import load
from .config import DFlashConfig
from .manifest import DFlashWeights
from .model import DFlashModelTensors

__all__ = [*_config.__all__, *_manifest.__all__, *_model.__all__, *_plan.__all__, "load", "DFlashFamily",
           "FAMILY"]

# ============================================================================ family interface
# (hf2q.models.FAMILIES: how the registry recognises, plans, loads and inspects a drafter)

def _config_of(ckpt: Checkpoint, config: Mapping[str, Any] | None) -> DFlashConfig:
    if config is None:
        return DFlashConfig.from_file(ckpt.directory / "config.json")
    try:
        return DFlashConfig.from_dict(config)
    except ConfigError as e:
        raise ConfigError(f"{ckpt.directory / 'config.json'}: {e}", key=e.key, rule=e.rule) from None


class DFlashFamily(ModelFamily):
    name = "dflash"
    description = "DFlash block-diffusion drafters"
    label = "DFlash drafters"
    options = ()

    def recognises(self, config: Mapping[str, Any] | None) -> bool:
        """A drafter's ``config.json``: ``DFlashDraftModel`` or a ``dflash_config``."""
        if config is None:
            return False
        archs = config.get("architectures") or []
        archs = [archs] if isinstance(archs, str) else (archs if isinstance(archs, list) else [])
        return "DFlashDraftModel" in archs or "dflash_config" in config

    def parse_config(self, ckpt: Checkpoint, config: Mapping[str, Any] | None) -> DFlashConfig:
        return _config_of(ckpt, config)

    def plan(self, ckpt: Checkpoint, config: Any, **options: Any) -> LoadPlan:
        """The drafter's plan; a drafter takes no option (one given is a
        TypeError naming it), and ``config`` is its :class:`DFlashConfig`."""
        self.check_options(options)
        if not isinstance(config, DFlashConfig):
            raise TypeError(f"dflash: plan() needs a DFlashConfig (the family's parse_config), got "
                            f"{type(config).__name__}")
        # The manifest check (names, dtypes, shapes against the config) first.
        return plan_dflash(DFlashWeights.load(ckpt, config))

    def model(self, device: Device, plan: LoadPlan, buffers: dict[str, Buffer]) -> DFlashModelTensors:
        return DFlashModelTensors.from_buffers(device, plan.config, buffers)

    def shard_rule(self, entry: Any, mode: str, experts: dict[str, int]) -> None:
        """A drafter is small (a few layers) and its view checks the whole
        manifest's shapes: every rank loads it whole (docs/SHARDING.md)."""
        return None


FAMILY = DFlashFamily()
# The family's methods under their module names (the registry uses FAMILY).
NAME = FAMILY.name
OPTIONS = FAMILY.option_names
recognises = FAMILY.recognises
load_checkpoint = FAMILY.load_checkpoint
inspect_checkpoint = FAMILY.inspect_checkpoint
