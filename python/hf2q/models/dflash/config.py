"""DFlash drafter config: both ``config.json`` revisions, the eight rules,
and the published drafters' configs (docs/DFLASH.md)."""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Union

from ..._configfile import json_type_name, parse_config_json, read_config_text
from ...errors import ConfigError
from .._limits import check_bound

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_MASK_TOKEN_ID",
    "DEFAULT_ROPE_THETA",
    "DRAFTER_CONFIGS",
    "FULL_ATTENTION",
    "GEMMA4_26B_A4B_DRAFTER_CONFIG",
    "LAYER_TENSOR_NAMES",
    "NORM_SUFFIXES",
    "QWEN36_27B_DRAFTER_CONFIG",
    "QWEN36_35B_A3B_DRAFTER_CONFIG",
    "QWEN36_35B_A3B_NEW_DRAFTER_CONFIG",
    "SLIDING_ATTENTION",
    "TINY_DRAFTER_CONFIG",
    "DFlashConfig",
]

PathLike = Union[str, "os.PathLike[str]"]

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
_LAYER_KINDS = (FULL_ATTENTION, SLIDING_ATTENTION)
U32_MAX = (1 << 32) - 1
#: Values used when config.json leaves the field out: those of llama.cpp's
#: converter (block size 16; rope_theta through transformers' Qwen3Config,
#: 10000), mask token 0, all layers full attention.
DEFAULT_BLOCK_SIZE = 16
DEFAULT_ROPE_THETA = 10000.0
DEFAULT_MASK_TOKEN_ID = 0

#: Per-layer tensor names (after ``layers.{i}.``), in manifest (alphabetical) order.
LAYER_TENSOR_NAMES: tuple[str, ...] = (
    "input_layernorm.weight",
    "mlp.down_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "post_attention_layernorm.weight",
    "self_attn.k_norm.weight",
    "self_attn.k_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.q_proj.weight",
    "self_attn.v_proj.weight",
)

#: The six RMSNorm kinds (decoded to F32 on the device).
NORM_SUFFIXES: tuple[str, ...] = (
    "hidden_norm.weight",
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "self_attn.k_norm.weight",
    "self_attn.q_norm.weight",
    "norm.weight",
)




# ============================================================================ config


def _type_error(key: str, want: str, v: Any) -> ConfigError:
    return ConfigError(f"config key '{key}' must be {want}, got {json_type_name(v)} {v!r}", key=key)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool))


def _as_int(v: Any, key: str, *, minimum: int | None = None) -> int:
    if not _is_int(v):
        raise _type_error(key, "an integer", v)
    if minimum is not None and v < minimum:
        raise ConfigError(f"config key '{key}' must be >= {minimum}, got {v}", key=key)
    check_bound(key, v)  # cost limits: nothing scales with an unreasonable number
    return int(v)


def _as_float(v: Any, key: str, *, positive: bool = False) -> float:
    if not _is_number(v):
        raise _type_error(key, "a number", v)
    f = float(v)
    if not math.isfinite(f):
        raise ConfigError(f"config key '{key}' must be finite, got {v!r}", key=key)
    if positive and f <= 0:
        raise ConfigError(f"config key '{key}' must be > 0, got {v!r}", key=key)
    return f


def _copy_json(v: Any, key: str) -> Any:
    # A mapping handed to from_dict may nest deeper than the recursion limit.
    try:
        return copy.deepcopy(v)
    except RecursionError:
        raise ConfigError(f"config key '{key}' nests too deeply", key=key) from None


def _as_object(v: Any, key: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise _type_error(key, "an object", v)
    return v


@dataclass(frozen=True)
class DFlashConfig:
    """A validated DFlash drafter config (docs/DFLASH.md).

    Build with :meth:`from_file`, :meth:`from_json_str` or :meth:`from_dict`,
    which accept both config revisions (root ``rope_theta``/``block_size`` or
    ``rope_parameters`` + ``dflash_config.block_size``), check JSON types
    (naming the key) and then the eight validation rules, in order. Direct
    construction also runs the eight rules.
    """

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    num_target_layers: int
    target_layer_ids: tuple[int, ...]
    rope_theta: float
    block_size: int
    mask_token_id: int = 0
    #: ``rope_scaling`` when it is an object, else ``rope_parameters`` when its
    #: ``rope_type`` is present and not ``"default"``, else None.
    rope_scaling: dict[str, Any] | None = field(default=None, compare=True, hash=False)
    #: One entry per layer; None (the default) means all ``"full_attention"``.
    layer_types: tuple[str, ...] | None = None
    sliding_window: int | None = None
    final_logit_softcapping: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_layer_ids", tuple(self.target_layer_ids))
        if self.layer_types is None:
            object.__setattr__(self, "layer_types", (FULL_ATTENTION,) * self.num_hidden_layers)
        else:
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
        self.validate()

    # ------------------------------------------------------------------ rules
    def validate(self) -> None:
        """The eight rules of docs/DFLASH.md, in order; the first broken raises
        :class:`~hf2q.ConfigError` with ``rule`` set."""
        L = self.num_hidden_layers
        lt = self.layer_types or ()
        if len(lt) != L:
            raise ConfigError(
                f"config rule 1: layer_types has {len(lt)} entries but num_hidden_layers is {L} "
                "(one attention kind per layer)",
                key="layer_types",
                rule=1,
            )
        if SLIDING_ATTENTION in lt and self.sliding_window is None:
            raise ConfigError(
                "config rule 2: layer_types has sliding_attention layers but sliding_window is not set",
                key="sliding_window",
                rule=2,
            )
        if self.block_size < 2:
            raise ConfigError(
                f"config rule 3: block_size must be >= 2 (at least one mask token per block), got {self.block_size}",
                key="block_size",
                rule=3,
            )
        if self.num_target_layers <= 0:
            raise ConfigError(
                f"config rule 4: num_target_layers must be > 0, got {self.num_target_layers}",
                key="num_target_layers",
                rule=4,
            )
        ids = self.target_layer_ids
        if not ids:
            raise ConfigError(
                "config rule 5: dflash_config.target_layer_ids is empty (fc needs at least one tapped layer)",
                key="dflash_config.target_layer_ids",
                rule=5,
            )
        for a, b in zip(ids, ids[1:]):
            if b <= a:
                raise ConfigError(
                    f"config rule 6: dflash_config.target_layer_ids must be strictly increasing, got {list(ids)} "
                    f"({a} then {b})",
                    key="dflash_config.target_layer_ids",
                    rule=6,
                )
        if ids[0] < 0 or ids[-1] >= self.num_target_layers:
            raise ConfigError(
                f"config rule 7: dflash_config.target_layer_ids {list(ids)} must lie in "
                f"[0, num_target_layers = {self.num_target_layers})",
                key="dflash_config.target_layer_ids",
                rule=7,
            )
        if not 0 <= self.mask_token_id <= U32_MAX:
            raise ConfigError(
                f"config rule 8: dflash_config.mask_token_id must be in [0, 2^32 - 1], got {self.mask_token_id}",
                key="dflash_config.mask_token_id",
                rule=8,
            )

    # ------------------------------------------------------------------ derived
    @property
    def num_taps(self) -> int:
        """T, the number of tapped target layers."""
        return len(self.target_layer_ids)

    @property
    def fc_input_dim(self) -> int:
        """``T * H`` (not ``num_target_layers * H``)."""
        return self.num_taps * self.hidden_size

    @property
    def q_width(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def n_norm_elements(self) -> int:
        """``L * (2*Dh + 2*H) + 2*H``: elements of the six norm kinds."""
        H, L, Dh = self.hidden_size, self.num_hidden_layers, self.head_dim
        return L * (2 * Dh + 2 * H) + 2 * H

    @property
    def num_tensors(self) -> int:
        """``2 + 11*L + 1``."""
        return 3 + len(LAYER_TENSOR_NAMES) * self.num_hidden_layers

    def is_sliding(self, layer: int) -> bool:
        return (self.layer_types or ())[layer] == SLIDING_ATTENTION

    # ------------------------------------------------------------------ parsing
    @classmethod
    def from_file(cls, path: PathLike) -> DFlashConfig:
        """Read ``config.json`` (``path`` may be the file or its directory)."""
        p, text = read_config_text(path)
        try:
            return cls.from_json_str(text)
        except ConfigError as e:
            raise ConfigError(f"{p}: {e}", key=e.key, rule=e.rule) from None

    @classmethod
    def from_json_str(cls, text: str | bytes) -> DFlashConfig:
        d = parse_config_json(text)  # bounded depth and integer sizes: ConfigError otherwise
        if not isinstance(d, dict):
            raise ConfigError(f"config must be a JSON object, got {json_type_name(d)}")
        return cls.from_dict(d)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DFlashConfig:
        """Parse a config mapping: required keys and JSON types first (naming
        the key), then the two revisions' resolution, then rules 1-8."""
        if not isinstance(d, Mapping):
            raise ConfigError(f"config must be a JSON object, got {json_type_name(d)}")

        archs = d.get("architectures")
        if "dflash_config" not in d and not (isinstance(archs, list) and "DFlashDraftModel" in archs):
            # another model's config: say so, not which key it lacks
            raise ConfigError(
                f"not a DFlash drafter config (architectures {archs!r}, model_type {d.get('model_type')!r}): "
                "it has no 'dflash_config'; hf2q.dflash loads DFlash drafters only (`hf2q load` picks the "
                "loader from config.json)", key="dflash_config")

        def req(key: str) -> Any:
            if key not in d:
                raise ConfigError(f"config is missing required key '{key}'", key=key)
            return d[key]

        H = _as_int(req("hidden_size"), "hidden_size", minimum=1)
        L = _as_int(req("num_hidden_layers"), "num_hidden_layers", minimum=1)
        Qh = _as_int(req("num_attention_heads"), "num_attention_heads", minimum=1)
        Kh = _as_int(req("num_key_value_heads"), "num_key_value_heads", minimum=1)
        Dh = _as_int(req("head_dim"), "head_dim", minimum=1)
        I = _as_int(req("intermediate_size"), "intermediate_size", minimum=1)
        vocab = _as_int(req("vocab_size"), "vocab_size", minimum=1)
        eps = _as_float(req("rms_norm_eps"), "rms_norm_eps", positive=True)
        max_pos = _as_int(req("max_position_embeddings"), "max_position_embeddings", minimum=1)
        n_target = _as_int(req("num_target_layers"), "num_target_layers")

        dcfg = _as_object(req("dflash_config"), "dflash_config")
        if "target_layer_ids" not in dcfg:
            raise ConfigError(
                "config is missing required key 'dflash_config.target_layer_ids'", key="dflash_config.target_layer_ids"
            )
        raw_ids = dcfg["target_layer_ids"]
        if not isinstance(raw_ids, (list, tuple)):
            raise _type_error("dflash_config.target_layer_ids", "an array of integers", raw_ids)
        ids = tuple(_as_int(v, f"dflash_config.target_layer_ids[{i}]") for i, v in enumerate(raw_ids))
        mask = dcfg.get("mask_token_id")
        mask_id = DEFAULT_MASK_TOKEN_ID if mask is None else _as_int(mask, "dflash_config.mask_token_id")

        # Optional keys.
        raw_scaling = d.get("rope_scaling")
        rope_scaling = dict(_copy_json(raw_scaling, "rope_scaling")) if isinstance(raw_scaling, Mapping) else None
        rope_params: Mapping[str, Any] | None = None
        if d.get("rope_parameters") is not None:
            rope_params = _as_object(d["rope_parameters"], "rope_parameters")
        layer_types: tuple[str, ...] | None = None
        if d.get("layer_types") is not None:
            raw_lt = d["layer_types"]
            if not isinstance(raw_lt, (list, tuple)):
                raise _type_error("layer_types", "an array of strings", raw_lt)
            kinds = []
            for i, v in enumerate(raw_lt):
                if not isinstance(v, str):
                    raise _type_error(f"layer_types[{i}]", "a string", v)
                if v not in _LAYER_KINDS:
                    raise ConfigError(
                        f"config key 'layer_types[{i}]' must be 'full_attention' or 'sliding_attention', got {v!r}",
                        key=f"layer_types[{i}]",
                    )
                kinds.append(v)
            layer_types = tuple(kinds)
        sliding_window = None
        if d.get("sliding_window") is not None:
            sliding_window = _as_int(d["sliding_window"], "sliding_window", minimum=1)
        softcap = None
        if d.get("final_logit_softcapping") is not None:
            softcap = _as_float(d["final_logit_softcapping"], "final_logit_softcapping")

        # rope_theta: root, else rope_parameters.rope_theta, else rope_scaling.rope_theta.
        if d.get("rope_theta") is not None:
            rope_theta = _as_float(d["rope_theta"], "rope_theta", positive=True)
        elif rope_params is not None and rope_params.get("rope_theta") is not None:
            rope_theta = _as_float(rope_params["rope_theta"], "rope_parameters.rope_theta", positive=True)
        elif rope_scaling is not None and rope_scaling.get("rope_theta") is not None:
            rope_theta = _as_float(rope_scaling["rope_theta"], "rope_scaling.rope_theta", positive=True)
        else:
            # transformers' Qwen3Config default, which llama.cpp's converter
            # reads through AutoConfig when no location states it.
            rope_theta = DEFAULT_ROPE_THETA

        # block_size: root, else dflash_config.block_size; both and different -> error.
        root_bs = None if d.get("block_size") is None else _as_int(d["block_size"], "block_size")
        nested_bs = None if dcfg.get("block_size") is None else _as_int(dcfg["block_size"], "dflash_config.block_size")
        if root_bs is not None and nested_bs is not None and root_bs != nested_bs:
            raise ConfigError(
                f"config has conflicting block sizes: block_size = {root_bs} but dflash_config.block_size = {nested_bs}",
                key="block_size",
            )
        block_size = root_bs if root_bs is not None else nested_bs
        if block_size is None:
            # Neither location states it: llama.cpp's converter (and z-lab's
            # DFlashDraftModel) use 16. A default is not checked against anything.
            block_size = DEFAULT_BLOCK_SIZE

        # Scaling: rope_scaling object, else rope_parameters with a non-default rope_type.
        if rope_scaling is None and rope_params is not None and "rope_type" in rope_params:
            rt = rope_params["rope_type"]
            if not isinstance(rt, str):
                raise _type_error("rope_parameters.rope_type", "a string", rt)
            if rt != "default":
                rope_scaling = dict(_copy_json(rope_params, "rope_parameters"))

        return cls(
            hidden_size=H,
            num_hidden_layers=L,
            num_attention_heads=Qh,
            num_key_value_heads=Kh,
            head_dim=Dh,
            intermediate_size=I,
            vocab_size=vocab,
            rms_norm_eps=eps,
            max_position_embeddings=max_pos,
            num_target_layers=n_target,
            target_layer_ids=ids,
            rope_theta=rope_theta,
            block_size=block_size,
            mask_token_id=mask_id,
            rope_scaling=rope_scaling,
            layer_types=layer_types,
            sliding_window=sliding_window,
            final_logit_softcapping=softcap,
        )


# ============================================================================ known drafters

#: z-lab gemma-4-26B-A4B-it-DFlash ``config.json`` (docs/DFLASH.md), verbatim.
GEMMA4_26B_A4B_DRAFTER_CONFIG: dict[str, Any] = {
    "architectures": ["DFlashDraftModel"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "block_size": 16,
    "bos_token_id": 2,
    "dflash_config": {"mask_token_id": 4, "target_layer_ids": [1, 6, 11, 17, 22, 27]},
    "dtype": "bfloat16",
    "eos_token_id": 1,
    "final_logit_softcapping": 30.0,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2816,
    "intermediate_size": 5632,
    "layer_types": [
        "sliding_attention",
        "sliding_attention",
        "sliding_attention",
        "sliding_attention",
        "full_attention",
    ],
    "max_position_embeddings": 262144,
    "max_window_layers": 5,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_hidden_layers": 5,
    "num_key_value_heads": 8,
    "num_target_layers": 30,
    "pad_token_id": 0,
    "rms_norm_eps": 1e-06,
    "sliding_window": 2048,
    "tie_word_embeddings": False,
    "use_cache": True,
    "use_sliding_window": True,
    "vocab_size": 262144,
    "rope_theta": 1000000,
    "rope_scaling": None,
}

#: Qwen3.6-27B drafter (docs/DFLASH.md): original revision, root block_size.
QWEN36_27B_DRAFTER_CONFIG: dict[str, Any] = {
    "architectures": ["DFlashDraftModel"],
    "block_size": 16,
    "dflash_config": {"mask_token_id": 248070, "target_layer_ids": [1, 16, 31, 46, 61]},
    "dtype": "bfloat16",
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 5120,
    "intermediate_size": 17408,
    "layer_types": ["sliding_attention"] * 4 + ["full_attention"],
    "max_position_embeddings": 262144,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_hidden_layers": 5,
    "num_key_value_heads": 8,
    "num_target_layers": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 10000000,
    "sliding_window": 2048,
    "tie_word_embeddings": False,
    "use_sliding_window": True,
    "vocab_size": 248320,
}

#: Qwen3.6-35B-A3B drafter, original revision (docs/DFLASH.md): 8 full-attention layers.
QWEN36_35B_A3B_DRAFTER_CONFIG: dict[str, Any] = {
    "architectures": ["DFlashDraftModel"],
    "block_size": 16,
    "dflash_config": {"mask_token_id": 248070, "target_layer_ids": [1, 10, 19, 28, 37]},
    "dtype": "bfloat16",
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "max_position_embeddings": 262144,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_hidden_layers": 8,
    "num_key_value_heads": 4,
    "num_target_layers": 40,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 10000000,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "vocab_size": 248320,
}

#: Qwen3.6-35B-A3B drafter, newer revision (docs/DFLASH.md): rope_parameters and
#: dflash_config.block_size, 5 sliding (4096) + 1 full layers.
QWEN36_35B_A3B_NEW_DRAFTER_CONFIG: dict[str, Any] = {
    "architectures": ["DFlashDraftModel"],
    "dflash_config": {
        "block_size": 16,
        "mask_token_id": 248077,
        "target_layer_ids": [1, 6, 11, 16, 22, 27, 32, 37],
    },
    "dtype": "bfloat16",
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
    "max_position_embeddings": 262144,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_hidden_layers": 6,
    "num_key_value_heads": 8,
    "num_target_layers": 40,
    "rms_norm_eps": 1e-06,
    "rope_parameters": {"rope_theta": 10000000, "rope_type": "default"},
    "sliding_window": 4096,
    "tie_word_embeddings": False,
    "use_sliding_window": True,
    "vocab_size": 248320,
}

#: A small valid drafter for tests (H=64, L=2, Qh/Kh=4/2, Dh=16, I=128, taps [1, 3]).
TINY_DRAFTER_CONFIG: dict[str, Any] = {
    "architectures": ["DFlashDraftModel"],
    "block_size": 4,
    "dflash_config": {"mask_token_id": 5, "target_layer_ids": [1, 3]},
    "dtype": "bfloat16",
    "head_dim": 16,
    "hidden_size": 64,
    "intermediate_size": 128,
    "layer_types": ["sliding_attention", "full_attention"],
    "max_position_embeddings": 512,
    "model_type": "qwen3",
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "num_target_layers": 6,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 10000,
    "sliding_window": 32,
    "vocab_size": 256,
}

#: Named configs (deep-copy before mutating).
DRAFTER_CONFIGS: dict[str, dict[str, Any]] = {
    "gemma-4-26B-A4B-it": GEMMA4_26B_A4B_DRAFTER_CONFIG,
    "Qwen3.6-27B": QWEN36_27B_DRAFTER_CONFIG,
    "Qwen3.6-35B-A3B": QWEN36_35B_A3B_DRAFTER_CONFIG,
    "Qwen3.6-35B-A3B-new": QWEN36_35B_A3B_NEW_DRAFTER_CONFIG,
    "tiny": TINY_DRAFTER_CONFIG,
}


