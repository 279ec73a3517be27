"""Qwen3.5/3.6 MoE: the in-memory loader (docs/QWEN35MOE.md).

Every planned tensor goes straight into its own device buffer: expert stacks
are streamed expert by expert from the file into their slice of the
destination (quantized to Q8_0 on the way, no whole-stack staging copy),
plain tensors are ``pread`` and converted in native code, and only the small
transformed tensors (norms +1, linear-attention reorders, ``A_log``) pass
through numpy. No GGUF file is written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any, Union


from ...device import Buffer, Device, check_device_arg
from ...model import LoadedModel, check_layout
from ...plan import LoadPlan, destinations_by_source
from ...safetensors import Checkpoint, open_checkpoint
from ...shard import Shard
from ..base import DENSE_DTYPE, EXPERT_DTYPE, RECIPE, ModelFamily, Option
from .config import FULL_ATTENTION, Qwen35Config
from .plan import Qwen35Plan, plan_qwen35_moe

__all__ = ["Qwen35Layer", "Qwen35Model", "Qwen35Family", "FAMILY", "load", "inspect"]

PathLike = Union[str, "os.PathLike[str]"]


@dataclass
class Qwen35Layer:
    """One block's buffers by GGUF suffix (``attn_q``, ``ffn_gate_exps``, ...)."""

    index: int
    kind: str  # "full_attention" | "linear_attention" (MTP blocks: full attention)
    tensors: dict[str, Buffer] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Buffer:
        tensors = self.__dict__.get("tensors", {})
        for key in (f"{name}.weight", name, f"{name}.bias"):
            if key in tensors:
                return tensors[key]
        raise AttributeError(f"block {self.index} has no tensor {name!r}; it has {sorted(tensors)}")

    @property
    def is_full_attention(self) -> bool:
        return self.kind == FULL_ATTENTION

    @property
    def moe(self) -> dict[str, Buffer]:
        """The MoE FFN: router, experts, shared expert and its gate."""
        keys = {
            "router": "ffn_gate_inp.weight",
            "gate_exps": "ffn_gate_exps.weight",
            "up_exps": "ffn_up_exps.weight",
            "down_exps": "ffn_down_exps.weight",
            "gate_shexp": "ffn_gate_shexp.weight",
            "up_shexp": "ffn_up_shexp.weight",
            "down_shexp": "ffn_down_shexp.weight",
            "shexp_gate": "ffn_gate_inp_shexp.weight",
        }
        return {k: self.tensors[v] for k, v in keys.items() if v in self.tensors}


class Qwen35Model(LoadedModel):
    """Inference-ready Qwen3.5/3.6 MoE weights on a device, addressable by
    GGUF name (``model["blk.3.ffn_down_exps.weight"]``). Shapes are logical
    numpy shapes (the reverse of GGUF's ``ne``)."""

    family = "qwen35moe"

    def __init__(self, device: Device, config: Qwen35Config, plan: Qwen35Plan, buffers: dict[str, Buffer]) -> None:
        super().__init__(device, config, buffers)
        self.plan = plan
        self.layers: list[Qwen35Layer] = []
        for b in range(plan.n_blocks):
            kind = config.layer_types[b] if b < config.num_hidden_layers else FULL_ATTENTION
            self.layers.append(Qwen35Layer(b, kind))
        for n, buf in buffers.items():  # one pass over the buffers, not one per block
            if n.startswith("blk."):
                b_text, _, rest = n[4:].partition(".")
                if b_text.isdigit() and len(b_text) < 19 and int(b_text) < plan.n_blocks:
                    self.layers[int(b_text)].tensors[rest] = buf
        # Always-on invariant: every buffer has its planned dtype and shape.
        check_layout(buffers, plan.layout(), "Qwen3.5 device buffers break the planned layout")

    def __repr__(self) -> str:
        return (f"<hf2q.qwen35.Qwen35Model {len(self)} tensors, {self.gpu_resident_bytes():,} resident bytes "
                f"on {self.device.kind}>")


def load(path: PathLike, device: Device | str | None = None, expert_dtype: str | None = None,
         dense_dtype: str | None = None, progress: bool = True, mtp: bool | None = None, *, revision: str | None = None,
         download: bool = False, check_finite: bool = False, shard: Shard | None = None,
         recipe: str | None = None) -> Qwen35Model:
    """Load a Qwen3.5/3.6 MoE checkpoint (directory with ``config.json``,
    single-file or sharded) into inference-ready device buffers.

    ``expert_dtype`` (None: ``"q8_0"``) applies to the expert stacks,
    ``dense_dtype`` (None: ``"f32"``; ``"bf16"``, ``"f16"``, ``"q8_0"``, ...; with ``"q8_0"`` the
    same tensors are quantized as by ``convert_hf_to_gguf.py --outtype q8_0``)
    to the other matrices; norms, ``ssm_*`` and routers stay F32. ``mtp``:
    keep (None: when present), require (True) or drop (False) the MTP block.
    ``check_finite=True``: a NaN/Inf weight copied or decoded as it is raises
    :class:`~hf2q.NonFiniteError` (off by default: the bytes are the file's;
    quantized tensors always refuse them).
    On any failure every buffer allocated so far is freed. ``path`` may be a
    Hugging Face repo id in the local cache (``revision``, ``download``: see
    :func:`hf2q.hub.resolve`). ``shard``: only that rank's slices (docs/SHARDING.md).
    ``recipe`` (``"q4_k_m"``, ...): every tensor's format as llama-quantize's
    file type gives it (replaces the dtype options; docs/KQUANTS.md)."""
    from ...hub import resolve

    from .. import family, load_with

    check_device_arg(device)
    path = resolve(path, revision, download=download, api="hf2q.qwen35.load")
    return load_with(path, None, family("qwen35moe"), device, progress=progress, check_finite=check_finite,
                     shard=shard, expert_dtype=expert_dtype, dense_dtype=dense_dtype, mtp=mtp, recipe=recipe)


def inspect(path: PathLike, dense_dtype: str | None = None, expert_dtype: str | None = None, *,
            revision: str | None = None, download: bool = False, recipe: str | None = None) -> dict[str, Any]:
    """The load plan of a checkpoint (or Hugging Face repo id, as for
    :func:`load`: ``download=True`` fetches it first), without reading tensor
    bytes; the options as for :func:`load`."""
    from ...hub import resolve

    with open_checkpoint(resolve(path, revision, download=download, api="hf2q.qwen35.inspect")) as ckpt:
        return inspect_checkpoint(ckpt, config=None, dense_dtype=dense_dtype, expert_dtype=expert_dtype,
                                  recipe=recipe)


# ----------------------------------------------------------------------------- family interface
# (hf2q.models.FAMILIES: how the registry recognises, plans, loads and inspects a Qwen3.5 MoE checkpoint)

def _config_of(ckpt: Checkpoint, config: Mapping[str, Any] | None) -> Qwen35Config:
    if config is None:
        return Qwen35Config.from_file(ckpt.directory / "config.json")
    return Qwen35Config.from_dict(config, source=str(ckpt.directory / "config.json"))


def _own_plan(plan: LoadPlan, method: str) -> Qwen35Plan:
    """The protocol's methods take any LoadPlan; this family's need its own
    (what its :meth:`Qwen35Family.plan` makes): refused with a TypeError
    otherwise, never read as another family's."""
    if not isinstance(plan, Qwen35Plan):
        raise TypeError(f"qwen35moe: {method}() needs a Qwen3.5 MoE plan (Qwen35Plan, from the family's plan or "
                        f"plan_checkpoint), got {type(plan).__name__} of family {plan.family!r}")
    return plan


class Qwen35Family(ModelFamily):
    name = "qwen35moe"
    description = "Qwen3.5 / Qwen3.6 MoE (experts in Q8_0 at load time)"
    label = "Qwen3.5/3.6 MoE"
    options = (EXPERT_DTYPE, DENSE_DTYPE,
               Option("mtp", (None, True, False), None, "keep (None: when present), require or drop the MTP block",
                      cli=False), RECIPE)

    def recognises(self, config: Mapping[str, Any] | None) -> bool:
        """``model_type`` (root or ``text_config``) ``qwen3_5_moe[_text]``, or a ``Qwen3_5Moe*`` architecture."""
        if config is None:
            return False
        archs = config.get("architectures") or []
        archs = [archs] if isinstance(archs, str) else (archs if isinstance(archs, list) else [])
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
        model_types = {m for m in (config.get("model_type"), text.get("model_type")) if isinstance(m, str)}
        return bool(model_types & {"qwen3_5_moe", "qwen3_5_moe_text"}) or any("Qwen3_5Moe" in str(a) for a in archs)

    def parse_config(self, ckpt: Checkpoint, config: Mapping[str, Any] | None) -> Qwen35Config:
        return _config_of(ckpt, config)

    def plan(self, ckpt: Checkpoint, config: Qwen35Config, *, expert_dtype: str = "q8_0", dense_dtype: str = "f32",
             mtp: bool | None = None, recipe: str | None = None) -> Qwen35Plan:
        if recipe is None:
            return plan_qwen35_moe(ckpt, config, dense_dtype=dense_dtype, expert_dtype=expert_dtype, mtp=mtp)
        from ...recipes import ModelFacts, apply_recipe

        # llama-quantize's input: the converter's --outtype bf16 file (MTP blocks count in block_count).
        plan = plan_qwen35_moe(ckpt, config, dense_dtype="bf16", expert_dtype="bf16", mtp=mtp)
        return apply_recipe(plan, recipe, ModelFacts(plan.extra["blocks"], config.num_experts))

    def model(self, device: Device, plan: LoadPlan, buffers: dict[str, Buffer]) -> Qwen35Model:
        # plan.config: the plan resolves what the file leaves out (mtp_num_hidden_layers)
        plan = _own_plan(plan, "model")
        return Qwen35Model(device, plan.config, plan, buffers)

    def target_heads(self, plan: LoadPlan) -> dict[str, Any]:
        """``token_embd.weight``; the LM head is ``output.weight``, or the embedding when tied."""
        plan = _own_plan(plan, "target_heads")
        cfg = plan.config
        return {"embedding": "token_embd.weight",
                "lm_head": "token_embd.weight" if plan.tied_output else "output.weight",
                "tied": plan.tied_output, "declared_tied": cfg.tie_word_embeddings, "hidden_size": cfg.hidden_size,
                "vocab_size": cfg.vocab_size, "embedding_rows": plan["token_embd.weight"].shape[0],
                "num_layers": cfg.num_hidden_layers}

    def describe(self, plan: LoadPlan, ckpt: Checkpoint) -> dict[str, Any]:
        plan = _own_plan(plan, "describe")
        return {
            "planned_tensors": len(plan),
            "gpu_resident_bytes": plan.nbytes,
            "resident_bytes_by_kind": plan.nbytes_by_kind(),
            "skipped": list(plan.skipped),
            # by checkpoint name (the CLI's listing); the GGUF side in gguf_tensors
            "device_dtypes": {p.tensor: pt.dtype for pt in plan for p in pt.sources},
            "gguf_names": destinations_by_source(plan),
            "gguf_tensors": [{"name": pt.gguf_name, "shape": list(pt.shape), "dtype": pt.dtype, "kind": pt.kind}
                             for pt in plan],
            **_fp8_report(plan, ckpt),
        }


def _fp8_report(plan: Qwen35Plan, ckpt: Checkpoint) -> dict[str, Any]:
    """``quantization`` and ``scale_layouts`` of an FP8 checkpoint (docs/FP8.md), else nothing."""
    scheme = plan.config.quantization
    if scheme is None:
        return {}
    from .._quant import scale_layouts, scaled_tensors

    return {"quantization": scheme.describe(), "scale_layouts": scale_layouts(scaled_tensors(ckpt, scheme))}


FAMILY = Qwen35Family()
# The family's methods under their module names (the registry and hf2q.pairs use FAMILY).
NAME = FAMILY.name
OPTIONS = FAMILY.option_names
recognises = FAMILY.recognises
plan_checkpoint = FAMILY.plan_checkpoint
load_checkpoint = FAMILY.load_checkpoint
load_planned = FAMILY.load_planned
inspect_checkpoint = FAMILY.inspect_checkpoint
target_heads = FAMILY.target_heads
