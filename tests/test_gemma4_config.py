"""Gemma 4 config parsing (both serialised forms, transformers' defaults,
typed errors naming the key) and the plan's manifest checks."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import hf2q
from hf2q import ConfigError, DtypeMismatchError, ExtraTensorError, MissingTensorError, ShapeMismatchError
from hf2q.models import FAMILIES, detect
from hf2q.models.gemma4 import Gemma4Config, device_dtype, plan_gemma4, recognises, rope_freqs
from hf2q.safetensors import open_checkpoint

DATA = Path(__file__).parent / "data" / "gemma4"

# gemma-4-26B-A4B-it text config in the published form (docs/GEMMA4.md).
G26 = {
    "hidden_size": 2816, "num_hidden_layers": 30, "vocab_size": 262144, "intermediate_size": 2112,
    "moe_intermediate_size": 704, "num_experts": 128, "top_k_experts": 8, "enable_moe_block": True,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "global_head_dim": 512,
    "num_global_key_value_heads": 2, "attention_k_eq_v": True, "sliding_window": 1024,
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 5, "final_logit_softcapping": 30.0,
    "tie_word_embeddings": True, "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0,
    "rms_norm_eps": 1e-6, "max_position_embeddings": 262144, "model_type": "gemma4_text",
    "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                           "rope_theta": 1000000.0}},
}


def _wrapped(text: dict) -> dict:
    return {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "text_config": text,
            "vision_config": {"hidden_size": 1152}, "audio_config": None, "tie_word_embeddings": True}


def test_26b_published_form() -> None:
    c = Gemma4Config.from_dict(_wrapped(copy.deepcopy(G26)))
    assert c.wrapper and not c.per_layer_config_form
    assert c.full_layers == (5, 11, 17, 23, 29)
    full, sl = c.layers[5], c.layers[0]
    assert (full.head_dim, full.num_key_value_heads, full.has_v_proj) == (512, 2, False)
    assert (sl.head_dim, sl.num_key_value_heads, sl.has_v_proj) == (256, 8, True)
    r = rope_freqs(c)
    assert r.shape == (256,) and (r[:64] == 1.0).all() and (r[64:] == 1e30).all()


def test_26b_resaved_form_is_the_same_geometry() -> None:
    text = copy.deepcopy(G26)
    del text["global_head_dim"], text["num_global_key_value_heads"]
    text["per_layer_config"] = {f"{i:02d}": {"head_dim": 512, "num_key_value_heads": 2} for i in (5, 11, 17, 23, 29)}
    a = Gemma4Config.from_dict(_wrapped(text))
    b = Gemma4Config.from_dict(_wrapped(copy.deepcopy(G26)))
    assert a.per_layer_config_form and a.layers == b.layers


def test_defaults_of_an_almost_empty_config() -> None:
    c = Gemma4Config.from_dict({"model_type": "gemma4_text", "num_hidden_layers": 7})
    assert c.hidden_size == 2304 and c.vocab_size == 262144 and c.hidden_size_per_layer_input == 256
    assert c.layer_types[5] == "full_attention" and c.layer_types[6] == "full_attention"  # last forced full
    assert c.forced_full_last and c.sliding_window == 512 and c.tie_word_embeddings
    assert c.layers[5].head_dim == 512 and c.layers[5].num_key_value_heads == 4  # no k_eq_v: root nkv


def test_double_wide_and_kv_sharing() -> None:
    c = Gemma4Config.from_dict({"num_hidden_layers": 6, "num_kv_shared_layers": 2, "use_double_wide_mlp": True,
                                "intermediate_size": 64})
    assert [ly.intermediate_size for ly in c.layers] == [64] * 4 + [128] * 2
    assert [ly.kv_shared for ly in c.layers] == [False] * 4 + [True] * 2


@pytest.mark.parametrize("edit, key", [
    (lambda t: t.update(hidden_size="2816"), "text_config.hidden_size"),
    (lambda t: t.update(hidden_size=0), "text_config.hidden_size"),
    (lambda t: t.update(num_hidden_layers=10**9), "text_config.num_hidden_layers"),
    (lambda t: t.update(layer_types=["full_attention"] * 3), "text_config.layer_types"),
    (lambda t: t["layer_types"].__setitem__(2, "local"), "text_config.layer_types[2]"),
    (lambda t: t.pop("num_experts"), "text_config.num_experts"),
    (lambda t: t.update(top_k_experts=129), "text_config.top_k_experts"),
    (lambda t: t.update(attention_k_eq_v="yes"), "text_config.attention_k_eq_v"),
    (lambda t: t["rope_parameters"]["full_attention"].update(rope_type="default"),
     "text_config.rope_parameters.full_attention.rope_type"),
    (lambda t: t["rope_parameters"]["full_attention"].pop("partial_rotary_factor"),
     "text_config.rope_parameters.full_attention.partial_rotary_factor"),
    (lambda t: t.update(rope_parameters=[1]), "text_config.rope_parameters"),
    (lambda t: t.update(per_layer_config={"31": {"head_dim": 512}}), "text_config.per_layer_config.31"),
    (lambda t: t.update(per_layer_config={"05": {"head_dim": -1}}), "text_config.per_layer_config.5.head_dim"),
    (lambda t: t.update(num_kv_shared_layers=31), "text_config.num_kv_shared_layers"),
    (lambda t: t.update(rms_norm_eps=float("nan")), "text_config.rms_norm_eps"),
])
def test_bad_config_is_a_config_error_naming_the_key(edit, key) -> None:
    text = copy.deepcopy(G26)
    edit(text)
    with pytest.raises(ConfigError) as e:
        Gemma4Config.from_dict(_wrapped(text), source="x/config.json")
    assert e.value.key == key and key in str(e.value) and "x/config.json" in str(e.value)


def test_text_config_not_an_object() -> None:
    with pytest.raises(ConfigError, match="text_config"):
        Gemma4Config.from_dict({"text_config": [1]})


def test_registry_recognises_gemma4_only() -> None:
    assert [f.name for f in FAMILIES].index("gemma4") < [f.name for f in FAMILIES].index("generic")
    assert detect(_wrapped(G26)).name == "gemma4"
    assert detect({"architectures": ["Gemma4ForCausalLM"]}).name == "gemma4"
    assert detect({"model_type": "gemma4_text"}).name == "gemma4"
    assert not recognises({"architectures": ["Gemma4AssistantForCausalLM"], "model_type": "gemma4_text"})
    assert detect({"architectures": ["Gemma3ForCausalLM"]}).name == "generic"


def test_device_dtypes_follow_the_converter() -> None:
    assert device_dtype("blk.0.ffn_gate_inp.weight", (128, 2816), "q8_0", "q8_0") == "f32"
    assert device_dtype("blk.0.ffn_gate_inp.scale", (2816,), "q8_0", "q8_0") == "f32"
    assert device_dtype("blk.0.ffn_down_exps.scale", (128,), "bf16", "q8_0") == "f32"
    assert device_dtype("blk.0.layer_output_scale.weight", (1,), "q8_0", "q8_0") == "f32"
    assert device_dtype("blk.0.attn_q_norm.weight", (256,), "bf16", "q8_0") == "f32"
    assert device_dtype("blk.0.ffn_gate_up_exps.weight", (128, 1408, 2816), "f32", "q8_0") == "q8_0"
    assert device_dtype("token_embd.weight", (262144, 2816), "bf16", "q8_0") == "bf16"
    assert device_dtype("blk.0.attn_q.weight", (4096, 2800), "q8_0", "q8_0") == "f16"  # rows not 32-blocks


# ----------------------------------------------------------------------------- plan checks (headers only)
def _header(variant: str = "gemma4_moe_causal_lm") -> tuple[dict, dict]:
    hf = DATA / variant / "hf"
    with open_checkpoint(hf) as ck:
        tensors = {n: SimpleNamespace(dtype=ck[n].dtype, shape=tuple(ck[n].shape)) for n in ck.keys()}
    return json.loads((hf / "config.json").read_text()), tensors


class _Fake(dict):
    directory = Path("fake")


def _plan(cfg: dict, tensors: dict, **kw):
    return plan_gemma4(_Fake(tensors), Gemma4Config.from_dict(cfg), **kw)


def test_plan_of_the_fixture() -> None:
    cfg, t = _header()
    plan = _plan(cfg, t, dense_dtype="q8_0")
    assert len(plan) == 46 and plan.entries[0].name == "rope_freqs.weight"
    assert {e.dtype for e in plan if e.kind == "expert"} == {"q8_0"}


def test_missing_tensor() -> None:
    cfg, t = _header()
    del t["model.layers.1.self_attn.q_norm.weight"]
    with pytest.raises(MissingTensorError, match=r"model\.layers\.1\.self_attn\.q_norm\.weight"):
        _plan(cfg, t)


def test_extra_tensor_and_per_expert_form() -> None:
    cfg, t = _header()
    t["model.layers.0.experts.0.gate_proj.weight"] = SimpleNamespace(dtype="BF16", shape=(32, 32))
    t["model.layers.0.self_attn.rotary.weight"] = SimpleNamespace(dtype="BF16", shape=(4,))
    with pytest.raises(ExtraTensorError) as e:
        _plan(cfg, t)
    assert "per-expert" in str(e.value) and "rotary" in str(e.value)
    assert {p.kind for p in e.value.problems} == {"extra"}


def test_v_proj_on_a_k_eq_v_layer_is_extra() -> None:
    cfg, t = _header()
    t["model.layers.1.self_attn.v_proj.weight"] = SimpleNamespace(dtype="BF16", shape=(64, 32))
    with pytest.raises(ExtraTensorError, match="v_proj"):
        _plan(cfg, t)


def test_duplicate_through_language_model_prefix() -> None:
    cfg, t = _header()
    t["model.language_model.norm.weight"] = t["model.norm.weight"]
    with pytest.raises(ExtraTensorError, match="also given as"):
        _plan(cfg, t)


def test_dtype_and_shape() -> None:
    cfg, t = _header()
    t["model.layers.0.mlp.up_proj.weight"] = SimpleNamespace(dtype="I32", shape=(32, 32))
    t["model.layers.0.experts.down_proj"] = SimpleNamespace(dtype="BF16", shape=(4, 32, 64))
    with pytest.raises(DtypeMismatchError) as e:
        _plan(cfg, t)
    assert [p.kind for p in e.value.problems] == ["dtype", "shape"]
    del t["model.layers.0.mlp.up_proj.weight"]
    t["model.layers.0.mlp.up_proj.weight"] = SimpleNamespace(dtype="BF16", shape=(32, 32))
    with pytest.raises(ShapeMismatchError, match=r"experts\.down_proj"):
        _plan(cfg, t)


def test_untied_config_without_lm_head() -> None:
    cfg, t = _header()
    cfg["tie_word_embeddings"] = False
    with pytest.raises(MissingTensorError, match="lm_head.weight"):
        _plan(cfg, t)


def test_layer_count_bounded_by_the_checkpoint() -> None:
    cfg, t = _header()
    cfg.update(num_hidden_layers=4000, layer_types=None)
    with pytest.raises(ConfigError, match="num_hidden_layers") as e:
        _plan(cfg, t)
    assert e.value.key == "num_hidden_layers"


def test_bad_option() -> None:
    cfg, t = _header()
    with pytest.raises(ValueError, match="dense_dtype"):
        _plan(cfg, t, dense_dtype="q3_k")  # q4_0 and the k-quants are formats now
    with pytest.raises(TypeError, match="takes no option"):
        hf2q.load(DATA / "gemma4_moe_causal_lm" / "hf", dtype="q8_0")


def test_failed_load_frees_everything(tmp_path: Path) -> None:
    import shutil

    src = DATA / "gemma4_moe_causal_lm" / "hf"
    d = tmp_path / "ck"
    shutil.copytree(src, d)
    st = d / "model.safetensors"
    st.write_bytes(st.read_bytes()[:-1000])  # truncated: header fine, data short
    dev = hf2q.Device._isolated("host")
    before = dev.residency.stats()
    with pytest.raises(hf2q.Hf2qError):
        hf2q.load(d, dev, progress=False)
    import gc

    gc.collect()
    assert dev.residency.stats()["count"] == before["count"]


# ----------------------------------------------------------------------------- any JSON
from hypothesis import given, settings, strategies as st  # noqa: E402

_json = st.recursive(st.none() | st.booleans() | st.integers(-5, 1 << 40) | st.floats() | st.text(max_size=4),
                     lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
                     max_leaves=12)
_KEYS = sorted(set(G26) | {"per_layer_config", "global_head_dim", "text_config", "vocab_size_per_layer_input",
                           "use_double_wide_mlp", "partial_rotary_factor", "rope_theta"})


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(_KEYS), _json, max_size=8), st.booleans())
def test_any_json_is_a_config_or_a_config_error(edits: dict, wrap: bool) -> None:
    text = copy.deepcopy(G26)
    text.update(edits)
    try:
        Gemma4Config.from_dict(_wrapped(text) if wrap else text)
    except ConfigError:
        pass


def test_layer_names_with_a_trailing_newline_map_to_nothing() -> None:
    """A regex `$` matches before a final newline: such a name must not pass
    for the name without it."""
    from hf2q.models.gemma4.plan import gguf_name

    assert gguf_name("model.layers.0.input_layernorm.weight") == "blk.0.attn_norm.weight"
    assert gguf_name("model.layers.0.input_layernorm.weight\n") is None
