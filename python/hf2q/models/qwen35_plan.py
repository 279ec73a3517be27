"""Qwen3.5 / Qwen3.6 MoE tensor plan: checkpoint names -> GGUF names, shapes,
transforms and device dtypes (spec qwen35moe.md §3-§5).

The plan is built from tensor *metadata* only (name -> dtype, shape); no byte
is read. It validates the checkpoint against the manifest the config implies
and fails with every offending name at once:

- :class:`UnknownTensorError` — names that map to nothing (listed, with why);
- :class:`DuplicateTensorError` — two checkpoint tensors for one destination
  (a duplicate expert, ``dt_bias`` and ``dt_proj.bias``, a name present with
  and without ``language_model.``, ...);
- :class:`MixedExpertFormsError` — fused and per-expert experts in one layer;
- :class:`hf2q.MissingTensorError`, :class:`hf2q.DtypeMismatchError`,
  :class:`hf2q.ShapeMismatchError` — as named;
- :class:`hf2q.ConfigError` — a Q8_0 tensor whose last dimension is not a
  multiple of 32.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ..errors import (
    ConfigError,
    DtypeMismatchError,
    ExtraTensorError,
    ManifestError,
    MissingTensorError,
    ShapeMismatchError,
)
from .qwen35_config import Qwen35Config
from .qwen35_transforms import device_nbytes

__all__ = [
    "TensorKind",
    "DeviceDtype",
    "Transform",
    "SourcePiece",
    "PlannedTensor",
    "Qwen35Plan",
    "UnknownTensorError",
    "DuplicateTensorError",
    "MixedExpertFormsError",
    "plan_qwen35_moe",
    "hf_name_to_gguf",
    "checkpoint_targets",
    "is_multimodal_tensor",
    "select_device_dtype",
    "SOURCE_DTYPES",
    "DEVICE_DTYPES",
]

TensorKind = Literal["dense", "f32", "expert"]
DeviceDtype = Literal["f32", "bf16", "q8_0"]
SOURCE_DTYPES = ("BF16", "F16", "F32")
DEVICE_DTYPES = ("f32", "bf16", "q8_0")


class Transform:
    """Transform tags of :attr:`PlannedTensor.transforms`, applied in the order listed there."""

    FUSED_SPLIT = "fused_split"  # gate_up_proj [E, 2I, H] -> the half named by SourcePiece.half
    STACK_EXPERTS = "stack_experts"  # per-expert [rows, cols] -> [E, rows, cols], SourcePiece.expert = index
    NORM_PLUS_ONE = "norm_plus_one"  # widen to F32, + 1.0f
    SQUEEZE_CONV1D = "squeeze_conv1d"  # [C, 1, K] -> [C, K]
    REORDER_V_QKV = "reorder_v_qkv"  # in_proj_qkv: V rows (after 2*nk*dk), dv per head
    REORDER_V_ROWS = "reorder_v_rows"  # in_proj_z: rows, dv per head
    REORDER_V_HEADS = "reorder_v_heads"  # in_proj_a/_b rows, A_log/dt_bias elements: 1 per head
    REORDER_V_CONV1D = "reorder_v_conv1d"  # squeezed conv1d: V channels (after 2*nk*dk), dv per head
    REORDER_V_COLS = "reorder_v_cols"  # out_proj: columns, dv per head
    NEG_EXP = "neg_exp"  # A_log -> -exp(A_log) in F32

    ALL = (FUSED_SPLIT, STACK_EXPERTS, NORM_PLUS_ONE, SQUEEZE_CONV1D, REORDER_V_QKV, REORDER_V_ROWS,
           REORDER_V_HEADS, REORDER_V_CONV1D, REORDER_V_COLS, NEG_EXP)
    REORDERS = (REORDER_V_QKV, REORDER_V_ROWS, REORDER_V_HEADS, REORDER_V_CONV1D, REORDER_V_COLS)


# --------------------------------------------------------------------------- errors
def _listing(items: list[str], limit: int = 60) -> str:
    head = "\n  ".join(items[:limit])
    more = f"\n  ... and {len(items) - limit} more" if len(items) > limit else ""
    return f"\n  {head}{more}"


class UnknownTensorError(ExtraTensorError):
    """Checkpoint tensors that map to no GGUF tensor of this model. ``names`` lists
    them all (sorted); ``reasons`` maps each to why."""

    def __init__(self, reasons: Mapping[str, str]) -> None:
        self.reasons = dict(sorted(reasons.items()))
        self.names = list(self.reasons)
        lines = [f"{n}: {r}" for n, r in self.reasons.items()]
        super().__init__(f"{len(lines)} checkpoint tensor(s) map to no qwen35moe tensor:{_listing(lines)}")


class DuplicateTensorError(ManifestError):
    """Two or more checkpoint tensors feed the same destination. ``groups`` maps
    each destination (GGUF name, with ``[expert e]`` for experts) to the names."""

    def __init__(self, groups: Mapping[str, list[str]]) -> None:
        self.groups = {k: sorted(v) for k, v in sorted(groups.items())}
        lines = [f"{k}: {', '.join(v)}" for k, v in self.groups.items()]
        super().__init__(f"{len(lines)} destination(s) are given more than once:{_listing(lines)}")


class MixedExpertFormsError(ManifestError):
    """A layer holds both fused (``experts.gate_up_proj``/``experts.down_proj``) and
    per-expert (``experts.{e}.*_proj.weight``) expert tensors. ``layers`` maps
    the block index to (fused names, per-expert names)."""

    def __init__(self, layers: Mapping[int, tuple[list[str], list[str]]]) -> None:
        self.layers = dict(sorted(layers.items()))
        lines = [
            f"block {b}: fused {sorted(f)} and {len(p)} per-expert tensor(s), e.g. {sorted(p)[0]}"
            for b, (f, p) in self.layers.items()
        ]
        super().__init__(f"fused and per-expert expert tensors mixed in {len(lines)} layer(s):{_listing(lines)}")


def _missing_error(names: list[str]) -> MissingTensorError:
    err = MissingTensorError(f"{len(names)} tensor(s) the config requires are missing:{_listing(names)}")
    err.names = names  # type: ignore[attr-defined]
    return err


def _dtype_error(lines: list[str]) -> DtypeMismatchError:
    err = DtypeMismatchError(
        f"{len(lines)} tensor(s) with an unsupported dtype (qwen35moe reads BF16, F16, F32):{_listing(lines)}"
    )
    err.lines = lines  # type: ignore[attr-defined]
    return err


def _shape_error(lines: list[str]) -> ShapeMismatchError:
    err = ShapeMismatchError(f"{len(lines)} tensor(s) do not have the shape the config implies:{_listing(lines)}")
    err.lines = lines  # type: ignore[attr-defined]
    return err


# --------------------------------------------------------------------------- plan data
@dataclass(frozen=True)
class SourcePiece:
    """One checkpoint tensor (or part of one) feeding a planned tensor.

    ``name``/``dtype``/``shape`` are as on disk. For a per-expert piece
    ``expert`` is the index on axis 0 of the stack it fills (``dest[expert] =
    source``). For a fused ``experts.gate_up_proj`` piece ``half`` says which
    half of axis 1 is used: ``"gate"`` = ``[:, :I, :]``, ``"up"`` = ``[:, I:, :]``
    (``dest[:] = source[:, :I]`` or ``source[:, I:]``). Otherwise both are None
    and the whole tensor is used.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    expert: int | None = None
    half: Literal["gate", "up"] | None = None

    def selection(self) -> tuple[slice, ...]:
        """Index into the source array that gives this piece's contribution."""
        if self.half is None:
            return ()
        n = self.shape[1] // 2
        return (slice(None), slice(0, n) if self.half == "gate" else slice(n, 2 * n))


@dataclass(frozen=True)
class PlannedTensor:
    """One device tensor of the model.

    - ``gguf_name``: GGUF tensor name (``blk.3.ffn_up_exps.weight``).
    - ``hf_name``: the name after the spec's renames (§4 left column, e.g.
      ``model.layers.3.mlp.experts.up_proj.weight``; MTP blocks as ``model.layers.{L+i}``).
    - ``shape``: logical numpy shape after every transform (Q8_0 keeps the logical shape).
    - ``kind``: ``"dense"`` | ``"f32"`` | ``"expert"`` (spec §5 class).
    - ``dtype``: device dtype, ``"f32"`` | ``"bf16"`` | ``"q8_0"``.
    - ``sources``: the checkpoint pieces, in the order :func:`transform_tensor` takes them.
    - ``transforms``: :class:`Transform` tags, in application order.
    - ``layer``: block index (``None`` for token_embd / output_norm / output).
    - ``source_dtype``: the (common) checkpoint dtype of the sources.
    """

    gguf_name: str
    hf_name: str
    shape: tuple[int, ...]
    kind: TensorKind
    dtype: DeviceDtype
    sources: tuple[SourcePiece, ...]
    transforms: tuple[str, ...]
    layer: int | None
    source_dtype: str

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        """Device bytes (F32 4/elt, BF16 2/elt, Q8_0 numel/32*34)."""
        return device_nbytes(self.shape, self.dtype)

    @property
    def source_nbytes(self) -> int:
        """Bytes read from the checkpoint (a fused gate_up piece counts its half)."""
        total = 0
        for p in self.sources:
            n = int(np.prod(p.shape, dtype=np.int64)) * (4 if p.dtype == "F32" else 2)
            total += n // 2 if p.half is not None else n
        return total


@dataclass(frozen=True)
class Qwen35Plan:
    """The ordered tensor plan of one checkpoint.

    ``tensors``: token_embd, then blocks 0..n_blocks-1 (each: attn_norm,
    attention, post_attention_norm, router, experts, shared expert, and for MTP
    blocks the 4 nextn tensors), then output_norm and output.
    ``skipped``: vision/multimodal tensors, known and not loaded (checkpoint names).
    ``dropped``: ``mtp.*`` tensors left out because MTP was turned off.
    ``mtp_layers``: MTP blocks in the plan (``blk.L`` .. ``blk.L+mtp_layers-1``).
    ``tied_output``: no ``output.weight`` is planned (tied embeddings, no
    ``lm_head.weight`` in the checkpoint): the consumer uses ``token_embd``.
    """

    config: Qwen35Config
    tensors: tuple[PlannedTensor, ...]
    skipped: tuple[str, ...]
    dropped: tuple[str, ...]
    mtp_layers: int
    dense_dtype: DeviceDtype
    expert_dtype: DeviceDtype
    tied_output: bool = False
    _index: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._index.update({t.gguf_name: i for i, t in enumerate(self.tensors)})

    def __len__(self) -> int:
        return len(self.tensors)

    def __iter__(self) -> Iterator[PlannedTensor]:
        return iter(self.tensors)

    def __getitem__(self, key: str | int) -> PlannedTensor:
        if isinstance(key, str):
            return self.tensors[self._index[key]]
        return self.tensors[key]

    def __contains__(self, gguf_name: object) -> bool:
        return gguf_name in self._index

    @property
    def names(self) -> list[str]:
        return [t.gguf_name for t in self.tensors]

    @property
    def n_blocks(self) -> int:
        """``L`` plus the MTP blocks in the plan."""
        return self.config.num_hidden_layers + self.mtp_layers

    @property
    def nbytes(self) -> int:
        """Total device bytes."""
        return sum(t.nbytes for t in self.tensors)

    def nbytes_by_kind(self) -> dict[str, int]:
        out = {"dense": 0, "f32": 0, "expert": 0}
        for t in self.tensors:
            out[t.kind] += t.nbytes
        return out

    def source_names(self) -> set[str]:
        """Every checkpoint tensor the plan reads."""
        return {p.name for t in self.tensors for p in t.sources}


# --------------------------------------------------------------------------- name table
@dataclass(frozen=True)
class _Spec:
    hf: str  # per-layer suffix after "model.layers.{b}." (global: the full name)
    gguf: str  # per-layer suffix after "blk.{b}." (global: the full name)
    kind: TensorKind
    where: str  # "global" | "all" | "full" | "linear" | "mtp"
    shape: Callable[[Qwen35Config], tuple[int, ...]]
    src_shape: Callable[[Qwen35Config], tuple[int, ...]] | None = None
    reorder: str | None = None
    aliases: tuple[str, ...] = ()


def _H(c: Qwen35Config) -> int:
    return c.hidden_size


_GLOBAL_SPECS = (
    _Spec("model.embed_tokens.weight", "token_embd.weight", "dense", "global", lambda c: (c.vocab_size, _H(c))),
    _Spec("model.norm.weight", "output_norm.weight", "f32", "global", lambda c: (_H(c),)),
    _Spec("lm_head.weight", "output.weight", "dense", "global", lambda c: (c.vocab_size, _H(c))),
)

_EXPERT_PROJS = ("gate", "up", "down")

# In plan order within a block.
_LAYER_SPECS = (
    _Spec("input_layernorm.weight", "attn_norm.weight", "f32", "all", lambda c: (_H(c),)),
    # full attention
    _Spec("self_attn.q_proj.weight", "attn_q.weight", "dense", "full", lambda c: (c.q_proj_rows, _H(c))),
    _Spec("self_attn.k_proj.weight", "attn_k.weight", "dense", "full",
          lambda c: (c.num_key_value_heads * c.head_dim, _H(c))),
    _Spec("self_attn.v_proj.weight", "attn_v.weight", "dense", "full",
          lambda c: (c.num_key_value_heads * c.head_dim, _H(c))),
    _Spec("self_attn.o_proj.weight", "attn_output.weight", "dense", "full",
          lambda c: (_H(c), c.num_attention_heads * c.head_dim)),
    _Spec("self_attn.q_norm.weight", "attn_q_norm.weight", "f32", "full", lambda c: (c.head_dim,)),
    _Spec("self_attn.k_norm.weight", "attn_k_norm.weight", "f32", "full", lambda c: (c.head_dim,)),
    # linear attention (Gated DeltaNet)
    _Spec("linear_attn.in_proj_qkv.weight", "attn_qkv.weight", "dense", "linear",
          lambda c: (c.conv_channels, _H(c)), reorder=Transform.REORDER_V_QKV),
    _Spec("linear_attn.in_proj_z.weight", "attn_gate.weight", "dense", "linear",
          lambda c: (c.linear_num_value_heads * c.linear_value_head_dim, _H(c)), reorder=Transform.REORDER_V_ROWS),
    _Spec("linear_attn.in_proj_a.weight", "ssm_alpha.weight", "dense", "linear",
          lambda c: (c.linear_num_value_heads, _H(c)), reorder=Transform.REORDER_V_HEADS),
    _Spec("linear_attn.in_proj_b.weight", "ssm_beta.weight", "dense", "linear",
          lambda c: (c.linear_num_value_heads, _H(c)), reorder=Transform.REORDER_V_HEADS),
    _Spec("linear_attn.A_log", "ssm_a", "f32", "linear",
          lambda c: (c.linear_num_value_heads,), reorder=Transform.REORDER_V_HEADS),
    _Spec("linear_attn.dt_bias", "ssm_dt.bias", "f32", "linear",
          lambda c: (c.linear_num_value_heads,), reorder=Transform.REORDER_V_HEADS,
          aliases=("linear_attn.dt_proj.bias",)),
    _Spec("linear_attn.conv1d.weight", "ssm_conv1d.weight", "f32", "linear",
          lambda c: (c.conv_channels, c.linear_conv_kernel_dim),
          src_shape=lambda c: (c.conv_channels, 1, c.linear_conv_kernel_dim), reorder=Transform.REORDER_V_CONV1D),
    _Spec("linear_attn.norm.weight", "ssm_norm.weight", "f32", "linear", lambda c: (c.linear_value_head_dim,)),
    _Spec("linear_attn.out_proj.weight", "ssm_out.weight", "dense", "linear",
          lambda c: (_H(c), c.linear_num_value_heads * c.linear_value_head_dim), reorder=Transform.REORDER_V_COLS),
    # MoE block
    _Spec("post_attention_layernorm.weight", "post_attention_norm.weight", "f32", "all", lambda c: (_H(c),)),
    _Spec("mlp.gate.weight", "ffn_gate_inp.weight", "f32", "all", lambda c: (c.num_experts, _H(c))),
    _Spec("mlp.experts.gate_proj.weight", "ffn_gate_exps.weight", "expert", "all",
          lambda c: (c.num_experts, c.moe_intermediate_size, _H(c)),
          src_shape=lambda c: (c.moe_intermediate_size, _H(c))),
    _Spec("mlp.experts.up_proj.weight", "ffn_up_exps.weight", "expert", "all",
          lambda c: (c.num_experts, c.moe_intermediate_size, _H(c)),
          src_shape=lambda c: (c.moe_intermediate_size, _H(c))),
    _Spec("mlp.experts.down_proj.weight", "ffn_down_exps.weight", "expert", "all",
          lambda c: (c.num_experts, _H(c), c.moe_intermediate_size),
          src_shape=lambda c: (_H(c), c.moe_intermediate_size)),
    _Spec("mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight", "f32", "all", lambda c: (1, _H(c))),
    _Spec("mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight", "dense", "all",
          lambda c: (c.shared_expert_intermediate_size, _H(c))),
    _Spec("mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight", "dense", "all",
          lambda c: (c.shared_expert_intermediate_size, _H(c))),
    _Spec("mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight", "dense", "all",
          lambda c: (_H(c), c.shared_expert_intermediate_size)),
    # MTP (nextn) block extras
    _Spec("eh_proj.weight", "nextn.eh_proj.weight", "dense", "mtp", lambda c: (_H(c), 2 * _H(c))),
    _Spec("enorm.weight", "nextn.enorm.weight", "f32", "mtp", lambda c: (_H(c),)),
    _Spec("hnorm.weight", "nextn.hnorm.weight", "f32", "mtp", lambda c: (_H(c),)),
    _Spec("shared_head.norm.weight", "nextn.shared_head_norm.weight", "f32", "mtp", lambda c: (_H(c),)),
)

_GLOBAL_BY_HF = {s.hf: s for s in _GLOBAL_SPECS}
_LAYER_BY_HF: dict[str, _Spec] = {}
for _s in _LAYER_SPECS:
    _LAYER_BY_HF[_s.hf] = _s
    for _a in _s.aliases:
        _LAYER_BY_HF[_a] = _s
_EXPERT_SPEC = {p: _LAYER_BY_HF[f"mlp.experts.{p}_proj.weight"] for p in _EXPERT_PROJS}

# MTP non-layer tensors -> per-block names (llama.cpp _Qwen35MtpMixin).
_MTP_GLOBALS = {
    "mtp.fc.weight": "eh_proj.weight",
    "mtp.pre_fc_norm_embedding.weight": "enorm.weight",
    "mtp.pre_fc_norm_hidden.weight": "hnorm.weight",
    "mtp.norm.weight": "shared_head.norm.weight",
}

_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_MTP_LAYER_RE = re.compile(r"^mtp\.layers\.(\d+)\.(.+)$")
_PER_EXPERT_RE = re.compile(r"^mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")
_FUSED_GATE_UP_RE = re.compile(r"^mlp\.experts\.gate_up_proj(?:\.weight)?$")
_FUSED_DOWN_RE = re.compile(r"^mlp\.experts\.down_proj(?:\.weight)?$")

# llama.cpp TextModel.filter_tensors: multimodal tensors a text model skips.
_MM_PREFIXES = ("mlp", "vit.", "vpm.", "siglip2.", "conformer.", "merger.", "resampler.", "sound_encoder.",
                "sound_projection.", "speech_embeddings.")
_MM_SUBSTRINGS = ("visual.", "vision.", "audio.", "talker.", "vision_", "audio_", "sam_model", "token2wav.",
                  "code2wav.", "projector.", "pre_mm_projector_norm", "image_newline", "view_seperator",
                  "patch_embed", "patch_embedding", "patch_merger.", "model.connector.")


def is_multimodal_tensor(name: str) -> bool:
    """True for vision/audio/projector tensors (llama.cpp's text-model filter)."""
    return name.startswith(_MM_PREFIXES) or any(s in name for s in _MM_SUBSTRINGS)


def _canon_int(s: str) -> int | None:
    """A decimal index as written by HF (no sign, no leading zeros)."""
    n = int(s)
    return n if str(n) == s else None


def _strip_lm(name: str) -> str:
    return name.replace("language_model.", "")


def _rename_mtp(name: str, cfg: Qwen35Config) -> list[str] | str:
    """``mtp.*`` -> ``model.layers.{L+i}.*`` names, or the reason it maps to nothing."""
    L, n = cfg.num_hidden_layers, cfg.mtp_num_hidden_layers
    if n == 0:
        return "MTP tensor, but the config has mtp_num_hidden_layers = 0"
    m = _MTP_LAYER_RE.match(name)
    if m:
        i = _canon_int(m.group(1))
        if i is None or i >= n:
            return f"MTP layer index {m.group(1)} outside 0..{n - 1} (mtp_num_hidden_layers = {n})"
        return [f"model.layers.{L + i}.{m.group(2)}"]
    if name in _MTP_GLOBALS:
        # llama.cpp writes these into every MTP block (one block in practice).
        return [f"model.layers.{L + j}.{_MTP_GLOBALS[name]}" for j in range(n)]
    return "unknown MTP tensor"


@dataclass(frozen=True)
class _Target:
    form: str  # "simple" | "expert" | "fused_gate_up" | "fused_down"
    canonical: str
    layer: int | None
    spec: _Spec | None = None
    proj: str | None = None
    expert: int | None = None


def _classify(name: str, cfg: Qwen35Config, n_blocks: int, *, stacked: bool = False) -> _Target | str:
    """Classify a name after steps 1 and 3 (``language_model.`` removed, MTP renamed).
    ``stacked``: accept the post-merge ``experts.{gate,up}_proj.weight`` names
    (they are not a checkpoint form)."""
    if name in _GLOBAL_BY_HF:
        return _Target("simple", name, None, _GLOBAL_BY_HF[name])
    m = _LAYER_RE.match(name)
    if not m:
        return "no qwen35moe tensor has this name"
    b = _canon_int(m.group(1))
    if b is None:
        return f"malformed layer index {m.group(1)!r}"
    L = cfg.num_hidden_layers
    if b >= n_blocks:
        extra = f" + {n_blocks - L} MTP" if n_blocks > L else ""
        return f"layer {b} beyond the {L}{extra} block(s) of the config"
    rest = m.group(2)
    kind = "full" if b >= L else cfg.layer_kinds[b]
    if (em := _PER_EXPERT_RE.match(rest)) is not None:
        e = _canon_int(em.group(1))
        if e is None or e >= cfg.num_experts:
            return f"expert index {em.group(1)} outside 0..{cfg.num_experts - 1} (num_experts = {cfg.num_experts})"
        return _Target("expert", name, b, _EXPERT_SPEC[em.group(2)], em.group(2), e)
    if _FUSED_GATE_UP_RE.match(rest):
        return _Target("fused_gate_up", name, b)
    if _FUSED_DOWN_RE.match(rest):
        return _Target("fused_down", name, b, _EXPERT_SPEC["down"], "down")
    spec = _LAYER_BY_HF.get(rest)
    if spec is None:
        return "no qwen35moe tensor has this name"
    if spec.kind == "expert":
        if stacked:
            return _Target("simple", name, b, spec)
        return ("pre-stacked expert tensor; expected experts.gate_up_proj or "
                f"experts.{{e}}.{spec.hf.split('.')[2]}.weight")
    if spec.where == "mtp" and b < L:
        return f"MTP-only tensor in main layer {b}"
    if spec.where in ("full", "linear") and spec.where != kind:
        return f"layer {b} is a {kind}-attention layer; this is a {spec.where}-attention tensor"
    return _Target("simple", name, b, spec)


def _gguf_name(spec: _Spec, layer: int | None) -> str:
    return spec.gguf if layer is None else f"blk.{layer}.{spec.gguf}"


def hf_name_to_gguf(name: str, cfg: Qwen35Config) -> str:
    """GGUF name of a tensor named as after the spec's transforms (§4 left column).

    ``language_model.`` is removed and ``mtp.*`` renamed first (non-layer MTP
    tensors map to block ``L``). The merged ``experts.gate_proj.weight`` and the
    per-expert names map to their stack (``experts.{e}.gate_proj.weight`` ->
    ``blk.b.ffn_gate_exps.weight``). A fused
    ``experts.gate_up_proj`` feeds two tensors, so it raises here: use
    :func:`checkpoint_targets`. Anything else that maps to nothing raises
    :class:`UnknownTensorError`.
    """
    n_blocks = cfg.num_hidden_layers + cfg.mtp_num_hidden_layers
    cname = _strip_lm(name)
    if cname.startswith("mtp."):
        r = _rename_mtp(cname, cfg)
        if isinstance(r, str):
            raise UnknownTensorError({name: r})
        cname = r[0]
    t = _classify(cname, cfg, n_blocks, stacked=True)
    if isinstance(t, str):
        raise UnknownTensorError({name: t})
    if t.form == "fused_gate_up":
        raise UnknownTensorError({name: "fused gate_up_proj feeds two tensors; use checkpoint_targets()"})
    assert t.spec is not None
    return _gguf_name(t.spec, t.layer)


def checkpoint_targets(name: str, cfg: Qwen35Config, *, mtp: bool = True) -> tuple[str, ...]:
    """GGUF tensors a checkpoint tensor contributes to: ``()`` for skipped
    multimodal tensors (and ``mtp.*`` with ``mtp=False``), two names for a fused
    ``experts.gate_up_proj``. Raises :class:`UnknownTensorError` otherwise."""
    if is_multimodal_tensor(name):
        return ()
    cname = _strip_lm(name)
    if cname.startswith("mtp."):
        if not mtp:
            return ()
        r = _rename_mtp(cname, cfg)
        if isinstance(r, str):
            raise UnknownTensorError({name: r})
        names = r
    else:
        names = [cname]
    n_blocks = cfg.num_hidden_layers + cfg.mtp_num_hidden_layers
    out: list[str] = []
    for n in names:
        t = _classify(n, cfg, n_blocks)
        if isinstance(t, str):
            raise UnknownTensorError({name: t})
        if t.form == "fused_gate_up":
            out += [_gguf_name(_EXPERT_SPEC["gate"], t.layer), _gguf_name(_EXPERT_SPEC["up"], t.layer)]
        else:
            assert t.spec is not None
            out.append(_gguf_name(t.spec, t.layer))
    return tuple(out)


# --------------------------------------------------------------------------- dtypes
def select_device_dtype(kind: TensorKind, dense_dtype: str = "f32", expert_dtype: str = "q8_0") -> DeviceDtype:
    """Spec §5: expert -> ``expert_dtype``; F32 class -> ``"f32"``; dense -> ``dense_dtype``.

    With ``dense_dtype="q8_0"`` this is exactly the set that llama.cpp's
    ``convert_hf_to_gguf.py --outtype q8_0`` quantizes.
    """
    for what, v in (("dense_dtype", dense_dtype), ("expert_dtype", expert_dtype)):
        if v not in DEVICE_DTYPES:
            raise ValueError(f"{what} must be one of {', '.join(DEVICE_DTYPES)}, got {v!r}")
    if kind == "expert":
        return expert_dtype  # type: ignore[return-value]
    if kind == "f32":
        return "f32"
    if kind == "dense":
        return dense_dtype  # type: ignore[return-value]
    raise ValueError(f"unknown tensor kind {kind!r}")


_DTYPE_ALIASES = {"BFLOAT16": "BF16", "FLOAT16": "F16", "HALF": "F16", "FLOAT32": "F32", "FLOAT": "F32"}


def _dtype_str(d: Any) -> str:
    if isinstance(d, str):
        s = d
    elif isinstance(d, np.dtype) or (isinstance(d, type) and issubclass(d, np.generic)):
        s = np.dtype(d).name
    else:
        s = getattr(d, "name", None) or getattr(d, "value", None) or str(d)
        s = str(s)
    s = s.upper().removeprefix("TORCH.")
    return _DTYPE_ALIASES.get(s, s)


def _info(name: str, info: Any) -> tuple[str, str, tuple[int, ...]]:
    if isinstance(info, (tuple, list)) and len(info) == 2 and not hasattr(info, "shape"):
        dtype, shape = info
    else:
        dtype, shape = getattr(info, "dtype"), getattr(info, "shape")
    return name, _dtype_str(dtype), tuple(int(x) for x in shape)


def _entries(tensors: Any) -> list[tuple[str, str, tuple[int, ...]]]:
    """Normalise the plan's input to (name, dtype code, shape) triples.

    Accepted: a mapping name -> (dtype, shape) or -> object with ``.dtype`` and
    ``.shape`` (e.g. ``hf2q.safetensors.TensorInfo``); an object whose
    ``tensors`` is such a mapping or a method/attribute giving TensorInfo-like
    objects (``hf2q.safetensors.Checkpoint`` / ``SafetensorsFile``); a
    mapping-like object with ``keys()`` and ``[name]``; an iterable of
    TensorInfo-like objects or (name, info) pairs (duplicates are kept, so
    they can be reported).
    """
    if not isinstance(tensors, Mapping):
        inner = getattr(tensors, "tensors", None)
        if callable(inner):
            inner = inner()
        if inner is not None:
            tensors = inner
        elif callable(getattr(tensors, "keys", None)) and hasattr(tensors, "__getitem__"):
            tensors = {k: tensors[k] for k in tensors.keys()}
    if isinstance(tensors, Mapping):
        return [_info(str(k), v) for k, v in tensors.items()]
    out = []
    for item in tensors:
        if hasattr(item, "name") and hasattr(item, "shape"):
            out.append(_info(item.name, item))
        else:
            n, info = item
            out.append(_info(str(n), info))
    return out


# --------------------------------------------------------------------------- the plan
def _transforms(spec: _Spec, cfg: Qwen35Config) -> tuple[str, ...]:
    """Transform tags of a non-expert tensor, in spec §3 order."""
    tags: list[str] = []
    full = spec.hf
    if full.endswith("norm.weight") and not full.endswith("linear_attn.norm.weight"):
        tags.append(Transform.NORM_PLUS_ONE)
    if spec.hf == "linear_attn.conv1d.weight":
        tags.append(Transform.SQUEEZE_CONV1D)
    if spec.reorder is not None and cfg.linear_num_key_heads != cfg.linear_num_value_heads:
        tags.append(spec.reorder)
    if spec.hf == "linear_attn.A_log":
        tags.append(Transform.NEG_EXP)
    return tuple(tags)


def _mtp_name(canonical: str, cfg: Qwen35Config) -> str:
    """Checkpoint-side spelling of a canonical name (for missing-tensor messages)."""
    m = _LAYER_RE.match(canonical)
    L = cfg.num_hidden_layers
    if m and int(m.group(1)) >= L:
        rest = m.group(2)
        for g, local in _MTP_GLOBALS.items():
            if rest == local:
                return g
        return f"mtp.layers.{int(m.group(1)) - L}.{rest}"
    return canonical


def plan_qwen35_moe(
    tensors: Any,
    config: Qwen35Config,
    *,
    dense_dtype: str = "f32",
    expert_dtype: str = "q8_0",
    mtp: bool | None = None,
) -> Qwen35Plan:
    """Plan the device tensors of a Qwen3.5/3.6 MoE checkpoint from its metadata.

    ``tensors``: an ``hf2q.safetensors`` checkpoint/file, name -> (dtype string
    such as ``"BF16"``, shape), name -> object with ``.dtype``/``.shape`` (a
    ``TensorInfo``), or an iterable of TensorInfo-like objects. No tensor byte
    is read.

    ``mtp``: ``None`` (default) keeps the MTP block when the checkpoint has
    ``mtp.*`` tensors, ``True`` requires it, ``False`` drops every ``mtp.*``.
    ``dense_dtype``/``expert_dtype``: device dtypes of the dense and expert
    classes (``"f32"``, ``"bf16"`` or ``"q8_0"``); the F32 class is always F32.
    """
    select_device_dtype("dense", dense_dtype, expert_dtype)  # validates both options
    cfg = config
    L = cfg.num_hidden_layers
    entries = _entries(tensors)

    has_mtp = any(_strip_lm(n).startswith("mtp.") for n, _, _ in entries if not is_multimodal_tensor(n))
    if has_mtp and not cfg.mtp_num_hidden_layers_stated:
        # config.json does not say: llama.cpp's converter counts mtp.layers.{i}
        # (a default, so it is taken from the names rather than refused).
        idx = [int(m.group(1)) for n, _, _ in entries if (m := _MTP_LAYER_RE.match(_strip_lm(n)))]
        if idx:
            cfg = dataclasses.replace(cfg, mtp_num_hidden_layers=max(idx) + 1)
    if mtp is None:
        use_mtp = has_mtp
    elif mtp:
        if cfg.mtp_num_hidden_layers == 0:
            raise ConfigError("MTP requested, but the config has mtp_num_hidden_layers = 0")
        use_mtp = True
    else:
        use_mtp = False
    n_mtp = cfg.mtp_num_hidden_layers if use_mtp else 0
    n_blocks = L + n_mtp

    skipped: list[str] = []
    dropped: list[str] = []
    unknown: dict[str, str] = {}
    # destination key -> [(raw name, dtype, shape)]
    simple: dict[str, list[tuple[str, str, tuple[int, ...], _Target]]] = {}
    per_expert: dict[tuple[int, str], dict[int, list[tuple[str, str, tuple[int, ...]]]]] = {}
    fused: dict[tuple[int, str], list[tuple[str, str, tuple[int, ...]]]] = {}
    forms: dict[int, tuple[set[str], set[str]]] = {}

    for name, dtype, shape in entries:
        if is_multimodal_tensor(name):
            skipped.append(name)
            continue
        cname = _strip_lm(name)
        if cname.startswith("mtp."):
            if not use_mtp:
                dropped.append(name)
                continue
            renamed = _rename_mtp(cname, cfg)
            if isinstance(renamed, str):
                unknown[name] = renamed
                continue
            targets = renamed
        else:
            targets = [cname]
        for tname in targets:
            t = _classify(tname, cfg, n_blocks)
            if isinstance(t, str):
                unknown[name] = t
                break
            rec = (name, dtype, shape)
            if t.form == "simple":
                assert t.spec is not None
                simple.setdefault(_gguf_name(t.spec, t.layer), []).append((*rec, t))
            elif t.form == "expert":
                assert t.layer is not None and t.proj is not None and t.expert is not None
                per_expert.setdefault((t.layer, t.proj), {}).setdefault(t.expert, []).append(rec)
                forms.setdefault(t.layer, (set(), set()))[1].add(name)
            else:
                assert t.layer is not None
                projs = ("gate", "up") if t.form == "fused_gate_up" else ("down",)
                for p in projs:
                    fused.setdefault((t.layer, p), []).append(rec)
                forms.setdefault(t.layer, (set(), set()))[0].add(name)

    if unknown:
        raise UnknownTensorError(unknown)

    # duplicates
    dups: dict[str, list[str]] = {}
    for g, recs in simple.items():
        if len(recs) > 1:
            dups[g] = [r[0] for r in recs]
    for (b, p), by_e in per_expert.items():
        for e, recs in by_e.items():
            if len(recs) > 1:
                dups[f"{_gguf_name(_EXPERT_SPEC[p], b)} [expert {e}]"] = [r[0] for r in recs]
    for (b, p), recs in fused.items():
        if len(recs) > 1:
            dups[_gguf_name(_EXPERT_SPEC[p], b)] = [r[0] for r in recs]
    if dups:
        raise DuplicateTensorError(dups)

    mixed = {b: (sorted(f), sorted(pe)) for b, (f, pe) in forms.items() if f and pe}
    if mixed:
        raise MixedExpertFormsError(mixed)

    # Expected manifest, in plan order; collect missing / dtype / shape problems.
    missing: list[str] = []
    bad_dtype: list[str] = []
    bad_shape: list[str] = []
    planned: list[PlannedTensor] = []

    def check_piece(raw: str, dtype: str, shape: tuple[int, ...], want: tuple[int, ...]) -> None:
        if dtype not in SOURCE_DTYPES:
            bad_dtype.append(f"{raw}: {dtype}")
        if shape != want:
            bad_shape.append(f"{raw}: shape {list(shape)}, expected {list(want)}")

    def plan_simple(spec: _Spec, layer: int | None) -> None:
        g = _gguf_name(spec, layer)
        canonical = spec.hf if layer is None else f"model.layers.{layer}.{spec.hf}"
        recs = simple.get(g)
        if not recs:
            if spec.hf == "lm_head.weight" and cfg.tie_word_embeddings:
                return
            missing.append(_mtp_name(canonical, cfg) + ("" if not spec.aliases else
                                                        f" (or {', '.join(spec.aliases)})"))
            return
        raw, dtype, shape, _ = recs[0]
        want_src = (spec.src_shape or spec.shape)(cfg)
        check_piece(raw, dtype, shape, want_src)
        planned.append(PlannedTensor(
            gguf_name=g, hf_name=canonical, shape=spec.shape(cfg), kind=spec.kind,
            dtype=select_device_dtype(spec.kind, dense_dtype, expert_dtype),
            sources=(SourcePiece(raw, dtype, shape),), transforms=_transforms(spec, cfg),
            layer=layer, source_dtype=dtype,
        ))

    def plan_experts(spec: _Spec, b: int, proj: str) -> None:
        g = _gguf_name(spec, b)
        canonical = f"model.layers.{b}.{spec.hf}"
        logical = spec.shape(cfg)
        E = cfg.num_experts
        if (b, proj) in fused:
            raw, dtype, shape = fused[(b, proj)][0]
            if proj == "down":
                want = logical
                pieces = (SourcePiece(raw, dtype, shape),)
                tags: tuple[str, ...] = ()
            else:
                want = (E, 2 * cfg.moe_intermediate_size, cfg.hidden_size)
                pieces = (SourcePiece(raw, dtype, shape, half=proj),)  # type: ignore[arg-type]
                tags = (Transform.FUSED_SPLIT,)
            # gate and up share one fused tensor: report its problems once
            if proj != "up":
                check_piece(raw, dtype, shape, want)
            src_dtype = dtype
        elif (b, proj) in per_expert:
            by_e = per_expert[(b, proj)]
            absent = [e for e in range(E) if e not in by_e]
            if absent:
                missing.extend(_mtp_name(f"model.layers.{b}.mlp.experts.{e}.{proj}_proj.weight", cfg) for e in absent)
                return
            want = (spec.src_shape or spec.shape)(cfg)
            pieces = tuple(SourcePiece(*by_e[e][0], expert=e) for e in range(E))
            for p in pieces:
                check_piece(p.name, p.dtype, p.shape, want)
            dts = sorted({p.dtype for p in pieces})
            if len(dts) > 1:
                counts = {d: sum(p.dtype == d for p in pieces) for d in dts}
                bad_dtype.append(f"{g}: experts mix dtypes {counts}")
            src_dtype = pieces[0].dtype
            tags = (Transform.STACK_EXPERTS,)
        else:
            form = "gate_up_proj" if proj != "down" else "down_proj"
            missing.append(_mtp_name(canonical, cfg)
                           + f" (fused experts.{form} or per-expert experts.{{0..{E - 1}}}.{proj}_proj.weight)")
            return
        planned.append(PlannedTensor(
            gguf_name=g, hf_name=canonical, shape=logical, kind="expert",
            dtype=select_device_dtype("expert", dense_dtype, expert_dtype),
            sources=pieces, transforms=tags, layer=b, source_dtype=src_dtype,
        ))

    plan_simple(_GLOBAL_BY_HF["model.embed_tokens.weight"], None)
    for b in range(n_blocks):
        kind = "full" if b >= L else cfg.layer_kinds[b]
        for spec in _LAYER_SPECS:
            if spec.where == "mtp" and b < L:
                continue
            if spec.where in ("full", "linear") and spec.where != kind:
                continue
            if spec.kind == "expert":
                plan_experts(spec, b, spec.hf.split(".")[2].removesuffix("_proj"))
            else:
                plan_simple(spec, b)
    plan_simple(_GLOBAL_BY_HF["model.norm.weight"], None)
    plan_simple(_GLOBAL_BY_HF["lm_head.weight"], None)

    if missing:
        raise _missing_error(missing)
    if bad_dtype:
        raise _dtype_error(bad_dtype)
    if bad_shape:
        raise _shape_error(bad_shape)

    not_q8 = [f"{t.gguf_name} {list(t.shape)}" for t in planned if t.dtype == "q8_0" and t.shape[-1] % 32]
    if not_q8:
        raise ConfigError(
            f"{len(not_q8)} tensor(s) to be stored as Q8_0 have a last dimension that is not a multiple of 32 "
            f"(Q8_0 quantizes rows in blocks of 32; llama.cpp would silently fall back to F16):{_listing(not_q8)}"
        )

    return Qwen35Plan(
        config=cfg, tensors=tuple(planned), skipped=tuple(skipped), dropped=tuple(dropped),
        mtp_layers=n_mtp, dense_dtype=dense_dtype, expert_dtype=expert_dtype,  # type: ignore[arg-type]
        tied_output="output.weight" not in simple,
    )
