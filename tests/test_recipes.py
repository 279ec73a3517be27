"""``recipe="q4_k_m"`` (and q4_k_s, q5_k_m, q6_k, q8_0) against llama-quantize.

tests/data/kquants/recipes.json (scripts/make_recipe_golden.py) holds, for
each checkpoint of tests/_recipe_variants.py and each recipe, the GGML type
and a SHA-256 prefix of every tensor llama-quantize writes from the
converter's BF16 GGUF file without an importance matrix. hf2q's plan under
the same recipe, loaded on the host, must give the same tensors, types and
bytes."""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

import hf2q
from hf2q import formats
from hf2q.models.generic.names import llama_gguf_name
from hf2q.recipes import ModelFacts, allows_quantization, category, recipe_types

from _recipe_variants import (FULL_SIZE, GENERIC_FULL, RECIPES_FTYPE, VARIANTS, full_size_plan,
                              generic_full_size_plan, materialize)

GOLDEN = Path(__file__).parent / "data" / "kquants" / "recipes.json"
GOLDEN_FULL = Path(__file__).parent / "data" / "kquants" / "recipes_full_size.json"


@lru_cache(maxsize=None)
def golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text())


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    scratch = tmp_path_factory.mktemp("recipes")
    return {name: materialize(name, scratch / name) for name in VARIANTS}


def _ggml_shape(shape: list[int]) -> list[int]:
    """A numpy-order shape as llama-quantize writes it: ggml's trailing 1s
    (numpy's leading ones) dropped, as ``ggml_n_dims`` counts dimensions
    (the converter's file keeps ``[1, 32]``; llama-quantize writes ``[32]``)."""
    i = 0
    while i < len(shape) - 1 and shape[i] == 1:
        i += 1
    return list(shape[i:])


def _ours(path: Path, recipe: str) -> dict[str, tuple[list[int], int, str]]:
    model = hf2q.load(path, hf2q.Device("host"), recipe=recipe, progress=False)
    out = {}
    for name, buf in model.named_buffers():
        data = buf._storage_bytes(0, buf.byte_len)
        out[name] = (_ggml_shape(list(buf.shape)), formats.get(buf.dtype).gguf_type,
                     hashlib.sha256(bytes(data)).hexdigest()[:16])
    return out


def test_golden_covers_every_variant_and_recipe() -> None:
    g = golden()
    assert set(g["variants"]) == set(VARIANTS)
    assert g["recipes"] == RECIPES_FTYPE
    # The synthetic checkpoints really choose the k-quants (Q4_K 12, Q5_K 13, Q6_K 14)
    # and the tiny ones their fallbacks (Q5_0 6, Q5_1 7, Q8_0 8).
    types = {ty for v in g["variants"].values() for rows in v["results"].values() for ty, _ in rows}
    assert {12, 13, 14, 6, 7, 8, 0, 30} <= types


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("recipe", ["q4_k_m", "q4_k_s", "q5_k_m", "q6_k", "q8_0"])
def test_recipe_equals_llama_quantize(checkpoints, variant: str, recipe: str) -> None:
    v = golden()["variants"][variant]
    want = {name: (shape, ty, h) for (name, shape), (ty, h) in zip(v["tensors"], v["results"][recipe])}
    got = _ours(checkpoints[variant], recipe)
    assert sorted(got) == sorted(want)
    bad = {n: (got[n], want[n]) for n in want if got[n] != want[n]}
    assert bad == {}


def test_recipe_is_a_family_option_and_refused_when_unknown(checkpoints) -> None:
    from hf2q import models

    for fam in ("qwen35moe", "gemma4", "generic"):
        assert "recipe" in models.family(fam).impl().option_names
    with pytest.raises(ValueError, match="recipe must be one of"):
        hf2q.load(checkpoints["qwen35moe_causal_lm"], hf2q.Device("host"), recipe="q3_k_m", progress=False)


def test_rules_by_name() -> None:
    assert category("blk.3.attn_qkv.weight") == "attn_qkv"
    assert category("blk.3.ffn_down_exps.weight") == "ffn_down"
    assert category("per_layer_token_embd.weight") == "token_embd"
    assert not allows_quantization("blk.0.ffn_gate_inp.weight", (4, 32))
    assert not allows_quantization("blk.0.ssm_conv1d.weight", (320, 4))
    assert not allows_quantization("blk.0.ffn_gate_inp_shexp.weight", (1, 32))  # one row: 1-D for ggml
    assert allows_quantization("blk.0.ssm_beta.weight", (6, 32))
    assert not allows_quantization("blk.0.attn_norm.weight", (32,))
    # use_more_bits over 32 layers: the first and last quarter-ish and every third one between.
    names = [(f"blk.{i}.ffn_down.weight", (256, 256), "bf16") for i in range(32)]
    t = recipe_types(names + [("output.weight", (64, 256), "bf16")], "q4_k_m", ModelFacts(32))
    more = [i for i in range(32) if t[f"blk.{i}.ffn_down.weight"] == "q6_k"]
    assert more == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    assert t["output.weight"] == "q6_k"
    # Mixtral-like (8 experts): attn_v and attn_k Q8_0, attn_output Q5_K.
    t = recipe_types([("blk.0.attn_v.weight", (256, 256), "bf16"), ("blk.0.attn_k.weight", (256, 256), "bf16"),
                      ("blk.0.attn_output.weight", (256, 256), "bf16")], "q4_k_m", ModelFacts(1, 8))
    assert t == {"blk.0.attn_v.weight": "q8_0", "blk.0.attn_k.weight": "q8_0", "blk.0.attn_output.weight": "q5_k"}
    # A LLaMA 70B's attn_v: Q5_K where Q4_K_M keeps Q4_K.
    names = [(f"blk.{i}.attn_v.weight", (1024, 8192), "bf16") for i in range(80)]
    t = recipe_types(names, "q4_k_m", ModelFacts(80, 0, llama_70b=True))
    assert {t[f"blk.{i}.attn_v.weight"] for i in range(80)} == {"q5_k", "q6_k"}


def test_generic_llama_names_and_load(tmp_path: Path) -> None:
    import ml_dtypes
    import numpy as np
    from safetensors.numpy import save_file

    assert llama_gguf_name("model.layers.7.self_attn.v_proj.weight") == "blk.7.attn_v.weight"
    assert llama_gguf_name("model.layers.0.block_sparse_moe.experts.3.w2.weight") == "blk.0.ffn_down_exps.3.weight"
    assert llama_gguf_name("lm_head.weight") == "output.weight"
    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(ml_dtypes.bfloat16)

    t = {"model.embed_tokens.weight": w(64, 256), "lm_head.weight": w(64, 256), "model.norm.weight": w(256)}
    for i in range(4):
        p = f"model.layers.{i}."
        t |= {p + "self_attn.q_proj.weight": w(256, 256), p + "self_attn.k_proj.weight": w(128, 256),
              p + "self_attn.v_proj.weight": w(128, 256), p + "self_attn.o_proj.weight": w(256, 256),
              p + "mlp.gate_proj.weight": w(512, 256), p + "mlp.up_proj.weight": w(512, 256),
              p + "mlp.down_proj.weight": w(256, 512), p + "input_layernorm.weight": w(256),
              p + "post_attention_layernorm.weight": w(256)}
    save_file(t, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    model = hf2q.load(tmp_path, hf2q.Device("host"), family="generic", recipe="q4_k_m", progress=False)
    got = {n: b.dtype for n, b in model.named_buffers()}
    assert got["lm_head.weight"] == "q6_k" and got["model.embed_tokens.weight"] == "q4_k"
    assert got["model.norm.weight"] == "f32"  # not quantized: the BF16 file's type (1-D: F32)
    # use_more_bits(i, 4): layers 2 and 3 of 4.
    assert [got[f"model.layers.{i}.mlp.down_proj.weight"] for i in range(4)] == ["q4_k", "q4_k", "q6_k", "q6_k"]
    assert [got[f"model.layers.{i}.self_attn.v_proj.weight"] for i in range(4)] == ["q4_k", "q4_k", "q6_k", "q6_k"]
    assert got["model.layers.0.self_attn.q_proj.weight"] == "q4_k"
    w0 = t["model.layers.0.mlp.down_proj.weight"].astype(np.float32)
    assert bytes(model["model.layers.0.mlp.down_proj.weight"].numpy().tobytes()) == \
        hf2q.ops.quantize(w0, "q4_k").tobytes()


def test_convert_with_a_recipe_writes_llama_quantize_tensors(checkpoints, tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    from hf2q.cli import main

    variant = "qwen35moe_wide"
    out = tmp_path / "q4km.gguf"
    assert main(["convert", str(checkpoints[variant]), str(out), "--recipe", "q4_k_m", "--no-progress"]) == 0
    r = gguf.GGUFReader(str(out))
    assert int(r.fields["general.file_type"].parts[-1][0]) == 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    v = golden()["variants"][variant]
    want = {name: (ty, h) for (name, _), (ty, h) in zip(v["tensors"], v["results"]["q4_k_m"])}
    got = {t.name: (int(t.tensor_type), hashlib.sha256(bytes(t.data.tobytes())).hexdigest()[:16]) for t in r.tensors}
    assert got == want


@pytest.mark.parametrize("variant", FULL_SIZE)
def test_full_size_types_equal_llama_quantize(variant: str, tmp_path: Path) -> None:
    """The published Qwen3.6-35B-A3B and gemma-4-26B-A4B configs (40 + 1 MTP /
    30 blocks, 256 / 128 experts, Gemma's expert rows of 704 values), planned
    from headers alone: every tensor's type equals llama-quantize --dry-run's
    for each recipe (tests/data/kquants/recipes_full_size.json)."""
    g = json.loads(GOLDEN_FULL.read_text())["variants"][variant]
    for recipe, types in g["types"].items():
        plan, _, _ = full_size_plan(variant, recipe, tmp_path / recipe)
        want = dict(zip(g["tensors"], types.split()))
        got = {e.name: e.dtype for e in plan}
        assert sorted(got) == sorted(want)
        assert {n: (got[n], want[n]) for n in want if got[n] != want[n]} == {}, recipe


@pytest.mark.parametrize("variant", sorted(GENERIC_FULL))
def test_generic_llama_like_types_equal_llama_quantize(variant: str, tmp_path: Path) -> None:
    """The generic family (checkpoint names) on llama-like shapes at full
    size: a LLaMA-70B (llama.cpp's 70B rule for attn_v) and a Mixtral-8x7B
    (the 8-expert rules; per-expert tensors take their stacked tensor's
    type). Types equal llama-quantize --dry-run's on the converter's names."""
    import re

    g = json.loads(GOLDEN_FULL.read_text())["variants"][variant]
    for recipe, types in g["types"].items():
        want = dict(zip(g["tensors"], types.split()))
        plan = generic_full_size_plan(variant, recipe, tmp_path / recipe)
        got: dict[str, set[str]] = {}
        for e in plan:
            name = re.sub(r"(_exps)\.\d+\.weight$", r"\1.weight", llama_gguf_name(e.name))
            got.setdefault(name, set()).add(e.dtype)
        assert sorted(got) == sorted(want)
        assert {n: (got[n], want[n]) for n in want if got[n] != {want[n]}} == {}, recipe


def test_f32_checkpoint_is_quantized_from_its_bf16_rounding(tmp_path: Path) -> None:
    """An F32 checkpoint (fused expert halves included) under a recipe gives
    the bytes of its BF16 rounding: what llama-quantize reads from the
    converter's BF16 file."""
    import ml_dtypes
    import numpy as np
    from safetensors.numpy import load_file, save_file

    from hf2q.testing import make_qwen35_moe_checkpoint

    src = make_qwen35_moe_checkpoint(tmp_path / "bf16", "tiny", fused_gate_up=True, mtp=False)
    f32 = tmp_path / "f32"
    f32.mkdir()
    (f32 / "config.json").write_text((src / "config.json").read_text())
    t = load_file(str(src / "model.safetensors"))
    # F32 values that are not BF16 values: the rounding decides the bytes.
    rng = np.random.default_rng(0)
    wide = {k: (v.astype(np.float32) * (1 + rng.uniform(-3e-3, 3e-3, v.shape).astype(np.float32))) if
            v.dtype == ml_dtypes.bfloat16 else v for k, v in t.items()}
    save_file(wide, str(f32 / "model.safetensors"))
    rounded = tmp_path / "rounded"
    rounded.mkdir()
    (rounded / "config.json").write_text((src / "config.json").read_text())
    save_file({k: v.astype(ml_dtypes.bfloat16) if v.dtype == np.float32 and t[k].dtype == ml_dtypes.bfloat16 else v
               for k, v in wide.items()}, str(rounded / "model.safetensors"))
    a = hf2q.load(f32, hf2q.Device("host"), recipe="q4_k_m", progress=False)
    b = hf2q.load(rounded, hf2q.Device("host"), recipe="q4_k_m", progress=False)
    assert any(buf.dtype == "q5_0" for _, buf in b.named_buffers())
    for name, buf in b.named_buffers():
        assert a[name].dtype == buf.dtype, name
        if buf.dtype == "f32":  # kept in F32 (norms, ...): the F32 file's own values, not rounded
            continue
        assert bytes(a[name]._storage_bytes(0, a[name].byte_len)) == bytes(buf._storage_bytes(0, buf.byte_len)), name


def test_gather_bf16_cuts_rows_and_rounds() -> None:
    import ml_dtypes
    import numpy as np

    from hf2q.plan import Piece, TensorPlan
    from hf2q.recipes import _gather_bf16

    fused = np.arange(2 * 6 * 4, dtype=np.float32).reshape(2, 6, 4) * np.float32(1.0001)
    entry = TensorPlan("blk.0.ffn_up_exps.weight", (2, 3, 4), "bf16",
                       (Piece("gate_up", "f32", (2, 6, 4), rows=(3, 6)),))
    fused[0, 4, :] = [np.nan, -np.inf, 3.4e38, -1e-45]  # NaN, Inf, past BF16's largest, a subnormal
    got = _gather_bf16(entry)([fused])
    # BF16 values as float32 (no ml_dtypes import inside a load): ml_dtypes' cast bit for bit
    assert got.dtype == np.float32 and not (got.view(np.uint32) & 0xFFFF).any()
    want = fused[:, 3:6].astype(ml_dtypes.bfloat16).astype(np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_cli_load_and_inspect_take_recipe(checkpoints, capsys) -> None:
    from hf2q.cli import main

    path = str(checkpoints["qwen35moe_causal_lm"])
    assert main(["inspect", path, "--recipe", "q4_k_m", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    v = golden()["variants"]["qwen35moe_causal_lm"]
    want = {name: ty for (name, _), (ty, _) in zip(v["tensors"], v["results"]["q4_k_m"])}
    got = {t["name"]: formats.get(t["dtype"]).gguf_type for t in out["gguf_tensors"]}
    assert got == want
    assert main(["load", path, "--recipe", "q6_k", "--device", "host", "--no-progress", "--json"]) == 0
    capsys.readouterr()
    assert main(["load", path, "--recipe", "q3_k_m", "--device", "host", "--no-progress"]) == 2


def test_generic_recipe_refuses_matrices_llama_cpp_cannot_name() -> None:
    # gpt-oss: a router (mlp.router.weight) and fused experts without a .weight suffix have no
    # name in the llama-like map; a recipe would guess their types (the router quantized).
    from hf2q.errors import ConfigError

    ck = Path(__file__).parent / "data" / "fp8" / "gptoss_mxfp4" / "hf"
    with pytest.raises(ConfigError, match="mlp.experts.down_proj") as ei:
        hf2q.load(ck, hf2q.Device("host"), recipe="q4_k_m", progress=False)
    assert ei.value.key == "recipe" and str(ck) in str(ei.value)
