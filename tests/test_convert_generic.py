"""``hf2q convert`` of the generic family's llama-like checkpoints against
llama.cpp's converter's whole file (tests/data/gguf/generic/<name>.json, made
by scripts/make_golden_generic_gguf.py from the tiny checkpoints beside it,
written by transformers with their tokenizers): every tensor (order, name,
type, shape, offset, bytes) and every key/value (type, value, order) equal,
but the keys that name the tool's guess of the model (docs/CONVERT.md), for
q8_0, bf16 and f32. Needs neither torch nor transformers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hf2q
from _helpers import assert_gguf_equals_record

gguf = pytest.importorskip("gguf")

GENERIC = Path(__file__).parent / "data" / "gguf" / "generic"
NAMES = sorted(p.stem for p in GENERIC.glob("*.json"))
CASES = [(n, o) for n in NAMES for o in ("q8_0", "bf16", "f32")]
#: pre-tokenizer hf2q names from each tokenizer's regex (the converter, hashing a
#: fixed text, names only published vocabularies: "(unrecognised)" in the record)
PRE = {"llama3": "llama-bpe", "qwen3": "qwen2", "qwen3_moe": "qwen2"}


def _record(name: str) -> dict[str, Any]:
    return json.loads((GENERIC / f"{name}.json").read_text(encoding="utf-8"))


def test_every_architecture_covered() -> None:
    archs = {_record(n)["architecture"] for n in NAMES}
    assert archs == {"LlamaForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"}
    assert sum(p.stat().st_size for p in GENERIC.rglob("*") if p.is_file()) < 1 << 20


@pytest.mark.parametrize("name, outtype", CASES)
def test_generic_equals_converter(tmp_path: Path, name: str, outtype: str) -> None:
    want = _record(name)["outtypes"][outtype]
    out = tmp_path / "out.gguf"
    s = hf2q.convert(GENERIC / name, out, outtype)
    assert s.family == "generic" and s.bytes == out.stat().st_size
    assert_gguf_equals_record(out, want, PRE.get(name))


def test_permutation_is_the_converters() -> None:
    """Llama's Q/K rows, per head, from transformers' rotary halves back to
    interleaved pairs (the converter's LlamaModel.permute)."""
    from hf2q.export.generic import _permute

    w = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)  # 2 heads of 4 rows
    got = _permute(2, w.shape)([w])
    assert got[:, 0].tolist() == [0, 6, 3, 9, 12, 18, 15, 21]


def test_other_architectures_refused(tmp_path: Path) -> None:
    d = tmp_path / "gpt2"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    (d / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(hf2q.export.UnsupportedModelError, match="GPT2LMHeadModel.*LlamaForCausalLM"):
        hf2q.convert(d, tmp_path / "o.gguf")
    assert not list(tmp_path.glob("*.gguf")) and not list(tmp_path.glob(".*partial"))


def test_unmapped_tensor_refused(tmp_path: Path) -> None:
    """A tensor the layout has no GGUF name for: refused, naming it (the
    converter stops there too); no output file is left."""
    st = pytest.importorskip("safetensors.numpy")
    d = tmp_path / "ck"
    d.mkdir()
    (d / "config.json").write_text((GENERIC / "qwen3" / "config.json").read_text())
    st.save_file({"model.embed_tokens.weight": np.zeros((128, 64), np.float32),
                  "model.layers.0.mlp.odd_proj.weight": np.zeros((64, 64), np.float32)}, str(d / "model.safetensors"))
    with pytest.raises(hf2q.export.UnsupportedModelError, match="model.layers.0.mlp.odd_proj.weight"):
        hf2q.convert(d, tmp_path / "o.gguf")
    assert not list(tmp_path.glob("*.gguf")) and not list(tmp_path.glob(".*partial"))


def test_options_the_generic_writer_does_not_take_are_refused(tmp_path: Path) -> None:
    # The generic family's GGUF writer takes a recipe (tests/test_convert_recipe_files.py) and
    # nothing else: the TypeError names the option and what it takes.
    src = GENERIC / "qwen3"
    with pytest.raises(TypeError, match=r"takes no option\(s\) expert_dtype; it takes recipe"):
        hf2q.convert(src, tmp_path / "out.gguf", "q8_0", expert_dtype="q4_k")
    assert not list(tmp_path.iterdir())


def test_qwen3_moe_num_experts_is_num_local_experts(tmp_path: Path) -> None:
    """Published Qwen3-MoE configs say ``num_experts`` (transformers 5 writes
    ``num_local_experts``; its Qwen3MoeConfig maps one to the other, and the
    converter reads the mapped value): the same file either way, not the
    default of 128 experts."""
    import shutil

    d = tmp_path / "qwen3_moe"
    shutil.copytree(GENERIC / "qwen3_moe", d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_experts"] = cfg.pop("num_local_experts")
    (d / "config.json").write_text(json.dumps(cfg))
    hf2q.convert(GENERIC / "qwen3_moe", tmp_path / "a.gguf")
    hf2q.convert(d, tmp_path / "b.gguf")
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
