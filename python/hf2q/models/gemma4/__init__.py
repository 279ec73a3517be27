"""Gemma 4 (``gemma4``): the text model of ``Gemma4ForConditionalGeneration``
and ``Gemma4ForCausalLM`` checkpoints — the MoE layout of gemma-4-26B-A4B and
the dense variants — loaded into device buffers under llama.cpp's GGUF names,
every tensor byte-identical to ``convert_hf_to_gguf.py --outtype`` q8_0 / f32 /
bf16 (docs/GEMMA4.md). Experts are quantized to Q8_0 at load time; no GGUF
file is written.

    >>> import hf2q
    >>> model = hf2q.gemma4.load("gemma-4-26B-A4B-it")        # doctest: +SKIP
    >>> model["blk.0.ffn_gate_up_exps.weight"].dtype          # doctest: +SKIP
    'q8_0'
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Union

from ...device import Buffer, Device, check_device_arg
from ...model import LoadedModel, check_layout
from ...plan import LoadPlan, destinations_by_source
from ...safetensors import Checkpoint, open_checkpoint
from ...shard import Shard
from ..base import DENSE_DTYPE, EXPERT_DTYPE, RECIPE, ModelFamily
from .config import ARCHITECTURES, FULL_ATTENTION, MODEL_TYPES, SLIDING_ATTENTION, Gemma4Config, Gemma4Layer
from .plan import DEVICE_DTYPES, device_dtype, gguf_name, is_multimodal_tensor, plan_gemma4, rope_freqs, vocab_rows

__all__ = ["Gemma4Config", "Gemma4Layer", "Gemma4Model", "Gemma4Block", "plan_gemma4", "load", "inspect",
           "device_dtype", "gguf_name", "is_multimodal_tensor", "rope_freqs", "vocab_rows", "DEVICE_DTYPES",
           "FULL_ATTENTION", "SLIDING_ATTENTION", "NAME", "OPTIONS", "recognises", "target_heads", "Gemma4Family",
           "FAMILY"]

PathLike = Union[str, "os.PathLike[str]"]

class Gemma4Block:
    """One decoder layer's buffers by GGUF suffix (``attn_q``, ``ffn_gate_up_exps``, ...)."""

    def __init__(self, layer: Gemma4Layer, tensors: dict[str, Buffer]) -> None:
        self.layer = layer
        self.tensors = tensors

    @property
    def index(self) -> int:
        return self.layer.index

    @property
    def kind(self) -> str:
        return self.layer.kind

    def __getattr__(self, name: str) -> Buffer:
        tensors = self.__dict__.get("tensors", {})
        for key in (f"{name}.weight", name):
            if key in tensors:
                return tensors[key]
        raise AttributeError(f"block {self.index} has no tensor {name!r}; it has {sorted(tensors)}")

    def __repr__(self) -> str:
        return f"<Gemma4Block {self.index} {self.kind}: {len(self.tensors)} tensors>"


class Gemma4Model(LoadedModel):
    """Gemma 4 weights on a device, addressable by GGUF name
    (``model["blk.5.attn_q.weight"]``); ``model.layers[b]`` views one block.
    ``embed_tokens`` is ``token_embd.weight``; ``lm_head`` is ``output.weight``
    when the checkpoint has its own LM head, else the same buffer as the
    embedding (tied; counted once)."""

    family = "gemma4"

    def __init__(self, device: Device, config: Gemma4Config, plan: LoadPlan, buffers: dict[str, Buffer]) -> None:
        super().__init__(device, config, buffers)
        self.plan = plan
        check_layout(buffers, plan.layout(), "Gemma 4 device buffers break the planned layout")
        self.layers = [
            Gemma4Block(ly, {n[len(f"blk.{ly.index}."):]: b for n, b in buffers.items()
                             if n.startswith(f"blk.{ly.index}.")})
            for ly in config.layers
        ]

    @property
    def embed_tokens(self) -> Buffer:
        return self["token_embd.weight"]

    @property
    def lm_head(self) -> Buffer:
        return self["output.weight"] if "output.weight" in self else self.embed_tokens

    @property
    def tied(self) -> bool:
        return "output.weight" not in self


# ----------------------------------------------------------------------------- family interface
def _config_of(ckpt: Checkpoint, config: Mapping[str, Any] | None) -> Gemma4Config:
    if config is None:
        return Gemma4Config.from_file(ckpt.directory / "config.json")
    return Gemma4Config.from_dict(config, source=str(ckpt.directory / "config.json"))


class Gemma4Family(ModelFamily):
    name = "gemma4"
    description = "Gemma 4 text models, MoE and dense (experts in Q8_0 at load time)"
    label = "Gemma 4"
    options = (EXPERT_DTYPE, DENSE_DTYPE, RECIPE)

    def recognises(self, config: Mapping[str, Any] | None) -> bool:
        """An architecture ``Gemma4ForConditionalGeneration`` / ``Gemma4ForCausalLM``,
        or (without ``architectures``) ``model_type`` ``gemma4`` / ``gemma4_text``."""
        if config is None:
            return False
        archs = config.get("architectures")
        archs = [archs] if isinstance(archs, str) else (archs if isinstance(archs, list) else [])
        if archs:
            return any(a in ARCHITECTURES for a in archs)
        tc = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else {}
        return config.get("model_type") in MODEL_TYPES or tc.get("model_type") in MODEL_TYPES

    def parse_config(self, ckpt: Checkpoint, config: Mapping[str, Any] | None) -> Gemma4Config:
        return _config_of(ckpt, config)

    def plan(self, ckpt: Checkpoint, config: Gemma4Config, *, expert_dtype: str = "q8_0",
             dense_dtype: str = "f32", recipe: str | None = None) -> LoadPlan:
        if recipe is None:
            return plan_gemma4(ckpt, config, dense_dtype=dense_dtype, expert_dtype=expert_dtype,
                               directory=ckpt.directory)
        from ...recipes import ModelFacts, apply_recipe

        # llama-quantize's input: the converter's --outtype bf16 file.
        plan = plan_gemma4(ckpt, config, dense_dtype="bf16", expert_dtype="bf16", directory=ckpt.directory)
        n_expert = config.num_experts or 0  # expert_count, as the converter writes it
        return apply_recipe(plan, recipe, ModelFacts(config.num_hidden_layers, n_expert))

    def model(self, device: Device, plan: LoadPlan, buffers: dict[str, Buffer]) -> Gemma4Model:
        return Gemma4Model(device, plan.config, plan, buffers)

    def target_heads(self, plan: LoadPlan) -> dict[str, Any]:
        """GGUF names of the embedding and LM head, whether they are one
        tensor, and the numbers a drafter must match."""
        cfg: Gemma4Config = plan.config
        tied = plan.extra["tied_output"]
        return {"embedding": "token_embd.weight", "lm_head": "token_embd.weight" if tied else "output.weight",
                "tied": tied, "declared_tied": cfg.tie_word_embeddings, "hidden_size": cfg.hidden_size,
                "vocab_size": cfg.vocab_size, "embedding_rows": plan.extra["embedding_rows"],
                "num_layers": cfg.num_hidden_layers, "tie_key": "tie_word_embeddings"}

    def describe(self, plan: LoadPlan, ckpt: Checkpoint) -> dict[str, Any]:
        by_kind: dict[str, int] = {}
        for e in plan:
            by_kind[e.kind] = by_kind.get(e.kind, 0) + e.nbytes
        return {"planned_tensors": len(plan), "gpu_resident_bytes": plan.nbytes, "resident_bytes_by_kind": by_kind,
                # by checkpoint name (the CLI's listing); the GGUF side in gguf_tensors
                "device_dtypes": {p.tensor: e.dtype for e in plan for p in e.sources},
                "gguf_names": destinations_by_source(plan),
                "gguf_tensors": [{"name": e.name, "shape": list(e.shape), "dtype": e.dtype, "kind": e.kind}
                                 for e in plan],
                "skipped": list(plan.skipped), **plan.extra}


FAMILY = Gemma4Family()
# The family's methods under their module names (the registry and hf2q.pairs use FAMILY).
NAME = FAMILY.name
OPTIONS = FAMILY.option_names
recognises = FAMILY.recognises
plan_checkpoint = FAMILY.plan_checkpoint
load_checkpoint = FAMILY.load_checkpoint
load_planned = FAMILY.load_planned
inspect_checkpoint = FAMILY.inspect_checkpoint
target_heads = FAMILY.target_heads


def load(path: PathLike, device: Device | str | None = None, *, expert_dtype: str | None = None,
         dense_dtype: str | None = None, progress: bool = True, revision: str | None = None, download: bool = False,
         check_finite: bool = False, shard: Shard | None = None, recipe: str | None = None) -> Gemma4Model:
    """Load a Gemma 4 checkpoint (directory with ``config.json``, single file
    or sharded) into device buffers. ``expert_dtype`` (None: ``"q8_0"``)
    applies to ``ffn_gate_up_exps`` / ``ffn_down_exps``, ``dense_dtype``
    (None: ``"f32"``; ``"bf16"``, ``"f16"``, ``"q8_0"``, ...) to every other tensor llama.cpp
    would quantize; the rest stays F32. On failure every buffer is freed.
    ``check_finite=True``: a NaN/Inf weight kept as it is raises
    NonFiniteError (quantized tensors always refuse them; docs/RELIABILITY.md).
    ``path`` may be a Hugging Face repo id in the local cache (``revision``,
    ``download``: see :func:`hf2q.hub.resolve`). ``shard``: only that rank's
    slices (docs/SHARDING.md). ``recipe`` (``"q4_k_m"``, ...): every tensor's
    format as llama-quantize's file type gives it (docs/KQUANTS.md)."""
    from ...hub import resolve

    from .. import family, load_with

    check_device_arg(device)
    path = resolve(path, revision, download=download, api="hf2q.gemma4.load")
    return load_with(path, None, family("gemma4"), device, progress=progress, check_finite=check_finite,
                     shard=shard, expert_dtype=expert_dtype, dense_dtype=dense_dtype, recipe=recipe)


def inspect(path: PathLike, *, expert_dtype: str | None = None, dense_dtype: str | None = None,
            revision: str | None = None, download: bool = False, recipe: str | None = None) -> dict[str, Any]:
    """The load plan's numbers for a checkpoint (or Hugging Face repo id, as
    for :func:`load`, the options too), reading no tensor bytes."""
    from ...hub import resolve

    with open_checkpoint(resolve(path, revision, download=download, api="hf2q.gemma4.inspect")) as ckpt:
        return inspect_checkpoint(ckpt, config=None, expert_dtype=expert_dtype, dense_dtype=dense_dtype,
                                  recipe=recipe)
