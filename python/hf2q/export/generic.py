"""Llama-like checkpoints of the generic family in the converter's GGUF
layout (docs/CONVERT.md, "Generic family"): Llama and Mistral (GGUF
architecture ``llama``), Qwen3 (``qwen3``) and Qwen3-MoE (``qwen3moe``).

The converter's rules, restated:

- tensor names: ``model.embed_tokens`` -> ``token_embd``, ``model.norm`` ->
  ``output_norm``, ``lm_head`` -> ``output`` (absent when the checkpoint ties
  it to the embedding: llama.cpp then reads ``token_embd``), per layer
  ``input_layernorm`` -> ``attn_norm``, ``self_attn.{q,k,v,o}_proj`` ->
  ``attn_{q,k,v,output}``, ``self_attn.{q,k}_norm`` -> ``attn_{q,k}_norm``,
  ``post_attention_layernorm`` -> ``ffn_norm``, ``mlp.{gate,up,down}_proj``
  -> ``ffn_{gate,up,down}``, ``mlp.gate`` (the router) -> ``ffn_gate_inp``,
  the experts ``mlp.experts.<e>.{gate,up,down}_proj`` stacked (expert major)
  into ``ffn_{gate,up,down}_exps`` (written down, gate, up, once the layer's
  last expert tensor is read); a tensor with no GGUF name is refused;
- Llama / Mistral: the rows of ``q_proj`` (and its bias) are permuted per
  head from transformers' rotary layout (first half, second half) back to
  llama.cpp's (interleaved pairs): ``reshape(heads, 2, head_dim / 2, ...)``,
  swap the two middle axes; ``k_proj`` the same with the KV head count;
- types: 1-D tensors, ``*_norm.weight``, routers and biases F32; the rest
  the ``--outtype``; for ``q8_0`` a tensor whose rows are not whole 32-value
  blocks F16 (the converter's fallback);
- FP8 checkpoints (``quantization_config``: ``fp8`` with or without
  ``weight_block_size``, compressed-tensors ``float-quantized``): each FP8
  weight is decoded with its scale (``weight.float() * scale.float()``, the
  scale repeated over its block), as the converter's ``dequant_model`` does,
  then converted as any weight; the scale tensors (``*_scale_inv``,
  ``*.weight_scale``) and activation scales are not tensors of the file. FP8
  weights without a ``quantization_config`` and without scales are cast to
  F32 exactly, as the converter casts them.

``recipe`` (llama-quantize's file types, :mod:`hf2q.recipes`): the plan of
the converter's ``--outtype bf16`` file with each tensor's type chosen as
``llama-quantize`` chooses it from that file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import formats
from ..models.generic.names import GLOBAL_NAMES, LAYER_NAMES, expert_of, split_block
from ..plan import LoadPlan, Piece, TensorPlan
from . import metadata as md

__all__ = ["ARCHITECTURES", "gguf_architecture", "plan_generic_gguf", "write_kv", "write_tokenizer", "GenericGGUF",
           "OPTIONS"]

#: The options the generic family's GGUF writer takes (``hf2q convert``).
OPTIONS = ("recipe",)
#: FP8 formats read without a scale (no ``quantization_config``): cast to F32 exactly, as the converter does.
_BARE_FP8 = ("f8_e4m3", "f8_e5m2")

#: config.json ``architectures[0]`` -> GGUF architecture (the converter's class for it).
ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3",
                 "Qwen3MoeForCausalLM": "qwen3moe"}
#: Q/K rows permuted back to llama.cpp's rotary layout (the converter's LlamaModel).
_PERMUTE = {"llama"}
#: transformers' defaults for the hyper-parameters the converter writes, where config.json omits them.
_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
              "intermediate_size": 11008},
    "qwen3": {"max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "head_dim": 128,
              "intermediate_size": 22016},
    "qwen3moe": {"max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "head_dim": 128,
                 "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts_per_tok": 8,
                 "num_local_experts": 128},
}
_MISTRAL_DEFAULTS = {"max_position_embeddings": 4096 * 32, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
                     "intermediate_size": 14336}



@dataclass
class GenericGGUF:
    """What the key/value and tokenizer writers need of a generic checkpoint."""

    architecture: str
    hparams: dict[str, Any]
    num_hidden_layers: int
    vocab_size: int


def _unsupported(msg: str) -> Exception:
    from . import UnsupportedModelError

    return UnsupportedModelError(msg)


def gguf_architecture(config: Mapping[str, Any] | None) -> str:
    """The GGUF architecture of a generic checkpoint, or
    :class:`~hf2q.export.UnsupportedModelError` naming what is supported."""
    archs = (config or {}).get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs else None
    if arch not in ARCHITECTURES:
        raise _unsupported(f"config.json: architecture {arch!r} has no GGUF conversion in hf2q (generic family: "
                           f"{', '.join(ARCHITECTURES)})")
    return ARCHITECTURES[arch]


def _hparams(config: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    arch = gguf_architecture(config)
    h = md.hparams(config)
    defaults = _MISTRAL_DEFAULTS if (config.get("architectures") or [None])[0] == "MistralForCausalLM" \
        else _DEFAULTS[arch]
    for k in ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size"):
        if not isinstance(h.get(k), int) or isinstance(h.get(k), bool) or h[k] <= 0:
            raise md.ConfigError(f"config.json: {k} must be a positive integer, got {h.get(k)!r}", key=k)
    if arch == "qwen3moe" and h.get("num_local_experts") is None and h.get("num_experts") is not None:
        # transformers' Qwen3MoeConfig maps num_experts (published configs: Qwen3-30B-A3B's) to
        # num_local_experts, which the converter then reads; the default below is for neither.
        h["num_local_experts"] = h["num_experts"]
    for k, v in defaults.items():
        if k == "rope_theta":
            continue
        if h.get(k) is None:
            h[k] = v
    if h.get("num_key_value_heads") is None:
        h["num_key_value_heads"] = h["num_attention_heads"]
    if arch == "llama" and h.get("head_dim") is None:
        h["head_dim"] = h["hidden_size"] // h["num_attention_heads"]
    rp = md.rope_parameters(h)
    if rp.get("rope_theta") is None:
        rp["rope_theta"] = defaults["rope_theta"]
    full = rp.get("full_attention", rp)
    if isinstance(full, Mapping) and full.get("rope_type") not in (None, "default", "linear", "yarn"):
        raise _unsupported(f"config.json: rope type {full.get('rope_type')!r} not supported by hf2q convert yet "
                           "(the converter generates a rope_freqs tensor for llama3)")
    h["_rope"] = rp
    return arch, h


def _dtype(gguf: str, shape: tuple[int, ...], outtype: str) -> str:
    if len(shape) <= 1 or gguf.endswith("_norm.weight") or gguf.endswith("ffn_gate_inp.weight") \
            or not gguf.endswith(".weight"):
        return "f32"
    if outtype == "q8_0" and shape[-1] % 32:
        return "f16"  # the converter: "falling back to F16"
    return outtype


def _permute(heads: int, shape: tuple[int, ...]) -> Any:
    def f(arrays: list[np.ndarray]) -> np.ndarray:
        w = np.asarray(arrays[0], dtype=np.float32)
        return (w.reshape(heads, 2, shape[0] // heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape))

    return f


def _scaled(ckpt: Any, config: Mapping[str, Any], arch: str) -> Any:
    """The checkpoint's FP8 weights paired with their scales, as the generic
    loader pairs them (:func:`hf2q.models._quant.scaled_tensors`; typed errors
    for a scale missing, of the wrong dtype or shape, an unsupported
    ``quantization_config``); MXFP4 (gpt-oss's scheme) is refused."""
    from ..models._quant import quant_scheme, scaled_tensors, unconfigured_error, unconfigured_scales

    scheme = quant_scheme(config, str(ckpt.directory / "config.json"))
    if scheme is not None and scheme.method == "mxfp4":
        raise _unsupported(f"{ckpt.location}: MXFP4 weights (quantization_config.quant_method 'mxfp4', gpt-oss's "
                           f"scheme) in a {arch} checkpoint: hf2q convert writes MXFP4 only as gpt-oss's "
                           "converter does, and has no gpt-oss GGUF writer")
    scaled = scaled_tensors(ckpt, scheme)
    if scheme is None:  # (a stated scheme refuses an FP8 weight it leaves unpaired: scaled_tensors)
        unconf = unconfigured_scales(ckpt, scaled)
        if unconf:
            raise unconfigured_error(ckpt, unconf, scheme, "hf2q convert")
    return scaled


def plan_generic_gguf(ckpt: Any, config: Mapping[str, Any], outtype: str,
                      options: dict[str, Any]) -> tuple[LoadPlan, GenericGGUF]:
    """The GGUF tensors of a Llama / Mistral / Qwen3 / Qwen3-MoE checkpoint
    for ``outtype`` (``f32``, ``bf16`` or ``q8_0``), in the converter's
    per-tensor order (the file's order is :func:`~hf2q.export.order.converter_order`).
    ``options``: ``recipe`` (module doc)."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise TypeError(f"the generic family's GGUF conversion takes no option(s) {', '.join(unknown)}")
    recipe = options.get("recipe")
    if recipe is not None:
        return _recipe_plan(ckpt, config, recipe)
    arch, h = _hparams(config)
    scaled = _scaled(ckpt, config, arch)
    n_head, n_kv = h["num_attention_heads"], h["num_key_value_heads"]
    entries: list[TensorPlan] = []
    experts: dict[int, dict[str, dict[int, tuple[str, str, tuple[int, ...], Any]]]] = {}
    for name in ckpt.keys():
        info = ckpt[name]
        src = formats.from_safetensors(info.dtype).name
        shape = tuple(int(d) for d in info.shape)
        if name.endswith(".rotary_emb.inv_freq"):
            continue  # the converter drops it
        if name in scaled.consumed or name in scaled.dropped:
            continue  # a weight's scale (applied to it) or an activation scale: no tensor of the file
        scale = scaled.scales.get(name)
        if scale is None and src not in ("f32", "f16", "bf16", *_BARE_FP8):
            raise _unsupported(f"{name}: dtype {info.dtype} (hf2q convert reads F32 / F16 / BF16 checkpoints and "
                               "FP8 ones: F8_E4M3 / F8_E5M2 with their scales as quantization_config states them, "
                               "or without any)")
        group = None
        if name in GLOBAL_NAMES:
            gguf = GLOBAL_NAMES[name]
        else:
            split = split_block(name)
            rest = split[1] if split else ""
            if split and (e := expert_of(rest, mixtral=False)):
                experts.setdefault(split[0], {}).setdefault(e[1], {})[e[0]] = (name, src, shape, scale)
                continue
            if not split or rest not in LAYER_NAMES:
                raise _unsupported(f"{ckpt.location}: tensor {name} has no GGUF name in the {arch} layout "
                                   "(hf2q convert, generic family)")
            group = split[0]
            gguf = f"blk.{group}.{LAYER_NAMES[rest]}"
        transform = None
        if arch in _PERMUTE and name.endswith(("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias")):
            heads = n_head if ".q_proj." in name else n_kv
            if shape[0] % (2 * heads):
                raise md.ConfigError(f"{name}: {shape[0]} rows are not {heads} heads of an even size",
                                     key="num_attention_heads")
            transform = _permute(heads, shape)
        entries.append(TensorPlan(gguf, shape, _dtype(gguf, shape, outtype), (Piece(name, src, shape, scale=scale),),
                                  transform=transform, group=group, kind="fp8" if scale is not None else ""))
    n_exp = h.get("num_local_experts", h.get("num_experts"))
    for b, projs in sorted(experts.items()):
        for proj in ("down", "gate", "up"):
            got = projs.get(proj, {})
            if not isinstance(n_exp, int) or sorted(got) != list(range(n_exp)):
                raise _unsupported(f"{ckpt.location}: layer {b} has experts {sorted(got)} of {proj}_proj, "
                                   f"config.json says {n_exp}")
            shapes = {s for _, _, s, _ in got.values()}
            if len(shapes) != 1:
                raise _unsupported(f"{ckpt.location}: layer {b} {proj}_proj experts differ in shape")
            shape = shapes.pop()
            numel = formats.numel(shape)
            pieces = tuple(Piece(got[x][0], got[x][1], shape, dest_offset=x * numel, scale=got[x][3])
                           for x in range(n_exp))
            gguf = f"blk.{b}.ffn_{proj}_exps.weight"
            out_shape = (n_exp, *shape)
            entries.append(TensorPlan(gguf, out_shape, _dtype(gguf, out_shape, outtype), pieces, group=b,
                                      kind="expert"))
    cfg = GenericGGUF(arch, h, h["num_hidden_layers"], h["vocab_size"])
    extra: dict[str, Any] = {"architecture": arch}
    if scaled.scheme is not None:
        extra["quantization"] = scaled.scheme.describe()
    return LoadPlan("generic", entries, cfg, skipped=tuple(sorted(scaled.consumed | scaled.dropped)),
                    extra=extra), cfg


def _recipe_plan(ckpt: Any, config: Mapping[str, Any], recipe: str) -> tuple[LoadPlan, GenericGGUF]:
    """The converter's ``--outtype bf16`` plan with each tensor's type as
    llama-quantize chooses it for ``recipe`` from that file: by GGUF name and
    shape, the block count, the expert count (``expert_count``, 0 for a dense
    model) and llama.cpp's 70B rule (a ``llama`` of 80 blocks, not 8 experts,
    whose KV heads are fewer than its heads)."""
    from ..recipes import ModelFacts, apply_recipe

    plan, cfg = plan_generic_gguf(ckpt, config, "bf16", {})
    h = cfg.hparams
    n_expert = md._find(h, ["num_local_experts", "num_experts", "n_routed_experts"])
    n_expert = n_expert if isinstance(n_expert, int) and not isinstance(n_expert, bool) else 0
    # llama.cpp's models/llama.cpp: 80 blocks, not 8 experts, grouped-query attention -> LLM_TYPE_70B.
    is_70b = (cfg.architecture == "llama" and cfg.num_hidden_layers == 80 and n_expert != 8
              and h["num_key_value_heads"] != h["num_attention_heads"])
    return apply_recipe(plan, recipe, ModelFacts(cfg.num_hidden_layers, n_expert, is_70b)), cfg


def write_kv(kv: md.KVList, config: Mapping[str, Any], cfg: GenericGGUF, outtype: str) -> None:
    """The converter's hyper-parameters: the base keys, then for ``llama``
    the vocabulary size and rotary dimension, for ``qwen3moe`` the expert
    feed-forward lengths."""
    h = cfg.hparams
    md.text_model(kv, h, h["_rope"], cfg.num_hidden_layers, outtype)
    if cfg.architecture == "llama":
        kv.u32("{arch}.vocab_size", h["vocab_size"])
        kv.u32("{arch}.rope.dimension_count", h["head_dim"])
    elif cfg.architecture == "qwen3moe":
        if (v := h.get("moe_intermediate_size")) is not None:
            kv.u32("{arch}.expert_feed_forward_length", v)
        if (v := h.get("shared_expert_intermediate_size")) is not None:
            kv.u32("{arch}.expert_shared_feed_forward_length", v)


def write_tokenizer(kv: md.KVList, directory: Path, cfg: GenericGGUF) -> str:
    """A byte-level BPE (``gpt2``) vocabulary, as the converter writes one
    for these architectures; SentencePiece (``tokenizer.model``) and
    byte-fallback BPE vocabularies (the converter's ``llama`` vocabulary) are
    refused for now."""
    from .vocab import TokenizerError, _read_json, cross_check, gpt2_vocab  # noqa: F401

    if (directory / "tokenizer.model").is_file():
        raise TokenizerError(f"{directory / 'tokenizer.model'}: SentencePiece vocabularies are not written by "
                             "hf2q convert yet (the converter reads this file first)", key="tokenizer.model")
    tok = _read_json(directory / "tokenizer.json")
    model = tok.get("model") if isinstance(tok, Mapping) else None
    if isinstance(model, Mapping) and model.get("type") == "BPE" and model.get("byte_fallback", False):
        raise TokenizerError(f"{directory / 'tokenizer.json'}: a byte-fallback BPE vocabulary (the converter's "
                             "'llama' vocabulary) is not written by hf2q convert yet", key="model")
    if cfg.architecture == "llama":
        # the converter's LlamaModel writes the tokenizer's add_prefix_space first
        tcfg_path = directory / "tokenizer_config.json"
        tcfg = _read_json(tcfg_path) if tcfg_path.is_file() else None
        if isinstance(tcfg, Mapping) and isinstance(tcfg.get("add_prefix_space"), bool):
            kv.set("tokenizer.ggml.add_space_prefix", md.T.BOOL, tcfg["add_prefix_space"])
        if cfg.vocab_size in (32016, 49152):
            raise TokenizerError(f"{directory}: vocab_size {cfg.vocab_size} (the converter's special cases for "
                                 "CodeLlama / SmolLM) not supported", key="vocab_size")
    checked = gpt2_vocab(kv, directory, cfg.vocab_size)
    pre = next(k.value for k in kv.items() if k.key == "tokenizer.ggml.pre")
    return f"gpt2 (pre-tokenizer {pre}; fingerprint {checked})"
