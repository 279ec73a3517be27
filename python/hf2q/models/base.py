"""The one interface every model family implements (:class:`ModelFamily`),
and the options a family declares (:class:`Option`).

A family says what it recognises, parses its ``config.json``, plans a load
(a :class:`~hf2q.plan.LoadPlan`, reading no tensor byte) and wraps the
loaded buffers in its model view; the base class does the rest the same way
for every family: option defaults, plan then :func:`hf2q.loader.execute`,
the plan's numbers for ``inspect``. A family whose models can be a
speculative drafter's target (:mod:`hf2q.pairs`) also says where their
embedding and LM head are (:meth:`ModelFamily.target_heads`).

The registry (:data:`hf2q.models.FAMILIES`) finds each family's instance as
``FAMILY`` in its package; the command line and :func:`hf2q.load` read the
options from there (docs/ARCHITECTURE.md, "Adding a family")."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._gc import pausing
from ..device import Buffer, Device, DeviceOpening, resolve_device
from ..loader import execute
from ..model import LoadedModel
from ..plan import CONVERT_DTYPES, LoadPlan
from ..prefetch import Prefetch
from ..recipes import RECIPES, replaced_by_recipe
from ..safetensors import Checkpoint
from ..shard import Decision, Shard, name_rule, shard_plan

__all__ = ["ModelFamily", "Option", "EXPERT_DTYPE", "DENSE_DTYPE", "RECIPE"]


@dataclass(frozen=True)
class Option:
    """A keyword option of a family's loader: ``name`` (the keyword),
    ``choices`` (None: any value of the default's kind), ``default``, a
    ``help`` line (the command line's, after the families that take it), and
    whether the command line offers it (``cli``; ``mtp`` is Python only)."""

    name: str
    choices: tuple[Any, ...] | None
    default: Any
    help: str
    cli: bool = True


#: The options of the families that convert by tensor class (Qwen3.5, Gemma 4).
EXPERT_DTYPE = Option("expert_dtype", CONVERT_DTYPES, "q8_0", "dtype of the expert stacks")
DENSE_DTYPE = Option("dense_dtype", CONVERT_DTYPES, "f32", "dtype of the other matrices")
#: llama-quantize's file type (hf2q.recipes): every tensor's format chosen as
#: ``llama-quantize ... Q4_K_M`` chooses it from the converter's BF16 file
#: (replaces the dtype options).
RECIPE = Option("recipe", tuple(RECIPES), None,
                "each tensor's format as llama-quantize's file type (no imatrix) chooses it; replaces the dtype "
                "options")


class ModelFamily:
    """One model family. Subclasses set :attr:`name`, :attr:`description`,
    :attr:`options` and implement :meth:`recognises`, :meth:`parse_config`,
    :meth:`plan` and :meth:`model` (and :meth:`target_heads` when their
    models can be a speculative target); the other methods are the same for
    every family."""

    #: Registry name (``"qwen35moe"``), also the plan's and the summary's.
    name: str = ""
    #: One line for listings.
    description: str = ""
    #: What the command line's help calls the family's models (``"Gemma 4"``).
    label: str = ""
    #: The keyword options :meth:`plan` takes, in the order they are listed.
    options: tuple[Option, ...] = ()

    # ------------------------------------------------------------ what a family says
    def recognises(self, config: Mapping[str, Any] | None) -> bool:
        """Whether a parsed ``config.json`` (None: the checkpoint has none) is one of this family's models."""
        raise NotImplementedError

    def parse_config(self, ckpt: Checkpoint, config: Mapping[str, Any] | None) -> Any:
        """The family's config object from the parsed ``config.json`` of
        ``ckpt`` (None: read it from the checkpoint's directory)."""
        raise NotImplementedError

    def plan(self, ckpt: Checkpoint, config: Any, **options: Any) -> LoadPlan:
        """The load plan of ``ckpt`` under the parsed ``config`` and every
        option of :attr:`options` (defaults filled in), reading no tensor byte."""
        raise NotImplementedError

    def model(self, device: Device, plan: LoadPlan, buffers: dict[str, Buffer]) -> LoadedModel:
        """The family's view of the loaded ``buffers`` (runs its layout check)."""
        raise NotImplementedError

    def target_heads(self, plan: LoadPlan) -> dict[str, Any]:
        """Where a speculative drafter finds this model's embedding and LM
        head: ``embedding``, ``lm_head`` (buffer names), ``tied``,
        ``declared_tied``, ``hidden_size``, ``vocab_size``,
        ``embedding_rows``, ``num_layers`` (see :class:`hf2q.pairs.TargetHeads`)."""
        raise NotImplementedError(f"{self.name} models cannot be a speculative target")

    @property
    def is_target(self) -> bool:
        """Whether this family's models can be a speculative drafter's target."""
        return type(self).target_heads is not ModelFamily.target_heads

    def describe(self, plan: LoadPlan, ckpt: Checkpoint) -> dict[str, Any]:
        """The plan's numbers for ``inspect`` (``gpu_resident_bytes`` at least)."""
        return {"gpu_resident_bytes": plan.nbytes, "device_dtypes": {e.name: e.dtype for e in plan}}

    def shard_rule(self, entry: Any, mode: str, experts: dict[str, int]) -> Decision:
        """How a sharded load splits ``entry`` (a plan entry) in ``mode``
        (``"tensor"`` / ``"expert"``): a :class:`~hf2q.shard.Split`, an
        :class:`~hf2q.shard.Owned` expert tensor, or None (replicated).
        Default: :func:`hf2q.shard.name_rule` (HF and GGUF names; docs/SHARDING.md)."""
        return name_rule(entry, mode, experts)

    # ------------------------------------------------------------ the same for every family
    @property
    def option_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.options)

    def check_options(self, options: Mapping[str, Any]) -> None:
        """A TypeError naming every option of ``options`` this family does
        not take, and the family (one that would do nothing is refused, never
        dropped)."""
        unknown = sorted(set(options) - set(self.option_names))
        if unknown:
            takes = f"it takes {', '.join(self.option_names)}" if self.options else "it takes none"
            raise TypeError(f"the {self.name} family takes no option(s) {', '.join(unknown)}; {takes}")
        replaced = replaced_by_recipe(options)
        if replaced:  # (never dropped without a word: the recipe chooses every tensor's format)
            raise TypeError(f"recipe {options['recipe']!r} chooses every tensor's format: it replaces "
                            f"{' and '.join(replaced)}; give one or the other")

    def with_defaults(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """``options`` (checked) with every option of the family not given,
        or given as None, at its default (None is no option's choice but its
        default: a family-level ``load(expert_dtype=None)`` is the default)."""
        self.check_options(options)
        return {o.name: o.default if options.get(o.name) is None else options[o.name] for o in self.options}

    @pausing  # entries and pieces per tensor, no cycles: no collection while they are made (hf2q._gc)
    def plan_checkpoint(self, ckpt: Checkpoint, *, config: Mapping[str, Any] | None, shard: Shard | None = None,
                        **options: Any) -> LoadPlan:
        """The plan of an open checkpoint and its parsed ``config.json`` (None:
        read it); ``shard``: only that rank's slices (:mod:`hf2q.shard`)."""
        plan = self.plan(ckpt, self.parse_config(ckpt, config), **self.with_defaults(options))
        if shard is not None:
            if not isinstance(shard, Shard):
                raise TypeError(f"shard must be an hf2q.Shard, got {type(shard).__name__}")
            plan = shard_plan(plan, shard, self.shard_rule)
        return plan

    def load_planned(self, plan: LoadPlan, ckpt: Checkpoint, device: Device | DeviceOpening | str | None, *,
                     progress: bool, check_finite: bool = False, prefetch: Prefetch | None = None) -> Any:
        """Run a plan that :meth:`plan_checkpoint` made for ``ckpt`` (a pair
        checks the plan's heads first, then loads it: planned once);
        ``prefetch``: shards read ahead onto the device (:mod:`hf2q.prefetch`)."""
        dev = resolve_device(device)
        return execute(plan, ckpt, dev, lambda bufs: self.model(dev, plan, bufs), progress=progress,
                       extra=plan.extra, check_finite=check_finite, prefetch=prefetch)

    def load_checkpoint(self, ckpt: Checkpoint, device: Device | DeviceOpening | str | None, *,
                        config: Mapping[str, Any] | None,
                        progress: bool, check_finite: bool = False, shard: Shard | None = None,
                        prefetch: Prefetch | None = None, **options: Any) -> Any:
        """Plan and load an open checkpoint (``shard``: only that rank's
        slices; ``prefetch``: shards read ahead onto the device)."""
        plan = self.plan_checkpoint(ckpt, config=config, shard=shard, **options)
        return self.load_planned(plan, ckpt, device, progress=progress, check_finite=check_finite,
                                 prefetch=prefetch)

    def inspect_checkpoint(self, ckpt: Checkpoint, *, config: Mapping[str, Any] | None,
                           **options: Any) -> dict[str, Any]:
        """The plan's numbers, reading no tensor bytes."""
        return self.describe(self.plan_checkpoint(ckpt, config=config, **options), ckpt)

    def __repr__(self) -> str:
        return f"<hf2q model family {self.name!r}>"
