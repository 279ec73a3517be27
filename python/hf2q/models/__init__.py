"""Model families and the registry that picks one for a checkpoint.

A family is a module (one folder under ``hf2q/models/``) that declares:

- ``NAME``: its registry name (``"dflash"``, ``"qwen35moe"``, ``"generic"``);
- ``OPTIONS``: the keyword options its loader takes (the CLI offers them);
- ``recognises(config)``: whether a parsed ``config.json`` (None when the
  checkpoint has none) is one of its models;
- ``load_checkpoint(ckpt, device, *, config, progress, **options)``: parse the
  config, build the :class:`~hf2q.plan.LoadPlan` and run it with
  :func:`hf2q.loader.execute`, returning a :class:`~hf2q.model.LoadedModel`;
- ``inspect_checkpoint(ckpt, *, config, **options)``: the plan's numbers
  (``gpu_resident_bytes``, ``device_dtypes`` by tensor, family fields),
  reading no tensor bytes;
- optionally, for a family whose models can be a speculative drafter's
  target (:mod:`hf2q.pairs`): ``plan_checkpoint(ckpt, *, config, **options)``
  (the plan, no bytes read), ``target_heads(plan)`` (where the embedding
  and LM head are, and the numbers a drafter must match) and
  ``load_planned(plan, ckpt, device, *, progress, check_finite)`` (that plan
  loaded, so that a pair plans its target once).

:func:`detect` asks the families in :data:`FAMILIES` order; ``generic``
recognises everything and is asked last. :func:`load` reads ``config.json``
once and opens the checkpoint once, then hands both to the family.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Union

from ..errors import ConfigError, parse_config_json, read_config_text

__all__ = ["Family", "FAMILIES", "family", "detect", "read_config", "check_options", "load", "load_with", "inspect"]

PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class Family:
    """One registry row: the family's name and the module implementing it."""

    name: str
    module: str
    description: str

    def impl(self) -> ModuleType:
        return importlib.import_module(self.module)

    @property
    def options(self) -> tuple[str, ...]:
        return tuple(self.impl().OPTIONS)

    def recognises(self, config: Mapping[str, Any] | None) -> bool:
        return bool(self.impl().recognises(config))


#: The registry, in the order :func:`detect` asks (the catch-all last).
FAMILIES: tuple[Family, ...] = (
    Family("dflash", "hf2q.models.dflash", "DFlash block-diffusion drafters"),
    Family("qwen35moe", "hf2q.models.qwen35", "Qwen3.5 / Qwen3.6 MoE (experts in Q8_0 at load time)"),
    Family("gemma4", "hf2q.models.gemma4", "Gemma 4 text models, MoE and dense (experts in Q8_0 at load time)"),
    Family("generic", "hf2q.models.generic", "any safetensors checkpoint, its own tensor names"),
)


def family(name: str) -> Family:
    """The registry row named ``name``."""
    for f in FAMILIES:
        if f.name == name:
            return f
    raise ValueError(f"unknown model family {name!r}; known: {', '.join(f.name for f in FAMILIES)}")


def read_config(path: PathLike) -> tuple[Path | None, dict[str, Any] | None]:
    """``(config path, parsed config.json)`` of a checkpoint (a directory, or
    a file with ``config.json`` beside it); ``(None, None)`` when there is
    none. Invalid JSON or a non-object is a :class:`~hf2q.ConfigError`."""
    p = Path(os.fspath(path))
    try:
        directory = p if p.is_dir() else p.parent
        cfg_path = directory / "config.json"
        if not os.path.lexists(cfg_path):  # a FIFO or device node is there: refused below, not skipped
            return None, None
    except OSError as e:
        raise ConfigError(f"{p}: {e.strerror or e}") from None
    # Non-blocking, regular files only, size-capped; bounded nesting and integers.
    cfg_path, text = read_config_text(cfg_path)
    cfg = parse_config_json(text, f"{cfg_path}: cannot read config.json")
    if not isinstance(cfg, dict):
        raise ConfigError(f"{cfg_path}: config.json is not a JSON object")
    return cfg_path, cfg


def detect(config: Mapping[str, Any] | None) -> Family:
    """The first family of :data:`FAMILIES` that recognises ``config``."""
    for f in FAMILIES:
        if f.recognises(config):
            return f
    raise ConfigError("no model family recognises this config.json")  # unreachable: generic takes all


def check_options(fam: Family, options: Mapping[str, Any]) -> None:
    """A TypeError naming every option of ``options`` that ``fam``'s loader
    does not take, and the family (one that would do nothing is refused,
    never dropped): the rule of :func:`load`, :func:`inspect` and
    :func:`hf2q.pairs.load_pair`."""
    unknown = sorted(set(options) - set(fam.options))
    if unknown:
        takes = f"it takes {', '.join(fam.options)}" if fam.options else "it takes none"
        raise TypeError(f"the {fam.name} family takes no option(s) {', '.join(unknown)}; {takes}")


def load(path: PathLike, device: Any = None, *, family: str | None = None, progress: bool = True,
         revision: str | None = None, download: bool = False, check_finite: bool = False, **options: Any) -> Any:
    """Load the checkpoint at ``path`` (directory with ``config.json``,
    ``.safetensors`` file, or sharded index) onto ``device`` (default:
    :meth:`hf2q.Device.default`) with the family its ``config.json`` names,
    or ``family``. ``options`` go to the family's loader (``dtype`` for
    generic; ``expert_dtype`` / ``dense_dtype`` / ``mtp`` for Qwen3.5 MoE);
    one it does not take is a TypeError. ``path`` may be a Hugging Face repo
    id in the local cache (``revision``, ``download``: see :func:`hf2q.hub.resolve`).
    ``check_finite=True`` (every family): a NaN/Inf weight kept as it is
    raises NonFiniteError (docs/RELIABILITY.md)."""
    from ..hub import resolve

    path = resolve(path, revision, download=download)
    _, config = read_config(path)
    fam = detect(config) if family is None else globals()["family"](family)
    check_options(fam, options)
    return load_with(path, config, fam, device, progress=progress, check_finite=check_finite, **options)


def load_with(path: PathLike, config: Mapping[str, Any] | None, fam: Family, device: Any = None, *,
              progress: bool = True, check_finite: bool = False, **options: Any) -> Any:
    """:func:`load` with ``config.json`` already read (``config``) and the
    family chosen: the checkpoint is opened once and handed to the family."""
    from ..device import Device
    from ..safetensors import open_checkpoint

    dev = device if device is not None else Device.default()
    with open_checkpoint(Path(os.fspath(path))) as ckpt:
        return fam.impl().load_checkpoint(ckpt, dev, config=config, progress=progress, check_finite=check_finite,
                                          **options)


def inspect(ckpt: Any, config: Mapping[str, Any] | None, *, family: str | None = None,
            **options: Any) -> tuple[Family, dict[str, Any]]:
    """``(family, plan numbers)`` for an open checkpoint and its parsed
    config; ``options`` as for :func:`load` (one the family does not take is
    a TypeError, as there)."""
    fam = detect(config) if family is None else globals()["family"](family)
    check_options(fam, options)
    return fam, fam.impl().inspect_checkpoint(ckpt, config=config, **options)
