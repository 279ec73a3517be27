"""The generic family's config: what ``config.json`` says about a checkpoint
whose architecture hf2q has no family for (names only; nothing is needed)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...plan import CONVERT_DTYPES
from .._quant import QuantScheme, quant_scheme

__all__ = ["GenericConfig", "DTYPE_POLICIES"]

#: ``--dtype`` policies: keep every tensor's dtype, or convert floats to f32 /
#: bf16 / f16 / q8_0 (and the k-quants) the way llama.cpp's
#: ``convert_hf_to_gguf.py --outtype`` would (f16: its ``--outtype f16``, the
#: tensors bf16 would make BF16 made F16, rounded to nearest even from float32).
DTYPE_POLICIES = ("keep", *CONVERT_DTYPES)


def _strings(v: Any) -> tuple[str, ...]:
    if isinstance(v, str):
        return (v,)
    if isinstance(v, list):
        return tuple(x for x in v if isinstance(x, str))
    return ()


@dataclass(frozen=True)
class GenericConfig:
    """``architectures`` and ``model_type`` of ``config.json`` (empty / None
    without one), for summaries; the tensors come from the checkpoint."""

    architectures: tuple[str, ...] = ()
    model_type: str | None = None
    has_config: bool = False
    #: ``quantization_config`` (docs/FP8.md); None: the checkpoint states none.
    quantization: QuantScheme | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None, source: str | None = None) -> GenericConfig:
        """Raises :class:`~hf2q.ConfigError` for a ``quantization_config``
        hf2q does not support (docs/FP8.md), led by ``source`` (the config
        file) where given."""
        if d is None:
            return cls()
        mt = d.get("model_type")
        return cls(_strings(d.get("architectures")), mt if isinstance(mt, str) else None, True,
                   quant_scheme(d, source))

    @property
    def label(self) -> str:
        """A name for summaries: the first architecture, else the model type, else "safetensors"."""
        if self.architectures:
            return self.architectures[0]
        return self.model_type or "safetensors"
