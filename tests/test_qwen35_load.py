"""Qwen3.5/3.6 MoE loader: device buffers equal the numpy reference and gguf-py."""

from __future__ import annotations

import gc
import os

import gguf
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file

import hf2q
from hf2q import qwen35
from hf2q.models.qwen35 import Qwen35Config, convert_reference
from hf2q.testing import make_qwen35_moe_checkpoint


@pytest.fixture
def dev() -> hf2q.Device:
    return hf2q.Device._isolated("host")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    out = {}
    for key, kw in {
        "plain": {},
        "fused": {"fused_gate_up": True},
        "sharded": {"sharded": True},
        "multimodal": {"multimodal": True},
    }.items():
        d = tmp_path_factory.mktemp(key)
        make_qwen35_moe_checkpoint(d, **kw)
        out[key] = d
    return out


def _held(dev: hf2q.Device) -> tuple[int, int, int]:
    st = dev.residency.stats()
    return st["count"], st["allocated_size"], st["locked_bytes"]


def _bytes(buf: hf2q.Buffer) -> bytes:
    return buf.numpy().view(np.uint8).tobytes()


@pytest.mark.parametrize("dense_dtype", ["f32", "bf16", "f16", "q8_0"])
def test_every_tensor_equals_the_reference(dev, ckpts, dense_dtype):
    model = qwen35.load(ckpts["plain"], device=dev, dense_dtype=dense_dtype, progress=False)
    cfg = Qwen35Config.from_file(ckpts["plain"] / "config.json")
    with hf2q.open_checkpoint(ckpts["plain"]) as ck:
        for pt in model.plan:
            ref = convert_reference(pt, [ck.read_array(p.name) for p in pt.sources], cfg)
            buf = model[pt.gguf_name]
            assert buf.dtype == pt.dtype and buf.shape == tuple(pt.shape), pt.gguf_name
            assert _bytes(buf) == np.ascontiguousarray(ref).view(np.uint8).tobytes(), pt.gguf_name
    assert model.names() == model.plan.names
    assert model.gpu_resident_bytes() == model.plan.nbytes
    assert dev.residency.count == len(model)
    assert model.verify()["buffers"] == len(model)


def test_expert_q8_0_bytes_equal_gguf_py(dev, ckpts):
    model = qwen35.load(ckpts["plain"], device=dev, progress=False)
    cfg = Qwen35Config.from_file(ckpts["plain"] / "config.json")
    tensors = load_file(str(ckpts["plain"] / "model.safetensors"))
    E = cfg.num_experts
    for b in range(cfg.num_hidden_layers):
        for proj, gname in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
            experts = [
                tensors[f"model.layers.{b}.mlp.experts.{e}.{proj}.weight"].view(ml_dtypes.bfloat16).astype(np.float32)
                for e in range(E)
            ]
            stacked = np.stack(experts)
            want = gguf.quants.quantize(stacked, gguf.GGMLQuantizationType.Q8_0)
            buf = model[f"blk.{b}.{gname}.weight"]
            assert buf.dtype == "q8_0" and buf.shape == stacked.shape
            assert buf.byte_len == stacked.size // 32 * 34
            assert np.array_equal(buf.numpy(), want)


def test_fused_sharded_and_multimodal_equal_plain(dev, ckpts):
    base = qwen35.load(ckpts["plain"], device=dev, progress=False)
    for key in ("fused", "sharded", "multimodal"):
        other = qwen35.load(ckpts[key], device=dev, progress=False)
        assert other.names() == base.names(), key
        for name in base.names():
            assert _bytes(other[name]) == _bytes(base[name]), (key, name)
        if key == "multimodal":
            assert other.summary.extra["skipped_tensors"] > 0


def test_layers_structures(dev, ckpts):
    model = qwen35.load(ckpts["plain"], device=dev, progress=False)
    cfg = model.config
    for b, layer in enumerate(model.layers[: cfg.num_hidden_layers]):
        assert layer.kind == cfg.layer_types[b]
        moe = layer.moe
        assert set(moe) == {"router", "gate_exps", "up_exps", "down_exps", "gate_shexp", "up_shexp",
                            "down_shexp", "shexp_gate"}
        assert moe["router"].dtype == "f32" and moe["gate_exps"].dtype == "q8_0"
        if layer.is_full_attention:
            assert layer.attn_q.shape[0] == 2 * cfg.num_attention_heads * cfg.head_dim
        else:
            assert layer.ssm_a.dtype == "f32" and layer.ssm_conv1d.dtype == "f32"
    with pytest.raises(AttributeError):
        model.layers[0].no_such_tensor
    with pytest.raises(KeyError):
        model["blk.999.attn_q.weight"]


def test_failed_load_leaves_no_buffers(dev, ckpts, tmp_path):
    import shutil

    d = tmp_path / "trunc"
    shutil.copytree(ckpts["plain"], d)
    before = _held(dev)
    ck = hf2q.open_checkpoint(d)
    ck.close()
    path = d / "model.safetensors"
    os.truncate(path, os.path.getsize(path) - 4096)
    with pytest.raises(hf2q.SafetensorsError):
        qwen35.load(d, device=dev, progress=False)
    gc.collect()
    assert _held(dev) == before


def test_nonfinite_expert_names_the_tensor(dev, ckpts, tmp_path):
    import json
    import shutil

    d = tmp_path / "nan"
    shutil.copytree(ckpts["plain"], d)
    tensors = load_file(str(d / "model.safetensors"))
    name = "model.layers.1.mlp.experts.2.up_proj.weight"
    bad = tensors[name].copy()
    bad.view(np.uint16).reshape(-1)[5] = 0x7FC0  # bf16 NaN
    tensors[name] = bad
    from safetensors.numpy import save_file

    save_file(tensors, str(d / "model.safetensors"))
    json.loads((d / "config.json").read_text())
    before = _held(dev)
    with pytest.raises(hf2q.NonFiniteError, match="blk.1.ffn_up_exps.weight"):
        qwen35.load(d, device=dev, progress=False)
    gc.collect()
    assert _held(dev) == before


def test_cli_detects_qwen(ckpts, capsys):
    from hf2q.cli import main

    assert main(["load", str(ckpts["plain"]), "--device", "host", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"model": "qwen35moe"' in out
    assert main(["inspect", str(ckpts["plain"]), "--json"]) == 0
    assert '"planned_tensors"' in capsys.readouterr().out


def test_layout_invariant_raises_not_asserts(dev, ckpts):
    model = qwen35.load(ckpts["plain"], device=dev, progress=False)
    name = "blk.0.ffn_gate_exps.weight"
    buffers = {n: model[n] for n in model.names()}
    buffers[name] = dev.alloc(model[name].shape, "bf16")  # planned q8_0
    with pytest.raises(hf2q.Hf2qError, match=name):
        qwen35.Qwen35Model(dev, model.config, model.plan, buffers)
