"""Synthetic checkpoints with real shapes and real HF naming, for tests,
benchmarks and ``hf2q demo``. Written with the ``safetensors`` package."""

# No ``from __future__ import annotations`` and no plain ``typing`` import:
# every name bound here shows in ``dir(hf2q.testing)``.
import typing as _typing

__all__ = ["make_dflash_checkpoint", "make_qwen35_moe_checkpoint", "make_gemma4_checkpoint"]

if _typing.TYPE_CHECKING:  # the lazily imported makers, typed for type checkers and IDEs
    from .dflash_checkpoint import make_dflash_checkpoint
    from .gemma4_checkpoint import make_gemma4_checkpoint
    from .qwen35_checkpoint import make_qwen35_moe_checkpoint
else:  # imported on first use: each pulls in its model module

    def __getattr__(name: str) -> _typing.Any:
        if name == "make_dflash_checkpoint":
            from .dflash_checkpoint import make_dflash_checkpoint

            return make_dflash_checkpoint
        if name == "make_qwen35_moe_checkpoint":
            from .qwen35_checkpoint import make_qwen35_moe_checkpoint

            return make_qwen35_moe_checkpoint
        if name == "make_gemma4_checkpoint":
            from .gemma4_checkpoint import make_gemma4_checkpoint

            return make_gemma4_checkpoint
        raise AttributeError(f"module 'hf2q.testing' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The makers (``__all__``) and the module's own dunder attributes."""
    return sorted(set(__all__) | {n for n in globals() if n.startswith("__") and n.endswith("__")})
