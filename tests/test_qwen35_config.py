"""Qwen35Config: config.json parsing (docs/QWEN35MOE.md)."""

from __future__ import annotations

import copy
import json

import pytest

from hf2q import ConfigError, Hf2qError
from hf2q.qwen35 import Qwen35Config
from hf2q.testing.qwen35_checkpoint import (
    QWEN36_35B_A3B_TEXT_CONFIG,
    TINY_TEXT_CONFIG,
    qwen35_config_dict,
)


def real(multimodal: bool = True) -> dict:
    return qwen35_config_dict(QWEN36_35B_A3B_TEXT_CONFIG, multimodal=multimodal)


def text_of(d: dict) -> dict:
    return d["text_config"] if "text_config" in d else d


@pytest.mark.parametrize("multimodal", [True, False])
def test_real_config_values(multimodal: bool) -> None:
    c = Qwen35Config.from_dict(real(multimodal))
    assert (c.hidden_size, c.num_hidden_layers, c.vocab_size) == (2048, 40, 248320)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (16, 2, 256)
    assert (c.linear_num_key_heads, c.linear_num_value_heads) == (16, 32)
    assert (c.linear_key_head_dim, c.linear_value_head_dim, c.linear_conv_kernel_dim) == (128, 128, 4)
    assert (c.num_experts, c.num_experts_per_tok) == (256, 8)
    assert (c.moe_intermediate_size, c.shared_expert_intermediate_size) == (512, 512)
    assert c.full_attention_interval == 4
    assert c.full_attention_layers == list(range(3, 40, 4))
    assert len(c.full_attention_layers) == 10 and len(c.linear_attention_layers) == 30
    assert c.layer_kinds[:4] == ["linear", "linear", "linear", "full"]
    assert c.partial_rotary_factor == 0.25 and c.rotary_dim == 64
    assert c.rope_theta == 1e7
    assert c.mrope_section == (11, 11, 10) and c.mrope_section_gguf == (11, 11, 10, 0)
    assert c.mrope_interleaved is True
    assert c.rms_norm_eps == 1e-6
    assert c.attn_output_gate is True
    assert c.max_position_embeddings == 262144
    assert c.mtp_num_hidden_layers == 1
    assert c.conv_channels == 8192
    assert c.v_per_k == 2
    assert c.q_proj_rows == 2 * 16 * 256
    assert c.multimodal is multimodal
    assert c.tie_word_embeddings is False
    assert c.layer_kind(40) == "full"  # the MTP block
    with pytest.raises(IndexError):
        c.layer_kind(41)


def test_from_file_dir_and_path(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(real()))
    a = Qwen35Config.from_file(tmp_path)
    b = Qwen35Config.from_file(tmp_path / "config.json")
    assert a == b == Qwen35Config.from_dict(real())


def test_from_file_errors(tmp_path) -> None:
    with pytest.raises(ConfigError, match="config.json: config file not found"):
        Qwen35Config.from_file(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="invalid JSON"):
        Qwen35Config.from_file(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="JSON object"):
        Qwen35Config.from_file(tmp_path)


def test_config_error_is_hf2q_error() -> None:
    d = real()
    del d["text_config"]["num_experts"]
    with pytest.raises(Hf2qError):
        Qwen35Config.from_dict(d)


REQUIRED = [
    "hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads", "num_key_value_heads",
    "head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
    "linear_value_head_dim", "linear_conv_kernel_dim", "num_experts", "num_experts_per_tok",
    "moe_intermediate_size", "shared_expert_intermediate_size", "max_position_embeddings", "rms_norm_eps",
]


@pytest.mark.parametrize("field", REQUIRED)
@pytest.mark.parametrize("multimodal", [True, False])
def test_missing_field(field: str, multimodal: bool) -> None:
    d = real(multimodal)
    del text_of(d)[field]
    want = f"text_config.{field}" if multimodal else field
    with pytest.raises(ConfigError, match=f"'{want}' is missing") as ei:
        Qwen35Config.from_dict(d)
    assert ei.value.field == want  # type: ignore[attr-defined]


def test_missing_rope_theta_takes_the_converters_default() -> None:
    d = real()
    del d["text_config"]["rope_parameters"]["rope_theta"]
    assert Qwen35Config.from_dict(d).rope_theta == 10000.0  # transformers' default, seen by llama.cpp
    d["text_config"]["rope_parameters"]["rope_theta"] = "1e7"
    with pytest.raises(ConfigError, match="rope_theta"):
        Qwen35Config.from_dict(d)


@pytest.mark.parametrize("field,value", [
    ("hidden_size", "2048"),
    ("hidden_size", 2048.0),
    ("hidden_size", True),
    ("num_experts", None.__class__),  # replaced below by a list
    ("num_experts_per_tok", 8.5),
    ("vocab_size", -1),
    ("vocab_size", 0),
    ("rms_norm_eps", "1e-6"),
    ("rms_norm_eps", 0),
    ("rms_norm_eps", True),
    ("attn_output_gate", "yes"),
    ("mtp_num_hidden_layers", -1),
    ("mtp_num_hidden_layers", 1.0),
    ("layer_types", "linear_attention"),
    ("layer_types", ["linear_attention"] * 39),
    ("layer_types", ["linear_attention"] * 39 + ["sliding_attention"]),
    ("full_attention_interval", 0),
    ("full_attention_interval", "4"),
    ("tie_word_embeddings", 0),
])
def test_wrong_typed_field(field: str, value) -> None:
    d = real()
    if value is None.__class__:
        value = [256]
    d["text_config"][field] = value
    with pytest.raises(ConfigError, match=f"text_config.{field}"):
        Qwen35Config.from_dict(d)


@pytest.mark.parametrize("field,value", [
    ("rope_theta", "1e7"),
    ("partial_rotary_factor", 1.5),
    ("partial_rotary_factor", "0.25"),
    ("partial_rotary_factor", 0.001),  # rotary_dim 0
    ("mrope_section", [11, 11]),  # sums to 22 != 32
    ("mrope_section", "11,11,10"),
    ("mrope_section", [11, 11, -1, 11]),
    ("mrope_interleaved", 1),
    ("rope_type", 3),
])
def test_wrong_rope_field(field: str, value) -> None:
    d = real()
    d["text_config"]["rope_parameters"][field] = value
    with pytest.raises(ConfigError, match=f"text_config.rope_parameters.{field}"):
        Qwen35Config.from_dict(d)


def test_nv_not_multiple_of_nk() -> None:
    d = real()
    d["text_config"]["linear_num_value_heads"] = 24  # 24 / 16 = 1.5
    with pytest.raises(ConfigError, match="linear_num_value_heads.*not an integer"):
        Qwen35Config.from_dict(d)


def test_kv_heads_must_divide_heads() -> None:
    d = real()
    d["text_config"]["num_key_value_heads"] = 3
    with pytest.raises(ConfigError, match="num_key_value_heads"):
        Qwen35Config.from_dict(d)


def test_topk_beyond_experts() -> None:
    d = real()
    d["text_config"]["num_experts_per_tok"] = 257
    with pytest.raises(ConfigError, match="num_experts_per_tok"):
        Qwen35Config.from_dict(d)


def test_layer_types_and_interval_disagree() -> None:
    d = real()
    lt = d["text_config"]["layer_types"]
    lt[3], lt[4] = "linear_attention", "full_attention"
    with pytest.raises(ConfigError, match="layer_types.*disagrees.*full_attention_interval"):
        Qwen35Config.from_dict(d)
    d["text_config"]["full_attention_interval"] = 4
    d["text_config"]["layer_types"] = ["full_attention" if i % 4 == 0 else "linear_attention" for i in range(40)]
    with pytest.raises(ConfigError, match="layer 0"):
        Qwen35Config.from_dict(d)


def test_layer_pattern_sources() -> None:
    # layer_types alone (no interval), custom pattern
    d = real()
    del d["text_config"]["full_attention_interval"]
    d["text_config"]["layer_types"] = ["full_attention" if i % 2 else "linear_attention" for i in range(40)]
    c = Qwen35Config.from_dict(d)
    assert c.full_attention_layers == list(range(1, 40, 2)) and c.full_attention_interval is None
    # interval alone
    d = real()
    del d["text_config"]["layer_types"]
    d["text_config"]["full_attention_interval"] = 5
    c = Qwen35Config.from_dict(d)
    assert c.full_attention_layers == list(range(4, 40, 5))
    # neither: default interval 4
    del d["text_config"]["full_attention_interval"]
    c = Qwen35Config.from_dict(d)
    assert c.full_attention_layers == list(range(3, 40, 4)) and c.full_attention_interval is None


def test_rope_from_rope_scaling_and_root() -> None:
    d = real(multimodal=False)
    rp = d.pop("rope_parameters")
    d["rope_scaling"] = rp
    c = Qwen35Config.from_dict(d)
    assert (c.rope_theta, c.rotary_dim, c.mrope_section) == (1e7, 64, (11, 11, 10))
    # everything at the root (older style), rope_scaling null
    d = real(multimodal=False)
    rp = d.pop("rope_parameters")
    d["rope_scaling"] = None
    d["rope_theta"] = 5e6
    d["partial_rotary_factor"] = 0.5  # rotary_dim 128 -> sections must sum to 64
    d["mrope_section"] = [24, 20, 20]
    c = Qwen35Config.from_dict(d)
    assert (c.rope_theta, c.rotary_dim, c.mrope_section_gguf) == (5e6, 128, (24, 20, 20, 0))
    # rope_parameters wins over the root
    d = real(multimodal=False)
    d["rope_theta"] = 1.0
    assert Qwen35Config.from_dict(d).rope_theta == 1e7


def test_defaults() -> None:
    d = real()
    tc = d["text_config"]
    for k in ("mtp_num_hidden_layers", "attn_output_gate"):
        del tc[k]
    for k in ("partial_rotary_factor", "mrope_section", "mrope_interleaved", "rope_type"):
        del tc["rope_parameters"][k]
    c = Qwen35Config.from_dict(d)
    assert c.mtp_num_hidden_layers == 0 and c.attn_output_gate is True
    assert c.partial_rotary_factor == 0.25 and c.rotary_dim == 64
    assert c.mrope_section == (11, 11, 10) and c.mrope_interleaved is True and c.rope_type == "default"


def test_text_fields_prefer_text_config() -> None:
    d = real()
    d["vocab_size"] = 1  # a stale root value must not win
    d["tie_word_embeddings"] = True
    del d["text_config"]["hidden_size"]
    d["hidden_size"] = 2048  # falls back to the root when text_config lacks it
    c = Qwen35Config.from_dict(d)
    assert c.vocab_size == 248320 and c.hidden_size == 2048
    assert c.tie_word_embeddings is True  # wrapper-level flag


def test_model_type_checked() -> None:
    d = real()
    d["model_type"] = "qwen3_next"
    with pytest.raises(ConfigError, match="model_type"):
        Qwen35Config.from_dict(d)
    d = real()
    d["text_config"]["model_type"] = "qwen3_moe"
    with pytest.raises(ConfigError, match="text_config.model_type"):
        Qwen35Config.from_dict(d)
    d = real()
    d["text_config"] = [1]
    with pytest.raises(ConfigError, match="text_config"):
        Qwen35Config.from_dict(d)


def test_tiny_config() -> None:
    c = Qwen35Config.from_dict(qwen35_config_dict("tiny"))
    assert c.v_per_k == 3 and c.conv_channels == 2 * 2 * 32 + 6 * 64 and c.rotary_dim == 8
    assert c.layer_kinds == ["linear", "linear", "linear", "full"]
    assert Qwen35Config.from_dict(copy.deepcopy(qwen35_config_dict(TINY_TEXT_CONFIG, multimodal=True))).multimodal
