"""Synthetic Qwen3.5/3.6 MoE checkpoints with real Hugging Face naming.

``make_qwen35_moe_checkpoint(dir, config="tiny" | "bench", ...)`` writes
``config.json`` and safetensors the way HF checkpoints look:

- text-only (``Qwen3_5MoeForCausalLM``): ``model.layers.*``, ``model.embed_tokens``,
  ``model.norm``, ``lm_head``; multimodal (``Qwen3_5MoeForConditionalGeneration``):
  ``model.language_model.*`` with the config under ``text_config``, plus a few
  ``model.visual.*`` tensors;
- ``mtp.*`` (``mtp.layers.0.*``, ``mtp.fc``, ``mtp.pre_fc_norm_{embedding,hidden}``,
  ``mtp.norm``) when the config has MTP;
- experts per expert (``mlp.experts.{e}.{gate,up,down}_proj.weight``) or fused
  (``mlp.experts.gate_up_proj`` [E, 2I, H], ``mlp.experts.down_proj`` [E, H, I]);
- ``linear_attn.*`` with ``A_log`` in F32 (as real checkpoints), ``conv1d.weight``
  [C, 1, K]; everything else BF16.

Values are deterministic per (seed, tensor): every tensor — every single expert
— draws from its own generator keyed by its text-only HF name, so the fused and
per-expert layouts (and the multimodal / sharded variants) of one seed hold the
same weights; fused ``gate_up_proj[e]`` is ``concat(gate_e, up_e)``.

Configs:

- ``"tiny"``: H=64, 4 layers (3 linear + 1 full), 1 MTP layer, E=4, I=32;
  nk=2, nv=6 (r=3 != nk, so the V-head reorder is exercised and nk/r cannot be
  confused), dk=32, dv=64. Every quantized row length is a multiple of 32.
- ``"bench"``: the real Qwen3.6-35B-A3B per-layer shapes (H=2048, E=256, I=512,
  Is=512, nh=16, nkv=2, hd=256, nk=16, nv=32, dk=dv=128, K=4) for two layers
  (0 linear, 1 full) and no MTP, with a **4096-token vocabulary** instead of
  248,320 to keep the file small (~3.3 GB, almost all experts). Written tensor
  by tensor (expert by expert), so peak memory stays at a few MiB.

A config may also be a dict of text-config fields (``text_config`` style).
"""

from __future__ import annotations

import dataclasses
import json
import os
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from .. import formats

__all__ = [
    "make_qwen35_moe_checkpoint",
    "qwen35_config_dict",
    "checkpoint_tensor_specs",
    "read_checkpoint_arrays",
    "TINY_TEXT_CONFIG",
    "BENCH_TEXT_CONFIG",
    "QWEN36_35B_A3B_TEXT_CONFIG",
]

_ROPE_REAL = {
    "mrope_interleaved": True,
    "mrope_section": [11, 11, 10],
    "rope_type": "default",
    "rope_theta": 10000000,
    "partial_rotary_factor": 0.25,
}

# The text fields of Qwen3.6-35B-A3B's published config.json (docs/QWEN35MOE.md).
QWEN36_35B_A3B_TEXT_CONFIG: dict[str, Any] = {
    "model_type": "qwen3_5_moe_text",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_output_gate": True,
    "dtype": "bfloat16",
    "eos_token_id": 248044,
    "full_attention_interval": 4,
    "head_dim": 256,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(40)],
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_value_head_dim": 128,
    "max_position_embeddings": 262144,
    "mamba_ssm_dtype": "float32",
    "moe_intermediate_size": 512,
    "mtp_num_hidden_layers": 1,
    "mtp_use_dedicated_embeddings": False,
    "num_attention_heads": 16,
    "num_experts": 256,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 40,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "router_aux_loss_coef": 0.001,
    "shared_expert_intermediate_size": 512,
    "use_cache": True,
    "vocab_size": 248320,
    "rope_parameters": dict(_ROPE_REAL),
}

TINY_TEXT_CONFIG: dict[str, Any] = {
    "model_type": "qwen3_5_moe_text",
    "attn_output_gate": True,
    "full_attention_interval": 4,
    "head_dim": 32,
    "hidden_act": "silu",
    "hidden_size": 64,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 6,
    "linear_value_head_dim": 64,
    "max_position_embeddings": 4096,
    "moe_intermediate_size": 32,
    "mtp_num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 4,
    "num_key_value_heads": 1,
    "rms_norm_eps": 1e-06,
    "shared_expert_intermediate_size": 32,
    "tie_word_embeddings": False,
    "vocab_size": 256,
    # rotary_dim = int(32 * 0.25) = 8 -> sections sum to 4
    "rope_parameters": {"mrope_interleaved": True, "mrope_section": [2, 1, 1], "rope_type": "default",
                        "rope_theta": 10000000, "partial_rotary_factor": 0.25},
}

BENCH_TEXT_CONFIG: dict[str, Any] = {
    **{k: v for k, v in QWEN36_35B_A3B_TEXT_CONFIG.items()},
    "num_hidden_layers": 2,
    "layer_types": ["linear_attention", "full_attention"],
    "full_attention_interval": 2,
    "mtp_num_hidden_layers": 0,
    "vocab_size": 4096,  # real: 248320 (kept small on purpose)
}

_CONFIGS = {"tiny": TINY_TEXT_CONFIG, "bench": BENCH_TEXT_CONFIG}

_VISION_CONFIG = {"model_type": "qwen3_5_moe_vision", "depth": 1, "hidden_size": 16, "num_heads": 2,
                  "in_channels": 3, "patch_size": 4, "temporal_patch_size": 2, "spatial_merge_size": 2,
                  "intermediate_size": 32}


def _text_config(config: str | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(config, str):
        try:
            return json.loads(json.dumps(_CONFIGS[config]))
        except KeyError:
            from ..errors import ConfigError

            raise ConfigError(f"unknown config {config!r}; expected one of {sorted(_CONFIGS)} or a dict",
                              key="config") from None
    return json.loads(json.dumps(dict(config)))


def qwen35_config_dict(config: str | Mapping[str, Any] = "tiny", *, multimodal: bool = False) -> dict[str, Any]:
    """The ``config.json`` object written for ``config`` (text-only or wrapped)."""
    text = _text_config(config)
    if not multimodal:
        return {"architectures": ["Qwen3_5MoeForCausalLM"], **text, "model_type": "qwen3_5_moe_text"}
    vision = dict(_VISION_CONFIG, out_hidden_size=text["hidden_size"])
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "image_token_id": 248056,
        "video_token_id": 248057,
        "vision_start_token_id": 248053,
        "vision_end_token_id": 248054,
        "tie_word_embeddings": bool(text.get("tie_word_embeddings", False)),
        "text_config": {**text, "model_type": "qwen3_5_moe_text"},
        "vision_config": vision,
    }


# --------------------------------------------------------------------------- tensor layout
@dataclass(frozen=True)
class _T:
    name: str  # as written
    dtype: str  # "BF16" | "F32"
    shape: tuple[int, ...]
    key: str  # generator key (text-only name)
    dist: str
    # fused experts: the per-expert keys, concatenated along axis 1 for each expert
    expert_keys: tuple[tuple[str, ...], ...] | None = None
    # FP8 (fp8_block): the block of the weight's scale grid; scale: this is the
    # weight's <name>_scale_inv (BF16), computed from the same values
    fp8: tuple[int, int] | None = None
    scale: bool = False
    src_shape: tuple[int, ...] | None = None  # a scale's weight shape (its values' shape)


def _as_fp8(items: list[_T], block: tuple[int, int]) -> list[_T]:
    """The layout as Qwen's -FP8 repos store it (docs/FP8.md): each matrix the
    quantizers convert becomes F8_E4M3 with a BF16 ``_scale_inv``; the rest
    (embeddings, lm_head, norms, routers, conv1d, in_proj_a/b, ...) stays."""
    from .fp8_checkpoint import keeps_bf16

    out: list[_T] = []
    for t in items:
        if t.expert_keys is not None or t.dtype != "BF16" or keeps_bf16(t.name, t.shape):
            out.append(t)
            continue
        rows, cols = t.shape
        grid = (-(-rows // block[0]), -(-cols // block[1]))
        out.append(dataclasses.replace(t, dtype="F8_E4M3", fp8=block))
        out.append(dataclasses.replace(t, name=t.name + "_scale_inv", shape=grid, fp8=block, scale=True,
                                       src_shape=t.shape))
    return out


def _layout(text: Mapping[str, Any], *, fused_gate_up: bool, multimodal: bool, mtp: bool) -> list[_T]:
    H, L, V = text["hidden_size"], text["num_hidden_layers"], text["vocab_size"]
    nh, nkv, hd = text["num_attention_heads"], text["num_key_value_heads"], text["head_dim"]
    nk, nv = text["linear_num_key_heads"], text["linear_num_value_heads"]
    dk, dv, K = text["linear_key_head_dim"], text["linear_value_head_dim"], text["linear_conv_kernel_dim"]
    E, I, Is = text["num_experts"], text["moe_intermediate_size"], text["shared_expert_intermediate_size"]
    C = 2 * nk * dk + nv * dv
    gate = text.get("attn_output_gate", True)
    interval = text.get("full_attention_interval", 4)
    kinds = text.get("layer_types") or [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(L)
    ]
    n_mtp = text.get("mtp_num_hidden_layers", 0) if mtp else 0
    base = "model.language_model." if multimodal else "model."
    out: list[_T] = []

    def add(name: str, shape: tuple[int, ...], dist: str, dtype: str = "BF16", key: str | None = None) -> None:
        out.append(_T(name, dtype, tuple(shape), key or name, dist))

    def layer(prefix: str, key_prefix: str, kind: str) -> None:
        def a(suffix: str, shape: tuple[int, ...], dist: str, dtype: str = "BF16") -> None:
            add(prefix + suffix, shape, dist, dtype, key_prefix + suffix)

        a("input_layernorm.weight", (H,), "zc_norm")
        a("post_attention_layernorm.weight", (H,), "zc_norm")
        if kind == "full_attention":
            a("self_attn.q_proj.weight", ((2 if gate else 1) * nh * hd, H), "w")
            a("self_attn.k_proj.weight", (nkv * hd, H), "w")
            a("self_attn.v_proj.weight", (nkv * hd, H), "w")
            a("self_attn.o_proj.weight", (H, nh * hd), "w")
            a("self_attn.q_norm.weight", (hd,), "zc_norm")
            a("self_attn.k_norm.weight", (hd,), "zc_norm")
        else:
            a("linear_attn.in_proj_qkv.weight", (C, H), "w")
            a("linear_attn.in_proj_z.weight", (nv * dv, H), "w")
            a("linear_attn.in_proj_a.weight", (nv, H), "w")
            a("linear_attn.in_proj_b.weight", (nv, H), "w")
            a("linear_attn.A_log", (nv,), "a_log", "F32")
            a("linear_attn.dt_bias", (nv,), "dt_bias")
            a("linear_attn.conv1d.weight", (C, 1, K), "conv")
            a("linear_attn.norm.weight", (dv,), "norm")
            a("linear_attn.out_proj.weight", (H, nv * dv), "w")
        a("mlp.gate.weight", (E, H), "w")
        a("mlp.shared_expert_gate.weight", (1, H), "w")
        a("mlp.shared_expert.gate_proj.weight", (Is, H), "w")
        a("mlp.shared_expert.up_proj.weight", (Is, H), "w")
        a("mlp.shared_expert.down_proj.weight", (H, Is), "w")
        ek = key_prefix + "mlp.experts."
        if fused_gate_up:
            out.append(_T(prefix + "mlp.experts.gate_up_proj", "BF16", (E, 2 * I, H), ek + "gate_up_proj", "w",
                          tuple((f"{ek}{e}.gate_proj.weight", f"{ek}{e}.up_proj.weight") for e in range(E))))
            out.append(_T(prefix + "mlp.experts.down_proj", "BF16", (E, H, I), ek + "down_proj", "w",
                          tuple((f"{ek}{e}.down_proj.weight",) for e in range(E))))
        else:
            for e in range(E):
                for p, shape in (("gate", (I, H)), ("up", (I, H)), ("down", (H, I))):
                    a(f"mlp.experts.{e}.{p}_proj.weight", shape, "w")

    add(base + "embed_tokens.weight", (V, H), "w", key="model.embed_tokens.weight")
    for b in range(L):
        layer(f"{base}layers.{b}.", f"model.layers.{b}.", kinds[b])
    add(base + "norm.weight", (H,), "zc_norm", key="model.norm.weight")
    add("lm_head.weight", (V, H), "w")
    for i in range(n_mtp):
        layer(f"mtp.layers.{i}.", f"mtp.layers.{i}.", "full_attention")
    if n_mtp:
        add("mtp.fc.weight", (H, 2 * H), "w")
        add("mtp.pre_fc_norm_embedding.weight", (H,), "zc_norm")
        add("mtp.pre_fc_norm_hidden.weight", (H,), "zc_norm")
        add("mtp.norm.weight", (H,), "zc_norm")
    if multimodal:
        vh = _VISION_CONFIG["hidden_size"]
        add("model.visual.patch_embed.proj.weight", (vh, 3, 2, 4, 4), "w")
        add("model.visual.blocks.0.norm1.weight", (vh,), "norm")
        add("model.visual.blocks.0.attn.qkv.weight", (3 * vh, vh), "w")
        add("model.visual.merger.linear_fc2.weight", (H, 4 * vh), "w")
    return out


def checkpoint_tensor_specs(
    config: str | Mapping[str, Any] = "tiny",
    *,
    fused_gate_up: bool = False,
    multimodal: bool = False,
    mtp: bool = True,
) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (dtype, shape) of the checkpoint :func:`make_qwen35_moe_checkpoint`
    would write (no file, no values). Works for any config, including
    :data:`QWEN36_35B_A3B_TEXT_CONFIG`."""
    text = _text_config(config)
    return {t.name: (t.dtype, t.shape) for t in _layout(text, fused_gate_up=fused_gate_up,
                                                          multimodal=multimodal, mtp=mtp)}


# --------------------------------------------------------------------------- values
def _values(seed: int, key: str, shape: tuple[int, ...], dist: str) -> np.ndarray:
    """float32 values of one tensor (or one expert), from its own generator."""
    rng = np.random.default_rng([seed, zlib.crc32(key.encode())])
    if dist == "w":
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
    if dist == "zc_norm":
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(0.1)
    if dist == "norm":
        return np.float32(1.0) + rng.standard_normal(shape, dtype=np.float32) * np.float32(0.1)
    if dist == "a_log":
        return np.log(rng.uniform(1.0, 16.0, shape)).astype(np.float32)
    if dist == "dt_bias":
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(0.5)
    if dist == "conv":
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(0.3)
    raise AssertionError(dist)


def _cast(x: np.ndarray, dtype: str) -> np.ndarray:
    return x.astype(ml_dtypes.bfloat16) if dtype == "BF16" else x.astype(np.float32)


def _chunks(t: _T, seed: int) -> Iterator[np.ndarray]:
    """The tensor's bytes in C order, as a sequence of arrays (one expert at a time)."""
    if t.fp8 is not None:
        from .fp8_checkpoint import quantize_fp8

        w, sc = quantize_fp8(_values(seed, t.key, t.src_shape or t.shape, t.dist), block=t.fp8, scale_dtype="bf16")
        yield sc if t.scale else w
        return
    if t.expert_keys is None:
        yield _cast(_values(seed, t.key, t.shape, t.dist), t.dtype)
        return
    rows = t.shape[1] // len(t.expert_keys[0])
    for keys in t.expert_keys:
        for k in keys:
            yield _cast(_values(seed, k, (rows, t.shape[2]), t.dist), t.dtype)


def _itemsize(code: str) -> int:
    return formats.from_safetensors(code).itemsize


def _nbytes(t: _T) -> int:
    return formats.nbytes(t.shape, t.dtype)


def _write_safetensors(path: Path, items: list[_T], chunks: Callable[[_T], Iterator[np.ndarray]]) -> None:
    """Stream a safetensors file: header first, then each tensor chunk by chunk.
    Layout as the reference writer: by descending dtype size, then name; header
    padded with spaces to a multiple of 8."""
    order = sorted(items, key=lambda t: (-_itemsize(t.dtype), t.name))
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    off = 0
    for t in order:
        n = _nbytes(t)
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(len(hb).to_bytes(8, "little"))
        f.write(hb)
        for t in order:
            written = 0
            for c in chunks(t):
                c = np.ascontiguousarray(c)
                f.write(c.reshape(-1).view(np.uint8).data)
                written += c.nbytes
            if written != _nbytes(t):  # pragma: no cover - generator bug
                raise AssertionError(f"{t.name}: wrote {written} bytes, expected {_nbytes(t)}")
    os.replace(tmp, path)


def make_qwen35_moe_checkpoint(
    dir: str | os.PathLike[str],
    config: str | Mapping[str, Any] = "tiny",
    seed: int = 0,
    fused_gate_up: bool = False,
    sharded: bool = False,
    multimodal: bool = False,
    *,
    mtp: bool = True,
    num_shards: int = 3,
    fp8_block: tuple[int, int] | None = None,
) -> Path:
    """Write a synthetic Qwen3.5/3.6 MoE checkpoint into ``dir`` (created if
    needed) and return its path.

    ``config``: ``"tiny"``, ``"bench"`` or a dict of text-config fields.
    ``fused_gate_up``: experts as ``experts.gate_up_proj``/``experts.down_proj``
    instead of per-expert tensors. ``sharded``: ``num_shards`` files plus
    ``model.safetensors.index.json`` instead of one ``model.safetensors``.
    ``multimodal``: ``text_config`` wrapper, ``model.language_model.*`` names and
    a few ``model.visual.*`` tensors. ``mtp=False`` leaves out the ``mtp.*``
    tensors (the config still declares them, as in a transformers re-save).
    ``fp8_block`` (e.g. ``(128, 128)``): the checkpoint as Qwen's ``-FP8``
    repos store it (per-expert experts only): matrices in F8_E4M3 with BF16
    ``_scale_inv`` blocks, quantized as :mod:`hf2q.testing.fp8_checkpoint`
    does, and their ``quantization_config``. A bad config raises before
    anything is written (``ValueError`` for an unknown preset,
    :class:`hf2q.ConfigError` naming the key for bad fields).
    """
    out = Path(dir)
    text = _text_config(config)
    cfg = qwen35_config_dict(text, multimodal=multimodal)
    # The loader's own parser first: a bad config is a typed ConfigError naming
    # the key (as the Gemma 4 and DFlash makers raise), before anything is written.
    from ..errors import ConfigError
    from ..models.qwen35.config import Qwen35Config

    Qwen35Config.from_dict(cfg, source=str(out / "config.json"))
    try:
        items = _layout(text, fused_gate_up=fused_gate_up, multimodal=multimodal, mtp=mtp)
    except KeyError as e:  # a field the parser defaults but the layout needs
        raise ConfigError(f"{out / 'config.json'}: {e.args[0]} is missing", key=str(e.args[0])) from None
    if fp8_block is not None:
        if fused_gate_up:
            raise ValueError("fp8_block: the FP8 form has per-expert experts (fused_gate_up=False)")
        items = _as_fp8(items, tuple(fp8_block))  # type: ignore[arg-type]
        cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                      "weight_block_size": list(fp8_block)}
    out.mkdir(parents=True, exist_ok=True)  # a bad config failed above: no empty folder left
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")

    def gen(t: _T) -> Iterator[np.ndarray]:
        return _chunks(t, seed)

    if not sharded:
        _write_safetensors(out / "model.safetensors", items, gen)
        return out
    by_name = sorted(items, key=lambda t: t.name)
    n = max(1, min(num_shards, len(by_name)))
    bounds = [len(by_name) * i // n for i in range(n + 1)]
    weight_map: dict[str, str] = {}
    for i in range(n):
        fname = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        part = by_name[bounds[i]:bounds[i + 1]]
        _write_safetensors(out / fname, part, gen)
        weight_map.update({t.name: fname for t in part})
    index = {"metadata": {"total_size": sum(_nbytes(t) for t in items)}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return out


def read_checkpoint_arrays(dir: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Every tensor of a (small) checkpoint as numpy arrays (BF16 as
    ``ml_dtypes.bfloat16``), via the ``safetensors`` package. For tests."""
    from safetensors import safe_open

    d = Path(dir)
    files = sorted(d.glob("*.safetensors"))
    arrays: dict[str, np.ndarray] = {}
    for f in files:
        with safe_open(str(f), framework="numpy") as sf:
            for k in sf.keys():
                arrays[k] = sf.get_tensor(k)
    return arrays
