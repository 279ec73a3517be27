"""Loading a DFlash drafter (:func:`load`): alone, or bound to its target
(:mod:`hf2q.models.dflash.pairs`)."""

from __future__ import annotations

import os
from typing import Union

from ...device import Device, opened_meanwhile, resolve_device
from ...model import LoadedModel
from .config import DFlashConfig
from .manifest import DFlashWeights
from .model import DFlashModelTensors
from ...shard import Shard
from .pairs import bind

__all__ = ["load"]

PathLike = Union[str, "os.PathLike[str]"]


def load(path: PathLike, device: Device | str | None = None, progress: bool = True,
         config: DFlashConfig | None = None, *, target: LoadedModel | None = None, revision: str | None = None,
         download: bool = False, check_finite: bool = False, shard: Shard | None = None) -> DFlashModelTensors:
    """Validate a DFlash drafter checkpoint (file or directory with
    ``config.json``, or a Hugging Face repo id in the local cache: see
    :func:`hf2q.hub.resolve` for ``revision`` and ``download``) and make it
    resident on ``device`` (default: :meth:`hf2q.Device.default`).
    ``model.summary`` holds the load summary; ``progress`` draws a bar on a
    terminal only.

    ``target``: a loaded target model (Qwen3.5/3.6 MoE, Gemma 4) to bind the
    drafter to — checked first, then ``embed_tokens`` / ``lm_head`` are the
    target's own buffers (see :mod:`hf2q.pairs`).

    ``shard``: accepted for the same call on every rank; a drafter is
    replicated (every rank loads it whole, docs/SHARDING.md)."""
    from ...hub import resolve

    if shard is not None and not isinstance(shard, Shard):
        raise TypeError(f"shard must be an hf2q.Shard, got {type(shard).__name__}")
    path = resolve(path, revision, download=download, api="hf2q.dflash.load")
    if target is not None:
        return bind(path, target, device, progress=progress, config=config, check_finite=check_finite)
    # None or a kind: the device opened while the drafter's files are opened and checked
    with opened_meanwhile(device) as dev, DFlashWeights.load(path, config) as weights:
        return DFlashModelTensors.upload(resolve_device(dev), weights.config, weights, progress=progress,
                                         check_finite=check_finite)
