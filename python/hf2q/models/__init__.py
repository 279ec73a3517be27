"""Model families and the registry that picks one for a checkpoint.

A family is a package under ``hf2q/models/`` whose ``FAMILY`` is a
:class:`~hf2q.models.base.ModelFamily`: its name, the options it declares
(:class:`~hf2q.models.base.Option`: name, choices, default, help),
``recognises(config)``, ``parse_config``, ``plan`` (a
:class:`~hf2q.plan.LoadPlan`, no tensor byte read), ``model`` (the view of
the loaded buffers) and, for a speculative drafter's target
(:mod:`hf2q.pairs`), ``target_heads(plan)``. Loading, inspecting and the pair
hooks (``plan_checkpoint``, ``load_planned``) are the base class's, the same
for every family.

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
from typing import TYPE_CHECKING, Any, Union

from .._configfile import parse_config_json, read_config_text
from ..errors import ConfigError

if TYPE_CHECKING:
    from .base import ModelFamily, Option

__all__ = ["Family", "FAMILIES", "family", "detect", "read_config", "check_options", "load", "load_with", "inspect"]

PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class Family:
    """One registry row: the family's name and the package whose ``FAMILY``
    implements it (imported when first asked)."""

    name: str
    module: str

    def impl(self) -> ModelFamily:
        """The family's :class:`~hf2q.models.base.ModelFamily`."""
        return importlib.import_module(self.module).FAMILY

    @property
    def description(self) -> str:
        return self.impl().description

    @property
    def options(self) -> tuple[str, ...]:
        """The names of the options the family declares."""
        return self.impl().option_names

    @property
    def option_specs(self) -> tuple[Option, ...]:
        """The options the family declares (name, choices, default, help)."""
        return self.impl().options

    def recognises(self, config: Mapping[str, Any] | None) -> bool:
        return bool(self.impl().recognises(config))


#: The registry, in the order :func:`detect` asks (the catch-all last).
FAMILIES: tuple[Family, ...] = (
    Family("dflash", "hf2q.models.dflash"),
    Family("qwen35moe", "hf2q.models.qwen35"),
    Family("gemma4", "hf2q.models.gemma4"),
    Family("generic", "hf2q.models.generic"),
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
    fam.impl().check_options(options)


def load(path: PathLike, device: Any = None, *, family: str | None = None, progress: bool = True,
         revision: str | None = None, download: bool = False, check_finite: bool = False, shard: Any = None,
         **options: Any) -> Any:
    """Load the checkpoint at ``path`` (directory with ``config.json``,
    ``.safetensors`` file, or sharded index) onto ``device`` (default:
    :meth:`hf2q.Device.default`) with the family its ``config.json`` names,
    or ``family``. ``options`` go to the family's loader (``dtype`` for
    generic; ``expert_dtype`` / ``dense_dtype`` / ``mtp`` for Qwen3.5 MoE);
    one it does not take is a TypeError. ``path`` may be a Hugging Face repo
    id in the local cache (``revision``, ``download``: see :func:`hf2q.hub.resolve`).
    ``check_finite=True`` (every family): a NaN/Inf weight kept as it is
    raises NonFiniteError (docs/RELIABILITY.md). ``shard`` (an
    :class:`hf2q.Shard`): only that rank's slice of each tensor is read and
    loaded (docs/SHARDING.md)."""
    from ..device import check_device_arg
    from ..hub import resolve

    check_device_arg(device)  # before any work; opened (None or a kind) while the checkpoint is planned
    path = resolve(path, revision, download=download, api="hf2q.load")
    _, config = read_config(path)
    fam = detect(config) if family is None else globals()["family"](family)
    check_options(fam, options)
    return load_with(path, config, fam, device, progress=progress, check_finite=check_finite, shard=shard,
                     **options)


def load_with(path: PathLike, config: Mapping[str, Any] | None, fam: Family, device: Any = None, *,
              progress: bool = True, check_finite: bool = False, shard: Any = None, **options: Any) -> Any:
    """:func:`load` with ``config.json`` already read (``config``) and the
    family chosen: the checkpoint is opened once and handed to the family."""
    from .. import prefetch
    from ..device import opened_meanwhile
    from ..safetensors import open_checkpoint

    # None or a kind: the device opened while the checkpoint is opened and
    # planned. An open GPU starts reading the first shards while that runs
    # (hf2q.prefetch; not for a shard's slices, which read parts of tensors).
    p = Path(os.fspath(path))
    with opened_meanwhile(device) as dev:
        # (the device first: a host load reads no config for it)
        wanted = shard is None and prefetch.serves(dev) and _scaled_fp8(p, config)
        pf = prefetch.start(dev, p) if wanted else None
        try:
            with open_checkpoint(p) as ckpt:
                if pf is not None:
                    pf.match(ckpt)
                return fam.impl().load_checkpoint(ckpt, dev, config=config, progress=progress,
                                                  check_finite=check_finite, shard=shard, prefetch=pf, **options)
        finally:
            if pf is not None:
                pf.close()


def _scaled_fp8(path: Path, config: Mapping[str, Any] | None) -> bool:
    """Whether the checkpoint's config.json declares FP8 weights with scales
    (``quant_method`` fp8 or compressed-tensors): the loads a prefetch can
    serve. Any doubt (no config, one that does not parse) is a no: the
    family's own reading says what is wrong."""
    from ._quant import quant_scheme

    try:
        if config is None:
            _, config = read_config(path)
        scheme = quant_scheme(config)
    except Exception:
        return False
    return scheme is not None and scheme.method in ("fp8", "compressed-tensors")


def inspect(ckpt: Any, config: Mapping[str, Any] | None, *, family: str | None = None,
            **options: Any) -> tuple[Family, dict[str, Any]]:
    """``(family, plan numbers)`` for an open checkpoint and its parsed
    config; ``options`` as for :func:`load` (one the family does not take is
    a TypeError, as there)."""
    fam = detect(config) if family is None else globals()["family"](family)
    check_options(fam, options)
    return fam, fam.impl().inspect_checkpoint(ckpt, config=config, **options)
