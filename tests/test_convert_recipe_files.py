"""``hf2q convert --recipe`` against llama-quantize's whole file.

tests/data/kquants/recipes_files.json (scripts/make_recipe_golden.py
``--files``) holds, for each checkpoint and recipe, what the pinned
``llama-quantize <bf16.gguf> <out.gguf> <TYPE> 1`` wrote from ``hf2q convert
--outtype bf16`` (the converter's BF16 file: tests/test_convert_golden.py,
test_convert_generic.py, test_fp8_golden.py): its SHA-256, its key order and
every tensor (name, shape, type, bytes' SHA-256 prefix) in file order. hf2q's
``--recipe`` file must be the same file, byte for byte: llama-quantize's
key/values (the BF16 file's, then ``general.quantization_version`` and
``general.file_type`` moved to the end), its tensor order (its loader's map:
by block, then name), its shapes (ggml's dimension count) and its tensors.
Qwen3.5 MoE, Gemma 4 and the generic family's Llama, Mistral, Qwen3,
Qwen3-MoE (FP8 included)."""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hf2q

from _recipe_variants import GENERIC_CONVERT, RECIPES_FTYPE, VARIANTS, materialize, materialize_generic

gguf = pytest.importorskip("gguf")

GOLDEN = Path(__file__).parent / "data" / "kquants" / "recipes_files.json"


@lru_cache(maxsize=None)
def golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text())


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    scratch = tmp_path_factory.mktemp("recipe_files")
    out = {name: materialize(name, scratch / name) for name in VARIANTS}
    out |= {name: materialize_generic(name, scratch / "generic") for name in GENERIC_CONVERT}
    return out


def test_golden_covers_every_variant_family_and_recipe() -> None:
    g = golden()
    assert set(g["variants"]) == set(VARIANTS) | set(GENERIC_CONVERT)
    assert g["recipes"] == RECIPES_FTYPE
    assert {v["family"] for v in g["variants"].values()} == {"qwen35moe", "gemma4", "generic"}
    # The generic variants really meet the k-quants (Q4_K 12, Q5_K 13, Q6_K 14), llama-quantize's
    # fallbacks (Q5_0 6, Q5_1 7, Q8_0 8) and the tensors it leaves alone (F32 0, BF16 30).
    types = {ty for n in GENERIC_CONVERT for r in golden()["variants"][n]["results"].values() for ty, _ in r["tensors"]}
    assert {12, 13, 14, 6, 8, 0} <= types
    assert sum(p.stat().st_size for p in GOLDEN.parent.iterdir()) < 2 << 20


def _tensors(path: Path) -> list[tuple[str, list[int], int, str]]:
    r = gguf.GGUFReader(str(path))
    return [(t.name, [int(d) for d in reversed(t.shape.tolist())], int(t.tensor_type),
             hashlib.sha256(bytes(t.data.tobytes())).hexdigest()[:16]) for t in r.tensors]


@pytest.mark.parametrize("recipe", list(RECIPES_FTYPE))
@pytest.mark.parametrize("variant", [*sorted(GENERIC_CONVERT), *sorted(VARIANTS)])
def test_recipe_file_is_llama_quantizes(checkpoints, tmp_path: Path, variant: str, recipe: str) -> None:
    want = golden()["variants"][variant]
    result = want["results"][recipe]
    out = tmp_path / "out.gguf"
    s = hf2q.convert(checkpoints[variant], out, recipe=recipe)
    assert s.extra["recipe"] == recipe and s.bytes == out.stat().st_size
    # Where the file differs, say where first: tensors, then keys, then the bytes.
    got = _tensors(out)
    assert [[n, shape] for n, shape, _, _ in got] == want["tensors"], "tensor order / shapes"
    bad = {n: (ty, h, wt) for (n, _, ty, h), wt in zip(got, result["tensors"]) if [ty, h] != wt}
    assert bad == {}, "tensor types / bytes"
    r = gguf.GGUFReader(str(out))
    assert [k for k in r.fields if not k.startswith("GGUF.")] == want["kv"], "key order"
    assert int(r.fields["general.file_type"].parts[-1][0]) == \
        {"q4_k_m": 15, "q4_k_s": 14, "q5_k_m": 17, "q6_k": 18, "q8_0": 7}[recipe]
    assert out.stat().st_size == result["bytes"]
    assert hashlib.sha256(out.read_bytes()).hexdigest() == result["sha256"], "file bytes (key/values)"


def test_cli_convert_takes_recipe_for_the_generic_family(checkpoints, tmp_path: Path, capsys) -> None:
    from hf2q.cli import main

    out = tmp_path / "cli.gguf"
    assert main(["convert", str(checkpoints["llama3"]), str(out), "--recipe", "q4_k_m", "--no-progress"]) == 0
    assert "llama (recipe q4_k_m)" in capsys.readouterr().out
    assert hashlib.sha256(out.read_bytes()).hexdigest() == \
        golden()["variants"]["llama3"]["results"]["q4_k_m"]["sha256"]
    assert main(["convert", str(checkpoints["llama3"]), str(tmp_path / "x.gguf"), "--recipe", "q3_k_m",
                 "--no-progress"]) == 2
    assert not (tmp_path / "x.gguf").exists()


def test_recipe_replaces_outtype(checkpoints, tmp_path: Path) -> None:
    # --outtype says nothing once a recipe decides every type (f16 included: no F16 rounding pass).
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    hf2q.convert(checkpoints["qwen3"], a, "f16", recipe="q6_k")
    hf2q.convert(checkpoints["qwen3"], b, "q8_0", recipe="q6_k")
    assert a.read_bytes() == b.read_bytes()


def test_generic_recipe_types_at_full_size_llama_70b(tmp_path: Path) -> None:
    """The convert planner's recipe types for a LLaMA-70B-shaped checkpoint
    (headers only): llama.cpp's 70B rule for attn_v and every other type
    equal to llama-quantize --dry-run's (tests/data/kquants/recipes_full_size.json)."""
    from hf2q.export.generic import plan_generic_gguf

    from _recipe_variants import HeaderCheckpoint, generic_specs

    g = json.loads((GOLDEN.parent / "recipes_full_size.json").read_text())["variants"]["llama_70b"]
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
              "intermediate_size": 28672, "num_attention_heads": 64, "num_key_value_heads": 8,
              "num_hidden_layers": 80, "vocab_size": 128256}
    ckpt = HeaderCheckpoint(generic_specs("llama_70b"), tmp_path)
    for recipe, types in g["types"].items():
        plan, _ = plan_generic_gguf(ckpt, config, "q8_0", {"recipe": recipe})
        want = dict(zip(g["tensors"], types.split()))
        got = {e.name: e.dtype for e in plan}
        assert got == want, recipe
    # The same with as many KV heads as heads (llama.cpp's 65B): no 70B rule, attn_v Q4_K where
    # use_more_bits is false.
    plan, _ = plan_generic_gguf(ckpt, {**config, "num_key_value_heads": 64}, "q8_0", {"recipe": "q4_k_m"})
    got = {e.name: e.dtype for e in plan}
    assert got["blk.20.attn_v.weight"] == "q4_k"
    assert dict(zip(g["tensors"], g["types"]["q4_k_m"].split()))["blk.20.attn_v.weight"] == "q5_k"
