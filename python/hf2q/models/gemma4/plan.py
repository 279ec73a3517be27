"""Gemma 4 tensor plan: checkpoint names -> GGUF names, shapes and device
formats, as llama.cpp's ``convert_hf_to_gguf.py`` makes them (docs/GEMMA4.md).

Built from tensor metadata only (no byte read). Every checkpoint tensor is
either planned, skipped (vision / audio towers of the multimodal wrapper) or
reported; problems are collected and raised at once, with the class of the
first kind present: extra (names that map to nothing, a per-expert expert
form, a tensor given twice) -> missing -> dtype -> shape.

There is no arithmetic on weights: BF16/F16/F32 sources are copied, decoded
to F32 or quantized to Q8_0 by the native core on the way into their device
buffer. The only computed tensor is ``rope_freqs.weight``. The embedding may
lose trailing rows (the converter keeps as many rows as the tokenizer has
tokens).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
else:  # numpy on first use (hf2q._lazy)
    from ..._lazy import numpy as np

from ... import formats
from ..._files import read_capped
from ...errors import (
    ConfigError,
    DtypeMismatchError,
    ExtraTensorError,
    ManifestError,
    ManifestProblem,
    MissingTensorError,
    ShapeMismatchError,
    tensor_file,
)
from ...plan import CONVERT_DTYPES, LoadPlan, Piece, TensorPlan
from .._quant import scaled_tensors
from .._names import GLOBAL_NAMES, LAYER_NAMES, multimodal_filter, with_additions
from .config import Gemma4Config, Gemma4Layer

__all__ = ["plan_gemma4", "DEVICE_DTYPES", "SOURCE_FORMATS", "is_multimodal_tensor", "gguf_name",
           "device_dtype", "vocab_rows", "rope_freqs"]

DEVICE_DTYPES = CONVERT_DTYPES  # the device formats a dtype option offers (hf2q.plan)
SOURCE_FORMATS = ("bf16", "f16", "f32")

#: The converter's text-model filter: checkpoint names that are not the text
#: model (a multimodal wrapper's towers and projectors); the shared filter
#: with this family's "patch_merge_mlp.".
_MM_PREFIXES, _MM_PARTS = multimodal_filter(("patch_merge_mlp.",))

# Gemma 4's own names (the shared ones: hf2q.models._names). Per layer:
# suffix after "model.layers.{b}." -> suffix after "blk.{b}.".
_LAYER_NAMES: dict[str, str] = with_additions(LAYER_NAMES, {
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "layer_scalar": "layer_output_scale.weight",
    "router.proj.weight": "ffn_gate_inp.weight",
    "router.scale": "ffn_gate_inp.scale",
    "router.per_expert_scale": "ffn_down_exps.scale",
    "experts.gate_up_proj": "ffn_gate_up_exps.weight",
    "experts.down_proj": "ffn_down_exps.weight",
    "pre_feedforward_layernorm_2.weight": "pre_ffw_norm_2.weight",
    "post_feedforward_layernorm_1.weight": "post_ffw_norm_1.weight",
    "post_feedforward_layernorm_2.weight": "post_ffw_norm_2.weight",
    "per_layer_input_gate.weight": "inp_gate.weight",
    "per_layer_projection.weight": "proj.weight",
    "post_per_layer_input_norm.weight": "post_norm.weight",
})
_GLOBAL_NAMES: dict[str, str] = with_additions(GLOBAL_NAMES, {
    "model.embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
    "model.per_layer_model_projection.weight": "per_layer_model_proj.weight",
    "model.per_layer_projection_norm.weight": "per_layer_proj_norm.weight",
})
_EXPERT_GGUF = ("ffn_gate_up_exps.weight", "ffn_down_exps.weight")
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)\Z")
_PER_EXPERT_RE = re.compile(r"^experts\.\d+\.")

_TOKENIZER_CAP = 256 << 20  # real tokenizer.json files are tens of MB


def is_multimodal_tensor(name: str) -> bool:
    """A tensor the converter's text model drops (vision / audio parts)."""
    n = name.replace("language_model.", "")
    if n.startswith(("model.vision_tower", "model.embed_vision", "model.audio_tower", "model.embed_audio")):
        return True
    return n.startswith(_MM_PREFIXES) or any(p in n for p in _MM_PARTS)


def _canonical(name: str) -> str:
    """The converter's prefix rule: every ``language_model.`` is removed."""
    return name.replace("language_model.", "")


def gguf_name(name: str) -> str | None:
    """GGUF name of a (canonical) checkpoint name; None when it maps to nothing."""
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    m = _LAYER_RE.match(name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"blk.{int(m.group(1))}.{_LAYER_NAMES[m.group(2)]}"
    return None


def device_dtype(gguf: str, shape: tuple[int, ...], dense_dtype: str, expert_dtype: str) -> str:
    """The device format llama.cpp's converter picks for a tensor, with the
    expert stacks under ``expert_dtype`` and every other quantizable tensor
    under ``dense_dtype`` (docs/GEMMA4.md, "Device formats")."""
    suffix = gguf.split(".", 2)[-1] if gguf.startswith("blk.") else gguf
    if len(shape) <= 1 or gguf.endswith("_norm.weight") or not gguf.endswith(".weight") \
            or suffix == "ffn_gate_inp.weight":
        return "f32"
    want = expert_dtype if suffix in _EXPERT_GGUF else dense_dtype
    # q8_0: the converter's "falling back to F16"; the k-quants: llama-quantize's
    # fallbacks (formats.for_row).
    return formats.for_row(want, shape[-1], gguf)


def vocab_rows(directory: Path, cfg: Gemma4Config) -> tuple[int | None, str]:
    """Rows of the embedding the converter keeps, and why: the tokenizer's
    token count (``tokenizer.json``: model vocab + added tokens;
    ``tokenizer.model``: the vocabulary padded to ``vocab_size_per_layer_input``
    or ``vocab_size``), or None (all rows) without a tokenizer file."""
    tj = directory / "tokenizer.json"
    if (directory / "tokenizer.model").is_file():
        return cfg.vocab_size_per_layer_input or cfg.vocab_size, "tokenizer.model"
    if tj.exists() or tj.is_symlink():
        # Through the package's one opener: regular files only, never blocking,
        # size-capped (a FIFO or a 4 GiB file here is an error, not "no tokenizer").
        data = read_capped(str(tj), _TOKENIZER_CAP, "tokenizer.json",
                           lambda msg, e: ConfigError(f"{tj}: {msg}", key="tokenizer.json"))
        try:
            tok = json.loads(data)
            n = len(tok["model"]["vocab"]) + len(tok["added_tokens"])
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
            raise ConfigError(f"{tj}: cannot count the tokenizer's tokens ({type(e).__name__}: {e})",
                              key="tokenizer.json") from None
        return n, "tokenizer.json"
    return None, "no tokenizer file"


def rope_freqs(cfg: Gemma4Config) -> np.ndarray:
    """``rope_freqs.weight`` (F32, ``full_head_dim / 2``): 1.0 for the rotated
    frequency pairs of the proportional RoPE, 1e30 (no rotation) for the rest."""
    hd = cfg.full_head_dim
    n_rot = int(hd * cfg.partial_rotary_factor_full / 2)
    n_half = int(hd / 2)
    return np.array([1.0] * n_rot + [1e30] * (n_half - n_rot), dtype=np.float32)


@dataclass(frozen=True)
class _Want:
    gguf: str
    hf: str  # canonical checkpoint name (for messages)
    shape: tuple[int, ...]
    required: bool = True


def _layer_wants(cfg: Gemma4Config, ly: Gemma4Layer) -> list[_Want]:
    H, b = cfg.hidden_size, ly.index
    q, kv = cfg.num_attention_heads * ly.head_dim, ly.num_key_value_heads * ly.head_dim
    kv_req = not ly.kv_shared  # transformers writes no k/v/k_norm for KV-reuse layers
    rows: list[tuple[str, tuple[int, ...], bool]] = [
        ("input_layernorm.weight", (H,), True),
        ("self_attn.q_proj.weight", (q, H), True),
        ("self_attn.k_proj.weight", (kv, H), kv_req),
    ]
    if ly.has_v_proj:
        rows.append(("self_attn.v_proj.weight", (kv, H), kv_req))
    rows += [
        ("self_attn.o_proj.weight", (H, q), True),
        ("self_attn.q_norm.weight", (ly.head_dim,), True),
        ("self_attn.k_norm.weight", (ly.head_dim,), kv_req),
        ("post_attention_layernorm.weight", (H,), True),
        ("pre_feedforward_layernorm.weight", (H,), True),
        ("mlp.gate_proj.weight", (ly.intermediate_size, H), True),
        ("mlp.up_proj.weight", (ly.intermediate_size, H), True),
        ("mlp.down_proj.weight", (H, ly.intermediate_size), True),
        ("post_feedforward_layernorm.weight", (H,), True),
    ]
    if cfg.enable_moe_block:
        E, Im = cfg.num_experts, cfg.moe_intermediate_size
        assert E is not None and Im is not None
        rows += [
            ("router.proj.weight", (E, H), True),
            ("router.scale", (H,), True),
            ("router.per_expert_scale", (E,), True),
            ("experts.gate_up_proj", (E, 2 * Im, H), True),
            ("experts.down_proj", (E, H, Im), True),
            ("pre_feedforward_layernorm_2.weight", (H,), True),
            ("post_feedforward_layernorm_1.weight", (H,), True),
            ("post_feedforward_layernorm_2.weight", (H,), True),
        ]
    if cfg.per_layer_input:
        P = cfg.hidden_size_per_layer_input
        rows += [
            ("per_layer_input_gate.weight", (P, H), True),
            ("per_layer_projection.weight", (H, P), True),
            ("post_per_layer_input_norm.weight", (H,), True),
        ]
    rows.append(("layer_scalar", (1,), True))
    return [_Want(f"blk.{b}.{_LAYER_NAMES[s]}", f"model.layers.{b}.{s}", shape, req) for s, shape, req in rows]


def _listing(problems: list[ManifestProblem], limit: int = 60) -> str:
    lines = [str(p) for p in problems[:limit]]
    more = [f"... and {len(problems) - limit} more"] if len(problems) > limit else []
    return "\n  " + "\n  ".join(lines + more)


_KIND_CLASS = {"extra": ExtraTensorError, "missing": MissingTensorError, "dtype": DtypeMismatchError,
               "shape": ShapeMismatchError}


def _raise(problems: list[ManifestProblem], where: str) -> None:
    if not problems:
        return
    order = ("extra", "missing", "dtype", "shape")
    first = min(problems, key=lambda p: order.index(p.kind)).kind
    problems = sorted(problems, key=lambda p: (order.index(p.kind), p.tensor))
    cls: type[ManifestError] = _KIND_CLASS[first]
    raise cls(f"{where}: {len(problems)} problem(s) with the Gemma 4 checkpoint:{_listing(problems)}", problems)


def plan_gemma4(ckpt: Any, cfg: Gemma4Config, *, dense_dtype: str = "f32", expert_dtype: str = "q8_0",
                directory: Path | None = None) -> LoadPlan:
    """The :class:`~hf2q.plan.LoadPlan` of a Gemma 4 checkpoint (an open
    :class:`~hf2q.safetensors.Checkpoint`, or anything with ``keys()`` and
    ``[name]`` giving ``.dtype`` / ``.shape``), in llama.cpp's GGUF names.

    ``dense_dtype`` / ``expert_dtype``: one of :data:`hf2q.plan.CONVERT_DTYPES`;
    the tensors llama.cpp keeps in F32 (norms, 1-D tensors, router, scales,
    ``rope_freqs``) are F32 under every choice. ``directory``: where to look
    for the tokenizer (default: the checkpoint's directory)."""
    for what, v in (("dense_dtype", dense_dtype), ("expert_dtype", expert_dtype)):
        if v not in DEVICE_DTYPES:
            raise ValueError(f"{what} must be one of {', '.join(DEVICE_DTYPES)}, got {v!r}")
    where = str(getattr(ckpt, "directory", "checkpoint"))
    names = list(ckpt.keys())
    if cfg.num_hidden_layers > len(names):
        raise ConfigError(f"{where}: num_hidden_layers is {cfg.num_hidden_layers}, but the checkpoint has only "
                          f"{len(names)} tensors", key="num_hidden_layers")

    problems: list[ManifestProblem] = []
    found: dict[str, tuple[str, str, tuple[int, ...]]] = {}  # gguf -> (raw name, hf2q format, shape)
    skipped: list[str] = []
    # FP8 checkpoints (docs/FP8.md): each FP8 weight decodes with its scale;
    # the scales and activation scales are no tensors of the model.
    scaled = scaled_tensors(ckpt, cfg.quantization)
    for raw in names:
        if raw in scaled.consumed or raw in scaled.dropped:
            continue
        if is_multimodal_tensor(raw):
            skipped.append(raw)
            continue
        canon = _canonical(raw)
        g = gguf_name(canon)
        if g is None:
            m = _LAYER_RE.match(canon)
            if m and _PER_EXPERT_RE.match(m.group(2)):
                why = "per-expert experts (Gemma 4 checkpoints store fused experts.gate_up_proj / experts.down_proj)"
            else:
                why = "no Gemma 4 tensor of this name"
            problems.append(ManifestProblem("extra", raw, why, "present", tensor_file(ckpt, raw)))
            continue
        m = _LAYER_RE.match(canon)
        if m and int(m.group(1)) >= cfg.num_hidden_layers:
            problems.append(ManifestProblem("extra", raw, f"a layer below num_hidden_layers = {cfg.num_hidden_layers}",
                                            "present", tensor_file(ckpt, raw)))
            continue
        info = ckpt[raw]
        fmt = formats.from_safetensors(str(info.dtype)).name if str(info.dtype) in formats.safetensors_codes() \
            else str(info.dtype)
        if g in found:
            problems.append(ManifestProblem("extra", raw, f"one tensor for {g} (also given as {found[g][0]})",
                                            "a second one", tensor_file(ckpt, raw)))
            continue
        found[g] = (raw, fmt, tuple(int(d) for d in info.shape))

    wants: list[tuple[_Want, int | None]] = []
    H, V = cfg.hidden_size, cfg.vocab_size
    wants.append((_Want("token_embd.weight", "model.embed_tokens.weight", (V, H)), None))
    if cfg.per_layer_input:
        LP = cfg.num_hidden_layers * cfg.hidden_size_per_layer_input
        wants += [
            (_Want("per_layer_token_embd.weight", "model.embed_tokens_per_layer.weight",
                   (cfg.vocab_size_per_layer_input, LP)), None),
            (_Want("per_layer_model_proj.weight", "model.per_layer_model_projection.weight", (LP, H)), None),
            (_Want("per_layer_proj_norm.weight", "model.per_layer_projection_norm.weight",
                   (cfg.hidden_size_per_layer_input,)), None),
        ]
    for ly in cfg.layers:
        wants += [(w, ly.index) for w in _layer_wants(cfg, ly)]
    wants.append((_Want("output_norm.weight", "model.norm.weight", (H,)), None))
    untied = "output.weight" in found
    if untied or not cfg.tie_word_embeddings:
        wants.append((_Want("output.weight", "lm_head.weight", (V, H)), None))

    wanted = {w.gguf for w, _ in wants}
    for g, (raw, _, _) in found.items():
        if g not in wanted:
            problems.append(ManifestProblem("extra", raw, "not a tensor of this config (e.g. a v_proj on a "
                                                          "k_eq_v layer, or MoE/PLE tensors the config lacks)",
                                            "present", tensor_file(ckpt, raw)))

    rows, rows_why = vocab_rows(directory or Path(where), cfg)
    entries: list[TensorPlan] = [TensorPlan("rope_freqs.weight", (cfg.full_head_dim // 2,), "f32", (),
                                            transform=lambda _a, c=cfg: rope_freqs(c), kind="generated")]
    for w, layer in wants:
        if w.gguf not in found:
            if w.required:
                problems.append(ManifestProblem("missing", w.hf, f"{list(w.shape)}", "absent"))
            continue
        raw, fmt, shape = found[w.gguf]
        scale = scaled.scales.get(raw)
        if fmt not in SOURCE_FORMATS and scale is None:
            problems.append(ManifestProblem("dtype", raw, "BF16, F16 or F32", str(ckpt[raw].dtype),
                                            tensor_file(ckpt, raw)))
            continue
        if shape != w.shape:
            problems.append(ManifestProblem("shape", raw, f"{list(w.shape)}", f"{list(shape)}",
                                            tensor_file(ckpt, raw)))
            continue
        out_shape = shape
        piece = Piece(raw, fmt, shape, scale=scale)
        transform = None
        if w.gguf == "token_embd.weight" and rows is not None and rows < shape[0]:
            out_shape = (rows, shape[1])
            piece = Piece(raw, fmt, (1, *shape), rows=(0, rows), scale=scale)  # the first `rows` rows, streamed
        dtype = device_dtype(w.gguf, out_shape, dense_dtype, expert_dtype)
        if piece.rows is not None and (scale is not None or not formats.can_convert(fmt, dtype)):
            # a trimmed embedding that must be staged (f32 -> bf16, or scaled FP8): its first
            # rows as one element range, converted a chunk at a time
            piece = Piece(raw, fmt, shape, select=np.array([[0, 0, formats.numel(out_shape)]], dtype=np.int64),
                          scale=scale)
        kind = ("expert" if w.gguf.endswith(_EXPERT_GGUF) else "f32" if dtype == "f32" else "dense")
        entries.append(TensorPlan(w.gguf, out_shape, dtype, (piece,), transform=transform, group=layer, kind=kind))
    _raise(problems, where)
    extra = {"layers": cfg.num_hidden_layers, "moe": cfg.enable_moe_block, "experts": cfg.num_experts,
             "dense_dtype": dense_dtype, "expert_dtype": expert_dtype, "tied_output": not untied,
             "embedding_rows": next(e.shape[0] for e in entries if e.name == "token_embd.weight"),
             "embedding_rows_from": rows_why, "skipped_tensors": len(skipped)}
    if scaled.scheme is not None:
        extra["quantization"] = scaled.scheme.describe()
    if cfg.forced_full_last:
        extra["forced_full_last_layer"] = True
    return LoadPlan("gemma4", entries, cfg, skipped=tuple(skipped), extra=extra)
