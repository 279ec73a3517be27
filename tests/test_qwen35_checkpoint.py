"""hf2q.testing.make_qwen35_moe_checkpoint: real HF naming, valid safetensors,
deterministic values shared across layouts; plus (when transformers has
Qwen3.5 MoE) a plan over a real ``save_pretrained`` checkpoint."""

from __future__ import annotations

import json
import struct

import ml_dtypes
import numpy as np
import pytest

from hf2q.qwen35 import Qwen35Config, plan_qwen35_moe
from hf2q.testing import make_qwen35_moe_checkpoint
from hf2q.testing.qwen35_checkpoint import (
    BENCH_TEXT_CONFIG,
    TINY_TEXT_CONFIG,
    checkpoint_tensor_specs,
    read_checkpoint_arrays,
)

BF16 = np.dtype(ml_dtypes.bfloat16)
ITEMSIZE = {"BF16": 2, "F16": 2, "F32": 4}


def parse_safetensors(path) -> dict:
    """Minimal independent check of docs/SAFETENSORS.md for our writer."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    assert n % 8 == 0  # padded like the reference writer
    header = json.loads(data[8:8 + n])
    assert header.pop("__metadata__") == {"format": "pt"}
    spans = sorted((v["data_offsets"], k) for k, v in header.items())
    end = 0
    for (b, e), k in spans:
        assert b == end, k
        assert e - b == int(np.prod(header[k]["shape"])) * ITEMSIZE[header[k]["dtype"]], k
        end = e
    assert 8 + n + end == len(data)
    # reference writer order: by descending dtype size, then name
    order = [k for _, k in spans]
    assert order == sorted(order, key=lambda k: (-ITEMSIZE[header[k]["dtype"]], k))
    return header


def test_tiny_layout(tmp_path) -> None:
    d = make_qwen35_moe_checkpoint(tmp_path, "tiny", seed=3)
    assert sorted(p.name for p in d.iterdir()) == ["config.json", "model.safetensors"]
    header = parse_safetensors(d / "model.safetensors")
    specs = checkpoint_tensor_specs("tiny")
    assert {k: (v["dtype"], tuple(v["shape"])) for k, v in header.items()} == specs
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3_5MoeForCausalLM"] and "text_config" not in cfg
    names = set(specs)
    assert "model.layers.0.linear_attn.A_log" in names and specs["model.layers.0.linear_attn.A_log"][0] == "F32"
    assert specs["model.layers.0.linear_attn.conv1d.weight"] == ("BF16", (512, 1, 4))
    assert "model.layers.3.self_attn.q_proj.weight" in names and "model.layers.3.linear_attn.A_log" not in names
    assert "model.layers.1.mlp.experts.3.down_proj.weight" in names
    assert {n for n in names if n.startswith("mtp.") and "layers" not in n} == {
        "mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight"}
    assert all(dt == "BF16" for n, (dt, _) in specs.items() if not n.endswith("A_log"))
    c = Qwen35Config.from_file(d)
    assert c.linear_num_key_heads != c.linear_num_value_heads and c.v_per_k != c.linear_num_key_heads
    arr = read_checkpoint_arrays(d)
    assert arr["model.layers.0.linear_attn.A_log"].dtype == np.float32
    assert arr["model.embed_tokens.weight"].dtype == BF16
    assert np.all(arr["model.layers.0.linear_attn.A_log"] > 0)  # log(uniform(1, 16))


def test_multimodal_sharded_layout(tmp_path) -> None:
    d = make_qwen35_moe_checkpoint(tmp_path, "tiny", multimodal=True, sharded=True, fused_gate_up=True)
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["model_type"] == "qwen3_5_moe" and cfg["text_config"]["model_type"] == "qwen3_5_moe_text"
    assert cfg["architectures"] == ["Qwen3_5MoeForConditionalGeneration"] and "vision_config" in cfg
    index = json.loads((d / "model.safetensors.index.json").read_text())
    wm = index["weight_map"]
    shards = sorted(set(wm.values()))
    assert shards == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    seen = {}
    for s in shards:
        for k in parse_safetensors(d / s):
            assert wm[k] == s and k not in seen
            seen[k] = s
    assert set(seen) == set(wm) == set(checkpoint_tensor_specs("tiny", multimodal=True, fused_gate_up=True))
    assert index["metadata"]["total_size"] == sum(
        int(np.prod(s)) * ITEMSIZE[dt] for dt, s in checkpoint_tensor_specs("tiny", multimodal=True, fused_gate_up=True).values())
    assert "model.language_model.layers.0.mlp.experts.gate_up_proj" in wm
    assert "model.language_model.embed_tokens.weight" in wm and "lm_head.weight" in wm
    assert any(k.startswith("model.visual.") for k in wm)
    assert any(k.startswith("mtp.layers.0.") for k in wm)


def test_same_seed_same_weights_across_layouts(tmp_path) -> None:
    a = read_checkpoint_arrays(make_qwen35_moe_checkpoint(tmp_path / "a", "tiny", seed=5))
    b = read_checkpoint_arrays(make_qwen35_moe_checkpoint(tmp_path / "b", "tiny", seed=5, fused_gate_up=True,
                                                          multimodal=True, sharded=True))
    c = read_checkpoint_arrays(make_qwen35_moe_checkpoint(tmp_path / "c", "tiny", seed=6))
    I, E = TINY_TEXT_CONFIG["moe_intermediate_size"], TINY_TEXT_CONFIG["num_experts"]
    for pa, pb in (("model.layers.2.", "model.language_model.layers.2."), ("mtp.layers.0.", "mtp.layers.0.")):
        gu, dn = b[pb + "mlp.experts.gate_up_proj"], b[pb + "mlp.experts.down_proj"]
        assert gu.shape == (E, 2 * I, 64) and dn.shape == (E, 64, I)
        for e in range(E):
            assert np.array_equal(gu[e, :I].view(np.uint16), a[f"{pa}mlp.experts.{e}.gate_proj.weight"].view(np.uint16))
            assert np.array_equal(gu[e, I:].view(np.uint16), a[f"{pa}mlp.experts.{e}.up_proj.weight"].view(np.uint16))
            assert np.array_equal(dn[e].view(np.uint16), a[f"{pa}mlp.experts.{e}.down_proj.weight"].view(np.uint16))
    for k, v in a.items():
        if "experts" in k:
            continue
        kb = k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k
        assert np.array_equal(v.view(np.uint8), b[kb].view(np.uint8)), k
        assert not np.array_equal(v.view(np.uint8), c[k].view(np.uint8)), k  # another seed differs
    # distinct experts differ
    assert not np.array_equal(a["model.layers.0.mlp.experts.0.gate_proj.weight"].view(np.uint16),
                              a["model.layers.0.mlp.experts.1.gate_proj.weight"].view(np.uint16))


def test_no_mtp_checkpoint(tmp_path) -> None:
    d = make_qwen35_moe_checkpoint(tmp_path, "tiny", mtp=False)
    arr = read_checkpoint_arrays(d)
    assert not any(k.startswith("mtp.") for k in arr)
    c = Qwen35Config.from_file(d)
    assert c.mtp_num_hidden_layers == 1  # still declared, as in a transformers re-save
    assert len(plan_qwen35_moe({k: (a.dtype, a.shape) for k, a in arr.items()}, c)) == 76


def test_bench_config_layout() -> None:
    specs = checkpoint_tensor_specs("bench")
    c = Qwen35Config.from_dict({"architectures": ["Qwen3_5MoeForCausalLM"], **BENCH_TEXT_CONFIG})
    assert c.layer_kinds == ["linear", "full"] and c.mtp_num_hidden_layers == 0
    assert (c.hidden_size, c.num_experts, c.moe_intermediate_size, c.vocab_size) == (2048, 256, 512, 4096)
    plan = plan_qwen35_moe(specs, c)
    assert len(plan) == 19 + 16 + 3
    exps = [t for t in plan if t.kind == "expert"]
    assert [t.shape for t in exps] == [(256, 512, 2048), (256, 512, 2048), (256, 2048, 512)] * 2
    assert all(t.nbytes == 285_212_672 for t in exps)
    file_bytes = sum(int(np.prod(s)) * ITEMSIZE[dt] for dt, s in specs.values())
    assert 3.2e9 < file_bytes < 3.5e9
    assert len(plan_qwen35_moe(checkpoint_tensor_specs("bench", fused_gate_up=True, multimodal=True),
                               Qwen35Config.from_dict({"text_config": BENCH_TEXT_CONFIG}))) == 38


def test_config_argument_forms(tmp_path) -> None:
    with pytest.raises(ValueError, match="unknown config"):
        make_qwen35_moe_checkpoint(tmp_path, "huge")
    d = make_qwen35_moe_checkpoint(tmp_path, dict(TINY_TEXT_CONFIG, linear_num_value_heads=4))
    assert Qwen35Config.from_file(d).linear_num_value_heads == 4


@pytest.mark.parametrize("kw", [{}, dict(sharded=True, multimodal=True, fused_gate_up=True)])
def test_plan_from_hf2q_safetensors_checkpoint(tmp_path, kw) -> None:
    st = pytest.importorskip("hf2q.safetensors")
    if not hasattr(st, "open_checkpoint"):
        pytest.skip("hf2q.safetensors has no open_checkpoint yet")
    d = make_qwen35_moe_checkpoint(tmp_path, "tiny", **kw)
    ck = st.open_checkpoint(d)
    plan = plan_qwen35_moe(ck, Qwen35Config.from_file(d))
    assert len(plan) == 96
    assert plan.source_names() | set(plan.skipped) == set(ck.keys())
    arr = read_checkpoint_arrays(d)
    for t in plan:
        for s in t.sources:
            info = ck[s.name]
            assert (info.dtype, tuple(info.shape)) == (s.dtype, s.shape)
            assert info.nbytes == arr[s.name].nbytes


# ----------------------------------------------------------------------------- transformers
def _transformers_qwen35():
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    names = ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextConfig", "Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeConfig")
    if not all(hasattr(transformers, n) for n in names):
        pytest.skip("this transformers has no Qwen3.5 MoE classes")
    return transformers


def _saved_specs(path) -> dict:
    from safetensors import safe_open

    out = {}
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), framework="numpy") as sf:
            for k in sf.keys():
                sl = sf.get_slice(k)
                out[k] = (sl.get_dtype(), tuple(sl.get_shape()))
    return out


def _tiny_text_kwargs() -> dict:
    """TINY_TEXT_CONFIG as constructor arguments, without the mrope_section
    that real text-only configs do not carry: what reaches config.json is
    transformers' own choice (it writes no mrope_section), never a field
    added by hand."""
    kw = {k: v for k, v in TINY_TEXT_CONFIG.items() if k != "model_type"}
    kw["rope_parameters"] = {k: v for k, v in kw["rope_parameters"].items() if k != "mrope_section"}
    return kw


def _assert_no_mrope_section(path) -> None:
    assert "mrope_section" not in (path / "config.json").read_text()


def test_transformers_causal_lm_plan_covers_every_tensor(tmp_path) -> None:
    tf = _transformers_qwen35()
    model = tf.Qwen3_5MoeForCausalLM(tf.Qwen3_5MoeTextConfig(**_tiny_text_kwargs()))
    model.save_pretrained(tmp_path, safe_serialization=True)
    _assert_no_mrope_section(tmp_path)
    specs = _saved_specs(tmp_path)
    cfg = Qwen35Config.from_file(tmp_path)
    assert cfg.mrope_section_gguf == (11, 11, 10, 0)  # llama.cpp's default, unchecked
    plan = plan_qwen35_moe(specs, cfg)
    assert plan.source_names() | set(plan.skipped) == set(specs)
    assert plan.mtp_layers == 0 and len(plan) == 76  # transformers saves no MTP
    from hf2q import Device, qwen35

    loaded = qwen35.load(tmp_path, device=Device._isolated("host"), progress=False)
    assert len(loaded) == 76


def test_transformers_conditional_generation_plan(tmp_path) -> None:
    tf = _transformers_qwen35()
    vision = {"depth": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64, "patch_size": 4,
              "temporal_patch_size": 2, "spatial_merge_size": 2, "out_hidden_size": TINY_TEXT_CONFIG["hidden_size"],
              "num_position_embeddings": 16}
    config = tf.Qwen3_5MoeConfig(text_config=_tiny_text_kwargs(), vision_config=vision)
    model = tf.Qwen3_5MoeForConditionalGeneration(config)
    model.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="200KB")
    _assert_no_mrope_section(tmp_path)
    assert (tmp_path / "model.safetensors.index.json").is_file()
    specs = _saved_specs(tmp_path)
    cfg = Qwen35Config.from_file(tmp_path)
    assert cfg.multimodal
    plan = plan_qwen35_moe(specs, cfg)
    assert plan.source_names() | set(plan.skipped) == set(specs)
    assert plan.skipped and all("visual" in n for n in plan.skipped)
    assert len(plan) == 76


def test_transformers_still_writes_the_golden_configs(tmp_path) -> None:
    """The committed golden checkpoints' config.json is what this transformers
    writes (modulo its version string): catches drift in what the ecosystem
    writes (regenerate with scripts/make_golden.py)."""
    tf = _transformers_qwen35()
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "make_golden", Path(__file__).resolve().parent.parent / "scripts" / "make_golden.py")
    mg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mg)
    for name in mg.QWEN_VARIANTS:
        out = tmp_path / name
        mg.make_qwen(name, out)
        ours = json.loads((out / "config.json").read_text())
        golden = json.loads((mg.GOLDEN / name / "hf" / "config.json").read_text())
        ours.pop("transformers_version", None)
        golden.pop("transformers_version", None)
        # Any transformers with these classes: what it writes must parse to the
        # config the golden checkpoint parses to (the property loads rely on).
        assert Qwen35Config.from_file(out) == Qwen35Config.from_file(mg.GOLDEN / name / "hf"), (
            f"{name}: transformers {tf.__version__} writes a config.json we read differently")
        # The pinned version (the one that wrote the golden data) must write it
        # exactly; another version may add or drop fields that nothing reads.
        if tf.__version__ == mg.PINNED["transformers"]:
            assert ours == golden, f"{name}: transformers {tf.__version__} writes another config.json"
