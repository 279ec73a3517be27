"""Tensor plan: names, counts, shapes, classes, device dtypes, validation
(docs/QWEN35MOE.md). Built from synthetic name -> (dtype, shape)
mappings: no file, no bytes."""

from __future__ import annotations

import re
from collections import namedtuple

import gguf
import numpy as np
import pytest

from hf2q import (
    ConfigError,
    DtypeMismatchError,
    ExtraTensorError,
    Hf2qError,
    ManifestError,
    MissingTensorError,
    ShapeMismatchError,
)
from hf2q.qwen35 import (
    DuplicateTensorError,
    MixedExpertFormsError,
    Qwen35Config,
    Transform,
    UnknownTensorError,
    checkpoint_targets,
    hf_name_to_gguf,
    plan_qwen35_moe,
    select_device_dtype,
)
from hf2q.testing.qwen35_checkpoint import (
    QWEN36_35B_A3B_TEXT_CONFIG,
    checkpoint_tensor_specs,
    qwen35_config_dict,
)

H, V, E, I_, IS = 2048, 248320, 256, 512, 512


@pytest.fixture(scope="module")
def real_cfg() -> Qwen35Config:
    return Qwen35Config.from_dict(qwen35_config_dict(QWEN36_35B_A3B_TEXT_CONFIG, multimodal=True))


@pytest.fixture(scope="module")
def real_specs() -> dict:
    return checkpoint_tensor_specs(QWEN36_35B_A3B_TEXT_CONFIG, multimodal=True)


@pytest.fixture(scope="module")
def real_plan(real_specs, real_cfg):
    return plan_qwen35_moe(real_specs, real_cfg)


def tiny(multimodal: bool = False, **over) -> Qwen35Config:
    d = qwen35_config_dict("tiny", multimodal=multimodal)
    (d["text_config"] if multimodal else d).update(over)
    return Qwen35Config.from_dict(d)


def tiny_specs(**kw) -> dict:
    return dict(checkpoint_tensor_specs("tiny", **kw))


# ----------------------------------------------------------------------------- the name table of docs/QWEN35MOE.md
FULL_NAMES = ["attn_norm", "post_attention_norm", "attn_q", "attn_k", "attn_v", "attn_output",
              "attn_q_norm", "attn_k_norm"]
LINEAR_NAMES = ["attn_norm", "post_attention_norm", "attn_qkv", "attn_gate", "ssm_alpha", "ssm_beta",
                "ssm_conv1d", "ssm_norm", "ssm_out"]
MOE_NAMES = ["ffn_gate_inp", "ffn_gate_inp_shexp", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp",
             "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"]
NEXTN_NAMES = ["nextn.eh_proj", "nextn.enorm", "nextn.hnorm", "nextn.shared_head_norm"]


def spec_names(L: int, full: set[int], mtp: int) -> set[str]:
    names = {"token_embd.weight", "output_norm.weight", "output.weight"}
    for b in range(L + mtp):
        if b in full or b >= L:
            names |= {f"blk.{b}.{n}.weight" for n in FULL_NAMES + MOE_NAMES}
        else:
            names |= {f"blk.{b}.{n}.weight" for n in LINEAR_NAMES + MOE_NAMES}
            names |= {f"blk.{b}.ssm_a", f"blk.{b}.ssm_dt.bias"}
        if b >= L:
            names |= {f"blk.{b}.{n}.weight" for n in NEXTN_NAMES}
    return names


# numpy shapes of docs/QWEN35MOE.md for Qwen3.6-35B-A3B
SPEC_SHAPES = {
    "token_embd.weight": (V, H), "output.weight": (V, H), "output_norm.weight": (H,),
    "attn_norm.weight": (H,), "post_attention_norm.weight": (H,),
    "attn_q.weight": (2 * 16 * 256, H), "attn_k.weight": (2 * 256, H), "attn_v.weight": (2 * 256, H),
    "attn_output.weight": (H, 16 * 256), "attn_q_norm.weight": (256,), "attn_k_norm.weight": (256,),
    "attn_qkv.weight": (8192, H), "attn_gate.weight": (32 * 128, H), "ssm_alpha.weight": (32, H),
    "ssm_beta.weight": (32, H), "ssm_a": (32,), "ssm_dt.bias": (32,), "ssm_conv1d.weight": (8192, 4),
    "ssm_norm.weight": (128,), "ssm_out.weight": (H, 32 * 128), "ffn_gate_inp.weight": (E, H),
    "ffn_gate_inp_shexp.weight": (1, H), "ffn_gate_shexp.weight": (IS, H), "ffn_up_shexp.weight": (IS, H),
    "ffn_down_shexp.weight": (H, IS), "ffn_gate_exps.weight": (E, I_, H), "ffn_up_exps.weight": (E, I_, H),
    "ffn_down_exps.weight": (E, H, I_), "nextn.eh_proj.weight": (H, 2 * H), "nextn.enorm.weight": (H,),
    "nextn.hnorm.weight": (H,), "nextn.shared_head_norm.weight": (H,),
}
F32_CLASS = {"output_norm.weight", "attn_norm.weight", "post_attention_norm.weight", "attn_q_norm.weight",
             "attn_k_norm.weight", "ssm_a", "ssm_dt.bias", "ssm_conv1d.weight", "ssm_norm.weight",
             "ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "nextn.enorm.weight", "nextn.hnorm.weight",
             "nextn.shared_head_norm.weight"}
EXPERT_CLASS = {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"}


def suffix(g: str) -> str:
    return re.sub(r"^blk\.\d+\.", "", g)


def test_real_counts(real_specs, real_cfg, real_plan) -> None:
    assert len(real_plan) == 753 and real_plan.mtp_layers == 1 and real_plan.n_blocks == 41
    no_mtp = plan_qwen35_moe(real_specs, real_cfg, mtp=False)
    assert len(no_mtp) == 733
    assert all(n.startswith("mtp.") for n in no_mtp.dropped) and len(no_mtp.dropped) > 0
    # the same checkpoint without mtp.* tensors: auto mode leaves MTP out
    specs = checkpoint_tensor_specs(QWEN36_35B_A3B_TEXT_CONFIG, multimodal=True, mtp=False)
    assert len(plan_qwen35_moe(specs, real_cfg)) == 733


def test_real_names_equal_spec_table(real_specs, real_cfg, real_plan) -> None:
    full = set(range(3, 40, 4))
    assert set(real_plan.names) == spec_names(40, full, 1)
    assert len(set(real_plan.names)) == len(real_plan.names)
    no_mtp = plan_qwen35_moe(real_specs, real_cfg, mtp=False)
    assert set(no_mtp.names) == spec_names(40, full, 0)
    per_block = {b: sum(1 for t in no_mtp if t.layer == b) for b in range(40)}
    assert all(per_block[b] == (16 if b in full else 19) for b in range(40))
    assert sum(1 for t in real_plan if t.layer == 40) == 20
    assert real_plan.names[0] == "token_embd.weight" and real_plan.names[-2:] == ["output_norm.weight", "output.weight"]
    # blocks appear in order
    layers = [t.layer for t in real_plan if t.layer is not None]
    assert layers == sorted(layers)


def test_real_shapes_and_classes(real_plan) -> None:
    for t in real_plan:
        s = suffix(t.gguf_name)
        assert t.shape == SPEC_SHAPES[s], t.gguf_name
        want_kind = "f32" if s in F32_CLASS else "expert" if s in EXPERT_CLASS else "dense"
        assert t.kind == want_kind, t.gguf_name
        want_dtype = {"f32": "f32", "expert": "q8_0", "dense": "f32"}[want_kind]  # defaults
        assert t.dtype == want_dtype, t.gguf_name


def test_real_names_are_gguf_qwen35moe_tensors(real_plan) -> None:
    kinds = list(gguf.MODEL_TENSORS[gguf.MODEL_ARCH.QWEN35MOE]) + [
        gguf.MODEL_TENSOR.NEXTN_EH_PROJ, gguf.MODEL_TENSOR.NEXTN_ENORM, gguf.MODEL_TENSOR.NEXTN_HNORM,
        gguf.MODEL_TENSOR.NEXTN_SHARED_HEAD_NORM,
    ]
    pats = [re.compile("^" + re.escape(gguf.TENSOR_NAMES[k]).replace(r"\{bid\}", r"\d+") + r"(\.weight|\.bias)?$")
            for k in kinds]
    for name in real_plan.names:
        assert any(p.match(name) for p in pats), name


def test_real_expert_bytes(real_specs, real_cfg) -> None:
    p = plan_qwen35_moe(real_specs, real_cfg, mtp=False)
    exps = [t for t in p if t.kind == "expert"]
    assert len(exps) == 120
    assert all(t.nbytes == 285_212_672 for t in exps)
    assert sum(t.nbytes for t in exps) == 34_225_520_640
    assert all(t.source_nbytes == 536_870_912 for t in exps)
    assert p.nbytes_by_kind()["expert"] == 34_225_520_640


def test_real_transform_tags(real_plan) -> None:
    tags = {suffix(t.gguf_name): t.transforms for t in real_plan if t.layer in (0, 3, 40) or t.layer is None}
    T = Transform
    assert tags["attn_norm.weight"] == (T.NORM_PLUS_ONE,)
    assert tags["attn_q_norm.weight"] == (T.NORM_PLUS_ONE,)
    assert tags["output_norm.weight"] == (T.NORM_PLUS_ONE,)
    assert tags["nextn.enorm.weight"] == tags["nextn.hnorm.weight"] == tags["nextn.shared_head_norm.weight"] == (T.NORM_PLUS_ONE,)
    assert tags["ssm_norm.weight"] == ()  # linear_attn.norm: no +1
    assert tags["attn_qkv.weight"] == (T.REORDER_V_QKV,)
    assert tags["attn_gate.weight"] == (T.REORDER_V_ROWS,)
    assert tags["ssm_alpha.weight"] == tags["ssm_beta.weight"] == (T.REORDER_V_HEADS,)
    assert tags["ssm_a"] == (T.REORDER_V_HEADS, T.NEG_EXP)
    assert tags["ssm_dt.bias"] == (T.REORDER_V_HEADS,)
    assert tags["ssm_conv1d.weight"] == (T.SQUEEZE_CONV1D, T.REORDER_V_CONV1D)
    assert tags["ssm_out.weight"] == (T.REORDER_V_COLS,)
    assert tags["ffn_gate_exps.weight"] == (T.STACK_EXPERTS,)
    assert tags["attn_q.weight"] == tags["token_embd.weight"] == tags["ffn_gate_inp.weight"] == ()


def test_mtp_sources(real_plan) -> None:
    assert real_plan["blk.40.nextn.eh_proj.weight"].sources[0].name == "mtp.fc.weight"
    assert real_plan["blk.40.nextn.enorm.weight"].sources[0].name == "mtp.pre_fc_norm_embedding.weight"
    assert real_plan["blk.40.nextn.hnorm.weight"].sources[0].name == "mtp.pre_fc_norm_hidden.weight"
    assert real_plan["blk.40.nextn.shared_head_norm.weight"].sources[0].name == "mtp.norm.weight"
    assert real_plan["blk.40.attn_q.weight"].sources[0].name == "mtp.layers.0.self_attn.q_proj.weight"
    g = real_plan["blk.40.ffn_gate_exps.weight"]
    assert [s.name for s in g.sources][:2] == ["mtp.layers.0.mlp.experts.0.gate_proj.weight",
                                               "mtp.layers.0.mlp.experts.1.gate_proj.weight"]
    assert g.hf_name == "model.layers.40.mlp.experts.gate_proj.weight"


def test_multimodal_prefix_and_skipped(real_plan) -> None:
    assert real_plan["blk.0.attn_qkv.weight"].sources[0].name == "model.language_model.layers.0.linear_attn.in_proj_qkv.weight"
    assert real_plan["blk.0.attn_qkv.weight"].hf_name == "model.layers.0.linear_attn.in_proj_qkv.weight"
    assert real_plan["token_embd.weight"].sources[0].name == "model.language_model.embed_tokens.weight"
    assert real_plan["output.weight"].sources[0].name == "lm_head.weight"
    assert set(real_plan.skipped) == {n for n in checkpoint_tensor_specs("tiny", multimodal=True) if "visual" in n}
    assert not any("visual" in n for n in real_plan.source_names())


def test_plan_covers_every_tensor(real_specs, real_plan) -> None:
    used = real_plan.source_names()
    assert used | set(real_plan.skipped) == set(real_specs)
    assert not used & set(real_plan.skipped)


def test_multimodal_and_text_only_plans_agree() -> None:
    a = plan_qwen35_moe(tiny_specs(), tiny())
    b = plan_qwen35_moe(tiny_specs(multimodal=True), tiny(multimodal=True))
    assert [(t.gguf_name, t.hf_name, t.shape, t.kind, t.dtype, t.transforms) for t in a] == \
           [(t.gguf_name, t.hf_name, t.shape, t.kind, t.dtype, t.transforms) for t in b]
    assert b.skipped and not a.skipped


def test_fused_vs_per_expert_plan(real_cfg) -> None:
    cfg = tiny()
    per = plan_qwen35_moe(tiny_specs(), cfg)
    fus = plan_qwen35_moe(tiny_specs(fused_gate_up=True), cfg)
    key = lambda p: [(t.gguf_name, t.hf_name, t.shape, t.kind, t.dtype, t.layer, t.source_dtype) for t in p]  # noqa: E731
    assert key(per) == key(fus)
    for t in fus:
        if t.kind != "expert":
            assert t == per[t.gguf_name]
    g, u, d = fus["blk.0.ffn_gate_exps.weight"], fus["blk.0.ffn_up_exps.weight"], fus["blk.0.ffn_down_exps.weight"]
    assert g.sources[0].name == u.sources[0].name == "model.layers.0.mlp.experts.gate_up_proj"
    assert (g.sources[0].half, u.sources[0].half) == ("gate", "up")
    assert g.sources[0].selection() == (slice(None), slice(0, 32))
    assert u.sources[0].selection() == (slice(None), slice(32, 64))
    assert g.transforms == u.transforms == (Transform.FUSED_SPLIT,)
    assert d.sources[0].name == "model.layers.0.mlp.experts.down_proj" and d.transforms == ()
    pg = per["blk.0.ffn_gate_exps.weight"]
    assert [s.expert for s in pg.sources] == [0, 1, 2, 3]
    assert pg.sources[2].name == "model.layers.0.mlp.experts.2.gate_proj.weight"
    # the real config, fused
    specs = checkpoint_tensor_specs(QWEN36_35B_A3B_TEXT_CONFIG, fused_gate_up=True, multimodal=True)
    assert len(specs) == 32122 - 256 * 3 * 41 + 2 * 41
    assert len(plan_qwen35_moe(specs, real_cfg)) == 753


def test_fused_with_weight_suffix_accepted() -> None:
    specs = tiny_specs(fused_gate_up=True)
    specs["model.layers.0.mlp.experts.gate_up_proj.weight"] = specs.pop("model.layers.0.mlp.experts.gate_up_proj")
    specs["model.layers.0.mlp.experts.down_proj.weight"] = specs.pop("model.layers.0.mlp.experts.down_proj")
    p = plan_qwen35_moe(specs, tiny())
    assert p["blk.0.ffn_up_exps.weight"].sources[0].name == "model.layers.0.mlp.experts.gate_up_proj.weight"


# ----------------------------------------------------------------------------- device dtypes
def llama_cpp_outtype_q8_0(name: str, ndim: int) -> str:
    """convert_hf_to_gguf.py --outtype q8_0 type choice (ModelBase.prepare_tensors)."""
    if ndim <= 1 or name.endswith("_norm.weight"):
        return "f32"
    always_f32 = (gguf.MODEL_TENSOR.FFN_GATE_INP, gguf.MODEL_TENSOR.FFN_GATE_INP_SHEXP, gguf.MODEL_TENSOR.SSM_CONV1D)
    for k in always_f32:
        pat = re.escape(gguf.TENSOR_NAMES[k]).replace(r"\{bid\}", r"\d+") + r"\.weight"
        if re.fullmatch(pat, name):
            return "f32"
    if name[-7:] not in (".weight", ".lora_a", ".lora_b"):
        return "f32"
    return "q8_0"


def test_dense_q8_0_matches_llama_cpp(real_specs, real_cfg) -> None:
    p = plan_qwen35_moe(real_specs, real_cfg, dense_dtype="q8_0")
    for t in p:
        assert t.dtype == llama_cpp_outtype_q8_0(t.gguf_name, len(t.shape)), t.gguf_name
    q8 = {suffix(t.gguf_name) for t in p if t.dtype == "q8_0"}
    assert "token_embd.weight" in q8 and "output.weight" in q8 and "ffn_gate_exps.weight" in q8
    assert not q8 & F32_CLASS


@pytest.mark.parametrize("dense", ["f32", "bf16", "q8_0"])
@pytest.mark.parametrize("expert", ["f32", "bf16", "q8_0"])
def test_dtype_selection(dense: str, expert: str) -> None:
    p = plan_qwen35_moe(tiny_specs(), tiny(), dense_dtype=dense, expert_dtype=expert)
    for t in p:
        assert t.dtype == {"f32": "f32", "dense": dense, "expert": expert}[t.kind]
        assert t.dtype == select_device_dtype(t.kind, dense, expert)
        n = int(np.prod(t.shape))
        assert t.nbytes == {"f32": 4 * n, "bf16": 2 * n, "q8_0": n // 32 * 34}[t.dtype]


def test_bad_dtype_option() -> None:
    with pytest.raises(ValueError, match="dense_dtype"):
        plan_qwen35_moe(tiny_specs(), tiny(), dense_dtype="f8_e4m3")
    with pytest.raises(ValueError, match="expert_dtype"):
        plan_qwen35_moe(tiny_specs(), tiny(), expert_dtype="q3_k")


def test_q8_0_last_dim_not_multiple_of_32() -> None:
    # H = 48: every [.., H] row is 48 long
    cfg = tiny(hidden_size=48)
    specs = checkpoint_tensor_specs(qwen35_config_dict("tiny") | {"hidden_size": 48})
    plan_qwen35_moe(specs, cfg, expert_dtype="f32")  # nothing quantized: fine
    with pytest.raises(ConfigError, match="multiple of 32") as ei:
        plan_qwen35_moe(specs, cfg)  # experts gate/up [E, I, 48]
    msg = str(ei.value)
    assert "blk.0.ffn_gate_exps.weight" in msg and "blk.0.ffn_up_exps.weight" in msg
    assert "blk.0.ffn_down_exps.weight" not in msg  # [E, 48, 32]: fine
    with pytest.raises(ConfigError, match="token_embd.weight"):
        plan_qwen35_moe(specs, cfg, dense_dtype="q8_0", expert_dtype="f32")


# ----------------------------------------------------------------------------- name mapping
@pytest.mark.parametrize("hf,want", [
    ("model.embed_tokens.weight", "token_embd.weight"),
    ("lm_head.weight", "output.weight"),
    ("model.norm.weight", "output_norm.weight"),
    ("model.language_model.norm.weight", "output_norm.weight"),
    ("model.layers.3.input_layernorm.weight", "blk.3.attn_norm.weight"),
    ("model.layers.0.post_attention_layernorm.weight", "blk.0.post_attention_norm.weight"),
    ("model.layers.3.self_attn.q_proj.weight", "blk.3.attn_q.weight"),
    ("model.layers.3.self_attn.k_proj.weight", "blk.3.attn_k.weight"),
    ("model.layers.3.self_attn.v_proj.weight", "blk.3.attn_v.weight"),
    ("model.layers.3.self_attn.o_proj.weight", "blk.3.attn_output.weight"),
    ("model.layers.3.self_attn.q_norm.weight", "blk.3.attn_q_norm.weight"),
    ("model.layers.3.self_attn.k_norm.weight", "blk.3.attn_k_norm.weight"),
    ("model.layers.0.linear_attn.in_proj_qkv.weight", "blk.0.attn_qkv.weight"),
    ("model.layers.0.linear_attn.in_proj_z.weight", "blk.0.attn_gate.weight"),
    ("model.layers.0.linear_attn.in_proj_a.weight", "blk.0.ssm_alpha.weight"),
    ("model.layers.0.linear_attn.in_proj_b.weight", "blk.0.ssm_beta.weight"),
    ("model.layers.0.linear_attn.A_log", "blk.0.ssm_a"),
    ("model.layers.0.linear_attn.dt_bias", "blk.0.ssm_dt.bias"),
    ("model.layers.0.linear_attn.dt_proj.bias", "blk.0.ssm_dt.bias"),
    ("model.layers.0.linear_attn.conv1d.weight", "blk.0.ssm_conv1d.weight"),
    ("model.layers.0.linear_attn.norm.weight", "blk.0.ssm_norm.weight"),
    ("model.layers.0.linear_attn.out_proj.weight", "blk.0.ssm_out.weight"),
    ("model.layers.5.mlp.gate.weight", "blk.5.ffn_gate_inp.weight"),
    ("model.layers.5.mlp.shared_expert_gate.weight", "blk.5.ffn_gate_inp_shexp.weight"),
    ("model.layers.5.mlp.shared_expert.gate_proj.weight", "blk.5.ffn_gate_shexp.weight"),
    ("model.layers.5.mlp.shared_expert.up_proj.weight", "blk.5.ffn_up_shexp.weight"),
    ("model.layers.5.mlp.shared_expert.down_proj.weight", "blk.5.ffn_down_shexp.weight"),
    ("model.layers.5.mlp.experts.gate_proj.weight", "blk.5.ffn_gate_exps.weight"),  # after the merge
    ("model.layers.5.mlp.experts.7.gate_proj.weight", "blk.5.ffn_gate_exps.weight"),
    ("model.layers.5.mlp.experts.255.up_proj.weight", "blk.5.ffn_up_exps.weight"),
    ("model.layers.5.mlp.experts.7.down_proj.weight", "blk.5.ffn_down_exps.weight"),
    ("model.layers.5.mlp.experts.down_proj", "blk.5.ffn_down_exps.weight"),
    ("model.layers.5.mlp.experts.down_proj.weight", "blk.5.ffn_down_exps.weight"),
    ("model.language_model.layers.39.self_attn.o_proj.weight", "blk.39.attn_output.weight"),
    ("mtp.fc.weight", "blk.40.nextn.eh_proj.weight"),
    ("mtp.pre_fc_norm_embedding.weight", "blk.40.nextn.enorm.weight"),
    ("mtp.pre_fc_norm_hidden.weight", "blk.40.nextn.hnorm.weight"),
    ("mtp.norm.weight", "blk.40.nextn.shared_head_norm.weight"),
    ("mtp.layers.0.self_attn.q_proj.weight", "blk.40.attn_q.weight"),
    ("mtp.layers.0.mlp.experts.3.down_proj.weight", "blk.40.ffn_down_exps.weight"),
    ("model.layers.40.eh_proj.weight", "blk.40.nextn.eh_proj.weight"),
    ("model.layers.40.shared_head.norm.weight", "blk.40.nextn.shared_head_norm.weight"),
    # maps to nothing
    ("model.layers.0.self_attn.q_proj.weight", None),  # layer 0 is linear
    ("model.layers.3.linear_attn.A_log", None),  # layer 3 is full
    ("model.layers.0.eh_proj.weight", None),  # MTP-only name in a main layer
    ("model.layers.41.input_layernorm.weight", None),
    ("model.layers.5.mlp.experts.256.up_proj.weight", None),
    ("model.layers.05.mlp.gate.weight", None),
    ("model.layers.5.mlp.experts.07.up_proj.weight", None),
    ("mtp.layers.1.input_layernorm.weight", None),
    ("mtp.embed_tokens.weight", None),
    ("model.layers.5.mlp.experts.gate_up_proj", None),  # two targets
    ("model.rotary_emb.inv_freq", None),
    ("model.layers.0.linear_attn.norm.bias", None),
    # A trailing newline is not the name without it (a regex `$` would match before it).
    ("model.layers.0.input_layernorm.weight\n", None),
    ("model.layers.5.mlp.experts.7.up_proj.weight\n", None),
    ("model.layers.5.mlp.experts.gate_up_proj\n", None),
    ("mtp.layers.0.input_layernorm.weight\n", None),
])
def test_hf_name_to_gguf(real_cfg, hf: str, want: str | None) -> None:
    if want is None:
        with pytest.raises(UnknownTensorError) as ei:
            hf_name_to_gguf(hf, real_cfg)
        assert ei.value.names == [hf]
        assert isinstance(ei.value, ExtraTensorError) and isinstance(ei.value, Hf2qError)
    else:
        assert hf_name_to_gguf(hf, real_cfg) == want


def test_hf_name_to_gguf_covers_plan(real_plan, real_cfg) -> None:
    for t in real_plan:
        assert hf_name_to_gguf(t.hf_name, real_cfg) == t.gguf_name
        for s in t.sources:
            assert t.gguf_name in checkpoint_targets(s.name, real_cfg)


def test_checkpoint_targets(real_cfg) -> None:
    assert checkpoint_targets("model.layers.2.mlp.experts.gate_up_proj", real_cfg) == (
        "blk.2.ffn_gate_exps.weight", "blk.2.ffn_up_exps.weight")
    assert checkpoint_targets("model.visual.blocks.0.attn.qkv.weight", real_cfg) == ()
    assert checkpoint_targets("mtp.fc.weight", real_cfg, mtp=False) == ()
    assert checkpoint_targets("mtp.fc.weight", real_cfg) == ("blk.40.nextn.eh_proj.weight",)
    with pytest.raises(UnknownTensorError):
        checkpoint_targets("model.layers.0.foo.weight", real_cfg)
    with pytest.raises(UnknownTensorError, match="pre-stacked"):  # not a checkpoint form
        checkpoint_targets("model.layers.0.mlp.experts.up_proj.weight", real_cfg)


# ----------------------------------------------------------------------------- validation errors
def test_unknown_tensors_all_listed() -> None:
    specs = tiny_specs()
    bad = {
        "model.layers.0.mlp.foo.weight": ("BF16", (4,)),
        "model.bogus": ("BF16", (4,)),
        "model.layers.0.self_attn.q_proj.weight": ("BF16", (128, 64)),  # layer 0 is linear
        "mtp.layers.3.input_layernorm.weight": ("BF16", (64,)),
        "model.layers.1.linear_attn.in_proj_qkvz.weight": ("BF16", (4, 64)),  # Qwen3-Next form
        "model.layers.1.mlp.experts.9.up_proj.weight": ("BF16", (32, 64)),  # E = 4
    }
    specs.update(bad)
    with pytest.raises(UnknownTensorError) as ei:
        plan_qwen35_moe(specs, tiny())
    assert ei.value.names == sorted(bad)
    for n in bad:
        assert n in str(ei.value)
    assert "linear-attention layer" in ei.value.reasons["model.layers.0.self_attn.q_proj.weight"]


def test_missing_expert() -> None:
    specs = tiny_specs()
    del specs["model.layers.1.mlp.experts.2.gate_proj.weight"]
    del specs["mtp.layers.0.mlp.experts.0.down_proj.weight"]
    with pytest.raises(MissingTensorError) as ei:
        plan_qwen35_moe(specs, tiny())
    assert ei.value.names == ["model.layers.1.mlp.experts.2.gate_proj.weight",  # type: ignore[attr-defined]
                              "mtp.layers.0.mlp.experts.0.down_proj.weight"]


def test_missing_tensors() -> None:
    specs = tiny_specs()
    del specs["model.layers.0.linear_attn.A_log"]
    del specs["mtp.fc.weight"]
    del specs["lm_head.weight"]
    with pytest.raises(MissingTensorError) as ei:
        plan_qwen35_moe(specs, tiny())
    assert isinstance(ei.value, ManifestError)
    for n in ("model.layers.0.linear_attn.A_log", "mtp.fc.weight", "lm_head.weight"):
        assert n in str(ei.value)
    specs = tiny_specs(fused_gate_up=True)
    del specs["model.layers.2.mlp.experts.down_proj"]
    with pytest.raises(MissingTensorError, match=r"model\.layers\.2\.mlp\.experts\.down_proj\.weight"):
        plan_qwen35_moe(specs, tiny())


def test_duplicate_expert() -> None:
    specs = tiny_specs(multimodal=True)
    specs["model.layers.1.mlp.experts.3.up_proj.weight"] = ("BF16", (32, 64))  # also under language_model.
    with pytest.raises(DuplicateTensorError) as ei:
        plan_qwen35_moe(specs, tiny(multimodal=True))
    assert ei.value.groups == {"blk.1.ffn_up_exps.weight [expert 3]": [
        "model.language_model.layers.1.mlp.experts.3.up_proj.weight",
        "model.layers.1.mlp.experts.3.up_proj.weight"]}
    # duplicates from an iterable input (e.g. the same name in two shards)
    info = namedtuple("TensorInfo", "name dtype shape offset nbytes")
    items = [info(n, d, s, 0, 0) for n, (d, s) in tiny_specs().items()]
    items.append(info("model.layers.0.mlp.experts.1.gate_proj.weight", "BF16", (32, 64), 0, 0))
    with pytest.raises(DuplicateTensorError, match=r"blk\.0\.ffn_gate_exps\.weight \[expert 1\]"):
        plan_qwen35_moe(items, tiny())


def test_dt_bias_and_dt_proj_bias() -> None:
    specs = tiny_specs()
    specs["model.layers.0.linear_attn.dt_proj.bias"] = ("BF16", (6,))
    with pytest.raises(DuplicateTensorError, match="ssm_dt.bias"):
        plan_qwen35_moe(specs, tiny())
    del specs["model.layers.0.linear_attn.dt_bias"]
    p = plan_qwen35_moe(specs, tiny())
    assert p["blk.0.ssm_dt.bias"].sources[0].name == "model.layers.0.linear_attn.dt_proj.bias"
    assert p["blk.0.ssm_dt.bias"].hf_name == "model.layers.0.linear_attn.dt_bias"


def test_mixed_expert_forms() -> None:
    specs = tiny_specs()
    specs["model.layers.2.mlp.experts.gate_up_proj"] = ("BF16", (4, 64, 64))
    with pytest.raises(MixedExpertFormsError) as ei:
        plan_qwen35_moe(specs, tiny())
    assert list(ei.value.layers) == [2]
    # fused down + per-expert gate/up in one layer is mixed too
    specs = tiny_specs()
    for e in range(4):
        del specs[f"model.layers.1.mlp.experts.{e}.down_proj.weight"]
    specs["model.layers.1.mlp.experts.down_proj"] = ("BF16", (4, 64, 32))
    with pytest.raises(MixedExpertFormsError):
        plan_qwen35_moe(specs, tiny())
    # different forms in different layers are fine
    specs = tiny_specs()
    fused = tiny_specs(fused_gate_up=True)
    for k in [k for k in specs if k.startswith("model.layers.1.mlp.experts.")]:
        del specs[k]
    specs.update({k: v for k, v in fused.items() if k.startswith("model.layers.1.mlp.experts.")})
    assert len(plan_qwen35_moe(specs, tiny())) == 96


def test_bad_fused_shapes() -> None:
    specs = tiny_specs(fused_gate_up=True)
    specs["model.layers.0.mlp.experts.gate_up_proj"] = ("BF16", (4, 48, 64))  # middle != 2I
    specs["model.layers.1.mlp.experts.gate_up_proj"] = ("BF16", (256, 64))  # not 3-D
    specs["model.layers.2.mlp.experts.down_proj"] = ("BF16", (4, 32, 64))  # transposed
    with pytest.raises(ShapeMismatchError) as ei:
        plan_qwen35_moe(specs, tiny())
    msg = str(ei.value)
    for n in ("layers.0.mlp.experts.gate_up_proj", "layers.1.mlp.experts.gate_up_proj", "layers.2.mlp.experts.down_proj"):
        assert n in msg
    assert msg.count("layers.0.mlp.experts.gate_up_proj") == 1


def test_shape_mismatches() -> None:
    specs = tiny_specs()
    specs["model.embed_tokens.weight"] = ("BF16", (256 + 16, 64))  # padded vocab
    specs["model.layers.0.linear_attn.conv1d.weight"] = ("BF16", (512, 2, 4))
    specs["model.layers.1.mlp.experts.3.down_proj.weight"] = ("BF16", (32, 64))
    with pytest.raises(ShapeMismatchError) as ei:
        plan_qwen35_moe(specs, tiny())
    assert len(ei.value.lines) == 3  # type: ignore[attr-defined]


def test_dtype_errors() -> None:
    specs = tiny_specs()
    specs["model.layers.0.linear_attn.in_proj_qkv.weight"] = ("F8_E4M3", (512, 64))
    specs["model.layers.2.mlp.experts.1.up_proj.weight"] = ("F16", (32, 64))
    with pytest.raises(DtypeMismatchError) as ei:
        plan_qwen35_moe(specs, tiny())
    msg = str(ei.value)
    assert "in_proj_qkv.weight: F8_E4M3" in msg and "blk.2.ffn_up_exps.weight: experts mix dtypes" in msg
    # F16 and F32 sources are fine
    specs = tiny_specs()
    specs["model.layers.0.linear_attn.in_proj_qkv.weight"] = ("F16", (512, 64))
    specs["model.norm.weight"] = ("F32", (64,))
    p = plan_qwen35_moe(specs, tiny())
    assert p["blk.0.attn_qkv.weight"].source_dtype == "F16" and p["output_norm.weight"].source_dtype == "F32"


def test_mtp_options() -> None:
    specs, cfg = tiny_specs(), tiny()
    assert len(plan_qwen35_moe(specs, cfg)) == 96
    off = plan_qwen35_moe(specs, cfg, mtp=False)
    assert len(off) == 76 and off.mtp_layers == 0
    assert set(off.dropped) == {n for n in specs if n.startswith("mtp.")}
    no_mtp_specs = tiny_specs(mtp=False)
    assert len(plan_qwen35_moe(no_mtp_specs, cfg)) == 76  # auto
    with pytest.raises(MissingTensorError, match="mtp.fc.weight"):
        plan_qwen35_moe(no_mtp_specs, cfg, mtp=True)
    cfg0 = tiny(mtp_num_hidden_layers=0)
    with pytest.raises(ConfigError, match="mtp_num_hidden_layers"):
        plan_qwen35_moe(no_mtp_specs, cfg0, mtp=True)
    with pytest.raises(UnknownTensorError, match="mtp_num_hidden_layers = 0"):
        plan_qwen35_moe(specs, cfg0)


def test_tied_embeddings() -> None:
    specs = tiny_specs()
    del specs["lm_head.weight"]
    with pytest.raises(MissingTensorError, match="lm_head.weight"):
        plan_qwen35_moe(specs, tiny())
    p = plan_qwen35_moe(specs, tiny(tie_word_embeddings=True))
    assert p.tied_output and "output.weight" not in p and len(p) == 95


def test_no_reorder_when_nk_equals_nv() -> None:
    cfg = tiny(linear_num_value_heads=2)
    specs = checkpoint_tensor_specs(qwen35_config_dict("tiny") | {"linear_num_value_heads": 2})
    p = plan_qwen35_moe(specs, cfg)
    for t in p:
        assert not set(t.transforms) & set(Transform.REORDERS), t.gguf_name
    assert p["blk.0.ssm_conv1d.weight"].transforms == (Transform.SQUEEZE_CONV1D,)
    assert p["blk.0.ssm_a"].transforms == (Transform.NEG_EXP,)


def test_input_forms() -> None:
    specs = tiny_specs()
    cfg = tiny()
    ref = plan_qwen35_moe(specs, cfg)
    info = namedtuple("TensorInfo", "name dtype shape offset nbytes")
    infos = {n: info(n, d, list(s), 0, 0) for n, (d, s) in specs.items()}
    assert plan_qwen35_moe(infos, cfg).tensors == ref.tensors  # mapping -> TensorInfo
    assert plan_qwen35_moe(list(infos.values()), cfg).tensors == ref.tensors  # iterable of TensorInfo
    assert plan_qwen35_moe(list(specs.items()), cfg).tensors == ref.tensors  # (name, (dtype, shape)) pairs

    class Ckpt:
        tensors = infos

    assert plan_qwen35_moe(Ckpt(), cfg).tensors == ref.tensors

    class CkptMethod:  # hf2q.safetensors.Checkpoint style: tensors() -> list[TensorInfo]
        def tensors(self):
            return list(infos.values())

    assert plan_qwen35_moe(CkptMethod(), cfg).tensors == ref.tensors

    class MappingLike:  # keys() + [name], not a Mapping subclass
        def keys(self):
            return list(infos)

        def __getitem__(self, k):
            return infos[k]

        def __iter__(self):
            return iter(infos)

    assert plan_qwen35_moe(MappingLike(), cfg).tensors == ref.tensors
    import ml_dtypes

    np_dt = {"BF16": np.dtype(ml_dtypes.bfloat16), "F32": np.dtype(np.float32)}
    as_np = {n: (np_dt[d], s) for n, (d, s) in specs.items()}
    assert plan_qwen35_moe(as_np, cfg).tensors == ref.tensors
    lower = {n: ("bfloat16" if d == "BF16" else "float32", s) for n, (d, s) in specs.items()}
    assert plan_qwen35_moe(lower, cfg).tensors == ref.tensors


def test_plan_container() -> None:
    p = plan_qwen35_moe(tiny_specs(), tiny())
    assert p[0] is p["token_embd.weight"] and "blk.4.nextn.eh_proj.weight" in p
    assert list(p) == list(p.tensors) and p.n_blocks == 5
    assert p.nbytes == sum(t.nbytes for t in p) == sum(p.nbytes_by_kind().values())


def test_checkpoint_input_matches_the_general_forms(tmp_path) -> None:
    """An open Checkpoint / SafetensorsFile takes a fast path through the
    plan's input normalisation: the plan is the one the general forms give."""
    from hf2q.safetensors import open as open_file
    from hf2q.safetensors import open_checkpoint
    from hf2q.testing import make_qwen35_moe_checkpoint

    from hf2q.models.qwen35.plan import _dtype_str
    from hf2q.safetensors import DTYPE_BITS

    assert all(_dtype_str(code) == code for code in DTYPE_BITS)  # what lets the fast path keep the codes
    d = make_qwen35_moe_checkpoint(tmp_path / "ck", multimodal=True)
    cfg = tiny(multimodal=True)
    with open_checkpoint(d) as ck, open_file(d / "model.safetensors") as sf:
        want = plan_qwen35_moe({t.name: (t.dtype, list(t.shape)) for t in ck.tensors()}, cfg)
        for src in (ck, sf):
            got = plan_qwen35_moe(src, cfg)
            assert got.tensors == want.tensors and got.skipped == want.skipped and got.dropped == want.dropped
            assert [(p.name, type(p.shape), [type(x) for x in p.shape]) for t in got for p in t.sources] == \
                [(p.name, tuple, [int] * len(p.shape)) for t in want for p in t.sources]

        class Wrapper:  # the same tensors behind the general path (an object with tensors())
            def tensors(self):
                return ck.tensors()
        assert plan_qwen35_moe(Wrapper(), cfg).tensors == want.tensors


@pytest.mark.parametrize("name,reason", [
    ("model.layers.01.input_layernorm.weight", "malformed layer index '01'"),
    ("model.layers.\u0661.input_layernorm.weight", "malformed layer index '\u0661'"),  # ARABIC-INDIC DIGIT ONE
    ("model.layers.1234567890123456789.input_layernorm.weight", "malformed layer index"),
    ("model.layers.0.mlp.experts.00.up_proj.weight", "expert index 00 outside 0..3"),
    ("model.layers.0.mlp.experts.\uff11.up_proj.weight", "expert index \uff11 outside"),  # FULLWIDTH DIGIT ONE
    ("mtp.layers.00.input_layernorm.weight", "MTP layer index 00 outside 0..0"),
])
def test_index_spellings(name: str, reason: str) -> None:
    """Indices as HF writes them only: ASCII digits, no leading zeros, at most 18 digits."""
    specs = tiny_specs()
    specs[name] = ("BF16", (64,))
    with pytest.raises(UnknownTensorError) as ei:
        plan_qwen35_moe(specs, tiny())
    assert list(ei.value.reasons) == [name] and ei.value.reasons[name].startswith(reason)


def test_multimodal_filter_names() -> None:
    from hf2q.models.qwen35.names import _MM_PREFIXES, _MM_SUBSTRINGS
    from hf2q.qwen35 import is_multimodal_tensor

    for p in _MM_PREFIXES:
        assert is_multimodal_tensor(p + "x.weight")
    for s in _MM_SUBSTRINGS:
        assert is_multimodal_tensor("model." + s + "x.weight") and is_multimodal_tensor("a" + s)
    for n in tiny_specs():
        assert not is_multimodal_tensor(n)
    assert not is_multimodal_tensor("model.mlp.x") and not is_multimodal_tensor("")


def test_hub_expert_names_are_never_multimodal() -> None:
    """The plan's fast path takes per-expert names without the multimodal
    filter: no prefix or part of the filter can occur in one."""
    from hf2q.models.qwen35.names import _HUB_EXPERT_NAME_RE, _MM_PREFIXES, _MM_SUBSTRINGS
    from hf2q.qwen35 import is_multimodal_tensor

    for wrapper in ("", "language_model."):
        for digits in ("0", "7", "10", "255", "1234567"):
            for proj in ("gate", "up", "down"):
                n = f"model.{wrapper}layers.{digits}.mlp.experts.{digits}.{proj}_proj.weight"
                assert _HUB_EXPERT_NAME_RE.match(n) and not is_multimodal_tensor(n)
    # the fixed text around the indices holds no filter string (the only
    # digits any of them has are the 2s of token2wav./code2wav., which need
    # letters before them: an index follows "layers." or "experts.")
    skeleton = "model.language_model.layers.#.mlp.experts.#.gate_proj.weight|up_proj|down_proj"
    assert not any(skeleton.startswith(p) for p in _MM_PREFIXES)
    assert not any(s in skeleton for s in _MM_SUBSTRINGS)
    assert all(s[0].isalpha() for s in _MM_SUBSTRINGS if any(c.isdigit() for c in s))


def _plan_or_error(specs: dict, cfg: Qwen35Config) -> object:
    try:
        p = plan_qwen35_moe(specs, cfg)
    except Hf2qError as e:
        return type(e), str(e), getattr(e, "reasons", None), getattr(e, "groups", None)
    return p.tensors, p.skipped, p.dropped, p.extra, p.mtp_layers


def _more_specs(**extra: tuple) -> dict:
    specs = tiny_specs(multimodal=True)
    specs.update(extra)
    return specs


@pytest.mark.parametrize("case", [
    lambda: (tiny_specs(), tiny()),
    lambda: (tiny_specs(multimodal=True), tiny(multimodal=True)),
    lambda: (tiny_specs(fused_gate_up=True), tiny()),
    lambda: (_more_specs(**{"model.layers.1.mlp.experts.3.up_proj.weight": ("BF16", (32, 64))}),
             tiny(multimodal=True)),  # the same expert under both spellings
    lambda: (_more_specs(**{"model.language_model.layers.9.mlp.experts.0.up_proj.weight": ("BF16", (32, 64)),
                            "model.language_model.layers.0.mlp.experts.9.up_proj.weight": ("BF16", (32, 64)),
                            "model.language_model.layers.0.mlp.experts.01.up_proj.weight": ("BF16", (32, 64)),
                            "model.language_model.layers.0.mlp.experts.\uff11.up_proj.weight": ("BF16", (32, 64))}),
             tiny(multimodal=True)),  # indices the fast path leaves to _classify's refusals
    lambda: (_more_specs(**{"model.language_model.layers.0.mlp.experts.1.gate_proj.weight": ("F16", (32, 64))}),
             tiny(multimodal=True)),  # a dtype the check refuses
    lambda: (_more_specs(**{"model.language_model.layers.0.mlp.experts.1.gate_proj.weight": ("BF16", (8, 64))}),
             tiny(multimodal=True)),  # a shape the check refuses
    lambda: ({k: v for k, v in tiny_specs().items() if ".experts.2.gate_proj" not in k}, tiny()),  # missing
    lambda: ({**tiny_specs(), "model.layers.0.mlp.experts.gate_up_proj": ("BF16", (4, 64, 64))}, tiny()),  # mixed
])
def test_per_expert_fast_path_plans_as_the_general_path(case, monkeypatch: pytest.MonkeyPatch) -> None:
    """Per-expert names matched at once plan (or fail) exactly as through
    the multimodal filter and _classify."""
    from hf2q.models.qwen35 import plan as plan_module

    specs, cfg = case()
    fast = _plan_or_error(specs, cfg)
    monkeypatch.setattr(plan_module, "_HUB_EXPERT_NAME_RE", re.compile(r"(?!)"))  # matches nothing
    assert _plan_or_error(specs, cfg) == fast


def _variants() -> list[tuple[str, dict, bool]]:
    out = []
    for mm in (False, True):
        pre = "model.language_model.layers" if mm else "model.layers"
        base = tiny_specs(multimodal=mm)
        out.append((f"plain mm={mm}", base, mm))
        out.append((f"no mtp mm={mm}", tiny_specs(multimodal=mm, mtp=False), mm))
        s = dict(base)
        del s[f"{pre}.1.mlp.experts.2.gate_proj.weight"]
        out.append((f"an expert absent mm={mm}", s, mm))
        s = dict(base)
        s[f"{pre}.0.mlp.experts.01.up_proj.weight"] = s[f"{pre}.0.mlp.experts.1.up_proj.weight"]
        out.append((f"a second spelling mm={mm}", s, mm))
        s = dict(base)
        s[f"{pre}.0.mlp.experts.99.down_proj.weight"] = s[f"{pre}.0.mlp.experts.1.down_proj.weight"]
        out.append((f"an expert past num_experts mm={mm}", s, mm))
        s = dict(base)
        s[f"{pre}.7.mlp.experts.0.down_proj.weight"] = s[f"{pre}.0.mlp.experts.1.down_proj.weight"]
        out.append((f"a block past the layers mm={mm}", s, mm))
        s = dict(base)
        s[f"{pre}.0.mlp.experts.0.down_proj.weight"] = ("F32", s[f"{pre}.0.mlp.experts.0.down_proj.weight"][1])
        s[f"{pre}.1.mlp.experts.3.up_proj.weight"] = ("BF16", (7, 3))
        out.append((f"a dtype and a shape wrong mm={mm}", s, mm))
    return out


@pytest.mark.parametrize("name, specs, mm", _variants(), ids=[v[0] for v in _variants()])
def test_claimed_hub_experts_plan_as_the_loop_does(monkeypatch, name, specs, mm) -> None:
    # The per-expert names claimed by lookup (_claim_hub_experts) give the
    # plan, or the error, that the per-name loop gives without that step.
    from hf2q.models.qwen35 import plan as qplan

    def outcome():
        try:
            p = plan_qwen35_moe(specs, tiny(multimodal=mm))
        except Exception as e:  # noqa: BLE001 - compared by type and words
            return type(e).__name__, str(e)
        return [(t.name, t.shape, t.dtype, t.sources, t.transforms, t.group) for t in p.entries], p.dropped

    claimed = []
    real = qplan._claim_hub_experts

    def spy(entries, layers, n):  # type: ignore[no-untyped-def]
        out = real(entries, layers, n)
        claimed.append(len(entries) - len(out[2]))
        return out

    monkeypatch.setattr(qplan, "_claim_hub_experts", spy)
    fast = outcome()
    assert claimed and claimed[0] >= 40, claimed  # the step took the experts' names (47-48 here)
    monkeypatch.setattr(qplan, "_claim_hub_experts", lambda entries, layers, n: ({}, {}, entries))
    assert fast == outcome()
    if name.startswith("plain"):
        assert isinstance(fast[0], list) and len(fast[0]) > 10
