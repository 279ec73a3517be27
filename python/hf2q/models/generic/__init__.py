"""The generic family: any safetensors checkpoint without a family of its
own loads with its own tensor names, each tensor kept in its dtype or
converted by ``dtype`` (``keep`` | ``f32`` | ``bf16`` | ``q8_0``; see
:mod:`hf2q.models.generic.plan`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union

from ...device import Device
from ...loader import execute
from ...model import LoadedModel, check_layout
from ...safetensors import Checkpoint, open_checkpoint
from .config import DTYPE_POLICIES, GenericConfig
from .plan import device_dtype, plan_generic

__all__ = ["GenericConfig", "GenericModel", "DTYPE_POLICIES", "plan_generic", "device_dtype", "load",
           "recognises", "NAME", "OPTIONS"]

PathLike = Union[str, "os.PathLike[str]"]

#: Family name in the registry and in summaries.
NAME = "generic"
#: Options of :func:`load` that the CLI offers.
OPTIONS = ("dtype",)


def recognises(config: Mapping[str, Any] | None) -> bool:
    """Every checkpoint: the registry asks the generic family last."""
    return True


class GenericModel(LoadedModel):
    """A checkpoint's tensors on a device under their own names."""

    family = NAME

    def __init__(self, device: Device, config: GenericConfig, plan: Any, buffers: dict) -> None:
        super().__init__(device, config, buffers)
        self.plan = plan
        check_layout(buffers, plan.layout(), "generic device buffers break the planned layout")


def load_checkpoint(ckpt: Checkpoint, device: Device, *, config: Mapping[str, Any] | None, progress: bool,
                    dtype: str = "keep", check_finite: bool = False) -> GenericModel:
    plan = plan_generic(ckpt, config, dtype=dtype)
    return execute(plan, ckpt, device, lambda bufs: GenericModel(device, plan.config, plan, bufs),
                   progress=progress, extra={"architecture": plan.config.label, "dtype": dtype},
                   check_finite=check_finite)


def inspect_checkpoint(ckpt: Checkpoint, *, config: Mapping[str, Any] | None, dtype: str = "keep") -> dict[str, Any]:
    """Device dtypes and bytes under ``dtype``; tensors no device format can
    hold are listed in ``unloadable`` (a load would refuse them)."""
    from ... import formats

    out: dict[str, str | None] = {}
    for name in ckpt.keys():
        info = ckpt[name]
        out[name] = device_dtype(name, formats.from_safetensors(info.dtype).name, tuple(info.shape), dtype)
    nbytes = sum(formats.nbytes(ckpt[n].shape, d) for n, d in out.items() if d is not None)
    return {"gpu_resident_bytes": nbytes, "device_dtypes": out, "dtype": dtype,
            "unloadable": [n for n, d in out.items() if d is None]}


def load(path: PathLike, device: Device | None = None, *, dtype: str = "keep", progress: bool = True,
         check_finite: bool = False) -> GenericModel:
    """Load any safetensors checkpoint (file or directory) with its own tensor
    names; ``dtype`` as in :func:`~hf2q.models.generic.plan.plan_generic`;
    ``check_finite=True``: a NaN/Inf weight raises NonFiniteError."""
    from .. import read_config

    dev = device if device is not None else Device.default()
    path = Path(path)
    _, config = read_config(path)
    with open_checkpoint(path) as ckpt:
        return load_checkpoint(ckpt, dev, config=config, progress=progress, dtype=dtype, check_finite=check_finite)
