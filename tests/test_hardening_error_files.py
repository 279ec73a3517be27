"""A manifest error about a tensor the checkpoint holds names the file that
holds it (docs/RELIABILITY.md): in a sharded checkpoint, the shard, beside
the tensor on its line, the error led by the checkpoint's directory; and
``ManifestProblem.file`` is that file's path. Each family's checks, on real
files: the bad tensor is moved into the second of two shards."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import hf2q
from hf2q.errors import DtypeMismatchError, ExtraTensorError, ManifestError, ShapeMismatchError
from hf2q.testing import make_dflash_checkpoint
from hf2q.testing.fp8_checkpoint import _read_all, mxfp4_checkpoint, write_safetensors
from hf2q.testing.qwen35_checkpoint import make_qwen35_moe_checkpoint
from hf2q.testing.gemma4_checkpoint import make_gemma4_checkpoint

SECOND = "model-00002-of-00002.safetensors"


def _two_shards(d: Path, arrays: dict[str, np.ndarray], second: set[str]) -> Path:
    """``d``'s weights rewritten as two shards and an index: the names in
    ``second`` in the second shard, the rest in the first. Returns the
    second shard's path."""
    for p in list(d.glob("*.safetensors")) + list(d.glob("*.index.json")):
        p.unlink()
    first = "model-00001-of-00002.safetensors"
    write_safetensors(d / first, {n: a for n, a in arrays.items() if n not in second})
    write_safetensors(d / SECOND, {n: a for n, a in arrays.items() if n in second})
    weight_map = {n: SECOND if n in second else first for n in sorted(arrays)}
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return d / SECOND


def _error(d: Path) -> ManifestError:
    with pytest.raises(ManifestError) as ei:
        hf2q.load(d, "host", progress=False)
    return ei.value


def _one_problem(d: Path, cls: type, tensor: str, shard: Path) -> tuple[ManifestError, str]:
    """Loading ``d`` raises ``cls`` with one problem, about ``tensor`` in
    ``shard``; returns the error and its line about the tensor."""
    e = _error(d)
    assert type(e) is cls, e
    (p,) = e.problems
    assert (p.tensor, p.file) == (tensor, str(shard))
    return e, _named(e, d, tensor)


def _named(e: ManifestError, d: Path, tensor: str) -> str:
    """The error's line about ``tensor``, after checking the lead."""
    msg = str(e)
    assert msg.startswith(str(d)), msg  # led by the checkpoint (its directory, or its index)
    lines = [ln for ln in msg.splitlines() if tensor in ln]
    assert lines, msg
    return lines[0]


def test_qwen_fp8_scale_of_the_wrong_shape(tmp_path: Path) -> None:
    d = make_qwen35_moe_checkpoint(tmp_path / "q", fp8_block=(128, 128), mtp=False)
    arrays, _ = _read_all(d)
    scale = "model.layers.1.mlp.experts.3.up_proj.weight_scale_inv"
    arrays[scale] = np.ones((2, 2), ml_dtypes.bfloat16)  # the tiny weight is one 128 x 128 block
    shard = _two_shards(d, arrays, {scale, scale.removesuffix("_scale_inv")})
    _, line = _one_problem(d, ShapeMismatchError, scale, shard)
    assert f"'{scale}' in {SECOND}: expected [1, 1]" in line


def test_qwen_shape_dtype_and_unknown_names(tmp_path: Path) -> None:
    d = make_qwen35_moe_checkpoint(tmp_path / "q", mtp=False)
    arrays, _ = _read_all(d)
    norm = "model.layers.1.input_layernorm.weight"
    good = arrays[norm]
    arrays[norm] = np.ones((3,), ml_dtypes.bfloat16)
    _two_shards(d, arrays, {norm})
    e = _error(d)
    assert type(e) is ShapeMismatchError
    assert f"{norm} in {SECOND}: shape [3], expected [64]" in _named(e, d, norm)

    arrays[norm] = good.astype(np.int32)
    _two_shards(d, arrays, {norm})
    e = _error(d)
    assert type(e) is DtypeMismatchError
    assert f"{norm} in {SECOND}: I32" in _named(e, d, norm)

    arrays[norm] = good
    bogus = "model.layers.0.bogus.weight"
    arrays[bogus] = np.ones((4,), ml_dtypes.bfloat16)
    _two_shards(d, arrays, {bogus})
    e = _error(d)
    assert isinstance(e, ExtraTensorError)
    assert f"{bogus} in {SECOND}: " in _named(e, d, bogus)


def test_gemma4_dtype(tmp_path: Path) -> None:
    d = make_gemma4_checkpoint(tmp_path / "g")
    arrays, _ = _read_all(d)
    name = "model.layers.0.mlp.up_proj.weight"
    arrays[name] = arrays[name].astype(np.int32)
    shard = _two_shards(d, arrays, {name})
    _, line = _one_problem(d, DtypeMismatchError, name, shard)
    assert f"'{name}' in {SECOND}: expected BF16, F16 or F32, actual I32" in line


def test_dflash_shape(tmp_path: Path) -> None:
    d = make_dflash_checkpoint(tmp_path / "f")
    arrays, _ = _read_all(d)
    name = "hidden_norm.weight"
    arrays[name] = arrays[name].reshape(1, -1)
    shard = _two_shards(d, arrays, {name})
    _, line = _one_problem(d, ShapeMismatchError, name, shard)
    assert f"'{name}' in {SECOND}: " in line


def test_generic_dtype_and_mxfp4_scales(tmp_path: Path) -> None:
    d = tmp_path / "g"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    arrays = {"a.weight": np.ones((2, 4), np.float32), "b.pos": np.arange(4, dtype=np.int64)}
    shard = _two_shards(d, arrays, {"b.pos"})
    _, line = _one_problem(d, DtypeMismatchError, "b.pos", shard)
    assert f"'b.pos' in {SECOND}: " in line

    # gpt-oss MXFP4: scales that are not E8M0 exponents, named in their shard
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"]}))
    rng = np.random.default_rng(0)
    write_safetensors(src / "model.safetensors", {
        "model.layers.0.mlp.experts.gate_up_proj": rng.standard_normal((2, 32, 64)).astype(np.float32),
        "model.norm.weight": np.ones(8, np.float32)})
    m = mxfp4_checkpoint(src, tmp_path / "mx")
    arrays, _ = _read_all(m)
    scales = [n for n in arrays if n.endswith("_scales")]
    assert scales
    arrays[scales[0]] = arrays[scales[0]].astype(np.int32)
    shard = _two_shards(m, arrays, {scales[0]})
    _, line = _one_problem(m, DtypeMismatchError, scales[0], shard)
    assert f"'{scales[0]}' in {SECOND}: " in line


def test_a_problem_without_a_file_reads_as_before() -> None:
    from hf2q.errors import ManifestProblem

    p = ManifestProblem("shape", "x.weight", "[2]", "[3]")
    assert str(p) == "shape mismatch 'x.weight': expected [2], actual [3]"
    assert p == ManifestProblem("shape", "x.weight", "[2]", "[3]", "/elsewhere/model.safetensors")
