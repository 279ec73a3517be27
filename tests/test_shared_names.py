"""The HF -> GGUF names and the multimodal filter that several families
share live once (hf2q.models._names); each family only adds its own."""

from __future__ import annotations

import pytest

from hf2q.models import _names
from hf2q.models.gemma4 import plan as gemma_plan
from hf2q.models.qwen35 import names as qwen_names


def test_families_add_to_the_shared_map_and_never_rename() -> None:
    for layer, glob in ((qwen_names._LAYER_NAMES, {s.hf: s.gguf for s in qwen_names._GLOBAL_SPECS}),
                        (gemma_plan._LAYER_NAMES, gemma_plan._GLOBAL_NAMES)):
        assert {k: layer[k] for k in _names.LAYER_NAMES} == dict(_names.LAYER_NAMES)
        assert {k: glob[k] for k in _names.GLOBAL_NAMES} == dict(_names.GLOBAL_NAMES)
    with pytest.raises(ValueError, match="renames shared tensor names: self_attn.q_proj.weight"):
        _names.with_additions(_names.LAYER_NAMES, {"self_attn.q_proj.weight": "q.weight", "new.weight": "n.weight"})
    assert _names.with_additions(_names.LAYER_NAMES, {"new.weight": "n.weight"})["new.weight"] == "n.weight"


def test_generic_names_are_the_shared_map_plus_one_rename() -> None:
    import inspect

    from hf2q.models.generic import names as generic_names

    want = {
        "input_layernorm.weight": "attn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
        "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
        "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
        "self_attn.o_proj.weight": "attn_output.weight", "self_attn.o_proj.bias": "attn_output.bias",
        "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight", "mlp.gate.weight": "ffn_gate_inp.weight",
    }
    assert dict(generic_names.LAYER_NAMES) == want
    differ = {k for k in _names.LAYER_NAMES if generic_names.LAYER_NAMES[k] != _names.LAYER_NAMES[k]}
    assert differ == {"post_attention_layernorm.weight"}
    # no shared entry is written out again in the generic module
    src = inspect.getsource(generic_names)
    for k, v in _names.LAYER_NAMES.items():
        assert f'"{k}": "{v}"' not in src, k
    with pytest.raises(ValueError, match="does not hold, or holds already: a.weight, input_layernorm.weight"):
        _names.with_additions(_names.LAYER_NAMES, {}, renames={"a.weight": "b.weight",
                                                               "input_layernorm.weight": "attn_norm.weight"})


def test_the_multimodal_filter_is_the_shared_one_plus_a_family_part() -> None:
    assert qwen_names._MM_PREFIXES == gemma_plan._MM_PREFIXES == _names.MULTIMODAL_PREFIXES
    assert set(qwen_names._MM_SUBSTRINGS) - set(_names.MULTIMODAL_PARTS) == {"sam_model"}
    assert set(gemma_plan._MM_PARTS) - set(_names.MULTIMODAL_PARTS) == {"patch_merge_mlp."}
    for is_mm in (qwen_names.is_multimodal_tensor, gemma_plan.is_multimodal_tensor):
        assert is_mm("model.visual.blocks.0.attn.qkv.weight") and is_mm("mlp1.0.weight")
        assert not is_mm("model.layers.0.self_attn.q_proj.weight")
    assert qwen_names.is_multimodal_tensor("sam_model.x") and not gemma_plan.is_multimodal_tensor("sam_model.x")
