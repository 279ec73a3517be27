"""``hf2q convert`` of FP8 checkpoints of the generic family (docs/CONVERT.md,
"Generic family"): the converter dequantizes each FP8 weight with its scale
(``weight.float() * scale.float()``, the scale repeated over its block) before
converting it to the outtype, and writes no scale tensor.

1. Against llama.cpp's converter: the tiny Qwen3 FP8 checkpoints of
   tests/data/fp8/ (scripts/make_golden_fp8.py) and what the converter wrote
   for them: its tensors (converted.json / .npz: names in file order, types,
   shapes, bytes) and its whole file (converted_file.json, ``--files``:
   every key/value, type and order, every tensor info and offset, each
   tensor's SHA-256), as tests/test_convert_generic.py checks the BF16
   checkpoints' files (no tokenizer here: the converter's vocabulary step was
   stubbed, and hf2q writes none without tokenizer.json).
2. Whole files, byte for byte, where no converter file is committed: an FP8
   checkpoint gives the same file (every key/value, every tensor) as the F32
   checkpoint holding its dequantized values, written by numpy here as the
   converter's ``dequant_simple`` computes them, which hf2q reads through the
   already-checked F32 path; Llama (Q/K permutation after the decode),
   Qwen3-MoE (expert stacks of FP8 pieces), compressed-tensors block and
   tensor strategies included."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import hf2q
from hf2q.errors import ConfigError, MissingTensorError
from hf2q.export import UnsupportedModelError
from _helpers import assert_gguf_equals_record

gguf = pytest.importorskip("gguf")
ml_dtypes = pytest.importorskip("ml_dtypes")

DATA = Path(__file__).parent / "data"
FP8 = DATA / "fp8"
GENERIC = DATA / "gguf" / "generic"
VARIANTS = ("qwen3_fp8_deepseek", "qwen3_fp8_ct_channel", "qwen3_fp8_ct_block", "qwen3_fp8_e5m2_tensor")
OUTTYPES = ("q8_0", "bf16", "f32")


def _golden(variant: str) -> tuple[dict, dict[str, bytes]]:
    meta = json.loads((FP8 / variant / "converted.json").read_text())
    with np.load(FP8 / variant / "converted.npz") as z:
        return meta, {k: z[k].tobytes() for k in z.files}


def _kv(r) -> dict:
    out = {}
    for key, f in r.fields.items():
        if not key.startswith("GGUF."):
            v = f.contents()
            out[key] = v.tolist() if isinstance(v, np.ndarray) else v
    return out


@pytest.mark.parametrize("outtype", OUTTYPES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_fp8_convert_equals_the_converters_tensors(tmp_path: Path, variant: str, outtype: str) -> None:
    meta, blobs = _golden(variant)
    want = meta["outtypes"][outtype]
    out = tmp_path / "o.gguf"
    s = hf2q.convert(FP8 / variant / "hf", out, outtype)
    assert s.architecture == want["architecture"] == "qwen3" and "quantization" in s.extra
    r = gguf.GGUFReader(out)
    # Same tensors in the converter's order; no *_scale_inv / *.weight_scale among them.
    assert [t.name for t in r.tensors] == [t["name"] for t in want["tensors"]]
    for t, w in zip(r.tensors, want["tensors"]):
        assert t.tensor_type.name == w["type"], t.name
        assert [int(x) for x in reversed(t.shape.tolist())] == w["shape"], t.name
        data = np.asarray(t.data).view(np.uint8).reshape(-1).tobytes()
        assert data == blobs[w["blob"]], f"{t.name} ({outtype}): bytes differ from the converter's"
    ours = _kv(r)
    for key, v in want["metadata"].items():
        if isinstance(v, float):
            assert np.float32(ours[key]) == np.float32(v), key
        else:
            assert ours[key] == v, key



@pytest.mark.parametrize("outtype", OUTTYPES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_fp8_convert_equals_the_converters_whole_file(tmp_path: Path, variant: str, outtype: str) -> None:
    want = json.loads((FP8 / variant / "converted_file.json").read_text())["outtypes"][outtype]
    out = tmp_path / "o.gguf"
    hf2q.convert(FP8 / variant / "hf", out, outtype)
    assert_gguf_equals_record(out, want)


def _dequantized_f32(src: Path, dst: Path) -> Path:
    """``src`` (an FP8 checkpoint) as an F32 one: each FP8 weight times its
    scale repeated over its block (the converter's dequant_simple, in numpy),
    the scale tensors dropped, the other tensors as they are; config.json
    without quantization_config; the other files copied."""
    from hf2q.safetensors import open_checkpoint
    from hf2q.testing.fp8_checkpoint import write_safetensors

    cfg = json.loads((src / "config.json").read_text())
    q = cfg.pop("quantization_config")
    block = q.get("weight_block_size")
    if q["quant_method"] == "compressed-tensors":
        w = q["config_groups"]["group_0"]["weights"]
        block = w["block_structure"] if w["strategy"] == "block" else None
    suffix = "_scale_inv" if q["quant_method"] == "fp8" else "_scale"
    dst.mkdir(parents=True)
    arrays: dict[str, np.ndarray] = {}
    with open_checkpoint(src) as ck:
        names = list(ck.keys())
        for n in names:
            if n.endswith(suffix):
                continue
            a = ck.read_array(n)
            if n + suffix not in names:
                arrays[n] = a
                continue
            fmt = ml_dtypes.float8_e4m3fn if ck[n].dtype == "F8_E4M3" else ml_dtypes.float8_e5m2
            wt = np.asarray(a).view(np.uint8).view(fmt).astype(np.float32)
            sc = np.asarray(ck.read_array(n + suffix)).astype(np.float32)
            if block is not None:
                for axis, size in zip((-2, -1), block):
                    sc = np.repeat(sc, size, axis=axis)
                sc = sc[..., :wt.shape[-2], :wt.shape[-1]]
            while sc.ndim < wt.ndim:
                sc = sc[..., None]
            arrays[n] = wt * sc
    write_safetensors(dst / "model.safetensors", arrays)
    (dst / "config.json").write_text(json.dumps(cfg))
    for f in src.iterdir():
        if f.suffix != ".safetensors" and f.name != "config.json":
            shutil.copyfile(f, dst / f.name)
    return dst


def _fp8(tmp: Path, base: str, **kw) -> Path:
    from hf2q.testing.fp8_checkpoint import fp8_checkpoint

    return fp8_checkpoint(GENERIC / base, tmp / "fp8" / base, **kw)


CASES = {
    # committed converter-checked FP8 checkpoints
    "qwen3_fp8_deepseek": lambda tmp: FP8 / "qwen3_fp8_deepseek" / "hf",
    "qwen3_fp8_ct_channel": lambda tmp: FP8 / "qwen3_fp8_ct_channel" / "hf",
    "qwen3_fp8_ct_block": lambda tmp: FP8 / "qwen3_fp8_ct_block" / "hf",
    "qwen3_fp8_e5m2_tensor": lambda tmp: FP8 / "qwen3_fp8_e5m2_tensor" / "hf",
    # Llama: Q/K rows permuted after the decode; blocks that do not divide the rows (48 x 32)
    "llama3_block": lambda tmp: _fp8(tmp, "llama3", block=(48, 32), scale_dtype="bf16"),
    # Qwen3-MoE: every expert an FP8 piece of its stack
    "qwen3_moe_block": lambda tmp: _fp8(tmp, "qwen3_moe", block=(32, 32), scale_dtype="f32"),
    "qwen3_moe_ct_tensor": lambda tmp: _fp8(tmp, "qwen3_moe", method="compressed-tensors", strategy="tensor",
                                            scale_dtype="f32"),
    "mistral_ct_block": lambda tmp: _fp8(tmp, "mistral", method="compressed-tensors", strategy="block",
                                         block=(32, 16), scale_dtype="bf16"),
}


@pytest.mark.parametrize("outtype", ("q8_0", "bf16", "f16", "f32"))
@pytest.mark.parametrize("case", sorted(CASES))
def test_fp8_file_is_its_dequantized_checkpoints_file(tmp_path: Path, case: str, outtype: str) -> None:
    src = CASES[case](tmp_path)
    ref = _dequantized_f32(src, tmp_path / "f32" / case)
    a, b = tmp_path / "fp8.gguf", tmp_path / "f32.gguf"
    hf2q.convert(src, a, outtype, name="same")
    hf2q.convert(ref, b, outtype, name="same")
    assert a.read_bytes() == b.read_bytes()
    names = [t.name for t in gguf.GGUFReader(a).tensors]
    assert not any("scale" in n for n in names)


def test_fp8_with_a_recipe_is_its_dequantized_checkpoints_bf16_rounding(tmp_path: Path) -> None:
    """A recipe quantizes what llama-quantize reads: the converter's BF16 file,
    in which each FP8 weight times its scale is rounded to BF16."""
    src = _fp8(tmp_path, "qwen3_moe", block=(32, 32), scale_dtype="f32")
    ref = _dequantized_f32(src, tmp_path / "f32" / "qwen3_moe")
    a, b = tmp_path / "fp8.gguf", tmp_path / "f32.gguf"
    hf2q.convert(src, a, recipe="q4_k_m", name="same")
    hf2q.convert(ref, b, recipe="q4_k_m", name="same")
    assert a.read_bytes() == b.read_bytes()


def test_bare_fp8_is_cast_exactly(tmp_path: Path) -> None:
    """FP8 weights with no quantization_config and no scale: cast to F32
    exactly (the converter's ``.to(torch.float32)``), as the same values
    stored as F32 would be."""
    from hf2q.safetensors import open_checkpoint
    from hf2q.testing.fp8_checkpoint import write_safetensors

    src = GENERIC / "qwen3"
    d8, d32 = tmp_path / "a" / "qwen3", tmp_path / "b" / "qwen3"
    arrays8, arrays32 = {}, {}
    with open_checkpoint(src) as ck:
        for n in ck.keys():
            a = np.asarray(ck.read_array(n))
            if a.ndim == 2 and "embed" not in n:
                a8 = a.astype(np.float32).astype(ml_dtypes.float8_e5m2)
                arrays8[n], arrays32[n] = a8, a8.astype(np.float32)
            else:
                arrays8[n] = arrays32[n] = a
    for d, arrays in ((d8, arrays8), (d32, arrays32)):
        d.mkdir(parents=True)
        write_safetensors(d / "model.safetensors", arrays)
        for f in src.iterdir():
            if f.suffix != ".safetensors":
                shutil.copyfile(f, d / f.name)
    for outtype in ("q8_0", "bf16"):
        hf2q.convert(d8, tmp_path / f"a.{outtype}.gguf", outtype)
        hf2q.convert(d32, tmp_path / f"b.{outtype}.gguf", outtype)
        assert (tmp_path / f"a.{outtype}.gguf").read_bytes() == (tmp_path / f"b.{outtype}.gguf").read_bytes()


def _small(tmp: Path, tensors: dict, qc: dict | None, name: str = "ck") -> Path:
    from hf2q.testing.fp8_checkpoint import write_safetensors

    d = tmp / name
    d.mkdir()
    write_safetensors(d / "model.safetensors", tensors)
    cfg = json.loads((GENERIC / "qwen3" / "config.json").read_text())
    if qc is not None:
        cfg["quantization_config"] = qc
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _f8(shape=(64, 64)) -> np.ndarray:
    return (np.arange(np.prod(shape)) % 100).astype(np.uint8).reshape(shape).view(ml_dtypes.float8_e4m3fn)


def test_fp8_problems_are_typed_and_leave_no_file(tmp_path: Path) -> None:
    w = "model.layers.0.self_attn.o_proj.weight"
    qc = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [32, 32]}
    # a scale missing
    d = _small(tmp_path, {w: _f8()}, qc, "miss")
    with pytest.raises(MissingTensorError, match=r"o_proj\.weight_scale_inv"):
        hf2q.convert(d, tmp_path / "o.gguf")
    # scales but no quantization_config: how they apply is not stated
    d = _small(tmp_path, {w: _f8(), w + "_scale_inv": np.ones((2, 2), np.float32)}, None, "noqc")
    with pytest.raises(ConfigError, match="quantization_config") as e:
        hf2q.convert(d, tmp_path / "o.gguf")
    assert e.value.key == "quantization_config"
    # a quantization method hf2q does not decode
    d = _small(tmp_path, {w: _f8()}, {"quant_method": "gptq", "bits": 4}, "gptq")
    with pytest.raises(ConfigError, match="quant_method 'gptq'"):
        hf2q.convert(d, tmp_path / "o.gguf")
    # MXFP4 in a llama-like checkpoint: no gpt-oss writer
    d = _small(tmp_path, {w + "_blocks": np.zeros((64, 2, 16), np.uint8), w + "_scales": np.zeros((64, 2), np.uint8)},
               {"quant_method": "mxfp4"}, "mx")
    with pytest.raises(UnsupportedModelError, match="MXFP4.*gpt-oss"):
        hf2q.convert(d, tmp_path / "o.gguf")
    # other dtypes: named
    d = _small(tmp_path, {w: np.zeros((64, 64), np.float64)}, None, "f64")
    with pytest.raises(UnsupportedModelError, match=r"o_proj\.weight: dtype F64"):
        hf2q.convert(d, tmp_path / "o.gguf")
    assert not list(tmp_path.glob("*.gguf")) and not list(tmp_path.glob(".*partial"))


def test_gpt_oss_mxfp4_is_refused_naming_the_architecture(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedModelError, match="GptOssForCausalLM.*LlamaForCausalLM"):
        hf2q.convert(FP8 / "gptoss_mxfp4" / "hf", tmp_path / "o.gguf")
    assert not list(tmp_path.iterdir())
