"""Qwen3.5 / Qwen3.6 MoE tensor names: the HF -> GGUF name table, its dtype
classes and shapes, the multimodal filter, MTP renames and the transform tags
each name needs (docs/QWEN35MOE.md). :mod:`.plan` turns a checkpoint into a
plan with it."""

from __future__ import annotations

import functools

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, NamedTuple

from ...errors import ExtraTensorError, _lead, _listing, in_file
from ...plan import CONVERT_DTYPES
from .._names import GLOBAL_NAMES, LAYER_NAMES, multimodal_filter, with_additions
from .config import Qwen35Config

#: Checkpoint dtypes the family reads (safetensors codes).
SOURCE_DTYPES = ("BF16", "F16", "F32")
#: Device formats of ``dense_dtype`` / ``expert_dtype`` (:data:`hf2q.plan.CONVERT_DTYPES`).
DEVICE_DTYPES = CONVERT_DTYPES

__all__ = [
    "TensorKind",
    "Transform",
    "UnknownTensorError",
    "hf_name_to_gguf",
    "checkpoint_targets",
    "is_multimodal_tensor",
]

TensorKind = Literal["dense", "f32", "expert"]


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


class UnknownTensorError(ExtraTensorError):
    """Checkpoint tensors that map to no GGUF tensor of this model. ``names`` lists
    them all (sorted); ``reasons`` maps each to why. ``files`` (given) maps
    each to the file that holds it, named beside it; ``where`` leads the
    message (the checkpoint)."""

    def __init__(self, reasons: Mapping[str, str], files: Mapping[str, str | None] | None = None,
                 where: str = "") -> None:
        self.reasons = dict(sorted(reasons.items()))
        self.names = list(self.reasons)
        files = files or {}
        lines = [f"{n}{in_file(files.get(n))}: {r}" for n, r in self.reasons.items()]
        super().__init__(f"{_lead(where)}{len(lines)} checkpoint tensor(s) map to no qwen35moe tensor:"
                         f"{_listing(lines)}")


# --------------------------------------------------------------------------- name table
@dataclass(frozen=True)
class _Spec:
    hf: str  # per-layer suffix after "model.layers.{b}." (global: the full name)
    kind: TensorKind
    where: str  # "global" | "all" | "full" | "linear" | "mtp"
    shape: Callable[[Qwen35Config], tuple[int, ...]]
    src_shape: Callable[[Qwen35Config], tuple[int, ...]] | None = None
    reorder: str | None = None
    aliases: tuple[str, ...] = ()

    @property
    def gguf(self) -> str:
        """Per-layer suffix after "blk.{b}." (global: the full name), from the name map."""
        return (GLOBAL_NAMES if self.where == "global" else _LAYER_NAMES)[self.hf]


def _H(c: Qwen35Config) -> int:
    return c.hidden_size


# Qwen3.5's own per-layer names (the shared ones: hf2q.models._names).
_LAYER_NAMES = with_additions(LAYER_NAMES, {
    "linear_attn.in_proj_qkv.weight": "attn_qkv.weight",
    "linear_attn.in_proj_z.weight": "attn_gate.weight",
    "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
    "linear_attn.in_proj_b.weight": "ssm_beta.weight",
    "linear_attn.A_log": "ssm_a",
    "linear_attn.dt_bias": "ssm_dt.bias",
    "linear_attn.conv1d.weight": "ssm_conv1d.weight",
    "linear_attn.norm.weight": "ssm_norm.weight",
    "linear_attn.out_proj.weight": "ssm_out.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.experts.gate_proj.weight": "ffn_gate_exps.weight",
    "mlp.experts.up_proj.weight": "ffn_up_exps.weight",
    "mlp.experts.down_proj.weight": "ffn_down_exps.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "eh_proj.weight": "nextn.eh_proj.weight",
    "enorm.weight": "nextn.enorm.weight",
    "hnorm.weight": "nextn.hnorm.weight",
    "shared_head.norm.weight": "nextn.shared_head_norm.weight",
})


_GLOBAL_SPECS = (
    _Spec("model.embed_tokens.weight", "dense", "global", lambda c: (c.vocab_size, _H(c))),
    _Spec("model.norm.weight", "f32", "global", lambda c: (_H(c),)),
    _Spec("lm_head.weight", "dense", "global", lambda c: (c.vocab_size, _H(c))),
)

_EXPERT_PROJS = ("gate", "up", "down")

# In plan order within a block.
_LAYER_SPECS = (
    _Spec("input_layernorm.weight", "f32", "all", lambda c: (_H(c),)),
    # full attention
    _Spec("self_attn.q_proj.weight", "dense", "full", lambda c: (c.q_proj_rows, _H(c))),
    _Spec("self_attn.k_proj.weight", "dense", "full",
          lambda c: (c.num_key_value_heads * c.head_dim, _H(c))),
    _Spec("self_attn.v_proj.weight", "dense", "full",
          lambda c: (c.num_key_value_heads * c.head_dim, _H(c))),
    _Spec("self_attn.o_proj.weight", "dense", "full",
          lambda c: (_H(c), c.num_attention_heads * c.head_dim)),
    _Spec("self_attn.q_norm.weight", "f32", "full", lambda c: (c.head_dim,)),
    _Spec("self_attn.k_norm.weight", "f32", "full", lambda c: (c.head_dim,)),
    # linear attention (Gated DeltaNet)
    _Spec("linear_attn.in_proj_qkv.weight", "dense", "linear",
          lambda c: (c.conv_channels, _H(c)), reorder=Transform.REORDER_V_QKV),
    _Spec("linear_attn.in_proj_z.weight", "dense", "linear",
          lambda c: (c.linear_num_value_heads * c.linear_value_head_dim, _H(c)), reorder=Transform.REORDER_V_ROWS),
    _Spec("linear_attn.in_proj_a.weight", "dense", "linear",
          lambda c: (c.linear_num_value_heads, _H(c)), reorder=Transform.REORDER_V_HEADS),
    _Spec("linear_attn.in_proj_b.weight", "dense", "linear",
          lambda c: (c.linear_num_value_heads, _H(c)), reorder=Transform.REORDER_V_HEADS),
    _Spec("linear_attn.A_log", "f32", "linear",
          lambda c: (c.linear_num_value_heads,), reorder=Transform.REORDER_V_HEADS),
    _Spec("linear_attn.dt_bias", "f32", "linear",
          lambda c: (c.linear_num_value_heads,), reorder=Transform.REORDER_V_HEADS,
          aliases=("linear_attn.dt_proj.bias",)),
    _Spec("linear_attn.conv1d.weight", "f32", "linear",
          lambda c: (c.conv_channels, c.linear_conv_kernel_dim),
          src_shape=lambda c: (c.conv_channels, 1, c.linear_conv_kernel_dim), reorder=Transform.REORDER_V_CONV1D),
    _Spec("linear_attn.norm.weight", "f32", "linear", lambda c: (c.linear_value_head_dim,)),
    _Spec("linear_attn.out_proj.weight", "dense", "linear",
          lambda c: (_H(c), c.linear_num_value_heads * c.linear_value_head_dim), reorder=Transform.REORDER_V_COLS),
    # MoE block
    _Spec("post_attention_layernorm.weight", "f32", "all", lambda c: (_H(c),)),
    _Spec("mlp.gate.weight", "f32", "all", lambda c: (c.num_experts, _H(c))),
    _Spec("mlp.experts.gate_proj.weight", "expert", "all",
          lambda c: (c.num_experts, c.moe_intermediate_size, _H(c)),
          src_shape=lambda c: (c.moe_intermediate_size, _H(c))),
    _Spec("mlp.experts.up_proj.weight", "expert", "all",
          lambda c: (c.num_experts, c.moe_intermediate_size, _H(c)),
          src_shape=lambda c: (c.moe_intermediate_size, _H(c))),
    _Spec("mlp.experts.down_proj.weight", "expert", "all",
          lambda c: (c.num_experts, _H(c), c.moe_intermediate_size),
          src_shape=lambda c: (_H(c), c.moe_intermediate_size)),
    _Spec("mlp.shared_expert_gate.weight", "f32", "all", lambda c: (1, _H(c))),
    _Spec("mlp.shared_expert.gate_proj.weight", "dense", "all",
          lambda c: (c.shared_expert_intermediate_size, _H(c))),
    _Spec("mlp.shared_expert.up_proj.weight", "dense", "all",
          lambda c: (c.shared_expert_intermediate_size, _H(c))),
    _Spec("mlp.shared_expert.down_proj.weight", "dense", "all",
          lambda c: (_H(c), c.shared_expert_intermediate_size)),
    # MTP (nextn) block extras
    _Spec("eh_proj.weight", "dense", "mtp", lambda c: (_H(c), 2 * _H(c))),
    _Spec("enorm.weight", "f32", "mtp", lambda c: (_H(c),)),
    _Spec("hnorm.weight", "f32", "mtp", lambda c: (_H(c),)),
    _Spec("shared_head.norm.weight", "f32", "mtp", lambda c: (_H(c),)),
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

_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)\Z")
_MTP_LAYER_RE = re.compile(r"^mtp\.layers\.(\d+)\.(.+)\Z")
_PER_EXPERT_RE = re.compile(r"^mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight\Z")
# A per-expert checkpoint name as the Hub writes it, with or without the
# multimodal wrapper's "language_model.": once stripped, _LAYER_RE and then
# _PER_EXPERT_RE on the rest would match it. None of the multimodal filter's
# prefixes or parts can occur in such a name (tests/test_qwen35_plan.py
# checks that): the plan's fast path for the layout's 30,000 expert tensors.
_HUB_EXPERT_NAME_RE = re.compile(r"^model\.(?:language_model\.)?layers\.(\d+)\."
                                 + _PER_EXPERT_RE.pattern.removeprefix("^"))
_FUSED_GATE_UP_RE = re.compile(r"^mlp\.experts\.gate_up_proj(?:\.weight)?\Z")
_FUSED_DOWN_RE = re.compile(r"^mlp\.experts\.down_proj(?:\.weight)?\Z")

# llama.cpp TextModel.filter_tensors: multimodal tensors a text model skips
# (the shared filter, with the converter's "sam_model" for this family).
_MM_PREFIXES, _MM_SUBSTRINGS = multimodal_filter(("sam_model",))


def is_multimodal_tensor(name: str) -> bool:
    """True for vision/audio/projector tensors (llama.cpp's text-model filter)."""
    if name.startswith(_MM_PREFIXES):
        return True
    for s in _MM_SUBSTRINGS:  # a plain loop: asked once per checkpoint tensor, cheaper than any() over a generator
        if s in name:
            return True
    return False


@functools.lru_cache(maxsize=4096)  # asked twice per tensor (layer, expert) of a 60,000-tensor checkpoint: few strings
def _canon_int(s: str) -> int | None:
    """A decimal index as written by HF (no sign, no leading zeros); None
    otherwise, and for more digits than any index can have (int() of
    thousands of digits raises ValueError). ``s`` is a ``\\d+`` match:
    digits, possibly non-ASCII ones (int() reads them, but HF never writes them)."""
    if len(s) > 18 or not s.isascii() or (s[0] == "0" and len(s) > 1):
        return None
    return int(s)


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


class _Target(NamedTuple):
    """What a checkpoint name feeds (a tuple: one is made per checkpoint tensor)."""

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
    index, rest = m.groups()
    b = _canon_int(index)
    if b is None:
        return f"malformed layer index {index!r}"
    L = cfg.num_hidden_layers
    if b >= n_blocks:
        extra = f" + {n_blocks - L} MTP" if n_blocks > L else ""
        return f"layer {b} beyond the {L}{extra} block(s) of the config"
    kind = "full" if b >= L else cfg.layer_kinds[b]
    if (em := _PER_EXPERT_RE.match(rest)) is not None:
        e_index, proj = em.groups()
        e = _canon_int(e_index)
        if e is None or e >= cfg.num_experts:
            return f"expert index {e_index} outside 0..{cfg.num_experts - 1} (num_experts = {cfg.num_experts})"
        return _Target("expert", name, b, _EXPERT_SPEC[proj], proj, e)
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
    """GGUF name of a tensor named as after the transforms of docs/QWEN35MOE.md.

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
