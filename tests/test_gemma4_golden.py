"""Gemma 4 against llama.cpp's converter: every tensor hf2q loads equals what
``convert_hf_to_gguf.py --outtype q8_0 | f32 | bf16`` writes for the same
checkpoint — names, shapes, GGML types and bytes — and the config hf2q reads
gives the metadata the converter writes.

The fixtures (tests/data/gemma4/) were written by transformers'
``save_pretrained`` and converted by the converter of llama-cpp-python 0.3.36;
scripts/make_golden_gemma4.py regenerates them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import hf2q
from hf2q.models import gemma4

DATA = Path(__file__).parent / "data" / "gemma4"
VARIANTS = ("gemma4_moe_causal_lm", "gemma4_moe_conditional_generation", "gemma4_dense_ple", "gemma4_moe_published",
            "gemma4_dense_f32_source")
OUTTYPES = ("q8_0", "f32", "bf16")
GGML = {"F32": "f32", "F16": "f16", "BF16": "bf16", "Q8_0": "q8_0"}


def _golden(variant: str) -> tuple[dict, dict[str, bytes]]:
    meta = json.loads((DATA / variant / "converted.json").read_text())
    npz = np.load(DATA / meta.get("blobs_in", variant) / "converted.npz")
    return meta, {k: npz[k].tobytes() for k in npz.files}


def _checkpoint(variant: str, tmp_path: Path) -> Path:
    """The variant's hf/ directory; the published-form variant commits only its
    config.json and takes the weights of its base."""
    meta = json.loads((DATA / variant / "converted.json").read_text())
    hf = DATA / variant / "hf"
    if "blobs_in" not in meta:
        return hf
    d = tmp_path / variant
    d.mkdir()
    for f in (DATA / meta["blobs_in"] / "hf").iterdir():
        if f.name != "config.json":
            (d / f.name).symlink_to(f)
    shutil.copy(hf / "config.json", d / "config.json")
    return d


@pytest.fixture(scope="module")
def device():
    return hf2q.Device("host")


@pytest.mark.parametrize("outtype", OUTTYPES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_tensor_equals_the_converter(variant: str, outtype: str, device, tmp_path: Path) -> None:
    meta, blobs = _golden(variant)
    want = {t["name"]: t for t in meta["outtypes"][outtype]["tensors"]}
    model = hf2q.load(_checkpoint(variant, tmp_path), device, progress=False, dense_dtype=outtype,
                      expert_dtype=outtype)
    assert isinstance(model, gemma4.Gemma4Model)
    assert sorted(model.names()) == sorted(want)
    for name in model.names():
        buf, t = model[name], want[name]
        assert buf.dtype == GGML[t["type"]], name
        assert list(buf.shape) == t["shape"], name
        assert buf.byte_len == t["nbytes"], name
        got = buf.numpy().view(np.uint8).tobytes()
        assert got == blobs[t["blob"]], f"{variant} --outtype {outtype}: {name} differs from the converter's bytes"
    assert model.gpu_resident_bytes() == sum(t["nbytes"] for t in want.values())


def _assert_metadata(m: dict, cfg: gemma4.Gemma4Config) -> None:
    """hf2q's config gives the gemma4.* metadata the converter wrote."""
    assert m["general.architecture"] == "gemma4"
    assert m["gemma4.block_count"] == cfg.num_hidden_layers
    assert m["gemma4.embedding_length"] == cfg.hidden_size
    assert m["gemma4.context_length"] == cfg.max_position_embeddings
    assert m["gemma4.attention.head_count"] == cfg.num_attention_heads
    swa = [k == gemma4.SLIDING_ATTENTION for k in cfg.layer_types]
    assert m["gemma4.attention.sliding_window_pattern"] == swa
    assert m["gemma4.attention.sliding_window"] == cfg.sliding_window
    assert m["gemma4.attention.key_length"] == cfg.full_head_dim
    assert m["gemma4.attention.key_length_swa"] == cfg.head_dim
    assert m["gemma4.rope.dimension_count"] == cfg.full_head_dim
    assert m["gemma4.rope.freq_base"] == pytest.approx(cfg.rope_theta_full)
    assert m["gemma4.rope.freq_base_swa"] == pytest.approx(cfg.rope_theta_sliding)
    assert m["gemma4.attention.layer_norm_rms_epsilon"] == pytest.approx(cfg.rms_norm_eps)
    assert m["gemma4.attention.shared_kv_layers"] == cfg.num_kv_shared_layers
    assert m["gemma4.embedding_length_per_layer_input"] == cfg.hidden_size_per_layer_input
    kv = m["gemma4.attention.head_count_kv"]
    want_kv = [ly.num_key_value_heads for ly in cfg.layers]
    assert (kv == want_kv) if isinstance(kv, list) else all(k == kv for k in want_kv)
    ff = m["gemma4.feed_forward_length"]
    want_ff = [ly.intermediate_size for ly in cfg.layers]
    assert (ff == want_ff) if isinstance(ff, list) else all(f == ff for f in want_ff)
    if cfg.enable_moe_block:
        assert m["gemma4.expert_count"] == cfg.num_experts
        assert m["gemma4.expert_used_count"] == cfg.top_k_experts
        assert m["gemma4.expert_feed_forward_length"] == cfg.moe_intermediate_size
    else:
        assert "gemma4.expert_count" not in m
    if cfg.final_logit_softcapping:
        assert m["gemma4.final_logit_softcapping"] == pytest.approx(cfg.final_logit_softcapping)
    else:
        assert "gemma4.final_logit_softcapping" not in m


@pytest.mark.parametrize("variant", VARIANTS)
def test_config_matches_converter_metadata(variant: str, tmp_path: Path) -> None:
    meta, _ = _golden(variant)
    cfg = gemma4.Gemma4Config.from_file(_checkpoint(variant, tmp_path) / "config.json")
    _assert_metadata(meta["outtypes"]["f32"]["metadata"], cfg)
    assert [meta["outtypes"][o]["metadata"]["general.file_type"] for o in OUTTYPES] == [7, 0, 32]


_CONFIG_VARIANTS = json.loads((DATA / "config_variants.json").read_text())["variants"]


@pytest.mark.parametrize("v", _CONFIG_VARIANTS, ids=[v["name"] for v in _CONFIG_VARIANTS])
def test_defaults_match_the_converter(v: dict) -> None:
    """Keys a config leaves out (or nulls) take the values the converter takes."""
    assert "converter_error" not in v
    _assert_metadata(v["metadata"], gemma4.Gemma4Config.from_dict(v["config"]))


def test_published_and_resaved_forms_agree(tmp_path: Path) -> None:
    a = gemma4.Gemma4Config.from_file(DATA / "gemma4_moe_causal_lm" / "hf" / "config.json")
    b = gemma4.Gemma4Config.from_file(_checkpoint("gemma4_moe_published", tmp_path) / "config.json")
    assert a.per_layer_config_form and not b.per_layer_config_form
    assert a.layers == b.layers


def test_multimodal_wrapper_skips_towers_and_reads_shards() -> None:
    hf = DATA / "gemma4_moe_conditional_generation" / "hf"
    assert (hf / "model.safetensors.index.json").is_file()
    info = gemma4.inspect(hf)
    assert info["skipped"] and all("vision" in n for n in info["skipped"])
    assert not any("vision" in n for n in info["device_dtypes"])
    assert info["device_dtypes"]["model.language_model.layers.0.experts.gate_up_proj"] == "q8_0"
    assert {t["name"] for t in info["gguf_tensors"]} >= {"rope_freqs.weight", "blk.1.ffn_gate_up_exps.weight"}


def test_embedding_rows_follow_the_tokenizer() -> None:
    info = gemma4.inspect(DATA / "gemma4_dense_ple" / "hf")
    assert info["embedding_rows"] == 90 and info["embedding_rows_from"] == "tokenizer.json"
    assert info["tied_output"] is False


def test_cli_inspect_and_load_detect_gemma4(capsys) -> None:
    from hf2q.cli import main

    hf = DATA / "gemma4_moe_causal_lm" / "hf"
    assert main(["load", str(hf), "--device", "host", "--json", "--verify"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "gemma4" and out["tensors"] == 46
    assert main(["inspect", str(hf), "--json"]) == 0
    assert "gemma4" in capsys.readouterr().out
