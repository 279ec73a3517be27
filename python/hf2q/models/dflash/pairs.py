"""Speculative pairs: a DFlash drafter bound to the target model it drafts for.

A DFlash drafter has no embedding and no LM head of its own: it looks tokens
up in the target's embedding and scores them with the target's LM head
(docs/DFLASH.md). Binding makes the drafter's ``embed_tokens`` and ``lm_head``
the target's own device buffers — the same memory, no copy, counted once in
the pair's resident bytes — after checking, before anything is uploaded,
that the two halves fit:

- ``hidden_size``: the drafter's equals the target's;
- ``vocab_size``: the drafter's equals the target's embedding rows;
- ``num_target_layers``: equals the target's decoder layer count;
- ``target_layer_ids``: every entry below that count;
- ``mask_token_id``: a row of the target's embedding;
- ``tie_word_embeddings``: the LM head is the target's ``output`` buffer when
  it has one, else its embedding; a target whose config declares an untied
  head but has none is refused.

Each mismatch is a :class:`PairError` (a :class:`~hf2q.ConfigError`) whose
``key`` names the field. A target family says where its embedding and LM head
are through the family hook ``target_heads(plan)``
(:class:`hf2q.models.base.ModelFamily`); the pair plans the target once with
``plan_checkpoint`` (checked before the target itself is loaded) and loads
that plan with ``load_planned``. Qwen3.5/3.6 MoE and Gemma 4 are targets.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from ...device import Buffer, Device, opened_meanwhile, resolve_device
from ...device import _detached as detached
from ...errors import ConfigError

__all__ = ["PairError", "TargetHeads", "SpeculativePair", "check_pair", "target_heads", "bind", "load_pair",
           "load_pair_with"]

PathLike = Union[str, "os.PathLike[str]"]


class PairError(ConfigError):
    """A drafter and a target that do not fit. ``key`` names the drafter's
    field (``hidden_size``, ``vocab_size``, ``num_target_layers``,
    ``dflash_config.target_layer_ids``, ``dflash_config.mask_token_id``,
    ``tie_word_embeddings``); ``drafter_value`` / ``target_value`` are the
    two sides."""

    def __init__(self, message: str, *, key: str, drafter_value: Any = None, target_value: Any = None) -> None:
        super().__init__(message, key=key)
        self.drafter_value = drafter_value
        self.target_value = target_value


@dataclass(frozen=True)
class TargetHeads:
    """What a family declares about a model as a speculative target: the
    names of its embedding and LM head buffers (the same name when tied) and
    the numbers a drafter must match. ``embedding_rows`` may be below
    ``vocab_size`` when the embedding was trimmed to the tokenizer."""

    family: str
    embedding: str
    lm_head: str
    tied: bool
    declared_tied: bool
    hidden_size: int
    vocab_size: int
    embedding_rows: int
    num_layers: int
    tie_key: str = "tie_word_embeddings"


def _heads_from(family: str, d: Any) -> TargetHeads:
    if isinstance(d, TargetHeads):
        return d
    return TargetHeads(family=family, **d)


def target_heads(target: Any) -> TargetHeads:
    """The :class:`TargetHeads` of a loaded model, from its family's hook."""
    from ... import models

    name = getattr(target, "family", None)
    try:
        fam = models.family(str(name))
    except ValueError:
        raise PairError(f"{type(target).__name__} is not a model hf2q loaded; it cannot be a speculative target",
                        key="target") from None
    impl = fam.impl()
    plan = getattr(target, "plan", None)
    if not impl.is_target or plan is None:
        raise PairError(f"the {fam.name} family declares no embedding / LM head, so a {fam.name} model cannot be "
                        "a drafter's target", key="target")
    return _heads_from(fam.name, impl.target_heads(plan))


def check_pair(drafter: Any, heads: TargetHeads) -> None:
    """Raise :class:`PairError` for the first field where the drafter config
    ``drafter`` (a :class:`~hf2q.dflash.DFlashConfig`) does not fit the target."""
    t = f"the {heads.family} target"
    if drafter.hidden_size != heads.hidden_size:
        raise PairError(f"hidden_size: the drafter has {drafter.hidden_size}, {t} {heads.hidden_size}",
                        key="hidden_size", drafter_value=drafter.hidden_size, target_value=heads.hidden_size)
    if drafter.vocab_size != heads.embedding_rows:
        trimmed = (f" (its config says {heads.vocab_size}; the converter's rule keeps {heads.embedding_rows} "
                   "embedding rows, one per tokenizer token)" if heads.embedding_rows != heads.vocab_size else "")
        raise PairError(f"vocab_size: the drafter has {drafter.vocab_size}, {t}'s embedding has "
                        f"{heads.embedding_rows} rows{trimmed}", key="vocab_size",
                        drafter_value=drafter.vocab_size, target_value=heads.embedding_rows)
    if drafter.num_target_layers != heads.num_layers:
        raise PairError(f"num_target_layers: the drafter expects {drafter.num_target_layers}, {t} has "
                        f"{heads.num_layers} decoder layers", key="num_target_layers",
                        drafter_value=drafter.num_target_layers, target_value=heads.num_layers)
    bad = [i for i in drafter.target_layer_ids if not 0 <= i < heads.num_layers]
    if bad:
        raise PairError(f"dflash_config.target_layer_ids: {bad} not below {t}'s {heads.num_layers} layers",
                        key="dflash_config.target_layer_ids", drafter_value=list(drafter.target_layer_ids),
                        target_value=heads.num_layers)
    if not 0 <= drafter.mask_token_id < heads.embedding_rows:
        raise PairError(f"dflash_config.mask_token_id: {drafter.mask_token_id} is not a token of {t} "
                        f"({heads.embedding_rows} embedding rows)", key="dflash_config.mask_token_id",
                        drafter_value=drafter.mask_token_id, target_value=heads.embedding_rows)
    if heads.tied and not heads.declared_tied:
        raise PairError(f"{heads.tie_key}: {t} declares an untied LM head but has none (no output buffer)",
                        key=heads.tie_key, target_value=False)


@dataclass
class SpeculativePair:
    """A target and the drafter bound to it. The drafter's ``embed_tokens``
    / ``lm_head`` are the target's buffers, so :meth:`gpu_resident_bytes`
    counts them once."""

    target: Any
    drafter: Any
    heads: TargetHeads
    extra: dict[str, Any] = field(default_factory=dict)

    def shared(self) -> dict[str, Buffer]:
        """The target's buffers the drafter uses, by the drafter's field name."""
        return {"embed_tokens": self.drafter.embed_tokens, "lm_head": self.drafter.lm_head}

    def gpu_resident_bytes(self) -> int:
        """Bytes of every distinct buffer of the pair (shared ones once)."""
        seen: dict[int, int] = {}
        for b in [*self.target.buffers_by_name().values(), *self.drafter.buffers_by_name().values(),
                  *self.shared().values()]:
            seen[id(b)] = b.byte_len
        return sum(seen.values())

    def summary(self) -> dict[str, Any]:
        t, d = self.target.gpu_resident_bytes(), self.drafter.gpu_resident_bytes()
        return {"target_family": self.heads.family, "target_resident_bytes": t, "drafter_resident_bytes": d,
                "shared": {k: self.heads.embedding if k == "embed_tokens" else self.heads.lm_head
                           for k in ("embed_tokens", "lm_head")},
                "tied": self.heads.tied, "pair_resident_bytes": self.gpu_resident_bytes()}

    def verify(self) -> dict[str, Any]:
        a, b = self.target.verify(), self.drafter.verify()
        return {"buffers": a["buffers"] + b["buffers"], "groups": a["groups"] + b["groups"],
                "seconds": a["seconds"] + b["seconds"]}


def _attach(drafter: Any, target: Any, heads: TargetHeads) -> SpeculativePair:
    drafter.embed_tokens = target[heads.embedding]
    drafter.lm_head = target[heads.lm_head]
    drafter.target = target
    pair = SpeculativePair(target, drafter, heads)
    drafter.pair = pair
    if drafter.summary is not None:
        drafter.summary.extra.update(pair.summary())
    return pair


def _drafter_weights(drafter: PathLike, config: Any = None) -> Any:
    from .manifest import DFlashWeights

    return DFlashWeights.load(Path(os.fspath(drafter)), config)


def bind(drafter: PathLike, target: Any, device: Device | str | None = None, *, progress: bool = True,
         config: Any = None, check_finite: bool = False) -> Any:
    """Load the DFlash drafter at ``drafter`` bound to the loaded ``target``
    (on the target's device unless ``device`` says otherwise — it must be the
    same device). The pair is checked from the drafter's headers and config
    before any drafter byte is uploaded. Returns the drafter, with
    ``embed_tokens``, ``lm_head``, ``target`` and ``pair`` set."""
    from .model import DFlashModelTensors

    heads = target_heads(target)
    dev = resolve_device(device) if device is not None else target.device
    if dev != target.device:
        raise PairError(f"the drafter must live on the target's device ({target.device.kind}), not {dev.kind}",
                        key="device")
    with _drafter_weights(drafter, config) as weights:
        check_pair(weights.config, heads)
        model = DFlashModelTensors.upload(dev, weights.config, weights, progress=progress, check_finite=check_finite)
    _attach(model, target, heads)
    return model


def load_pair(target: PathLike, drafter: PathLike, device: Device | str | None = None, *, progress: bool = True,
              check_finite: bool = False, **target_options: Any) -> SpeculativePair:
    """Load a target checkpoint and its DFlash drafter as a bound pair. Both
    checkpoints' headers and configs are validated and the pair checked
    before either is uploaded; ``target_options`` go to the target's family
    (``expert_dtype``, ``dense_dtype``, ...; one it does not take is a
    TypeError, as for :func:`hf2q.load`)."""
    from ... import models

    tpath = Path(os.fspath(target))
    _, config = models.read_config(tpath)
    return load_pair_with(tpath, config, models.detect(config), drafter, device, progress=progress,
                          check_finite=check_finite, **target_options)


#: The family hooks a speculative target uses (:class:`hf2q.models.base.ModelFamily`;
#: every family has the first and last, a target family implements ``target_heads``).
TARGET_HOOKS = ("plan_checkpoint", "target_heads", "load_planned")


def load_pair_with(target: PathLike, config: Any, fam: Any, drafter: PathLike, device: Device | str | None = None, *,
                   progress: bool = True, check_finite: bool = False, **target_options: Any) -> SpeculativePair:
    """:func:`load_pair` with the target's ``config.json`` already read
    (``config``) and its family (``fam``, a :class:`hf2q.models.Family`)
    chosen. The target is planned once: that plan's heads are checked against
    the drafter, then the same plan is loaded."""
    from ... import models
    from .model import DFlashModelTensors
    from ...safetensors import open_checkpoint

    tpath = Path(os.fspath(target))
    impl = fam.impl()
    if not impl.is_target:
        raise PairError(f"{tpath}: the {fam.name} family declares no embedding / LM head, so it cannot be a "
                        "drafter's target", key="target")
    models.check_options(fam, target_options)
    # None or a kind: the device opened while the checkpoints are opened and the target planned
    with opened_meanwhile(device) as dev, _drafter_weights(drafter) as weights, open_checkpoint(tpath) as ckpt:
        plan = impl.plan_checkpoint(ckpt, config=config, **target_options)
        heads = _heads_from(fam.name, impl.target_heads(plan))
        check_pair(weights.config, heads)
        dev = resolve_device(dev)
        target_model = impl.load_planned(plan, ckpt, dev, progress=progress, check_finite=check_finite)
        try:
            drafter_model = DFlashModelTensors.upload(dev, weights.config, weights, progress=progress,
                                                      check_finite=check_finite)
        except BaseException as e:
            # This frame holds the target: free it before the error leaves
            # (a kept traceback would otherwise keep the whole target resident).
            del target_model
            raise detached(e)
    return _attach(drafter_model, target_model, heads)
