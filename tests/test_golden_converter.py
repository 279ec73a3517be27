"""hf2q against what the ecosystem writes: checkpoints saved by transformers'
``save_pretrained`` (and DFlash drafters by ``make_dflash_checkpoint``), and
llama.cpp's ``convert_hf_to_gguf.py`` output for them (--outtype q8_0, f32,
bf16), all committed under tests/data/golden/ by scripts/make_golden.py.

Needs neither torch nor transformers: every test here runs in CI. Every
converter tensor is compared byte for byte with our in-memory result
(``ssm_a`` within 1 ulp: ``-exp`` may differ in the last bit), and our config
with every metadata key both sides have.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import hf2q
from hf2q import dflash, qwen35
from hf2q.models.dflash import DFlashConfig
from hf2q.models.qwen35.config import DEFAULT_FULL_ATTENTION_INTERVAL, Qwen35Config

GOLDEN = Path(__file__).parent / "data" / "golden"
OUTTYPES = ("q8_0", "f32", "bf16")
GGUF_TYPE = {"F32": "f32", "BF16": "bf16", "Q8_0": "q8_0"}
QWEN_VARIANTS = sorted(p.name for p in GOLDEN.glob("qwen35moe_*") if (p / "converted.json").is_file())
DFLASH_VARIANTS = sorted(p.name for p in GOLDEN.glob("dflash_*") if (p / "converted.json").is_file())


@lru_cache(maxsize=None)
def golden(variant: str) -> tuple[dict[str, Any], dict[str, bytes]]:
    meta = json.loads((GOLDEN / variant / "converted.json").read_text())
    with np.load(GOLDEN / variant / "converted.npz") as z:
        blobs = {k: z[k].tobytes() for k in z.files}
    return meta, blobs


@pytest.fixture
def dev() -> hf2q.Device:
    return hf2q.Device._isolated("host")


def test_golden_data_present() -> None:
    # An empty glob would make every parametrized test below vanish silently.
    assert len(QWEN_VARIANTS) == 5 and len(DFLASH_VARIANTS) == 2
    total = sum(f.stat().st_size for f in GOLDEN.rglob("*") if f.is_file())
    assert total < 8 << 20  # "a few MB"
    for v in QWEN_VARIANTS + DFLASH_VARIANTS:
        meta, blobs = golden(v)
        assert set(meta["outtypes"]) == set(OUTTYPES)
        for o in meta["outtypes"].values():
            for t in o["tensors"]:
                assert len(blobs[t["blob"]]) == t["nbytes"], (v, t["name"])


def _assert_ssm_a(ours: bytes, theirs: bytes, name: str) -> None:
    a = np.frombuffer(ours, dtype="<i4").astype(np.int64)
    b = np.frombuffer(theirs, dtype="<i4").astype(np.int64)
    assert a.shape == b.shape, name
    assert np.all(a < 0) == np.all(b < 0)  # same sign (ssm_a = -exp(A_log) < 0)
    assert int(np.max(np.abs(a - b))) <= 1, f"{name}: more than 1 ulp from the converter"


# ----------------------------------------------------------------------------- Qwen3.5 MoE tensors
@pytest.mark.parametrize("outtype", OUTTYPES)
@pytest.mark.parametrize("variant", QWEN_VARIANTS)
def test_qwen_every_tensor_equals_converter(dev, variant, outtype) -> None:
    meta, blobs = golden(variant)
    conv = meta["outtypes"][outtype]
    # --outtype X converts the experts too; our expert_dtype takes the same value.
    model = qwen35.load(GOLDEN / variant / "hf", device=dev, dense_dtype=outtype, expert_dtype=outtype,
                        progress=False)
    want = {t["name"]: t for t in conv["tensors"]}
    assert sorted(model.names()) == sorted(want), "tensor names differ from the converter's"
    for name, t in want.items():
        buf = model[name]
        assert buf.dtype == GGUF_TYPE[t["type"]], f"{name}: {buf.dtype} vs converter {t['type']}"
        assert list(buf.shape) == t["shape"], name
        ours = buf.numpy().view(np.uint8).tobytes()
        theirs = blobs[t["blob"]]
        assert len(ours) == t["nbytes"], name
        if name.endswith(".ssm_a"):
            _assert_ssm_a(ours, theirs, name)
        else:
            assert ours == theirs, f"{name} ({outtype}): bytes differ from the converter's"


#: The converter's GGUF files recorded at --outtype f16 (tests/data/gguf, scripts/make_golden_gguf.py).
GGUF_GOLDEN = Path(__file__).parent / "data" / "gguf"
F16_FILES = sorted(p.stem for p in GGUF_GOLDEN.glob("*.json")
                   if "f16" in json.loads(p.read_text()).get("outtypes", {}))


def test_f16_files_cover_both_families() -> None:
    families = {json.loads((GGUF_GOLDEN / f"{v}.json").read_text())["family"] for v in F16_FILES}
    assert len(F16_FILES) >= 3 and families >= {"qwen35moe", "gemma4"}, F16_FILES


@pytest.mark.parametrize("variant", F16_FILES)
def test_f16_load_equals_the_converters_f16_file(dev, variant) -> None:
    """``dense_dtype="f16", expert_dtype="f16"`` holds, tensor for tensor, the
    bytes ``convert_hf_to_gguf.py --outtype f16`` wrote (F16 where its bf16
    makes BF16, F32 elsewhere); ``ssm_a`` within 1 ulp, as everywhere."""
    import hashlib

    from hf2q import gemma4

    g = json.loads((GGUF_GOLDEN / f"{variant}.json").read_text())
    family = {"qwen35moe": qwen35, "gemma4": gemma4}[g["family"]]
    ck = Path(__file__).parent / g["checkpoint"].removeprefix("tests/")
    model = family.load(ck, device=dev, dense_dtype="f16", expert_dtype="f16", progress=False)
    want = {t["name"]: t for t in g["outtypes"]["f16"]["tensors"]}
    assert sorted(model.names()) == sorted(want)
    assert {t["type"] for t in want.values()} == {"F16", "F32"}
    for name, t in want.items():
        buf = model[name]
        assert buf.dtype == t["type"].lower() and list(buf.shape) == t["shape"], name
        ours = buf.numpy().view(np.uint8).tobytes()
        if name.endswith(".ssm_a") and hashlib.sha256(ours).hexdigest() != t["sha256"]:
            meta, blobs = golden(variant)  # its F32 tensor, as at --outtype f32
            _assert_ssm_a(ours, blobs[{x["name"]: x for x in meta["outtypes"]["f32"]["tensors"]}[name]["blob"]], name)
        else:
            assert hashlib.sha256(ours).hexdigest() == t["sha256"], f"{name} (f16): bytes differ from the converter's"


@pytest.mark.parametrize("variant", QWEN_VARIANTS)
def test_qwen_default_dtypes_match_q8_0_converter(dev, variant) -> None:
    """Our defaults (Q8_0 experts, F32 dense) against --outtype q8_0 / f32."""
    meta, blobs = golden(variant)
    q8 = {t["name"]: t for t in meta["outtypes"]["q8_0"]["tensors"]}
    f32 = {t["name"]: t for t in meta["outtypes"]["f32"]["tensors"]}
    model = qwen35.load(GOLDEN / variant / "hf", device=dev, progress=False)
    for name in model.names():
        t = q8[name] if "_exps." in name else f32[name]
        ours = model[name].numpy().view(np.uint8).tobytes()
        if name.endswith(".ssm_a"):
            _assert_ssm_a(ours, blobs[t["blob"]], name)
        else:
            assert ours == blobs[t["blob"]], name


# ----------------------------------------------------------------------------- Qwen3.5 MoE config
def qwen_expected_metadata(cfg: Qwen35Config, arch: str = "qwen35moe") -> dict[str, Any]:
    """The GGUF key/values that our config determines (GGUF key -> value)."""
    f32 = float(np.float32(cfg.rms_norm_eps))
    p = arch + "."
    return {
        p + "block_count": cfg.num_hidden_layers + cfg.mtp_num_hidden_layers,
        p + "context_length": cfg.max_position_embeddings,
        p + "embedding_length": cfg.hidden_size,
        p + "attention.head_count": cfg.num_attention_heads,
        p + "attention.head_count_kv": cfg.num_key_value_heads,
        p + "rope.freq_base": float(np.float32(cfg.rope_theta)),
        p + "attention.layer_norm_rms_epsilon": f32,
        p + "expert_count": cfg.num_experts,
        p + "expert_used_count": cfg.num_experts_per_tok,
        p + "attention.key_length": cfg.head_dim,
        p + "attention.value_length": cfg.head_dim,
        p + "expert_feed_forward_length": cfg.moe_intermediate_size,
        p + "expert_shared_feed_forward_length": cfg.shared_expert_intermediate_size,
        p + "ssm.conv_kernel": cfg.linear_conv_kernel_dim,
        p + "ssm.state_size": cfg.linear_key_head_dim,
        p + "ssm.group_count": cfg.linear_num_key_heads,
        p + "ssm.time_step_rank": cfg.linear_num_value_heads,
        p + "ssm.inner_size": cfg.linear_num_value_heads * cfg.linear_value_head_dim,
        # MTP blocks are full attention (not recurrent)
        p + "attention.recurrent_layers": [k == "linear" for k in cfg.layer_kinds] + [False] * cfg.mtp_num_hidden_layers,
        p + "rope.dimension_count": cfg.rotary_dim,
        p + "rope.dimension_sections": list(cfg.mrope_section_gguf),
    }


def assert_qwen_config_matches(cfg: Qwen35Config, metadata: dict[str, Any], where: str) -> int:
    expected = qwen_expected_metadata(cfg)
    compared = 0
    for key, want in expected.items():
        assert key in metadata, f"{where}: converter wrote no {key}"
        got = metadata[key]
        if isinstance(want, float):
            assert float(np.float32(got)) == want, f"{where}: {key} = {got}, ours {want}"
        else:
            assert got == want, f"{where}: {key} = {got}, ours {want}"
        compared += 1
    # transformers' config drops full_attention_interval (layer_types carries it),
    # so the converter always writes its own default there; ours is None unless stated.
    if cfg.full_attention_interval is None:
        assert metadata["qwen35moe.full_attention_interval"] == DEFAULT_FULL_ATTENTION_INTERVAL
        compared += 1
    if cfg.mtp_num_hidden_layers:
        assert metadata["qwen35moe.nextn_predict_layers"] == cfg.mtp_num_hidden_layers, where
        compared += 1
    else:  # transformers saves no MTP (converted with --no-mtp)
        assert "qwen35moe.nextn_predict_layers" not in metadata, where
    return compared


@pytest.mark.parametrize("variant", QWEN_VARIANTS)
def test_qwen_config_equals_converter_metadata(variant) -> None:
    meta, _ = golden(variant)
    cfg = Qwen35Config.from_file(GOLDEN / variant / "hf")
    for ot, o in meta["outtypes"].items():
        assert o["architecture"] == "qwen35moe"
        assert assert_qwen_config_matches(cfg, o["metadata"], f"{variant}/{ot}") >= 21
    assert o["metadata"]["general.file_type"] == 32  # bf16 last: the record is per outtype


def test_transformers_wrote_no_mrope_section_and_we_load_it() -> None:
    """The bug of issue 10: no mrope_section in the file, rotary_dim / 2 = 4,
    llama.cpp writes [11, 11, 10, 0]; we take that default without checking it."""
    raw = json.loads((GOLDEN / "qwen35moe_causal_lm" / "hf" / "config.json").read_text())
    assert "mrope_section" not in json.dumps(raw)
    cfg = Qwen35Config.from_dict(raw)
    assert cfg.rotary_dim // 2 == 4 and cfg.mrope_section_gguf == (11, 11, 10, 0)
    stated = json.loads((GOLDEN / "qwen35moe_causal_lm_fused_mrope" / "hf" / "config.json").read_text())
    assert stated["rope_parameters"]["mrope_section"] == [2, 1, 1]
    assert Qwen35Config.from_dict(stated).mrope_section_gguf == (2, 1, 1, 0)


# ----------------------------------------------------------------------------- config-only variants
CONFIG_VARIANTS = json.loads((GOLDEN / "config_variants.json").read_text())["variants"] \
    if (GOLDEN / "config_variants.json").is_file() else []


def dflash_expected_metadata(cfg: DFlashConfig) -> dict[str, Any]:
    p = "dflash."
    out: dict[str, Any] = {
        p + "block_count": cfg.num_hidden_layers,
        p + "context_length": cfg.max_position_embeddings,
        p + "embedding_length": cfg.hidden_size,
        p + "feed_forward_length": cfg.intermediate_size,
        p + "attention.head_count": cfg.num_attention_heads,
        p + "attention.head_count_kv": cfg.num_key_value_heads,
        p + "rope.freq_base": float(np.float32(cfg.rope_theta)),
        p + "attention.layer_norm_rms_epsilon": float(np.float32(cfg.rms_norm_eps)),
        p + "attention.key_length": cfg.head_dim,
        p + "attention.value_length": cfg.head_dim,
        p + "block_size": cfg.block_size,
        # GGUF stores hidden_states indices (decoder layer id + 1)
        p + "target_layers": [i + 1 for i in cfg.target_layer_ids],
    }
    return out


def assert_dflash_config_matches(cfg: DFlashConfig, raw: dict[str, Any], metadata: dict[str, Any],
                                 where: str) -> int:
    compared = 0
    for key, want in dflash_expected_metadata(cfg).items():
        assert key in metadata, f"{where}: converter wrote no {key}"
        got = metadata[key]
        if isinstance(want, float):
            assert float(np.float32(got)) == want, f"{where}: {key} = {got}, ours {want}"
        else:
            assert got == want, f"{where}: {key} = {got}, ours {want}"
        compared += 1
    # mask token: written by the converter only when stated; ours defaults to 0.
    mask_key = "tokenizer.ggml.mask_token_id"
    if mask_key in metadata:
        assert metadata[mask_key] == cfg.mask_token_id, where
        compared += 1
    else:
        assert "mask_token_id" not in raw.get("dflash_config", {}) and cfg.mask_token_id == 0, where
    # sliding window: the converter writes it only with use_sliding_window.
    if "dflash.attention.sliding_window" in metadata:
        assert metadata["dflash.attention.sliding_window"] == cfg.sliding_window, where
        assert metadata["dflash.attention.sliding_window_pattern"] == [
            cfg.is_sliding(i) for i in range(cfg.num_hidden_layers)], where
        compared += 2
    else:
        assert not raw.get("use_sliding_window") or cfg.sliding_window is None, where
    return compared


@pytest.mark.parametrize("variant", [v["name"] for v in CONFIG_VARIANTS])
def test_config_variant_equals_converter_metadata(variant) -> None:
    """Fields taken out of / moved in a golden config: the value the converter
    used for what the file does not state is the value we use."""
    (v,) = [v for v in CONFIG_VARIANTS if v["name"] == variant]
    assert "converter_error" not in v, v.get("converter_error")
    md = v["converter"]["metadata"]
    if v["base"].startswith("dflash"):
        cfg = DFlashConfig.from_dict(v["config"])
        assert assert_dflash_config_matches(cfg, v["config"], md, variant) >= 12
    else:
        # through the plan over the base checkpoint's tensors: it resolves what
        # needs the names (mtp_num_hidden_layers absent -> count mtp.layers.{i})
        with hf2q.open_checkpoint(GOLDEN / v["base"] / "hf") as ck:
            cfg = qwen35.plan_qwen35_moe(ck, Qwen35Config.from_dict(v["config"])).config
        assert assert_qwen_config_matches(cfg, md, variant) >= 21


def test_config_variants_cover_every_default() -> None:
    names = {v["name"] for v in CONFIG_VARIANTS}
    assert len(names) >= 16
    for n in ("qwen_no_mrope_prf_0.5", "qwen_no_partial_rotary_factor", "qwen_no_rope_parameters",
              "qwen_rope_scaling", "qwen_no_layer_types", "qwen_no_layer_types_interval_2",
              "qwen_mm_no_text_rope_parameters", "dflash_no_block_size", "dflash_no_mask_token_id",
              "dflash_no_rope_theta", "dflash_new_no_rope_parameters", "qwen_mtp_absent"):
        assert n in names


# ----------------------------------------------------------------------------- DFlash
@pytest.mark.parametrize("variant", DFLASH_VARIANTS)
def test_dflash_config_equals_converter_metadata(variant) -> None:
    meta, _ = golden(variant)
    raw = json.loads((GOLDEN / variant / "hf" / "config.json").read_text())
    cfg = DFlashConfig.from_file(GOLDEN / variant / "hf")
    for ot, o in meta["outtypes"].items():
        assert o["architecture"] == "dflash"
        assert assert_dflash_config_matches(cfg, raw, o["metadata"], f"{variant}/{ot}") >= 12


def _bf16_to_f32_bytes(b: bytes) -> bytes:
    return np.frombuffer(b, dtype=ml_dtypes.bfloat16).astype(np.float32).tobytes()


@pytest.mark.parametrize("outtype", OUTTYPES)
@pytest.mark.parametrize("variant", DFLASH_VARIANTS)
def test_dflash_every_tensor_equals_converter(dev, variant, outtype) -> None:
    """Our device buffers are BF16 projections and F32 norms: equal to the
    converter's --outtype bf16 bytes; widened, to its f32; quantized by our
    Q8_0 kernel, to its q8_0 (the norms stay F32 in all three)."""
    meta, blobs = golden(variant)
    conv = meta["outtypes"][outtype]["tensors"]
    model = dflash.load(GOLDEN / variant / "hf", device=dev, progress=False)
    ours = model.buffers_by_name()
    assert sorted(t["hf_name"] for t in conv) == sorted(ours)
    assert len(conv) == model.config.num_tensors
    for t in conv:
        buf = ours[t["hf_name"]]
        assert list(buf.shape) == t["shape"], t["name"]
        raw = buf.numpy().view(np.uint8).tobytes()
        if buf.dtype == "f32":  # the six norm kinds
            assert t["type"] == "F32", t["name"]
            got = raw
        elif t["type"] == "BF16":
            got = raw
        elif t["type"] == "F32":
            got = _bf16_to_f32_bytes(raw)
        else:
            assert t["type"] == "Q8_0", t["name"]
            got = hf2q.ops.quantize_q8_0(buf.numpy().view(ml_dtypes.bfloat16)).tobytes()
        assert got == blobs[t["blob"]], f"{t['name']} ({outtype}) differs from the converter's"


# ----------------------------------------------------------------------------- public API and CLI
@pytest.mark.parametrize("variant", QWEN_VARIANTS + DFLASH_VARIANTS)
def test_cli_inspect_and_load(variant, capsys) -> None:
    from hf2q.cli import main

    d = GOLDEN / variant / "hf"
    meta, _ = golden(variant)
    n = len(meta["outtypes"]["q8_0"]["tensors"])
    assert main(["inspect", str(d), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    if variant.startswith("dflash"):
        assert out["architecture"] == "dflash" and out["tensors"] == n
    else:
        assert out["architecture"] == "qwen35moe" and out["planned_tensors"] == n
    assert main(["load", str(d), "--device", "host", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == ("dflash" if variant.startswith("dflash") else "qwen35moe")
    assert out["tensors"] == n


@pytest.mark.parametrize("variant", QWEN_VARIANTS)
def test_public_api_inspect(variant) -> None:
    meta, _ = golden(variant)
    info = qwen35.inspect(GOLDEN / variant / "hf")
    assert info["planned_tensors"] == len(meta["outtypes"]["q8_0"]["tensors"])
    if "conditional_generation" in variant or json.loads((GOLDEN / variant / "hf" / "config.json").read_text()).get(
            "vision_config"):
        assert info["skipped"] and all(".visual." in n or n.startswith("model.visual") for n in info["skipped"])
    else:
        assert info["skipped"] == []
