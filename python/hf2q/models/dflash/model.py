"""A DFlash drafter resident on a device: the family's view of the one model
container (``drafter.fc``, ``drafter.layers[i].q_proj``, ...), filled by the
one loader from :func:`~hf2q.models.dflash.plan.plan_dflash`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...device import Buffer, Device
from ...errors import ConfigError
from ...loader import execute
from ...model import DTypeInvariantError, LoadedModel, check_layout
from .config import DFlashConfig
from .manifest import DFlashWeights, expected_manifest
from .plan import plan_dflash

__all__ = ["DFlashLayerTensors", "DFlashModelTensors", "DTypeInvariantError"]

#: Python field -> per-layer checkpoint name (after ``layers.{i}.``).
_LAYER_FIELDS: dict[str, str] = {
    "q_proj": "self_attn.q_proj.weight",
    "k_proj": "self_attn.k_proj.weight",
    "v_proj": "self_attn.v_proj.weight",
    "o_proj": "self_attn.o_proj.weight",
    "q_norm": "self_attn.q_norm.weight",
    "k_norm": "self_attn.k_norm.weight",
    "input_layernorm": "input_layernorm.weight",
    "post_attention_layernorm": "post_attention_layernorm.weight",
    "mlp_gate": "mlp.gate_proj.weight",
    "mlp_up": "mlp.up_proj.weight",
    "mlp_down": "mlp.down_proj.weight",
}


@dataclass
class DFlashLayerTensors:
    """One decoder layer's device buffers: projections BF16, norms F32."""

    q_proj: Buffer
    k_proj: Buffer
    v_proj: Buffer
    o_proj: Buffer
    q_norm: Buffer
    k_norm: Buffer
    input_layernorm: Buffer
    post_attention_layernorm: Buffer
    mlp_gate: Buffer
    mlp_up: Buffer
    mlp_down: Buffer

    def buffers(self) -> dict[str, Buffer]:
        return {f: getattr(self, f) for f in _LAYER_FIELDS}


class DFlashModelTensors(LoadedModel):
    """A DFlash drafter resident on a device: ``fc`` and the projections are
    raw BF16 copies of the file's bytes, the six RMSNorm kinds are F32."""

    family = "dflash"
    #: Bound to a target (:mod:`hf2q.pairs`): the target's embedding and LM
    #: head buffers, the target and the pair; None for a drafter loaded alone.
    embed_tokens: Buffer | None = None
    lm_head: Buffer | None = None
    target: LoadedModel | None = None
    pair: Any = None

    def __init__(self, device: Device, config: DFlashConfig, fc: Buffer, hidden_norm: Buffer,
                 final_norm: Buffer, layers: list[DFlashLayerTensors]) -> None:
        super().__init__(device, config, {})
        self.fc = fc
        self.hidden_norm = hidden_norm
        self.final_norm = final_norm
        self.layers = layers
        self.check_dtypes()

    @classmethod
    def from_buffers(cls, device: Device, cfg: DFlashConfig, bufs: dict[str, Buffer]) -> DFlashModelTensors:
        layers = [DFlashLayerTensors(**{f: bufs[f"layers.{i}.{n}"] for f, n in _LAYER_FIELDS.items()})
                  for i in range(cfg.num_hidden_layers)]
        return cls(device, cfg, bufs["fc.weight"], bufs["hidden_norm.weight"], bufs["norm.weight"], layers)

    # ------------------------------------------------------------------ build
    @classmethod
    def upload(cls, device: Device, cfg: DFlashConfig, weights: DFlashWeights, *,
               progress: bool = False, check_finite: bool = False) -> DFlashModelTensors:
        """Make ``weights`` resident on ``device``: one buffer per tensor,
        ``pread`` straight into it (BF16) or decoded into it (norms -> F32).
        ``check_finite=True``: a NaN/Inf weight raises
        :class:`~hf2q.NonFiniteError` naming the tensor, found during the
        read; off by default, the bytes are the file's (docs/RELIABILITY.md,
        "Non-finite weights").
        On any failure (including KeyboardInterrupt) every buffer allocated so
        far is freed before the exception propagates."""
        if weights.config != cfg:
            raise ConfigError("weights were validated against a different config")
        plan = plan_dflash(weights)
        return execute(plan, weights.checkpoint, device, lambda bufs: cls.from_buffers(device, cfg, bufs),
                       progress=progress, check_finite=check_finite, extra=plan.extra)

    # ------------------------------------------------------------------ access
    def buffers_by_name(self) -> dict[str, Buffer]:
        """Every buffer under its checkpoint name, in manifest order (read
        from the fields, so a reassigned field is what the checks see)."""
        out: dict[str, Buffer] = {"fc.weight": self.fc, "hidden_norm.weight": self.hidden_norm}
        for i, layer in enumerate(self.layers):
            for f, n in sorted(_LAYER_FIELDS.items(), key=lambda kv: kv[1]):
                out[f"layers.{i}.{n}"] = getattr(layer, f)
        out["norm.weight"] = self.final_norm
        return out

    # ------------------------------------------------------------------ checks
    def check_dtypes(self) -> None:
        """Always-on invariant: BF16 for fc and the seven projections, F32 for
        the six norm kinds. Raises :class:`~hf2q.model.DTypeInvariantError`."""
        layout = {e.name: (e.device_dtype, tuple(e.shape)) for e in expected_manifest(self.config)}
        check_layout(self.buffers_by_name(), layout, "DFlash device buffers break the dtype invariant")

    def __repr__(self) -> str:
        return (f"<hf2q.dflash.DFlashModelTensors L={self.config.num_hidden_layers} H={self.config.hidden_size} "
                f"{self.gpu_resident_bytes():,} resident bytes on {self.device.kind}>")

