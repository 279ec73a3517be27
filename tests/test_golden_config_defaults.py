"""Config defaults are not user input (issue 10, item 1).

Every defaulted field of both config readers: absent, it takes the value the
reference converter (llama.cpp's convert_hf_to_gguf.py, reading the file
through transformers' AutoConfig) uses, and is never rejected for disagreeing
with other fields; stated and inconsistent, it is still a ConfigError. The
converter's own values for these cases are pinned by
tests/data/golden/config_variants.json (see test_golden_converter.py).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from hf2q import ConfigError
from hf2q.dflash import DEFAULT_BLOCK_SIZE, DEFAULT_MASK_TOKEN_ID, DEFAULT_ROPE_THETA, DFlashConfig
from hf2q.qwen35 import (
    DEFAULT_FULL_ATTENTION_INTERVAL,
    DEFAULT_MROPE_SECTION,
    DEFAULT_PARTIAL_ROTARY_FACTOR,
    Qwen35Config,
)
from hf2q.qwen35 import DEFAULT_ROPE_THETA as QWEN_DEFAULT_ROPE_THETA
from hf2q.testing.qwen35_checkpoint import TINY_TEXT_CONFIG

# What transformers 5.24's save_pretrained writes for a tiny text-only model:
# head_dim 32, partial_rotary_factor 0.25 -> rotary_dim 8, no mrope_section.
TRANSFORMERS_TEXT: dict[str, Any] = {
    "architectures": ["Qwen3_5MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": None, "dtype": "bfloat16", "eos_token_id": None, "head_dim": 32, "hidden_act": "silu",
    "hidden_size": 32, "initializer_range": 0.02,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 32, "linear_num_key_heads": 2,
    "linear_num_value_heads": 6, "linear_value_head_dim": 32, "max_position_embeddings": 4096,
    "model_type": "qwen3_5_moe_text", "moe_intermediate_size": 32, "num_attention_heads": 2, "num_experts": 4,
    "num_experts_per_tok": 2, "num_hidden_layers": 4, "num_key_value_heads": 1, "output_router_logits": False,
    "pad_token_id": None, "rms_norm_eps": 1e-06,
    "rope_parameters": {"partial_rotary_factor": 0.25, "rope_theta": 10000.0, "rope_type": "default"},
    "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 32, "tie_word_embeddings": False,
    "transformers_version": "5.24.0", "use_cache": True, "vocab_size": 128,
}


def qwen(**changes: Any) -> dict[str, Any]:
    d = copy.deepcopy(TRANSFORMERS_TEXT)
    for k, v in changes.items():
        if v is _DEL:
            d.pop(k, None)
        else:
            d[k] = v
    return d


_DEL = object()


def rope(**changes: Any) -> dict[str, Any]:
    r = dict(TRANSFORMERS_TEXT["rope_parameters"])
    for k, v in changes.items():
        if v is _DEL:
            r.pop(k, None)
        else:
            r[k] = v
    return r


# ----------------------------------------------------------------------------- Qwen3.5 / 3.6
def test_absent_mrope_section_is_the_default_whatever_rotary_dim() -> None:
    """The issue's bug: rotary_dim / 2 = 4, default sections sum to 32."""
    c = Qwen35Config.from_dict(qwen())
    assert c.rotary_dim == 8 and c.mrope_section == DEFAULT_MROPE_SECTION == (11, 11, 10)
    assert c.mrope_section_gguf == (11, 11, 10, 0)
    for prf in (0.5, 1.0):  # any rotary_dim
        assert Qwen35Config.from_dict(qwen(rope_parameters=rope(partial_rotary_factor=prf))).mrope_section_gguf \
            == (11, 11, 10, 0)
    # multimodal wrapper: same
    mm = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
          "text_config": qwen(architectures=_DEL)}
    assert Qwen35Config.from_dict(mm).mrope_section_gguf == (11, 11, 10, 0)
    # null is the same as absent
    assert Qwen35Config.from_dict(qwen(rope_parameters=rope(mrope_section=None))).mrope_section == (11, 11, 10)


def test_stated_mrope_section_is_checked() -> None:
    assert Qwen35Config.from_dict(qwen(rope_parameters=rope(mrope_section=[2, 1, 1]))).mrope_section_gguf \
        == (2, 1, 1, 0)
    with pytest.raises(ConfigError, match=r"mrope_section.*sums to 32.*rotary_dim / 2 = 4"):
        Qwen35Config.from_dict(qwen(rope_parameters=rope(mrope_section=[11, 11, 10])))
    with pytest.raises(ConfigError, match="mrope_section"):
        Qwen35Config.from_dict(qwen(rope_parameters=rope(mrope_section=[2, 1, 1, 0, 0])))


def test_absent_partial_rotary_factor_is_the_default_and_unchecked() -> None:
    c = Qwen35Config.from_dict(qwen(rope_parameters=rope(partial_rotary_factor=_DEL)))
    assert c.partial_rotary_factor == DEFAULT_PARTIAL_ROTARY_FACTOR == 0.25 and c.rotary_dim == 8
    # head_dim 4: the default gives rotary_dim 1; the converter writes int(4 * 0.25) = 1 too
    c = Qwen35Config.from_dict(qwen(head_dim=4, rope_parameters=rope(partial_rotary_factor=_DEL)))
    assert c.rotary_dim == 1
    # stated, the same value is refused (rotary_dim must be even)
    with pytest.raises(ConfigError, match="partial_rotary_factor"):
        Qwen35Config.from_dict(qwen(head_dim=4))
    # stated mrope_section is checked against the defaulted factor
    with pytest.raises(ConfigError, match="mrope_section"):
        Qwen35Config.from_dict(qwen(rope_parameters=rope(partial_rotary_factor=_DEL, mrope_section=[11, 11, 10])))


def test_absent_rope_theta_and_rope_parameters() -> None:
    c = Qwen35Config.from_dict(qwen(rope_parameters=_DEL))
    assert c.rope_theta == QWEN_DEFAULT_ROPE_THETA == 10000.0
    assert (c.partial_rotary_factor, c.mrope_section, c.mrope_interleaved, c.rope_type) == (
        0.25, (11, 11, 10), True, "default")
    assert Qwen35Config.from_dict(qwen(rope_parameters=_DEL, rope_theta=1e6)).rope_theta == 1e6
    with pytest.raises(ConfigError, match="rope_theta"):
        Qwen35Config.from_dict(qwen(rope_parameters=rope(rope_theta=-1.0)))


def test_rope_scaling_is_read_like_rope_parameters() -> None:
    d = qwen(rope_parameters=_DEL, rope_scaling=rope(mrope_section=[2, 1, 1], rope_theta=1e7))
    c = Qwen35Config.from_dict(d)
    assert (c.rope_theta, c.mrope_section_gguf) == (1e7, (2, 1, 1, 0))


def test_absent_layer_types_and_interval() -> None:
    c = Qwen35Config.from_dict(qwen(layer_types=_DEL))
    assert c.full_attention_interval is None  # as written: absent
    assert c.layer_kinds == ["linear", "linear", "linear", "full"]  # interval 4 (the default)
    assert DEFAULT_FULL_ATTENTION_INTERVAL == 4
    # absent interval is never checked against layer_types (any pattern is fine)
    c = Qwen35Config.from_dict(qwen(layer_types=["full_attention", "linear_attention", "full_attention",
                                                 "linear_attention"]))
    assert c.layer_kinds == ["full", "linear", "full", "linear"]
    # stated interval without layer_types drives the pattern
    assert Qwen35Config.from_dict(qwen(layer_types=_DEL, full_attention_interval=2)).layer_kinds == [
        "linear", "full", "linear", "full"]
    # stated and disagreeing: ConfigError
    with pytest.raises(ConfigError, match="disagrees with full_attention_interval"):
        Qwen35Config.from_dict(qwen(full_attention_interval=2))


def test_other_qwen_defaults() -> None:
    c = Qwen35Config.from_dict(qwen())
    assert c.mtp_num_hidden_layers == 0  # transformers writes none
    assert c.attn_output_gate is True and c.mrope_interleaved is True and c.rope_type == "default"
    c = Qwen35Config.from_dict(qwen(tie_word_embeddings=_DEL))
    assert c.tie_word_embeddings is False
    for field, bad in (("mtp_num_hidden_layers", -1), ("attn_output_gate", "yes"), ("tie_word_embeddings", 1)):
        with pytest.raises(ConfigError, match=field):
            Qwen35Config.from_dict(qwen(**{field: bad}))


def test_our_tiny_fixture_no_longer_needs_a_hand_written_mrope_section() -> None:
    d = copy.deepcopy(TINY_TEXT_CONFIG)
    del d["rope_parameters"]["mrope_section"]
    assert Qwen35Config.from_dict(d).mrope_section_gguf == (11, 11, 10, 0)


# ----------------------------------------------------------------------------- DFlash
DFLASH: dict[str, Any] = {
    "architectures": ["DFlashDraftModel"], "block_size": 16,
    "dflash_config": {"mask_token_id": 5, "target_layer_ids": [1, 3]}, "head_dim": 32, "hidden_size": 64,
    "intermediate_size": 128, "layer_types": ["sliding_attention", "full_attention"],
    "max_position_embeddings": 4096, "model_type": "qwen3", "num_attention_heads": 4, "num_hidden_layers": 2,
    "num_key_value_heads": 2, "num_target_layers": 6, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 10000000, "sliding_window": 64, "use_sliding_window": True, "vocab_size": 256,
}


def dfl(**changes: Any) -> dict[str, Any]:
    d = copy.deepcopy(DFLASH)
    for k, v in changes.items():
        if v is _DEL:
            d.pop(k, None)
        else:
            d[k] = v
    return d


def test_dflash_absent_block_size_is_16() -> None:
    assert DFlashConfig.from_dict(dfl(block_size=_DEL)).block_size == DEFAULT_BLOCK_SIZE == 16
    assert DFlashConfig.from_dict(dfl(block_size=None)).block_size == 16
    with pytest.raises(ConfigError) as ei:
        DFlashConfig.from_dict(dfl(block_size=1))
    assert ei.value.rule == 3


def test_dflash_absent_rope_theta() -> None:
    assert DFlashConfig.from_dict(dfl(rope_theta=_DEL)).rope_theta == DEFAULT_ROPE_THETA == 10000.0
    with pytest.raises(ConfigError, match="rope_theta"):
        DFlashConfig.from_dict(dfl(rope_theta=0))


def test_dflash_absent_mask_token_id() -> None:
    d = dfl()
    del d["dflash_config"]["mask_token_id"]
    assert DFlashConfig.from_dict(d).mask_token_id == DEFAULT_MASK_TOKEN_ID == 0
    d["dflash_config"]["mask_token_id"] = -1
    with pytest.raises(ConfigError) as ei:
        DFlashConfig.from_dict(d)
    assert ei.value.rule == 8


def test_dflash_absent_layer_types_and_window() -> None:
    c = DFlashConfig.from_dict(dfl(layer_types=_DEL, sliding_window=_DEL, use_sliding_window=_DEL))
    assert c.layer_types == ("full_attention",) * 2 and c.sliding_window is None
    # absent layer_types are never checked against a stated window
    c = DFlashConfig.from_dict(dfl(layer_types=_DEL))
    assert c.layer_types == ("full_attention",) * 2 and c.sliding_window == 64
    # stated sliding layers without a window: rule 2
    with pytest.raises(ConfigError) as ei:
        DFlashConfig.from_dict(dfl(sliding_window=_DEL))
    assert ei.value.rule == 2
    # stated layer_types of the wrong length: rule 1
    with pytest.raises(ConfigError) as ei:
        DFlashConfig.from_dict(dfl(layer_types=["full_attention"]))
    assert ei.value.rule == 1


def test_dflash_absent_optional_scaling_and_softcap() -> None:
    c = DFlashConfig.from_dict(dfl(rope_scaling=_DEL))
    assert c.rope_scaling is None and c.final_logit_softcapping is None


def test_absent_mtp_num_hidden_layers_counts_the_mtp_tensors(tmp_path) -> None:
    """llama.cpp's converter counts mtp.layers.{i} when the config does not
    say; a stated 0 with MTP tensors present is still an error."""
    import json

    from hf2q import Device, qwen35
    from hf2q.testing import make_qwen35_moe_checkpoint

    d = make_qwen35_moe_checkpoint(tmp_path / "a", "tiny")
    cfg_path = d / "config.json"
    raw = json.loads(cfg_path.read_text())
    del raw["mtp_num_hidden_layers"]
    cfg_path.write_text(json.dumps(raw))
    c = Qwen35Config.from_file(d)
    assert c.mtp_num_hidden_layers == 0 and not c.mtp_num_hidden_layers_stated
    model = qwen35.load(d, device=Device._isolated("host"), progress=False)
    assert model.config.mtp_num_hidden_layers == 1 and model.plan.mtp_layers == 1
    assert "blk.4.nextn.eh_proj.weight" in model and len(model.layers) == 5
    raw["mtp_num_hidden_layers"] = 0
    cfg_path.write_text(json.dumps(raw))
    with pytest.raises(Exception, match="mtp_num_hidden_layers = 0"):
        qwen35.load(d, device=Device._isolated("host"), progress=False)
    # without MTP tensors an absent count stays 0
    d2 = make_qwen35_moe_checkpoint(tmp_path / "b", "tiny", mtp=False)
    raw2 = json.loads((d2 / "config.json").read_text())
    del raw2["mtp_num_hidden_layers"]
    (d2 / "config.json").write_text(json.dumps(raw2))
    assert qwen35.load(d2, device=Device._isolated("host"), progress=False).plan.mtp_layers == 0
