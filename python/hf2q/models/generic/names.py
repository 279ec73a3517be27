"""The GGUF names llama.cpp's converter gives llama-like checkpoints of the
generic family (one map: ``hf2q convert`` writes them, the k-quant recipes
decide each tensor's type by them, docs/GENERIC.md and docs/KQUANTS.md).

- :data:`GLOBAL_NAMES` / :data:`LAYER_NAMES`: what the converter's Llama,
  Mistral, Qwen3 and Qwen3-MoE classes call each tensor (``hf2q convert``
  writes these and refuses any other name);
- :data:`RECIPE_LAYER_NAMES`: the same plus the names of other llama-like
  layouts llama-quantize meets (Phi-3's fused ``qkv_proj`` / ``gate_up_proj``,
  Mixtral's ``block_sparse_moe``), which the recipes need only to choose types;
- experts: ``mlp.experts.<e>.{gate,up,down}_proj`` (and Mixtral's
  ``block_sparse_moe.experts.<e>.w{1,3,2}``), stacked by the converter into
  ``ffn_{gate,up,down}_exps``.

Note that ``post_attention_layernorm`` is ``ffn_norm`` here, where the
decoder families of ``models/_names.py`` (Qwen3.5, Gemma 4) call it
``post_attention_norm``: the converter's classes differ.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from .._names import GLOBAL_NAMES, with_additions  # the whole-model names are the decoder families' too
from .._names import LAYER_NAMES as _SHARED_LAYER_NAMES

__all__ = ["GLOBAL_NAMES", "LAYER_NAMES", "RECIPE_LAYER_NAMES", "split_block", "expert_of", "llama_gguf_name",
           "known_gguf_name"]

#: Per-layer tensors: suffix after ``model.layers.{b}.`` -> suffix after ``blk.{b}.``:
#: the shared map, the biases and the MoE router, and the one name the
#: converter's llama-like classes give differently.
LAYER_NAMES: Mapping[str, str] = with_additions(_SHARED_LAYER_NAMES, {
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias", "self_attn.o_proj.bias": "attn_output.bias",
    "mlp.gate.weight": "ffn_gate_inp.weight",
}, renames={"post_attention_layernorm.weight": "ffn_norm.weight"})

#: :data:`LAYER_NAMES` and the other llama-like layouts llama-quantize decides by.
RECIPE_LAYER_NAMES: Mapping[str, str] = with_additions(LAYER_NAMES, {
    "self_attn.qkv_proj.weight": "attn_qkv.weight",
    "mlp.gate_up_proj.weight": "ffn_up.weight",
    "block_sparse_moe.gate.weight": "ffn_gate_inp.weight",
})

_BLOCK = re.compile(r"model\.layers\.(\d{1,9})\.(.+)")
_EXPERT = re.compile(r"(mlp|block_sparse_moe)\.experts\.(\d{1,9})\.(gate_proj|up_proj|down_proj|w1|w2|w3)\.weight")
_EXPERT_KIND = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down", "w1": "gate", "w3": "up", "w2": "down"}


def split_block(hf_name: str) -> tuple[int, str] | None:
    """``(block, rest)`` of ``model.layers.<block>.<rest>``; None otherwise."""
    m = _BLOCK.fullmatch(hf_name)
    return (int(m.group(1)), m.group(2)) if m else None


def expert_of(rest: str, *, mixtral: bool = True) -> tuple[int, str] | None:
    """``(expert, kind)`` (kind ``gate`` / ``up`` / ``down``) of a block's
    expert tensor name; ``mixtral=False`` accepts only ``mlp.experts.<e>.
    {gate,up,down}_proj`` (the converter's Qwen3-MoE)."""
    m = _EXPERT.fullmatch(rest)
    if m is None or (not mixtral and (m.group(1) != "mlp" or m.group(3).startswith("w"))):
        return None
    return int(m.group(2)), _EXPERT_KIND[m.group(3)]


def known_gguf_name(hf_name: str) -> str | None:
    """The GGUF name llama.cpp's converter gives a llama-like checkpoint
    tensor (``model.layers.3.self_attn.v_proj.weight`` ->
    ``blk.3.attn_v.weight``; an expert ``...experts.E.w2.weight`` ->
    ``blk.N.ffn_down_exps.E.weight``: the converter stacks the experts, a
    recipe only needs the kind and block); None where the map has none."""
    if hf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[hf_name]
    split = split_block(hf_name)
    if split is None:
        return None
    b, rest = split
    if rest in RECIPE_LAYER_NAMES:
        return f"blk.{b}.{RECIPE_LAYER_NAMES[rest]}"
    e = expert_of(rest)
    return None if e is None else f"blk.{b}.ffn_{e[1]}_exps.{e[0]}.weight"


def llama_gguf_name(hf_name: str) -> str:
    """:func:`known_gguf_name`, else the name kept (a block's other tensors
    as ``blk.N.<rest>``): what the recipes decide by."""
    known = known_gguf_name(hf_name)
    if known is not None:
        return known
    split = split_block(hf_name)
    return hf_name if split is None else f"blk.{split[0]}.{split[1]}"
