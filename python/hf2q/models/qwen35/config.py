"""Qwen3.5 / Qwen3.6 MoE (``qwen35moe``) configuration, read from ``config.json``.

Everything comes from the file (docs/QWEN35MOE.md); nothing is inferred from
tensor shapes. Text fields come from ``text_config`` when the checkpoint is a
multimodal wrapper (``Qwen3_5MoeForConditionalGeneration``), falling back to the
root (as llama.cpp's converter, which merges ``text_config`` over the root);
RoPE fields come from ``rope_parameters`` (or ``rope_scaling``), else from the
text level. A missing, wrongly typed or inconsistent field raises
:class:`hf2q.ConfigError` naming it.

Defaults are the values the reference converter (llama.cpp's
``convert_hf_to_gguf.py``, which reads the file through transformers'
``AutoConfig``) uses when the field is absent: ``full_attention_interval`` 4,
``partial_rotary_factor`` 0.25, ``rope_theta`` 10000, ``mtp_num_hidden_layers``
0, ``attn_output_gate`` true, ``mrope_section`` [11, 11, 10] and
``mrope_interleaved`` true (llama.cpp's Qwen3.5 defaults), ``rope_type``
"default", ``tie_word_embeddings`` false. A default is not user input: it is
never rejected for disagreeing with other fields (transformers'
``save_pretrained`` writes no ``mrope_section`` for a text-only config, and
llama.cpp then uses [11, 11, 10, 0] whatever ``rotary_dim`` is). Only values
the file states are checked for consistency.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..._configfile import parse_config_json, read_config_text
from ...errors import ConfigError
from .._limits import check_bound
from .._quant import QuantScheme, quant_scheme

__all__ = [
    "Qwen35Config",
    "LayerKind",
    "LINEAR_ATTENTION",
    "FULL_ATTENTION",
    "MODEL_TYPES",
    "DEFAULT_MROPE_SECTION",
    "DEFAULT_ROPE_THETA",
    "DEFAULT_PARTIAL_ROTARY_FACTOR",
    "DEFAULT_FULL_ATTENTION_INTERVAL",
]

LayerKind = Literal["linear", "full"]

LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"
_LAYER_TYPE_KIND: dict[str, LayerKind] = {LINEAR_ATTENTION: "linear", FULL_ATTENTION: "full"}

# model_type values this loader accepts (wrapper and text-only).
MODEL_TYPES = ("qwen3_5_moe", "qwen3_5_moe_text")
# llama.cpp's _Qwen35MRopeMixin default when rope_parameters has no mrope_section
# (it writes [11, 11, 10, 0]).
DEFAULT_MROPE_SECTION = (11, 11, 10)
# transformers' Qwen3_5MoeTextConfig defaults, which llama.cpp's converter reads
# through AutoConfig when config.json leaves the field out.
DEFAULT_ROPE_THETA = 10000.0
DEFAULT_PARTIAL_ROTARY_FACTOR = 0.25
DEFAULT_FULL_ATTENTION_INTERVAL = 4

_MISSING = object()


class _Reader:
    """Field lookup with ConfigError messages that name the field as written."""

    def __init__(self, d: Mapping[str, Any], source: str) -> None:
        if not isinstance(d, Mapping):
            raise ConfigError(f"{source}: top level must be a JSON object, got {type(d).__name__}")
        self.source = source
        self.root = d
        tc = d.get("text_config", _MISSING)
        if tc is _MISSING or tc is None:
            self.text: Mapping[str, Any] | None = None
        elif isinstance(tc, Mapping):
            self.text = tc
        else:
            raise self.error("text_config", f"must be an object, got {type(tc).__name__}")
        rope_key, rope = self._rope_dict()
        self.rope_key = rope_key
        self.rope: Mapping[str, Any] = rope

    # -- locating -----------------------------------------------------------
    def error(self, name: str, what: str) -> ConfigError:
        return ConfigError(f"{self.source}: field '{name}' {what}", key=name)

    def text_name(self, key: str) -> str:
        return f"text_config.{key}" if self.text is not None else key

    def lookup(self, key: str) -> tuple[str, Any]:
        """(qualified name, value) of a text-level field; value is _MISSING if absent."""
        if self.text is not None and key in self.text:
            return f"text_config.{key}", self.text[key]
        if key in self.root:
            return key, self.root[key]
        return self.text_name(key), _MISSING

    def _rope_dict(self) -> tuple[str | None, Mapping[str, Any]]:
        for key in ("rope_parameters", "rope_scaling"):
            name, value = self.lookup(key)
            if value is _MISSING or value is None:
                continue
            if not isinstance(value, Mapping):
                raise self.error(name, f"must be an object, got {type(value).__name__}")
            if not value:
                continue
            return name, value
        return None, {}

    def rope_lookup(self, key: str) -> tuple[str, Any]:
        if key in self.rope:
            return f"{self.rope_key}.{key}", self.rope[key]
        return self.lookup(key)

    # -- typed getters --------------------------------------------------------
    def _present(self, name: str, value: Any, default: Any) -> Any:
        if value is _MISSING or value is None:
            if default is _MISSING:
                raise self.error(name, "is missing")
            return default
        return value

    def int_(self, key: str, *, default: Any = _MISSING, minimum: int = 1, rope: bool = False) -> int:
        name, value = self.rope_lookup(key) if rope else self.lookup(key)
        value = self._present(name, value, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(name, f"must be an integer, got {type(value).__name__} {value!r}")
        if value < minimum:
            raise self.error(name, f"must be >= {minimum}, got {value}")
        check_bound(name, value, self.source)  # cost limits: nothing scales with an unreasonable number
        return value

    def float_(self, key: str, *, default: Any = _MISSING, rope: bool = False, positive: bool = True) -> float:
        name, value = self.rope_lookup(key) if rope else self.lookup(key)
        value = self._present(name, value, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(name, f"must be a number, got {type(value).__name__} {value!r}")
        value = float(value)
        if not math.isfinite(value) or (positive and value <= 0):
            raise self.error(name, f"must be a finite positive number, got {value!r}")
        return value

    def bool_(self, key: str, *, default: Any = _MISSING, rope: bool = False) -> bool:
        name, value = self.rope_lookup(key) if rope else self.lookup(key)
        value = self._present(name, value, default)
        if not isinstance(value, bool):
            raise self.error(name, f"must be true or false, got {type(value).__name__} {value!r}")
        return value

    def str_(self, key: str, *, default: Any = _MISSING, rope: bool = False) -> str:
        name, value = self.rope_lookup(key) if rope else self.lookup(key)
        value = self._present(name, value, default)
        if not isinstance(value, str):
            raise self.error(name, f"must be a string, got {type(value).__name__} {value!r}")
        return value


@dataclass(frozen=True)
class Qwen35Config:
    """The text model's hyper-parameters (docs/QWEN35MOE.md).

    Symbols of docs/QWEN35MOE.md: ``H`` hidden_size, ``L`` num_hidden_layers, ``V``
    vocab_size, ``nh``/``nkv``/``hd`` attention heads / KV heads / head_dim,
    ``nk``/``nv``/``dk``/``dv`` linear-attention key/value heads and head dims,
    ``K`` linear_conv_kernel_dim, ``E`` num_experts, ``I``
    moe_intermediate_size, ``Is`` shared_expert_intermediate_size.
    """

    hidden_size: int
    num_hidden_layers: int
    vocab_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    layer_types: tuple[str, ...]
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    partial_rotary_factor: float = 0.25
    full_attention_interval: int | None = None  # as written in the file (None: absent)
    mrope_section: tuple[int, ...] = DEFAULT_MROPE_SECTION
    mrope_interleaved: bool = True
    rope_type: str = "default"
    attn_output_gate: bool = True
    mtp_num_hidden_layers: int = 0
    tie_word_embeddings: bool = False
    model_type: str | None = None
    architectures: tuple[str, ...] = ()
    multimodal: bool = False  # the file nests the text model under text_config
    #: False when config.json leaves ``mtp_num_hidden_layers`` out: the plan then
    #: counts the ``mtp.layers.{i}`` tensors, as llama.cpp's converter does.
    mtp_num_hidden_layers_stated: bool = field(default=True, compare=False, repr=False)
    rope_parameters: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    #: ``quantization_config`` (root or ``text_config``; docs/FP8.md), None when absent.
    quantization: QuantScheme | None = field(default=None, compare=False, repr=False)

    # -- construction -----------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Qwen35Config:
        """Read ``config.json`` (``path`` is the file or the checkpoint directory)."""
        p, text = read_config_text(path)
        d = parse_config_json(text, f"{p}: config")  # ConfigError for bad JSON, deep nesting, huge integers
        return cls.from_dict(d, source=str(p))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str = "config.json") -> Qwen35Config:
        """Parse an already-loaded ``config.json`` object."""
        r = _Reader(d, source)

        model_type = None
        for key_name, value in (("model_type", d.get("model_type")),
                                ("text_config.model_type", r.text.get("model_type") if r.text else None)):
            if value is None:
                continue
            if not isinstance(value, str) or value not in MODEL_TYPES:
                raise r.error(key_name, f"is {value!r}; this loader reads {' / '.join(MODEL_TYPES)}")
            model_type = value if model_type is None else model_type
        archs = d.get("architectures", ())
        if archs is None:
            archs = ()
        if not isinstance(archs, (list, tuple)) or not all(isinstance(a, str) for a in archs):
            raise r.error("architectures", "must be a list of strings")

        H = r.int_("hidden_size")
        L = r.int_("num_hidden_layers")
        V = r.int_("vocab_size")
        nh = r.int_("num_attention_heads")
        nkv = r.int_("num_key_value_heads")
        hd = r.int_("head_dim")
        nk = r.int_("linear_num_key_heads")
        nv = r.int_("linear_num_value_heads")
        dk = r.int_("linear_key_head_dim")
        dv = r.int_("linear_value_head_dim")
        K = r.int_("linear_conv_kernel_dim")
        E = r.int_("num_experts")
        topk = r.int_("num_experts_per_tok")
        I_ = r.int_("moe_intermediate_size")
        Is = r.int_("shared_expert_intermediate_size")
        max_pos = r.int_("max_position_embeddings")
        eps = r.float_("rms_norm_eps")
        mtp_n = r.int_("mtp_num_hidden_layers", default=0, minimum=0)
        mtp_stated = r.lookup("mtp_num_hidden_layers")[1] not in (_MISSING, None)
        gate = r.bool_("attn_output_gate", default=True)
        tie = r.bool_("tie_word_embeddings", default=False)

        if nh % nkv:
            raise r.error(r.text_name("num_key_value_heads"),
                          f"({nkv}) must divide num_attention_heads ({nh})")
        if nv % nk:
            raise r.error(r.text_name("linear_num_value_heads"),
                          f"({nv}) must be a multiple of linear_num_key_heads ({nk}): "
                          f"r = nv / nk = {nv / nk:g} is not an integer")
        if topk > E:
            raise r.error(r.text_name("num_experts_per_tok"), f"({topk}) exceeds num_experts ({E})")

        layer_types = _layer_types(r, L)
        interval = None
        iname, ival = r.lookup("full_attention_interval")
        if ival is not _MISSING and ival is not None:
            interval = r.int_("full_attention_interval")
        if layer_types is None:
            n = interval if interval is not None else DEFAULT_FULL_ATTENTION_INTERVAL
            layer_types = tuple(FULL_ATTENTION if (i + 1) % n == 0 else LINEAR_ATTENTION for i in range(L))
        elif interval is not None:
            for i, t in enumerate(layer_types):
                if (t == FULL_ATTENTION) != ((i + 1) % interval == 0):
                    raise r.error(
                        r.lookup("layer_types")[0],
                        f"disagrees with {iname} = {interval}: layer {i} is {t!r} in layer_types "
                        f"but {'full' if (i + 1) % interval == 0 else 'linear'} attention by the interval",
                    )

        # RoPE. Defaults are the reference converter's values and are never
        # checked against other fields; only values the file states are.
        theta = r.float_("rope_theta", default=DEFAULT_ROPE_THETA, rope=True)
        prf_name, prf_raw = r.rope_lookup("partial_rotary_factor")
        prf_stated = prf_raw is not _MISSING and prf_raw is not None
        prf = r.float_("partial_rotary_factor", default=DEFAULT_PARTIAL_ROTARY_FACTOR, rope=True)
        rot = int(hd * prf)
        if prf_stated:
            if prf > 1.0:
                raise r.error(prf_name, f"must be in (0, 1], got {prf!r}")
            if rot <= 0 or rot % 2:
                raise r.error(prf_name, f"gives rotary_dim = int({hd} * {prf!r}) = {rot}; it must be even and > 0")
        rope_type = r.str_("rope_type", default="default", rope=True)
        mname, msec = r.rope_lookup("mrope_section")
        if msec is _MISSING or msec is None:
            # transformers' save_pretrained writes no mrope_section for a
            # text-only config; llama.cpp then writes [11, 11, 10, 0] whatever
            # rotary_dim is, so the default is taken as is.
            mrope = DEFAULT_MROPE_SECTION
        else:
            if (not isinstance(msec, (list, tuple)) or not 1 <= len(msec) <= 4
                    or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in msec)):
                raise r.error(mname, f"must be a list of 1 to 4 non-negative integers, got {msec!r}")
            mrope = tuple(msec)
            if sum(mrope) != rot // 2:
                raise r.error(mname, f"{list(mrope)} sums to {sum(mrope)}, but rotary_dim / 2 = {rot // 2} "
                                     f"(head_dim {hd} x partial_rotary_factor {prf!r})")
        interleaved = r.bool_("mrope_interleaved", default=True, rope=True)

        return cls(
            hidden_size=H, num_hidden_layers=L, vocab_size=V,
            num_attention_heads=nh, num_key_value_heads=nkv, head_dim=hd,
            linear_num_key_heads=nk, linear_num_value_heads=nv,
            linear_key_head_dim=dk, linear_value_head_dim=dv, linear_conv_kernel_dim=K,
            num_experts=E, num_experts_per_tok=topk,
            moe_intermediate_size=I_, shared_expert_intermediate_size=Is,
            layer_types=layer_types, rms_norm_eps=eps, rope_theta=theta,
            max_position_embeddings=max_pos, partial_rotary_factor=prf,
            full_attention_interval=interval, mrope_section=mrope, mrope_interleaved=interleaved,
            rope_type=rope_type, attn_output_gate=gate, mtp_num_hidden_layers=mtp_n,
            tie_word_embeddings=tie, model_type=model_type, architectures=tuple(archs),
            multimodal=r.text is not None, mtp_num_hidden_layers_stated=mtp_stated, rope_parameters=dict(r.rope),
            quantization=quant_scheme(d, r.source),
        )

    # -- derived ------------------------------------------------------------------
    @property
    def rotary_dim(self) -> int:
        """``int(head_dim * partial_rotary_factor)`` (64 for Qwen3.6-35B-A3B)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def conv_channels(self) -> int:
        """``C = 2*nk*dk + nv*dv``: rows of ``in_proj_qkv``, channels of ``conv1d``."""
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def v_per_k(self) -> int:
        """``r = nv / nk`` (an integer; checked at parse time)."""
        return self.linear_num_value_heads // self.linear_num_key_heads

    @functools.cached_property
    def layer_kinds(self) -> list[LayerKind]:
        """``"linear"`` / ``"full"`` per main layer (MTP layers are not included).
        Computed once: the planner asks per layer and per tensor (linear, not
        quadratic, in the layer count)."""
        return [_LAYER_TYPE_KIND[t] for t in self.layer_types]

    @property
    def full_attention_layers(self) -> list[int]:
        return [i for i, k in enumerate(self.layer_kinds) if k == "full"]

    @property
    def linear_attention_layers(self) -> list[int]:
        return [i for i, k in enumerate(self.layer_kinds) if k == "linear"]

    @property
    def mrope_section_gguf(self) -> tuple[int, int, int, int]:
        """``mrope_section`` padded with zeros to the 4 entries GGUF stores."""
        s = tuple(self.mrope_section) + (0,) * (4 - len(self.mrope_section))
        return s[0], s[1], s[2], s[3]

    @property
    def q_proj_rows(self) -> int:
        """Rows of ``self_attn.q_proj``: Q and the output gate interleaved per head."""
        return (2 if self.attn_output_gate else 1) * self.num_attention_heads * self.head_dim

    def layer_kind(self, b: int) -> LayerKind:
        """Kind of block ``b``; MTP blocks (``b >= L``) are full-attention."""
        if b < 0:
            raise IndexError(b)
        if b >= self.num_hidden_layers:
            if b >= self.num_hidden_layers + self.mtp_num_hidden_layers:
                raise IndexError(f"block {b} beyond {self.num_hidden_layers} layers + {self.mtp_num_hidden_layers} MTP")
            return "full"
        return self.layer_kinds[b]


def _layer_types(r: _Reader, L: int) -> tuple[str, ...] | None:
    name, value = r.lookup("layer_types")
    if value is _MISSING or value is None:
        return None
    if not isinstance(value, (list, tuple)) or not all(isinstance(t, str) for t in value):
        raise r.error(name, "must be a list of strings")
    if len(value) != L:
        raise r.error(name, f"has {len(value)} entries, but num_hidden_layers is {L}")
    bad = sorted({t for t in value if t not in _LAYER_TYPE_KIND})
    if bad:
        raise r.error(name, f"holds unknown layer type(s) {bad}; expected {LINEAR_ATTENTION!r} or {FULL_ATTENTION!r}")
    return tuple(value)
