"""The generic family: any safetensors checkpoint without a family of its
own loads with its own tensor names, each tensor kept in its dtype or
converted by ``dtype`` (``keep`` | ``f32`` | ``bf16`` | ``f16`` | ``q8_0`` | a k-quant; see
:mod:`hf2q.models.generic.plan`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union

from ...device import Buffer, Device, check_device_arg
from ...model import LoadedModel, check_layout
from ...plan import LoadPlan
from ...safetensors import Checkpoint
from ...shard import Shard
from ..base import RECIPE, ModelFamily, Option
from .config import DTYPE_POLICIES, GenericConfig
from .plan import device_dtype, plan_generic

__all__ = ["GenericConfig", "GenericModel", "DTYPE_POLICIES", "plan_generic", "device_dtype", "load",
           "recognises", "NAME", "OPTIONS", "GenericFamily", "FAMILY"]

PathLike = Union[str, "os.PathLike[str]"]


class GenericModel(LoadedModel):
    """A checkpoint's tensors on a device under their own names."""

    family = "generic"

    def __init__(self, device: Device, config: GenericConfig, plan: Any, buffers: dict) -> None:
        super().__init__(device, config, buffers)
        self.plan = plan
        check_layout(buffers, plan.layout(), "generic device buffers break the planned layout")


class GenericFamily(ModelFamily):
    name = "generic"
    description = "any safetensors checkpoint, its own tensor names"
    label = "generic checkpoints (no known architecture)"
    options = (Option("dtype", DTYPE_POLICIES, "keep",
                      "keep each tensor's dtype, or convert floats as llama.cpp's --outtype would (bf16, f16, "
                      "q8_0: 2-D '.weight' matrices, norms and vectors stay f32; q8_0 rows not whole 32-blocks "
                      "fall back to f16)"), RECIPE)

    def recognises(self, config: Mapping[str, Any] | None) -> bool:
        """Every checkpoint: the registry asks the generic family last."""
        return True

    def parse_config(self, ckpt: Checkpoint, config: Mapping[str, Any] | None) -> GenericConfig:
        # The registry hands over what it read (None: the checkpoint has no config.json).
        return GenericConfig.from_dict(config, str(ckpt.directory / "config.json"))

    def plan(self, ckpt: Checkpoint, config: GenericConfig, *, dtype: str = "keep",
             recipe: str | None = None) -> LoadPlan:
        if recipe is None:
            return plan_generic(ckpt, config, dtype=dtype)
        from ...errors import ConfigError
        from ...recipes import apply_recipe, generic_facts
        from .names import known_gguf_name, llama_gguf_name

        # llama-like checkpoints: the converter's --outtype bf16 types, decided by their GGUF names.
        plan = plan_generic(ckpt, config, dtype="bf16")
        names = {e.name: llama_gguf_name(e.name) for e in plan}
        # A matrix llama.cpp has no name for would get a type by a guess (a router quantized,
        # fused experts left BF16): refused, naming it. Vectors stay as they are under every recipe.
        unnamed = sorted(e.name for e in plan if len(e.shape) >= 2 and known_gguf_name(e.name) is None)
        if unnamed:
            shown = ", ".join(unnamed[:5]) + (f" and {len(unnamed) - 5} more" if len(unnamed) > 5 else "")
            raise ConfigError(f"{ckpt.location}: recipe {recipe!r} decides each tensor's type by its llama.cpp "
                              f"name, and {len(unnamed)} tensor(s) have none in the generic family's llama-like "
                              f"map (models/generic/names.py): {shown}", key="recipe")
        return apply_recipe(plan, recipe, generic_facts(names, plan, config.model_type), names)

    def model(self, device: Device, plan: LoadPlan, buffers: dict[str, Buffer]) -> GenericModel:
        return GenericModel(device, plan.config, plan, buffers)

    def inspect_checkpoint(self, ckpt: Checkpoint, *, config: Mapping[str, Any] | None,
                           **options: Any) -> dict[str, Any]:
        """Device dtypes and bytes under ``dtype``; tensors no device format can
        hold, or whose shape no buffer can (``[0, 2^64-1]``: the loader's
        :func:`~hf2q.loader.loadable_shape`), are listed in ``unloadable``
        with no device dtype (a load would refuse them, a plan too)."""
        from ... import formats
        from ...loader import loadable_shape
        from .._quant import mxfp4_logical, scale_layouts
        from .plan import fp8_sources

        if self.with_defaults(options)["recipe"] is not None:
            return super().inspect_checkpoint(ckpt, config=config, **options)
        dtype = self.with_defaults(options)["dtype"]
        cfg = self.parse_config(ckpt, config)
        scaled = fp8_sources(ckpt, cfg, dtype)  # typed errors for bad FP8 checkpoints, as a load
        out: dict[str, str | None] = {}
        not_loaded: set[str] = set()
        mxfp4 = scaled.scheme is not None and scaled.scheme.method == "mxfp4"
        for name in ckpt.keys():
            info = ckpt[name]
            if (mxfp4 and name in scaled.consumed) or (dtype != "keep" and (name in scaled.consumed
                                                                            or name in scaled.dropped)):
                out[name] = None  # a scale, applied to its weight
                not_loaded.add(name)
                continue
            if mxfp4 and name in scaled.scales:
                lname, lshape = mxfp4_logical(name, tuple(info.shape))
                out[name] = "mxfp4" if dtype == "keep" else device_dtype(lname + ".weight", "f32", lshape, dtype)
                continue
            src = "f32" if dtype != "keep" and name in scaled.scales else formats.from_safetensors(info.dtype).name
            out[name] = device_dtype(name, src, tuple(info.shape), dtype) if loadable_shape(info.shape) else None
        nbytes = sum(formats.nbytes(mxfp4_logical(n, tuple(ckpt[n].shape))[1] if mxfp4 and n in scaled.scales
                                    else ckpt[n].shape, d) for n, d in out.items() if d is not None)
        report = {"gpu_resident_bytes": nbytes, "device_dtypes": out, "dtype": dtype,
                  "unloadable": [n for n, d in out.items() if d is None and n not in not_loaded]}
        if scaled.scheme is not None:
            report["quantization"] = scaled.scheme.describe()
            report["scale_layouts"] = scale_layouts(scaled)
        return report


FAMILY = GenericFamily()
# The family's methods under their module names (the registry uses FAMILY).
NAME = FAMILY.name
OPTIONS = FAMILY.option_names
recognises = FAMILY.recognises
load_checkpoint = FAMILY.load_checkpoint
inspect_checkpoint = FAMILY.inspect_checkpoint


def load(path: PathLike, device: Device | str | None = None, *, dtype: str | None = None, progress: bool = True,
         check_finite: bool = False, shard: Shard | None = None, recipe: str | None = None) -> GenericModel:
    """Load any safetensors checkpoint (file or directory) with its own tensor
    names; ``dtype`` as in :func:`~hf2q.models.generic.plan.plan_generic` (None: ``"keep"``);
    ``check_finite=True``: a NaN/Inf weight raises NonFiniteError; ``shard``:
    only that rank's slices (docs/SHARDING.md); ``recipe`` (``"q4_k_m"``, ...):
    llama-quantize's type for each tensor of a llama-like checkpoint, decided
    by its GGUF name (replaces ``dtype``; docs/KQUANTS.md)."""
    from .. import family, load_with, read_config

    check_device_arg(device)
    _, config = read_config(Path(path))
    return load_with(path, config, family("generic"), device, progress=progress, check_finite=check_finite,
                     shard=shard, dtype=dtype, recipe=recipe)
