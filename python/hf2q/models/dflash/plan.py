"""The DFlash drafter's tensor plan: one streamed entry per manifest tensor,
a raw BF16 copy or a BF16 -> F32 decode (the norms), grouped by layer."""

from __future__ import annotations

from ... import formats
from ...plan import LoadPlan, Piece, TensorPlan
from .manifest import DFlashWeights

__all__ = ["plan_dflash"]


def _layer(name: str) -> int | None:
    return int(name.split(".")[1]) if name.startswith("layers.") else None


def plan_dflash(weights: DFlashWeights) -> LoadPlan:
    """The :class:`~hf2q.plan.LoadPlan` of a validated drafter, in manifest order."""
    entries = []
    for t in weights:
        e = t.entry
        src = formats.from_safetensors(e.disk_dtype).name
        entries.append(TensorPlan(e.name, tuple(e.shape), e.device_dtype, (Piece(e.name, src, tuple(e.shape)),),
                                  group=_layer(e.name), kind="norm" if e.is_norm else "weight"))
    cfg = weights.config
    return LoadPlan("dflash", entries, cfg, extra={"layers": cfg.num_hidden_layers, "hidden_size": cfg.hidden_size})
