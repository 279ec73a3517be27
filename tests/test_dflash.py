"""hf2q.dflash: config revisions and rules (docs/DFLASH.md), manifest,
weight validation errors, byte accounting for every drafter and
the synthetic checkpoint writer. Never allocates a full-size drafter."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hf2q import dflash
from hf2q.dflash import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_ROPE_THETA,
    DRAFTER_CONFIGS,
    GEMMA4_26B_A4B_DRAFTER_CONFIG,
    QWEN36_27B_DRAFTER_CONFIG,
    QWEN36_35B_A3B_DRAFTER_CONFIG,
    QWEN36_35B_A3B_NEW_DRAFTER_CONFIG,
    TINY_DRAFTER_CONFIG,
    DFlashConfig,
    DFlashWeights,
    ManifestEntry,
    expected_manifest,
    expected_resident_bytes,
    expected_total_data_bytes,
)
from hf2q.errors import (
    ConfigError,
    DtypeMismatchError,
    ExtraTensorError,
    Hf2qError,
    ManifestError,
    MissingTensorError,
    ShapeMismatchError,
)
from hf2q.safetensors import open_checkpoint
from hf2q.testing import make_dflash_checkpoint
from hf2q.testing.dflash_checkpoint import tensor_bits, write_bf16_safetensors
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.numpy import save_file

HYP = settings(
    max_examples=int(os.environ.get("HF2Q_FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def gemma() -> dict[str, Any]:
    return copy.deepcopy(GEMMA4_26B_A4B_DRAFTER_CONFIG)


def tiny() -> dict[str, Any]:
    return copy.deepcopy(TINY_DRAFTER_CONFIG)


def config_error(d: Any) -> ConfigError:
    with pytest.raises(ConfigError) as ei:
        DFlashConfig.from_dict(d)
    assert isinstance(ei.value, Hf2qError) and isinstance(ei.value, ValueError)
    return ei.value


# =========================================================================== config


def test_gemma_fixture_derived_values() -> None:
    c = DFlashConfig.from_dict(gemma())
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == (2816, 5, 32, 8)
    assert (c.head_dim, c.intermediate_size, c.vocab_size, c.max_position_embeddings) == (128, 5632, 262144, 262144)
    assert c.target_layer_ids == (1, 6, 11, 17, 22, 27) and c.num_taps == 6
    assert c.fc_input_dim == 16_896 and c.q_width == 4096 and c.kv_width == 1024
    assert c.num_attention_heads // c.num_key_value_heads == 4
    assert c.n_norm_elements == 35_072 and c.num_tensors == 58
    assert c.block_size == 16 and c.rope_theta == 1_000_000.0 and c.rope_scaling is None
    assert c.mask_token_id == 4 and c.rms_norm_eps == 1e-6 and c.num_target_layers == 30
    assert c.sliding_window == 2048 and c.final_logit_softcapping == 30.0
    assert c.layer_types == ("sliding_attention",) * 4 + ("full_attention",)
    assert [c.is_sliding(i) for i in range(5)] == [True] * 4 + [False]


def test_gemma_per_tensor_bytes() -> None:
    m = {e.name: e for e in expected_manifest(DFlashConfig.from_dict(gemma()))}
    assert m["fc.weight"].disk_nbytes == 95_158_272
    assert m["hidden_norm.weight"].disk_nbytes == m["norm.weight"].disk_nbytes == 5_632
    assert m["layers.0.self_attn.q_norm.weight"].disk_nbytes == 256
    for k in ("down_proj", "gate_proj", "up_proj"):
        assert m[f"layers.3.mlp.{k}.weight"].disk_nbytes == 31_719_424
    for k in ("k_proj", "v_proj"):
        assert m[f"layers.3.self_attn.{k}.weight"].disk_nbytes == 5_767_168
    for k in ("q_proj", "o_proj"):
        assert m[f"layers.3.self_attn.{k}.weight"].disk_nbytes == 23_068_672
    assert sum(e.disk_nbytes for n, e in m.items() if n.startswith("layers.2.")) == 152_841_728


DRAFTERS = [
    # config, tensors, total_data_bytes, n_norm, resident
    (GEMMA4_26B_A4B_DRAFTER_CONFIG, 58, 859_378_176, 35_072, 859_448_320),
    (QWEN36_27B_DRAFTER_CONFIG, 58, 3_460_426_240, 62_720, 3_460_551_680),
    (QWEN36_35B_A3B_DRAFTER_CONFIG, 91, 947_990_528, 38_912, 948_068_352),
    (QWEN36_35B_A3B_NEW_DRAFTER_CONFIG, 69, 771_812_352, 30_208, 771_872_768),
]


@pytest.mark.parametrize("cfg,count,total,n_norm,resident", DRAFTERS, ids=["gemma4-26B", "qwen36-27B", "qwen36-35B-orig", "qwen36-35B-new"])
def test_drafter_byte_accounting(cfg: dict, count: int, total: int, n_norm: int, resident: int) -> None:
    c = DFlashConfig.from_dict(copy.deepcopy(cfg))
    m = expected_manifest(c)
    assert len(m) == count == 2 + 11 * c.num_hidden_layers + 1 == c.num_tensors
    assert expected_total_data_bytes(c) == total == sum(e.disk_nbytes for e in m)
    assert c.n_norm_elements == n_norm == sum(e.numel for e in m if e.device_dtype == "f32")
    assert expected_resident_bytes(c) == resident == total + 2 * n_norm
    assert sum(e.device_nbytes for e in m) == resident


def test_other_drafters_details() -> None:
    q27 = DFlashConfig.from_dict(copy.deepcopy(QWEN36_27B_DRAFTER_CONFIG))
    assert q27.rope_theta == 1e7 and q27.vocab_size == 248_320 and q27.final_logit_softcapping is None
    assert q27.mask_token_id == 248_070 and q27.block_size == 16 and q27.num_taps == 5
    orig = DFlashConfig.from_dict(copy.deepcopy(QWEN36_35B_A3B_DRAFTER_CONFIG))
    assert orig.layer_types == ("full_attention",) * 8 and orig.sliding_window is None
    assert orig.kv_width == 512
    new = DFlashConfig.from_dict(copy.deepcopy(QWEN36_35B_A3B_NEW_DRAFTER_CONFIG))
    assert new.block_size == 16 and new.rope_theta == 1e7 and new.rope_scaling is None
    assert new.mask_token_id == 248_077 and new.num_taps == 8 and new.fc_input_dim == 8 * 2048
    assert new.layer_types.count("sliding_attention") == 5 and new.sliding_window == 4096
    assert set(DRAFTER_CONFIGS) >= {"gemma-4-26B-A4B-it", "tiny"}


def test_default_taps_rule_matches_configs() -> None:
    # z-lab: T ids evenly spaced from 1 to num_target_layers - 3, rounded
    for cfg in (GEMMA4_26B_A4B_DRAFTER_CONFIG, QWEN36_27B_DRAFTER_CONFIG, QWEN36_35B_A3B_DRAFTER_CONFIG, QWEN36_35B_A3B_NEW_DRAFTER_CONFIG):
        ids = cfg["dflash_config"]["target_layer_ids"]
        t, end = len(ids), cfg["num_target_layers"] - 3
        assert ids == [int(round(1 + i * (end - 1) / (t - 1))) for i in range(t)]


# --------------------------------------------------------------------------- revisions


def test_newer_revision() -> None:
    d = gemma()
    del d["rope_theta"], d["block_size"]
    d["rope_parameters"] = {"rope_theta": 10_000_000, "rope_type": "default"}
    d["dflash_config"]["block_size"] = 8
    c = DFlashConfig.from_dict(d)
    assert c.rope_theta == 1e7 and c.block_size == 8 and c.rope_scaling is None


def test_root_keys_win() -> None:
    d = gemma()
    d["rope_parameters"] = {"rope_theta": 5, "rope_type": "default"}
    d["rope_scaling"] = {"rope_type": "yarn", "factor": 64.0, "rope_theta": 7}
    d["dflash_config"]["block_size"] = 16  # equal to the root: fine
    c = DFlashConfig.from_dict(d)
    assert c.rope_theta == 1_000_000.0 and c.block_size == 16
    assert c.rope_scaling == {"rope_type": "yarn", "factor": 64.0, "rope_theta": 7}


def test_rope_theta_fallbacks() -> None:
    d = gemma()
    del d["rope_theta"]
    d["rope_parameters"] = {"rope_theta": 123.0}
    assert DFlashConfig.from_dict(d).rope_theta == 123.0
    del d["rope_parameters"]
    d["rope_scaling"] = {"rope_type": "yarn", "factor": 64, "rope_theta": 456}
    c = DFlashConfig.from_dict(d)
    assert c.rope_theta == 456.0 and c.rope_scaling is not None and c.rope_scaling["factor"] == 64
    d["rope_scaling"] = None
    # stated nowhere: the converter's value (transformers' Qwen3Config default)
    assert DFlashConfig.from_dict(d).rope_theta == DEFAULT_ROPE_THETA == 10000.0
    d["rope_theta"] = "1e6"  # a stated value is still checked
    e = config_error(d)
    assert e.key == "rope_theta" and "rope_theta" in str(e)


def test_rope_scaling_resolution() -> None:
    d = gemma()
    d["rope_scaling"] = "yarn"  # any non-object means none
    assert DFlashConfig.from_dict(d).rope_scaling is None
    d["rope_scaling"] = [1, 2]
    assert DFlashConfig.from_dict(d).rope_scaling is None
    d["rope_scaling"] = None
    d["rope_parameters"] = {"rope_theta": 1e6, "rope_type": "yarn", "factor": 4.0}
    assert DFlashConfig.from_dict(d).rope_scaling == {"rope_theta": 1e6, "rope_type": "yarn", "factor": 4.0}
    d["rope_parameters"] = {"rope_theta": 1e6}  # no rope_type: no scaling
    assert DFlashConfig.from_dict(d).rope_scaling is None
    d["rope_scaling"] = {"type": "linear", "factor": 2.0}  # an object is kept even with rope_parameters
    d["rope_parameters"] = {"rope_theta": 1e6, "rope_type": "yarn"}
    assert DFlashConfig.from_dict(d).rope_scaling == {"type": "linear", "factor": 2.0}


def test_block_size_resolution() -> None:
    d = gemma()
    d["dflash_config"]["block_size"] = 8
    e = config_error(d)
    assert e.key == "block_size" and "16" in str(e) and "8" in str(e)
    del d["block_size"]
    assert DFlashConfig.from_dict(d).block_size == 8
    del d["dflash_config"]["block_size"]
    # stated nowhere: llama.cpp's converter (and z-lab's model) use 16
    assert DFlashConfig.from_dict(d).block_size == DEFAULT_BLOCK_SIZE == 16
    d["dflash_config"]["block_size"] = 1  # a stated value is still checked (rule 3)
    assert config_error(d).rule == 3


def test_original_rust_revision_only_and_yarn_copy() -> None:
    d = copy.deepcopy(QWEN36_35B_A3B_DRAFTER_CONFIG)
    d["rope_scaling"] = {"rope_type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096}
    c = DFlashConfig.from_dict(d)
    assert c.rope_scaling is not None and c.rope_scaling["factor"] == 64.0 and c.rope_theta == 1e7
    assert expected_total_data_bytes(c) == 947_990_528


# --------------------------------------------------------------------------- rules


def _rule(d: dict, rule: int) -> ConfigError:
    e = config_error(d)
    assert e.rule == rule, str(e)
    assert f"rule {rule}" in str(e)
    return e


def test_rule1_layer_types_length() -> None:
    d = gemma()
    d["layer_types"] = d["layer_types"][:4]
    _rule(d, 1)
    d["layer_types"] = ["full_attention"] * 6
    _rule(d, 1)


def test_rule2_sliding_window_required() -> None:
    d = gemma()
    del d["sliding_window"]
    _rule(d, 2)
    d["sliding_window"] = None
    _rule(d, 2)
    d["layer_types"] = ["full_attention"] * 5
    assert DFlashConfig.from_dict(d).sliding_window is None


@pytest.mark.parametrize("bs", [1, 0, -3])
def test_rule3_block_size(bs: int) -> None:
    d = gemma()
    d["block_size"] = bs
    _rule(d, 3)


def test_rule3_block_size_two_is_fine() -> None:
    d = gemma()
    d["block_size"] = 2
    assert DFlashConfig.from_dict(d).block_size == 2


@pytest.mark.parametrize("n", [0, -1])
def test_rule4_num_target_layers(n: int) -> None:
    d = gemma()
    d["num_target_layers"] = n
    _rule(d, 4)


def test_rule5_taps_non_empty() -> None:
    d = gemma()
    d["dflash_config"]["target_layer_ids"] = []
    _rule(d, 5)


@pytest.mark.parametrize("ids", [[1, 1], [6, 1], [1, 6, 11, 11, 22], [3, 2, 1]])
def test_rule6_taps_strictly_increasing(ids: list[int]) -> None:
    d = gemma()
    d["dflash_config"]["target_layer_ids"] = ids
    _rule(d, 6)


@pytest.mark.parametrize("ids", [[1, 30], [29, 45], [-1, 3]])
def test_rule7_taps_in_target(ids: list[int]) -> None:
    d = gemma()
    d["dflash_config"]["target_layer_ids"] = ids
    _rule(d, 7)


def test_rule7_last_layer_is_fine() -> None:
    d = gemma()
    d["dflash_config"]["target_layer_ids"] = [0, 29]
    c = DFlashConfig.from_dict(d)
    assert c.fc_input_dim == 2 * 2816  # T * H, not num_target_layers * H


@pytest.mark.parametrize("mask", [-1, 1 << 32, 1 << 40])
def test_rule8_mask_token_id(mask: int) -> None:
    d = gemma()
    d["dflash_config"]["mask_token_id"] = mask
    _rule(d, 8)


def test_mask_token_id_default_and_bounds() -> None:
    d = gemma()
    del d["dflash_config"]["mask_token_id"]
    assert DFlashConfig.from_dict(d).mask_token_id == 0
    d["dflash_config"]["mask_token_id"] = (1 << 32) - 1
    assert DFlashConfig.from_dict(d).mask_token_id == (1 << 32) - 1


def test_rules_are_checked_in_order() -> None:
    d = gemma()
    d["layer_types"] = ["sliding_attention"] * 3  # rule 1 (and 2 would pass)
    del d["sliding_window"]  # rule 2
    d["block_size"] = 1  # rule 3
    d["num_target_layers"] = 0  # rule 4
    d["dflash_config"]["target_layer_ids"] = [5, 2]  # rules 6, 7
    d["dflash_config"]["mask_token_id"] = -1  # rule 8
    for expected in (1, 2, 3, 4, 6, 8):
        _rule(d, expected)
        if expected == 1:
            d["layer_types"] = ["sliding_attention"] * 5
        elif expected == 2:
            d["sliding_window"] = 128
        elif expected == 3:
            d["block_size"] = 2
        elif expected == 4:
            d["num_target_layers"] = 3
        elif expected == 6:
            d["dflash_config"]["target_layer_ids"] = [0, 2]
    d["dflash_config"]["mask_token_id"] = 0
    DFlashConfig.from_dict(d)


def test_direct_construction_runs_the_rules() -> None:
    c = DFlashConfig.from_dict(tiny())
    with pytest.raises(ConfigError) as ei:
        DFlashConfig(**{**c.__dict__, "block_size": 1})
    assert ei.value.rule == 3
    plain = DFlashConfig(**{**c.__dict__, "layer_types": None, "sliding_window": None})
    assert plain.layer_types == ("full_attention", "full_attention")


# --------------------------------------------------------------------------- keys and types

REQUIRED = [
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "rms_norm_eps",
    "max_position_embeddings",
    "num_target_layers",
    "dflash_config",
]


@pytest.mark.parametrize("key", REQUIRED)
def test_missing_required_key(key: str) -> None:
    d = gemma()
    del d[key]
    e = config_error(d)
    assert e.key == key and f"'{key}'" in str(e) and "missing" in str(e)


def test_missing_target_layer_ids() -> None:
    d = gemma()
    del d["dflash_config"]["target_layer_ids"]
    e = config_error(d)
    assert e.key == "dflash_config.target_layer_ids" and "dflash_config.target_layer_ids" in str(e)


WRONG_TYPES = [
    ("hidden_size", True, "hidden_size"),
    ("hidden_size", 64.0, "hidden_size"),
    ("hidden_size", "2816", "hidden_size"),
    ("hidden_size", None, "hidden_size"),
    ("hidden_size", 0, "hidden_size"),
    ("num_hidden_layers", False, "num_hidden_layers"),
    ("num_attention_heads", [32], "num_attention_heads"),
    ("num_key_value_heads", -8, "num_key_value_heads"),
    ("head_dim", 128.5, "head_dim"),
    ("intermediate_size", {"x": 1}, "intermediate_size"),
    ("vocab_size", "big", "vocab_size"),
    ("rms_norm_eps", "1e-6", "rms_norm_eps"),
    ("rms_norm_eps", True, "rms_norm_eps"),
    ("rms_norm_eps", float("nan"), "rms_norm_eps"),
    ("rms_norm_eps", 0.0, "rms_norm_eps"),
    ("max_position_embeddings", 1.5, "max_position_embeddings"),
    ("num_target_layers", True, "num_target_layers"),
    ("num_target_layers", "30", "num_target_layers"),
    ("dflash_config", [1, 6], "dflash_config"),
    ("dflash_config", None, "dflash_config"),
    ("rope_theta", "1e6", "rope_theta"),
    ("rope_theta", True, "rope_theta"),
    ("rope_theta", -1.0, "rope_theta"),
    ("block_size", 16.0, "block_size"),
    ("block_size", True, "block_size"),
    ("layer_types", "full_attention", "layer_types"),
    ("layer_types", ["full_attention"] * 4 + ["global"], "layer_types[4]"),
    ("layer_types", ["full_attention"] * 4 + [1], "layer_types[4]"),
    ("sliding_window", True, "sliding_window"),
    ("sliding_window", "2048", "sliding_window"),
    ("final_logit_softcapping", "30", "final_logit_softcapping"),
    ("rope_parameters", "default", "rope_parameters"),
]


@pytest.mark.parametrize("key,value,named", WRONG_TYPES)
def test_wrong_types(key: str, value: Any, named: str) -> None:
    d = gemma()
    d[key] = value
    e = config_error(d)
    assert e.key == named and f"'{named}'" in str(e)


@pytest.mark.parametrize(
    "field,value,named",
    [
        ("target_layer_ids", "1,6", "dflash_config.target_layer_ids"),
        ("target_layer_ids", [1, True], "dflash_config.target_layer_ids[1]"),
        ("target_layer_ids", [1, 6.0], "dflash_config.target_layer_ids[1]"),
        ("mask_token_id", "4", "dflash_config.mask_token_id"),
        ("mask_token_id", False, "dflash_config.mask_token_id"),
        ("block_size", "16", "dflash_config.block_size"),
    ],
)
def test_wrong_types_in_dflash_config(field: str, value: Any, named: str) -> None:
    d = gemma()
    d["dflash_config"][field] = value
    e = config_error(d)
    assert e.key == named and f"'{named}'" in str(e)


def test_rope_type_must_be_string() -> None:
    d = gemma()
    d["rope_parameters"] = {"rope_theta": 1, "rope_type": 3}
    assert config_error(d).key == "rope_parameters.rope_type"


def test_ignored_keys_and_optional_nulls() -> None:
    d = gemma()
    d.update({"auto_map": {"x": "y"}, "tie_word_embeddings": "whatever", "use_sliding_window": 3})
    d["final_logit_softcapping"] = None
    d["layer_types"] = None  # absent: all full
    c = DFlashConfig.from_dict(d)
    assert c.final_logit_softcapping is None and c.layer_types == ("full_attention",) * 5


def test_from_file_and_json(tmp_path: Path) -> None:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(gemma()))
    assert DFlashConfig.from_file(p) == DFlashConfig.from_file(tmp_path) == DFlashConfig.from_dict(gemma())
    assert DFlashConfig.from_json_str(p.read_text()).fc_input_dim == 16_896
    with pytest.raises(ConfigError):
        DFlashConfig.from_json_str("{nope")
    with pytest.raises(ConfigError):
        DFlashConfig.from_json_str("[1]")
    with pytest.raises(ConfigError):
        DFlashConfig.from_dict([1])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="not found"):
        DFlashConfig.from_file(tmp_path / "nope.json")
    bad = gemma()
    bad["block_size"] = 1
    p.write_text(json.dumps(bad))
    with pytest.raises(ConfigError) as ei:
        DFlashConfig.from_file(p)
    assert ei.value.rule == 3 and str(p) in str(ei.value)


config_value = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 1 << 33), st.floats(allow_nan=True), st.text(max_size=4),
    st.lists(st.integers(-2, 40), max_size=6), st.dictionaries(st.sampled_from(["rope_theta", "rope_type", "block_size"]), st.integers(0, 9), max_size=2),
)


@HYP
@given(
    edits=st.dictionaries(
        st.sampled_from(REQUIRED + ["rope_theta", "block_size", "layer_types", "sliding_window", "rope_scaling", "rope_parameters", "final_logit_softcapping"]),
        st.one_of(st.just("<delete>"), config_value),
        max_size=4,
    ),
    dedits=st.dictionaries(st.sampled_from(["target_layer_ids", "mask_token_id", "block_size"]), st.one_of(st.just("<delete>"), config_value), max_size=2),
)
def test_fuzz_config(edits: dict, dedits: dict) -> None:
    d = tiny()
    for k, v in edits.items():
        if v == "<delete>":
            d.pop(k, None)
        else:
            d[k] = v
    if isinstance(d.get("dflash_config"), dict):
        for k, v in dedits.items():
            if v == "<delete>":
                d["dflash_config"].pop(k, None)
            else:
                d["dflash_config"][k] = v
    try:
        c = DFlashConfig.from_dict(d)
    except ConfigError:
        return
    m = expected_manifest(c)
    assert len(m) == c.num_tensors
    assert expected_resident_bytes(c) == sum(e.device_nbytes for e in m)


@HYP
@given(
    H=st.integers(1, 8192), L=st.integers(1, 12), Qh=st.integers(1, 64), Kh=st.integers(1, 16),
    Dh=st.integers(1, 256), I=st.integers(1, 30000), T=st.integers(1, 10),
)
def test_resident_formula(H: int, L: int, Qh: int, Kh: int, Dh: int, I: int, T: int) -> None:
    d = tiny()
    d.update(hidden_size=H, num_hidden_layers=L, num_attention_heads=Qh, num_key_value_heads=Kh, head_dim=Dh,
             intermediate_size=I, num_target_layers=T + 1, layer_types=None)
    d["dflash_config"]["target_layer_ids"] = list(range(T))
    c = DFlashConfig.from_dict(d)
    params = H * T * H + 2 * H + L * (2 * H + 2 * Dh + 3 * H * I + 2 * Qh * Dh * H + 2 * Kh * Dh * H)
    assert expected_total_data_bytes(c) == 2 * params
    assert c.n_norm_elements == L * (2 * Dh + 2 * H) + 2 * H
    assert expected_resident_bytes(c) == 2 * params + 2 * c.n_norm_elements


# =========================================================================== manifest


def test_manifest_order_and_dtypes() -> None:
    c = DFlashConfig.from_dict(tiny())
    m = expected_manifest(c)
    per_layer = [
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
    ]
    assert per_layer == sorted(per_layer)
    names = ["fc.weight", "hidden_norm.weight"] + [f"layers.{i}.{s}" for i in range(2) for s in per_layer] + ["norm.weight"]
    assert [e.name for e in m] == names
    H, Dh, I, q, kv = 64, 16, 128, 64, 32
    shapes = {
        "fc.weight": (H, 2 * H),
        "hidden_norm.weight": (H,),
        "norm.weight": (H,),
        "layers.1.input_layernorm.weight": (H,),
        "layers.1.mlp.down_proj.weight": (H, I),
        "layers.1.mlp.gate_proj.weight": (I, H),
        "layers.1.mlp.up_proj.weight": (I, H),
        "layers.1.post_attention_layernorm.weight": (H,),
        "layers.1.self_attn.k_norm.weight": (Dh,),
        "layers.1.self_attn.k_proj.weight": (kv, H),
        "layers.1.self_attn.o_proj.weight": (H, q),
        "layers.1.self_attn.q_norm.weight": (Dh,),
        "layers.1.self_attn.q_proj.weight": (q, H),
        "layers.1.self_attn.v_proj.weight": (kv, H),
    }
    by = {e.name: e for e in m}
    for n, s in shapes.items():
        assert by[n].shape == s, n
    for e in m:
        assert e.disk_dtype == "BF16"
        is_norm = e.name.endswith("norm.weight")
        assert e.device_dtype == ("f32" if is_norm else "bf16") and e.is_norm == is_norm
        assert e.device_nbytes == (4 if is_norm else 2) * e.numel
    assert sum(e.is_norm for e in m) == 2 + 4 * 2


# =========================================================================== weights


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dflash_checkpoint(tmp_path_factory.mktemp("tiny"), "tiny", seed=7)


@pytest.fixture(scope="module")
def tiny_sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dflash_checkpoint(tmp_path_factory.mktemp("tiny_sh"), "tiny", seed=7, sharded=True, num_shards=3)


def test_tiny_round_trip(tiny_ckpt: Path) -> None:
    assert sorted(os.listdir(tiny_ckpt)) == ["config.json", "model.safetensors"]
    cfg = DFlashConfig.from_file(tiny_ckpt)
    assert cfg == DFlashConfig.from_dict(tiny())
    with DFlashWeights.load(tiny_ckpt) as w:
        assert w.config == cfg and len(w) == 25 and w.names() == [e.name for e in expected_manifest(cfg)]
        assert w.total_data_bytes() == expected_total_data_bytes(cfg) == w.checkpoint.total_data_bytes()
        assert w.gpu_resident_bytes() == expected_resident_bytes(cfg) == w.total_data_bytes() + 2 * cfg.n_norm_elements
        with safe_open(str(tiny_ckpt / "model.safetensors"), framework="numpy") as ref:
            for entry, info, path in w:
                assert path == tiny_ckpt / "model.safetensors" == info.path
                assert info.name == entry.name and info.dtype == "BF16" and info.shape == entry.shape
                want = ref.get_tensor(entry.name)
                assert want.dtype == ml_dtypes.bfloat16
                assert bytes(w.read_raw(entry.name)) == want.tobytes()
                host = w.read_host(entry.name)
                if entry.is_norm:
                    assert host.dtype == np.float32
                    np.testing.assert_array_equal(host, want.astype(np.float32))
                    assert (host >= 0.5).all() and (host < 2).all()
                else:
                    assert host.dtype == ml_dtypes.bfloat16 and host.tobytes() == want.tobytes()
                    mag = np.abs(host.astype(np.float32))
                    assert (mag >= 2**-9).all() and (mag < 2**-5).all()
    assert w.checkpoint.closed


def test_tiny_sharded_round_trip(tiny_ckpt: Path, tiny_sharded: Path) -> None:
    files = sorted(os.listdir(tiny_sharded))
    assert files == [
        "config.json",
        "model-00001-of-00003.safetensors",
        "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors",
        "model.safetensors.index.json",
    ]
    index = json.loads((tiny_sharded / "model.safetensors.index.json").read_text())
    cfg = DFlashConfig.from_dict(tiny())
    assert index["metadata"]["total_size"] == expected_total_data_bytes(cfg)
    with DFlashWeights.load(tiny_sharded) as sh, DFlashWeights.load(tiny_ckpt) as one:
        assert sh.names() == one.names()
        assert len({t.path for t in sh}) == 3
        for t in sh:
            assert t.path.name == index["weight_map"][t.entry.name]
            # same seed: identical values whatever the layout
            assert bytes(sh.read_raw(t.entry.name)) == bytes(one.read_raw(t.entry.name))
        assert sh.total_data_bytes() == one.total_data_bytes()


def test_seed_changes_values(tmp_path: Path, tiny_ckpt: Path) -> None:
    other = make_dflash_checkpoint(tmp_path / "s8", "tiny", seed=8)
    with DFlashWeights.load(other) as a, DFlashWeights.load(tiny_ckpt) as b:
        assert bytes(a.read_raw("fc.weight")) != bytes(b.read_raw("fc.weight"))


def test_load_from_open_checkpoint_and_file(tiny_ckpt: Path) -> None:
    cfg = DFlashConfig.from_file(tiny_ckpt / "config.json")
    with open_checkpoint(tiny_ckpt) as ck:
        w = DFlashWeights.load(ck, cfg)
        w.close()  # not owned: stays open
        assert not ck.closed
        assert w["norm.weight"].entry.shape == (64,)
    w2 = DFlashWeights.load(tiny_ckpt / "model.safetensors", cfg)
    assert "fc.weight" in w2 and "lm_head.weight" not in w2
    with pytest.raises(KeyError):
        w2["lm_head.weight"]
    w2.close()


def test_norm_decode_is_exact_not_misread(tmp_path: Path) -> None:
    """docs/DFLASH.md: BF16 1.0, 1.0 read as one F32 is 0x3f803f80 = 1.0019379; the
    host layout decodes each norm element to F32 exactly."""
    raw = np.array([1.0, 1.0], dtype=ml_dtypes.bfloat16)
    assert raw.tobytes() == b"\x80\x3f\x80\x3f"
    misread = np.frombuffer(raw.tobytes(), dtype=np.float32)[0]
    assert misread.view(np.uint32) == 0x3F803F80 and abs(float(misread) - 1.0019379) < 1e-6
    d = make_dflash_checkpoint(tmp_path / "ck", "tiny", seed=1)
    with DFlashWeights.load(d) as w:
        bits = np.empty(64, np.uint16)
        w.read_raw("norm.weight", bits)
        host = w.read_host("norm.weight")
        assert host.dtype == np.float32 and host.shape == (64,)
        np.testing.assert_array_equal(host.view(np.uint32), bits.astype(np.uint32) << 16)


# --------------------------------------------------------------------------- manifest errors


def _tiny_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    c = DFlashConfig.from_dict(tiny())
    rng = np.random.default_rng(seed)
    return {e.name: (rng.standard_normal(e.shape) * 0.02).astype(ml_dtypes.bfloat16) for e in expected_manifest(c)}


def _load_error(tmp_path: Path, tensors: dict[str, np.ndarray]) -> ManifestError:
    p = tmp_path / "model.safetensors"
    save_file(tensors, str(p))
    with pytest.raises(ManifestError) as ei:
        DFlashWeights.load(p, DFlashConfig.from_dict(tiny()))
    return ei.value


def test_extra_tensor(tmp_path: Path) -> None:
    t = _tiny_tensors()
    t["lm_head.weight"] = np.zeros((4, 64), ml_dtypes.bfloat16)
    e = _load_error(tmp_path, t)
    assert type(e) is ExtraTensorError
    assert [(p.kind, p.tensor) for p in e.problems] == [("extra", "lm_head.weight")]
    assert "lm_head.weight" in str(e) and "BF16 [4, 64]" in str(e)


def test_missing_tensor(tmp_path: Path) -> None:
    t = _tiny_tensors()
    del t["layers.1.self_attn.q_norm.weight"], t["fc.weight"]
    e = _load_error(tmp_path, t)
    assert type(e) is MissingTensorError
    assert [(p.kind, p.tensor) for p in e.problems] == [("missing", "fc.weight"), ("missing", "layers.1.self_attn.q_norm.weight")]
    assert "expected BF16 [64, 128], actual absent" in str(e)


def test_dtype_mismatch(tmp_path: Path) -> None:
    t = _tiny_tensors()
    t["norm.weight"] = t["norm.weight"].astype(np.float32)
    t["layers.0.mlp.up_proj.weight"] = t["layers.0.mlp.up_proj.weight"].astype(np.float16)
    e = _load_error(tmp_path, t)
    assert type(e) is DtypeMismatchError
    assert [(p.kind, p.tensor, p.actual) for p in e.problems] == [
        ("dtype", "layers.0.mlp.up_proj.weight", "F16"),
        ("dtype", "norm.weight", "F32"),
    ]
    assert "BF16" in str(e) and "F32" in str(e)


def test_shape_mismatch(tmp_path: Path) -> None:
    t = _tiny_tensors()
    t["layers.0.mlp.down_proj.weight"] = np.ascontiguousarray(t["layers.0.mlp.down_proj.weight"].T)  # transposed
    t["hidden_norm.weight"] = t["hidden_norm.weight"].reshape(1, 64)  # same numel, wrong rank
    e = _load_error(tmp_path, t)
    assert type(e) is ShapeMismatchError
    assert [(p.kind, p.tensor, p.expected, p.actual) for p in e.problems] == [
        ("shape", "hidden_norm.weight", "[64]", "[1, 64]"),
        ("shape", "layers.0.mlp.down_proj.weight", "[64, 128]", "[128, 64]"),
    ]


def test_all_problems_listed_and_ordered(tmp_path: Path) -> None:
    t = _tiny_tensors()
    t["zzz.extra"] = np.zeros(3, ml_dtypes.bfloat16)
    t["aaa.extra"] = np.zeros(3, np.float32)
    del t["norm.weight"], t["layers.0.input_layernorm.weight"]
    t["fc.weight"] = t["fc.weight"].astype(np.float32)  # dtype
    t["layers.1.mlp.gate_proj.weight"] = t["layers.1.mlp.gate_proj.weight"][:64]  # shape
    t["layers.0.self_attn.k_norm.weight"] = np.zeros(8, np.float16)  # dtype and shape
    e = _load_error(tmp_path, t)
    assert type(e) is ExtraTensorError and isinstance(e, ManifestError)
    got = [(p.kind, p.tensor) for p in e.problems]
    assert got == [
        ("extra", "aaa.extra"),
        ("extra", "zzz.extra"),
        ("missing", "layers.0.input_layernorm.weight"),
        ("missing", "norm.weight"),
        ("dtype", "fc.weight"),
        ("dtype", "layers.0.self_attn.k_norm.weight"),
        ("shape", "layers.0.self_attn.k_norm.weight"),
        ("shape", "layers.1.mlp.gate_proj.weight"),
    ]
    msg = str(e)
    positions = [msg.index(f"'{name}'", msg.index(kind_label)) for kind_label, name in [
        ("extra tensor", "aaa.extra"), ("extra tensor", "zzz.extra"), ("missing tensor", "layers.0.input_layernorm.weight"),
        ("missing tensor", "norm.weight"), ("dtype mismatch", "fc.weight"), ("dtype mismatch", "layers.0.self_attn.k_norm.weight"),
        ("shape mismatch", "layers.0.self_attn.k_norm.weight"), ("shape mismatch", "layers.1.mlp.gate_proj.weight"),
    ]]
    assert positions == sorted(positions)
    assert "8 problem(s)" in msg
    assert "expected [16], actual [8]" in msg and "expected [128, 64], actual [64, 64]" in msg


@pytest.mark.parametrize(
    "kinds,cls",
    [
        (("missing", "dtype", "shape"), MissingTensorError),
        (("dtype", "shape"), DtypeMismatchError),
        (("extra", "shape"), ExtraTensorError),
        (("shape",), ShapeMismatchError),
    ],
)
def test_raised_class_is_first_kind_present(tmp_path: Path, kinds: tuple[str, ...], cls: type) -> None:
    t = _tiny_tensors()
    if "extra" in kinds:
        t["extra.weight"] = np.zeros(1, ml_dtypes.bfloat16)
    if "missing" in kinds:
        del t["norm.weight"]
    if "dtype" in kinds:
        t["fc.weight"] = t["fc.weight"].astype(np.float32)
    if "shape" in kinds:
        t["layers.1.self_attn.v_proj.weight"] = np.zeros((33, 64), ml_dtypes.bfloat16)
    e = _load_error(tmp_path, t)
    assert type(e) is cls
    assert [p.kind for p in e.problems] == list(kinds)


def test_manifest_error_sharded_and_config_from_dir(tmp_path: Path) -> None:
    d = make_dflash_checkpoint(tmp_path / "ck", "tiny", sharded=True)
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_hidden_layers"] = 3
    cfg["layer_types"] = None
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(MissingTensorError) as ei:
        DFlashWeights.load(d)  # config.json read from the checkpoint directory
    assert len(ei.value.problems) == 11 and all(p.tensor.startswith("layers.2.") for p in ei.value.problems)
    assert "model.safetensors.index.json" in str(ei.value)


# --------------------------------------------------------------------------- writer


def test_stream_writer_matches_package_bytes(tmp_path: Path) -> None:
    c = DFlashConfig.from_dict(tiny())
    m = expected_manifest(c)
    arrays = {}
    for i, e in enumerate(m):
        arrays[e.name] = np.concatenate(list(tensor_bits(e, 3, i))).view(ml_dtypes.bfloat16).reshape(e.shape)
    save_file(arrays, str(tmp_path / "pkg.safetensors"), metadata={"format": "pt"})
    n = write_bf16_safetensors(
        tmp_path / "stream.safetensors",
        [(e.name, e.shape) for e in m],
        lambda k: tensor_bits(m[k], 3, k),
        metadata={"format": "pt"},
    )
    assert n == expected_total_data_bytes(c)
    assert (tmp_path / "stream.safetensors").read_bytes() == (tmp_path / "pkg.safetensors").read_bytes()


def test_streamed_checkpoint_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_ckpt: Path) -> None:
    import hf2q.testing.dflash_checkpoint as dc

    monkeypatch.setattr(dc, "PACKAGE_WRITER_LIMIT", 0)  # force the streaming writer
    d = make_dflash_checkpoint(tmp_path / "ck", "tiny", seed=7)
    assert (d / "model.safetensors").read_bytes() == (tiny_ckpt / "model.safetensors").read_bytes()


def test_writer_configs_and_layout_switch(tmp_path: Path) -> None:
    d = tmp_path / "ck"
    custom = tiny()
    custom["num_hidden_layers"] = 1
    custom["layer_types"] = ["full_attention"]
    make_dflash_checkpoint(d, custom, sharded=True)
    assert (d / "model.safetensors.index.json").exists()
    make_dflash_checkpoint(d, custom)  # unsharded again: stale index and shards removed
    assert sorted(os.listdir(d)) == ["config.json", "model.safetensors"]
    with DFlashWeights.load(d) as w:
        assert len(w) == 14
    with pytest.raises(ConfigError):
        make_dflash_checkpoint(tmp_path / "x", "no-such-drafter")
    bad = tiny()
    bad["block_size"] = 1
    with pytest.raises(ConfigError):
        make_dflash_checkpoint(tmp_path / "y", bad)
    with pytest.raises(ValueError):
        make_dflash_checkpoint(tmp_path / "z", "tiny", sharded=True, num_shards=1)


def test_module_aliases() -> None:
    import hf2q.models.dflash as m
    from hf2q import testing

    assert dflash.DFlashWeights is m.DFlashWeights and dflash.expected_manifest is m.expected_manifest
    assert testing.make_dflash_checkpoint is make_dflash_checkpoint
    assert isinstance(expected_manifest(DFlashConfig.from_dict(tiny()))[0], ManifestEntry)
