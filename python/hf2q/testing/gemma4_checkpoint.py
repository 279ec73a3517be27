"""Synthetic Gemma 4 checkpoints with real HF naming and any shapes (tests,
benchmarks): ``config.json`` as transformers writes it for
``Gemma4ForCausalLM`` or the multimodal wrapper, one BF16 safetensors file
with every tensor the config implies (the layout of docs/GEMMA4.md), an
optional ``tokenizer.json`` holding a token count.

Values are normal(0, 0.02) for matrices and 1 + normal(0, 0.1) for 1-D
tensors, all BF16. Large tensors are written in chunks cut from one pool of
random values, so multi-GB real-shape checkpoints take seconds to write."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

import ml_dtypes
import numpy as np

from ..models.gemma4.config import Gemma4Config
from ..models.gemma4.plan import _layer_wants

__all__ = ["make_gemma4_checkpoint", "gemma4_tensor_shapes", "gemma4_config_dict", "GEMMA4_26B_A4B_TEXT_CONFIG",
           "TINY_TEXT_CONFIG", "PRESETS"]

#: gemma-4-26B-A4B-it's text config (docs/GEMMA4.md), published form.
GEMMA4_26B_A4B_TEXT_CONFIG: dict[str, Any] = {
    "model_type": "gemma4_text", "hidden_size": 2816, "num_hidden_layers": 30, "vocab_size": 262144,
    "intermediate_size": 2112, "moe_intermediate_size": 704, "num_experts": 128, "top_k_experts": 8,
    "enable_moe_block": True, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
    "global_head_dim": 512, "num_global_key_value_heads": 2, "attention_k_eq_v": True, "sliding_window": 1024,
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 5, "final_logit_softcapping": 30.0,
    "tie_word_embeddings": True, "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0,
    "use_double_wide_mlp": False, "rms_norm_eps": 1e-6, "max_position_embeddings": 262144,
    "hidden_activation": "gelu_pytorch_tanh", "attention_bias": False, "dtype": "bfloat16",
    "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                           "rope_theta": 1000000.0}},
}

#: A small MoE text config (2 layers, hidden 32, 4 experts, vocabulary 96,
#: tied): every tensor kind of the 26B-A4B layout at a size tests load in
#: milliseconds (the shapes of tests/data/gemma4/gemma4_moe_causal_lm).
TINY_TEXT_CONFIG: dict[str, Any] = {
    "model_type": "gemma4_text", "hidden_size": 32, "num_hidden_layers": 2, "vocab_size": 96,
    "intermediate_size": 32, "moe_intermediate_size": 32, "num_experts": 4, "top_k_experts": 2,
    "enable_moe_block": True, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 32,
    "global_head_dim": 64, "num_global_key_value_heads": 1, "attention_k_eq_v": True, "sliding_window": 64,
    "layer_types": ["sliding_attention", "full_attention"], "final_logit_softcapping": 30.0,
    "tie_word_embeddings": True, "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0,
    "use_double_wide_mlp": False, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
    "hidden_activation": "gelu_pytorch_tanh", "attention_bias": False, "dtype": "bfloat16",
    "rope_parameters": GEMMA4_26B_A4B_TEXT_CONFIG["rope_parameters"],
}

#: The presets :func:`make_gemma4_checkpoint` takes by name.
PRESETS: dict[str, dict[str, Any]] = {"tiny": TINY_TEXT_CONFIG, "gemma-4-26B-A4B": GEMMA4_26B_A4B_TEXT_CONFIG}

_POOL_ELEMS = 1 << 22


def gemma4_tensor_shapes(text_config: Mapping[str, Any], *, wrapper: bool = False,
                         lm_head: bool | None = None) -> dict[str, tuple[int, ...]]:
    """Checkpoint name -> shape of every text tensor the config implies
    (``lm_head``: write ``lm_head.weight``; default: when the config is untied)."""
    cfg = Gemma4Config.from_dict(dict(text_config))
    p = "model.language_model." if wrapper else "model."
    H, V = cfg.hidden_size, cfg.vocab_size
    out: dict[str, tuple[int, ...]] = {f"{p}embed_tokens.weight": (V, H)}
    if cfg.per_layer_input:
        LP = cfg.num_hidden_layers * cfg.hidden_size_per_layer_input
        out[f"{p}embed_tokens_per_layer.weight"] = (cfg.vocab_size_per_layer_input, LP)
        out[f"{p}per_layer_model_projection.weight"] = (LP, H)
        out[f"{p}per_layer_projection_norm.weight"] = (cfg.hidden_size_per_layer_input,)
    for ly in cfg.layers:
        for w in _layer_wants(cfg, ly):
            if w.required:
                out[p + w.hf.removeprefix("model.")] = w.shape
    out[f"{p}norm.weight"] = (H,)
    if lm_head if lm_head is not None else not cfg.tie_word_embeddings:
        out["lm_head.weight"] = (V, H)
    return out


def _pool(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal(_POOL_ELEMS, dtype=np.float32) * np.float32(0.02)).astype(ml_dtypes.bfloat16)
    n = (np.float32(1) + rng.standard_normal(_POOL_ELEMS, dtype=np.float32) * np.float32(0.1)).astype(
        ml_dtypes.bfloat16)
    return w.view(np.uint16), n.view(np.uint16)


def gemma4_config_dict(text_config: Mapping[str, Any], *, wrapper: bool = False) -> dict[str, Any]:
    """``config.json`` as transformers writes it for ``text_config``:
    ``Gemma4ForCausalLM``, or the multimodal wrapper (``wrapper``)."""
    text = dict(text_config)
    if wrapper:
        return {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
                "text_config": {**text, "model_type": "gemma4_text"}, "vision_config": None, "audio_config": None,
                "tie_word_embeddings": text.get("tie_word_embeddings", True)}
    return {"architectures": ["Gemma4ForCausalLM"], **text, "model_type": "gemma4_text"}


def make_gemma4_checkpoint(directory: str | os.PathLike[str], text_config: str | Mapping[str, Any] = "tiny", *,
                           wrapper: bool = False, seed: int = 0, lm_head: bool | None = None,
                           tokenizer_tokens: int | None = None) -> Path:
    """Write a Gemma 4 checkpoint for ``text_config`` into ``directory``
    (created if needed) and return its path. ``text_config``: a preset name
    of :data:`PRESETS` (``"tiny"``, ``"gemma-4-26B-A4B"``: full size, 51 GB)
    or a mapping of text-config fields. ``wrapper``: a
    ``Gemma4ForConditionalGeneration`` (text under ``text_config``, names
    under ``model.language_model.``); ``tokenizer_tokens``: also write a
    ``tokenizer.json`` with that many tokens. A bad config raises
    (:class:`hf2q.ConfigError`, a ``ValueError``, for an unknown preset or
    bad fields) before anything is written."""
    if isinstance(text_config, str):
        if text_config not in PRESETS:
            from ..errors import ConfigError

            raise ConfigError(f"unknown config {text_config!r}; expected one of {sorted(PRESETS)} or a mapping",
                              key="config")
        text_config = PRESETS[text_config]
    d = Path(directory)
    text = json.loads(json.dumps(dict(text_config)))  # a deep copy: the preset stays as it is
    shapes = gemma4_tensor_shapes(text, wrapper=wrapper, lm_head=lm_head)  # validates the config
    d.mkdir(parents=True, exist_ok=True)  # only now: a bad config leaves no empty folder behind
    (d / "config.json").write_text(json.dumps(gemma4_config_dict(text, wrapper=wrapper), indent=2) + "\n")
    if tokenizer_tokens is not None:
        tok = {"model": {"type": "BPE", "vocab": {f"t{i}": i for i in range(tokenizer_tokens)}, "merges": []},
               "added_tokens": []}
        (d / "tokenizer.json").write_text(json.dumps(tok) + "\n")

    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    off = 0
    names = sorted(shapes)
    for n in names:
        nb = 2 * int(np.prod(shapes[n], dtype=np.int64))
        header[n] = {"dtype": "BF16", "shape": list(shapes[n]), "data_offsets": [off, off + nb]}
        off += nb
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    w_pool, n_pool = _pool(seed)
    path = d / "model.safetensors"
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(len(hb).to_bytes(8, "little"))
        f.write(hb)
        for i, n in enumerate(names):
            pool = n_pool if len(shapes[n]) <= 1 else w_pool
            left = int(np.prod(shapes[n], dtype=np.int64))
            start = (i * 7919) % _POOL_ELEMS
            while left:
                k = min(left, _POOL_ELEMS - start)
                f.write(pool[start:start + k].data)
                left -= k
                start = 0
    os.replace(tmp, path)
    return d
