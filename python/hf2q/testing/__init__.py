"""Synthetic checkpoints with real shapes and real HF naming, for tests,
benchmarks and ``hf2q demo``. Written with the ``safetensors`` package."""

from __future__ import annotations

from typing import Any

__all__ = ["make_dflash_checkpoint", "make_qwen35_moe_checkpoint", "make_gemma4_checkpoint"]


def __getattr__(name: str) -> Any:  # imported lazily: each pulls in its model module
    if name == "make_dflash_checkpoint":
        from .dflash_checkpoint import make_dflash_checkpoint

        return make_dflash_checkpoint
    if name == "make_qwen35_moe_checkpoint":
        from .qwen35_checkpoint import make_qwen35_moe_checkpoint

        return make_qwen35_moe_checkpoint
    if name == "make_gemma4_checkpoint":
        from .gemma4_checkpoint import make_gemma4_checkpoint

        return make_gemma4_checkpoint
    raise AttributeError(name)
