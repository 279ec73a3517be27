"""Gemma 4 text config (docs/GEMMA4.md): ``config.json`` of a
``Gemma4ForConditionalGeneration`` (text fields under ``text_config``) or a
``Gemma4ForCausalLM`` (text fields at the root), read with transformers'
defaults for every absent key, in both serialised forms of the per-layer
geometry (root ``global_head_dim`` / ``num_global_key_value_heads``, or a
``per_layer_config`` of overrides).

llama.cpp's converter reads the config through transformers, so it sees the
same defaults; :class:`Gemma4Config` gives hf2q the same numbers without
transformers. Every bad value is a :class:`~hf2q.ConfigError` naming its key.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..._configfile import json_type_name
from ...errors import ConfigError
from .._quant import QuantScheme, quant_scheme

__all__ = ["Gemma4Config", "Gemma4Layer", "FULL_ATTENTION", "SLIDING_ATTENTION", "MODEL_TYPES", "ARCHITECTURES",
           "MAX_LAYERS"]

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
_LAYER_KINDS = (FULL_ATTENTION, SLIDING_ATTENTION)
MODEL_TYPES = ("gemma4", "gemma4_text")
ARCHITECTURES = ("Gemma4ForConditionalGeneration", "Gemma4ForCausalLM")
#: A config naming more layers than this is refused before anything is sized
#: by it (the published models have 30-60).
MAX_LAYERS = 4096
_MAX_DIM = 1 << 24

# transformers 5.24 Gemma4TextConfig defaults (docs/GEMMA4.md, "Defaults").
_DEFAULT_ROPE = {
    SLIDING_ATTENTION: {"rope_type": "default", "rope_theta": 10000.0},
    FULL_ATTENTION: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
}


_ARTICLE = {"boolean": "a", "integer": "an", "number": "a", "string": "a", "array": "an", "object": "an"}


def _tname(v: Any) -> str:
    """The JSON type with its article ("an integer"), as the messages read."""
    n = json_type_name(v)
    return f"{_ARTICLE[n]} {n}" if n in _ARTICLE else n


class _Reader:
    """Typed reads of one config object; ``prefix`` names it in errors."""

    def __init__(self, d: Mapping[str, Any], prefix: str, source: str | None) -> None:
        self.d = d
        self.prefix = prefix
        self.source = source

    def key(self, k: str) -> str:
        return f"{self.prefix}{k}"

    def error(self, k: str, msg: str) -> ConfigError:
        where = f"{self.source}: " if self.source else ""
        return ConfigError(f"{where}config key '{self.key(k)}' {msg}", key=self.key(k))

    def int(self, k: str, default: int | None, *, minimum: int = 1, maximum: int = _MAX_DIM,
            nullable: bool = False) -> int | None:
        v = self.d.get(k, default)
        if v is None:
            if nullable or default is None:
                return None
            v = default
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.error(k, f"must be an integer, got {_tname(v)}")
        if not minimum <= v <= maximum:
            raise self.error(k, f"must be in [{minimum}, {maximum}], got {v}")
        return v

    def float(self, k: str, default: float | None) -> float | None:
        v = self.d.get(k, default)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise self.error(k, f"must be a finite number, got {_tname(v) if not isinstance(v, float) else v}")
        return float(v)

    def bool(self, k: str, default: bool) -> bool:
        v = self.d.get(k, default)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self.error(k, f"must be true or false, got {_tname(v)}")
        return v


def _check_model_type(v: Any, key: str, source: str | None) -> None:
    """Refuse another family's config up front: a ``model_type`` (root or
    ``text_config``) that is present and not one this loader reads. Absent or
    null is accepted (transformers' defaults then apply)."""
    if v is None or v in MODEL_TYPES:
        return
    where = f"{source}: " if source else ""
    shown = repr(v) if isinstance(v, str) else _tname(v)
    raise ConfigError(
        f"{where}config key '{key}' is {shown}: not a Gemma 4 config; the Gemma 4 loader reads model_type "
        f"{' / '.join(MODEL_TYPES)} (`hf2q load` picks the loader from config.json)", key=key)


@dataclass(frozen=True)
class Gemma4Layer:
    """The geometry of one decoder layer (what its tensors' shapes follow)."""

    index: int
    kind: str
    head_dim: int
    num_key_value_heads: int
    has_v_proj: bool
    kv_shared: bool
    intermediate_size: int

    @property
    def is_full(self) -> bool:
        return self.kind == FULL_ATTENTION


@dataclass(frozen=True)
class Gemma4Config:
    """The text model's numbers, transformers' defaults applied.

    ``wrapper`` is True for ``Gemma4ForConditionalGeneration`` (text under
    ``text_config``); ``tie_word_embeddings`` is the flag of the model class
    (root for the wrapper, text config for ``Gemma4ForCausalLM``); whether the
    LM head is its own tensor is decided by the checkpoint (``lm_head.weight``
    present), as llama.cpp's converter does. ``forced_full_last`` records that
    the last layer was sliding in the file and is full here (transformers'
    rule)."""

    hidden_size: int
    num_hidden_layers: int
    vocab_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    layer_types: tuple[str, ...]
    layers: tuple[Gemma4Layer, ...]
    rope_theta_full: float
    rope_theta_sliding: float
    partial_rotary_factor_full: float
    rms_norm_eps: float
    max_position_embeddings: int
    sliding_window: int | None
    final_logit_softcapping: float | None
    attention_k_eq_v: bool
    enable_moe_block: bool
    num_experts: int | None
    top_k_experts: int | None
    moe_intermediate_size: int | None
    hidden_size_per_layer_input: int
    vocab_size_per_layer_input: int
    num_kv_shared_layers: int
    use_double_wide_mlp: bool
    tie_word_embeddings: bool
    wrapper: bool
    forced_full_last: bool = False
    per_layer_config_form: bool = False
    source: str | None = field(default=None, compare=False)
    #: ``quantization_config`` (root or ``text_config``; docs/FP8.md), None when absent.
    quantization: QuantScheme | None = field(default=None, compare=False)

    # ------------------------------------------------------------------ derived
    @property
    def full_head_dim(self) -> int:
        """Head dim of the first full-attention layer (sizes ``rope_freqs``)."""
        return next(ly.head_dim for ly in self.layers if ly.is_full)

    @property
    def full_layers(self) -> tuple[int, ...]:
        return tuple(ly.index for ly in self.layers if ly.is_full)

    @property
    def per_layer_input(self) -> bool:
        """Per-layer embeddings (PLE) present."""
        return self.hidden_size_per_layer_input > 0

    @property
    def first_kv_shared_layer(self) -> int:
        return self.num_hidden_layers - self.num_kv_shared_layers

    # ------------------------------------------------------------------ parsing
    @classmethod
    def from_file(cls, path: str | Path) -> Gemma4Config:
        from ..._configfile import read_config_text
        import json

        p, text = read_config_text(path)
        try:
            d = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise ConfigError(f"{p}: config is not valid JSON: {e}") from None
        if not isinstance(d, dict):
            raise ConfigError(f"{p}: config.json is not a JSON object")
        return cls.from_dict(d, source=str(p))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str | None = None) -> Gemma4Config:
        if not isinstance(d, Mapping):
            raise ConfigError(f"{source or 'config'}: config must be a JSON object, got {_tname(d)}")
        _check_model_type(d.get("model_type"), "model_type", source)
        tc = d.get("text_config")
        if tc is not None and not isinstance(tc, Mapping):
            raise _Reader(d, "", source).error("text_config", f"must be an object, got {_tname(tc)}")
        if tc is not None:
            _check_model_type(tc.get("model_type"), "text_config.model_type", source)
        wrapper = tc is not None
        t = _Reader(tc if wrapper else d, "text_config." if wrapper else "", source)
        root = _Reader(d, "", source)

        H = t.int("hidden_size", 2304)
        L = t.int("num_hidden_layers", 30, maximum=MAX_LAYERS)
        V = t.int("vocab_size", 262144, maximum=1 << 31)
        I = t.int("intermediate_size", 9216)
        nh = t.int("num_attention_heads", 8, maximum=1 << 16)
        nkv = t.int("num_key_value_heads", 4, maximum=1 << 16)
        hd = t.int("head_dim", 256, maximum=1 << 16)
        assert H and L and V and I and nh and nkv and hd
        k_eq_v = t.bool("attention_k_eq_v", False)
        moe = t.bool("enable_moe_block", False)
        E = t.int("num_experts", None, maximum=1 << 16)
        k = t.int("top_k_experts", None, maximum=1 << 16)
        Im = t.int("moe_intermediate_size", None)
        if moe:
            for key, v in (("num_experts", E), ("top_k_experts", k), ("moe_intermediate_size", Im)):
                if v is None:
                    raise t.error(key, "is required when enable_moe_block is true")
            assert E is not None and k is not None
            if k > E:
                raise t.error("top_k_experts", f"({k}) must not exceed num_experts ({E})")
        # absent: 256 (transformers' default); null or 0: no per-layer embeddings
        P = t.int("hidden_size_per_layer_input", 256, minimum=0, nullable=True) or 0
        V_ple = t.int("vocab_size_per_layer_input", 262144, maximum=1 << 31)
        S = t.int("num_kv_shared_layers", 0, minimum=0, maximum=MAX_LAYERS)
        assert V_ple is not None and S is not None
        if S > L:
            raise t.error("num_kv_shared_layers", f"({S}) must not exceed num_hidden_layers ({L})")
        double_wide = t.bool("use_double_wide_mlp", False)
        eps = t.float("rms_norm_eps", 1e-6)
        max_pos = t.int("max_position_embeddings", 131072, maximum=1 << 40)
        window = t.int("sliding_window", 512, nullable=True, maximum=1 << 40)
        softcap = t.float("final_logit_softcapping", None)
        # The model class's own flag: root of the wrapper, else the text config.
        tie = (root if wrapper else t).bool("tie_word_embeddings", True)

        # layer_types: absent -> every sixth layer full; the last layer is full.
        lt_raw = t.d.get("layer_types")
        if lt_raw is None:
            kinds = [FULL_ATTENTION if (i + 1) % 6 == 0 else SLIDING_ATTENTION for i in range(L)]
        else:
            if not isinstance(lt_raw, list):
                raise t.error("layer_types", f"must be an array of strings, got {_tname(lt_raw)}")
            if len(lt_raw) != L:
                raise t.error("layer_types", f"has {len(lt_raw)} entries but num_hidden_layers is {L}")
            kinds = []
            for i, v in enumerate(lt_raw):
                if v not in _LAYER_KINDS:
                    raise t.error(f"layer_types[{i}]", f"must be 'full_attention' or 'sliding_attention', got {v!r}")
                kinds.append(v)
        forced = kinds[-1] != FULL_ATTENTION
        kinds[-1] = FULL_ATTENTION

        # RoPE: keyed by layer type; the full layers' entry must be proportional
        # (llama.cpp realises it through the rope_freqs tensor it generates).
        rp = t.d.get("rope_parameters")
        if rp is None:
            rp = _DEFAULT_ROPE
        if not isinstance(rp, Mapping):
            raise t.error("rope_parameters", f"must be an object keyed by layer type, got {_tname(rp)}")
        full = rp.get(FULL_ATTENTION)
        if not isinstance(full, Mapping):
            raise t.error(f"rope_parameters.{FULL_ATTENTION}", f"must be an object, got {_tname(full)}")
        fr = _Reader(full, t.key(f"rope_parameters.{FULL_ATTENTION}."), source)
        if full.get("rope_type") != "proportional":
            raise fr.error("rope_type", "must be 'proportional' for Gemma 4's full-attention layers "
                                        f"(llama.cpp's converter requires it), got {full.get('rope_type')!r}")
        prf = fr.float("partial_rotary_factor", t.float("partial_rotary_factor", None))
        if prf is None:
            raise fr.error("partial_rotary_factor", "is required (no root partial_rotary_factor either)")
        if not 0.0 <= prf <= 1.0:
            raise fr.error("partial_rotary_factor", f"must be in [0, 1], got {prf}")
        theta_full = fr.float("rope_theta", t.float("rope_theta", 1000000.0))
        sl = rp.get(SLIDING_ATTENTION, {})
        if not isinstance(sl, Mapping):
            raise t.error(f"rope_parameters.{SLIDING_ATTENTION}", f"must be an object, got {_tname(sl)}")
        theta_sl = _Reader(sl, t.key(f"rope_parameters.{SLIDING_ATTENTION}."), source).float(
            "rope_theta", t.float("rope_theta", 10000.0))

        # Per-layer geometry: per_layer_config overrides (re-saved form), else
        # global_head_dim / num_global_key_value_heads on full layers (published form).
        plc = t.d.get("per_layer_config")
        overrides: dict[int, Mapping[str, Any]] = {}
        if plc is not None:
            if not isinstance(plc, Mapping):
                raise t.error("per_layer_config", f"must be an object keyed by layer index, got {_tname(plc)}")
            for key, v in plc.items():
                try:
                    idx = int(key)
                except ValueError:
                    idx = -1
                if not 0 <= idx < L or not str(key).isdecimal():
                    raise t.error(f"per_layer_config.{key}", f"is not a layer index in [0, {L})")
                if not isinstance(v, Mapping):
                    raise t.error(f"per_layer_config.{key}", f"must be an object, got {_tname(v)}")
                overrides[idx] = v
            ghd = nkvg = None
        else:
            ghd = t.int("global_head_dim", 512, maximum=1 << 16)
            nkvg = t.int("num_global_key_value_heads", None, maximum=1 << 16)

        layers = []
        for i, kind in enumerate(kinds):
            is_full = kind == FULL_ATTENTION
            if plc is not None:
                o = _Reader(overrides.get(i, {}), t.key(f"per_layer_config.{i}."), source)
                l_hd = o.int("head_dim", hd, maximum=1 << 16)
                l_nkv = o.int("num_key_value_heads", nkv, maximum=1 << 16)
                l_I = o.int("intermediate_size", I)
            else:
                l_hd = ghd if is_full else hd
                l_nkv = nkvg if (is_full and k_eq_v and nkvg is not None) else nkv
                l_I = I
            shared = i >= L - S
            if double_wide and shared:
                l_I = 2 * l_I  # type: ignore[operator]
            assert l_hd is not None and l_nkv is not None and l_I is not None
            layers.append(Gemma4Layer(i, kind, l_hd, l_nkv, not (is_full and k_eq_v), shared, l_I))

        return cls(
            hidden_size=H, num_hidden_layers=L, vocab_size=V, intermediate_size=I, num_attention_heads=nh,
            num_key_value_heads=nkv, head_dim=hd, layer_types=tuple(kinds), layers=tuple(layers),
            rope_theta_full=float(theta_full or 1000000.0), rope_theta_sliding=float(theta_sl or 10000.0),
            partial_rotary_factor_full=prf, rms_norm_eps=float(eps if eps is not None else 1e-6),
            max_position_embeddings=int(max_pos or 131072), sliding_window=window, final_logit_softcapping=softcap,
            attention_k_eq_v=k_eq_v, enable_moe_block=moe, num_experts=E, top_k_experts=k,
            moe_intermediate_size=Im, hidden_size_per_layer_input=P, vocab_size_per_layer_input=V_ple,
            num_kv_shared_layers=S, use_double_wide_mlp=double_wide, tie_word_embeddings=tie, wrapper=wrapper,
            forced_full_last=forced, per_layer_config_form=plc is not None, source=source,
            quantization=quant_scheme(d, source),
        )
