"""Published configs (issue 10, item 4): the config.json fields of the
published Qwen3.6-35B-A3B MoE model and of z-lab's DFlash drafters, typed by
us from docs/QWEN35MOE.md and docs/DFLASH.md into
tests/data/published/, must parse to the documented numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hf2q.dflash import (
    DFlashConfig,
    expected_manifest,
    expected_resident_bytes,
    expected_total_data_bytes,
    n_norm_elements,
)
from hf2q.qwen35 import Qwen35Config, plan_qwen35_moe
from hf2q.testing.qwen35_checkpoint import checkpoint_tensor_specs

PUBLISHED = Path(__file__).parent / "data" / "published"


def test_every_fixture_is_tested() -> None:
    files = sorted(p.name for p in PUBLISHED.glob("*.config.json"))
    assert files == sorted([*QWEN_FILES, *DRAFTERS])


# ----------------------------------------------------------------------------- Qwen3.6-35B-A3B
QWEN_FILES = ("qwen3.6-35b-a3b.config.json", "qwen3.6-35b-a3b-text.config.json")


@pytest.mark.parametrize("fname", QWEN_FILES)
def test_qwen36_35b_a3b_config(fname: str) -> None:
    c = Qwen35Config.from_file(PUBLISHED / fname)
    assert c.multimodal == (fname == "qwen3.6-35b-a3b.config.json")
    assert (c.hidden_size, c.num_hidden_layers, c.vocab_size) == (2048, 40, 248320)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (16, 2, 256)
    assert (c.linear_num_key_heads, c.linear_num_value_heads) == (16, 32)
    assert (c.linear_key_head_dim, c.linear_value_head_dim, c.linear_conv_kernel_dim) == (128, 128, 4)
    assert (c.num_experts, c.num_experts_per_tok) == (256, 8)
    assert (c.moe_intermediate_size, c.shared_expert_intermediate_size) == (512, 512)
    assert c.full_attention_interval == 4
    assert c.full_attention_layers == list(range(3, 40, 4)) and len(c.linear_attention_layers) == 30
    assert c.partial_rotary_factor == 0.25 and c.rotary_dim == 64
    assert c.rope_theta == 1e7 and c.mrope_section_gguf == (11, 11, 10, 0) and c.mrope_interleaved
    assert c.rms_norm_eps == 1e-6 and c.attn_output_gate and c.max_position_embeddings == 262144
    assert c.mtp_num_hidden_layers == 1
    assert c.conv_channels == 8192 and c.v_per_k == 2 and c.q_proj_rows == 2 * 16 * 256


@pytest.mark.parametrize("mtp", [False, True])
def test_qwen36_35b_a3b_plan_counts_and_expert_bytes(mtp: bool) -> None:
    """733 tensors (16 per full layer, 19 per linear, 3 global); the MTP block
    adds 20; each expert stack 285,212,672 Q8_0 bytes; 40 layers 34,225,520,640."""
    c = Qwen35Config.from_file(PUBLISHED / "qwen3.6-35b-a3b.config.json")
    text = json.loads((PUBLISHED / "qwen3.6-35b-a3b.config.json").read_text())["text_config"]
    specs = checkpoint_tensor_specs(text, multimodal=True, mtp=mtp)  # names, dtypes, shapes only
    plan = plan_qwen35_moe(specs, c, mtp=mtp)
    assert len(plan) == (753 if mtp else 733)
    exps = [t for t in plan if t.kind == "expert"]
    assert all(t.nbytes == 285_212_672 for t in exps)
    main = [t for t in exps if t.layer is not None and t.layer < 40]
    assert len(main) == 120 and sum(t.nbytes for t in main) == 34_225_520_640
    shapes = {t.gguf_name: tuple(t.shape) for t in plan}
    assert shapes["blk.0.ffn_gate_exps.weight"] == (256, 512, 2048)
    assert shapes["blk.0.ffn_down_exps.weight"] == (256, 2048, 512)
    assert shapes["blk.0.attn_qkv.weight"] == (8192, 2048) and shapes["blk.0.ssm_conv1d.weight"] == (8192, 4)
    assert shapes["blk.3.attn_q.weight"] == (8192, 2048) and shapes["blk.3.attn_k.weight"] == (512, 2048)
    assert shapes["token_embd.weight"] == (248320, 2048)
    if mtp:
        assert shapes["blk.40.nextn.eh_proj.weight"] == (2048, 4096)


# ----------------------------------------------------------------------------- DFlash drafters
# file -> (L, H, Qh, Kh, Dh, I, taps, num_target_layers, mask id, sliding layers, window,
#          tensors, total_data_bytes, n_norm, resident, rope_theta, block_size, softcap)
DRAFTERS = {
    "dflash-gemma-4-26b-a4b-it.config.json": (
        5, 2816, 32, 8, 128, 5632, (1, 6, 11, 17, 22, 27), 30, 4, 4, 2048,
        58, 859_378_176, 35_072, 859_448_320, 1e6, 16, 30.0),
    "dflash-qwen3.6-27b.config.json": (
        5, 5120, 32, 8, 128, 17408, (1, 16, 31, 46, 61), 64, 248070, 4, 2048,
        58, 3_460_426_240, 62_720, 3_460_551_680, 1e7, 16, None),
    "dflash-qwen3.6-35b-a3b.config.json": (
        8, 2048, 32, 4, 128, 6144, (1, 10, 19, 28, 37), 40, 248070, 0, None,
        91, 947_990_528, 38_912, 948_068_352, 1e7, 16, None),
    "dflash-qwen3.6-35b-a3b-yarn.config.json": (
        8, 2048, 32, 4, 128, 6144, (1, 10, 19, 28, 37), 40, 248070, 0, None,
        91, 947_990_528, 38_912, 948_068_352, 1e7, 16, None),
    "dflash-qwen3.6-35b-a3b-new.config.json": (
        6, 2048, 32, 8, 128, 6144, (1, 6, 11, 16, 22, 27, 32, 37), 40, 248077, 5, 4096,
        69, 771_812_352, 30_208, 771_872_768, 1e7, 16, None),
}


@pytest.mark.parametrize("fname", sorted(DRAFTERS))
def test_drafter_config_numbers(fname: str) -> None:
    (L, H, Qh, Kh, Dh, I, taps, n_target, mask, n_sliding, window, n_tensors, total, n_norm, resident,
     theta, block, softcap) = DRAFTERS[fname]
    c = DFlashConfig.from_file(PUBLISHED / fname)
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads) == (L, H, Qh, Kh)
    assert (c.head_dim, c.intermediate_size) == (Dh, I)
    assert c.target_layer_ids == taps and c.num_taps == len(taps) and c.fc_input_dim == len(taps) * H
    assert c.num_target_layers == n_target and c.mask_token_id == mask
    assert sum(c.is_sliding(i) for i in range(L)) == n_sliding and c.sliding_window == window
    if n_sliding:
        assert c.layer_types[-1] == "full_attention"
    assert c.num_tensors == len(expected_manifest(c)) == n_tensors == 3 + 11 * L
    assert expected_total_data_bytes(c) == total
    assert n_norm_elements(c) == n_norm
    assert expected_resident_bytes(c) == resident == total + 2 * n_norm
    assert c.rope_theta == theta and c.block_size == block and c.final_logit_softcapping == softcap
    assert c.vocab_size == (262144 if "gemma" in fname else 248320)
    if "yarn" in fname:
        assert c.rope_scaling == {"rope_type": "yarn", "factor": 64.0}
    else:
        assert c.rope_scaling is None


def test_gemma_drafter_derived_sizes() -> None:
    """docs/DFLASH.md (gemma-4 drafter): derived widths and BF16 bytes per tensor."""
    c = DFlashConfig.from_file(PUBLISHED / "dflash-gemma-4-26b-a4b-it.config.json")
    assert (c.fc_input_dim, c.q_width, c.kv_width, c.num_attention_heads // c.num_key_value_heads) == (
        16_896, 4_096, 1_024, 4)
    b = {e.name: e.disk_nbytes for e in expected_manifest(c)}
    assert b["fc.weight"] == 95_158_272 and b["hidden_norm.weight"] == 5_632 and b["norm.weight"] == 5_632
    assert b["layers.0.self_attn.q_norm.weight"] == b["layers.0.self_attn.k_norm.weight"] == 256
    for n in ("down_proj", "gate_proj", "up_proj"):
        assert b[f"layers.0.mlp.{n}.weight"] == 31_719_424
    assert b["layers.0.self_attn.k_proj.weight"] == b["layers.0.self_attn.v_proj.weight"] == 5_767_168
    assert b["layers.0.self_attn.q_proj.weight"] == b["layers.0.self_attn.o_proj.weight"] == 23_068_672
    assert sum(v for k, v in b.items() if k.startswith("layers.0.")) == 152_841_728


def test_qwen_drafter_default_taps_rule() -> None:
    """docs/DFLASH.md (other drafters): the 27B drafter's taps follow z-lab's rule, T ids spaced
    evenly from 1 to num_target_layers - 3, rounded."""
    c = DFlashConfig.from_file(PUBLISHED / "dflash-qwen3.6-27b.config.json")
    t, end = c.num_taps, c.num_target_layers - 3
    assert list(c.target_layer_ids) == [int(round(1 + i * (end - 1) / (t - 1))) for i in range(t)]
