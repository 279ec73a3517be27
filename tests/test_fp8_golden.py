"""FP8 checkpoints against llama.cpp's converter: tiny checkpoints quantized
the way the Hub's quantizers do it, and what ``convert_hf_to_gguf.py`` makes
of them with ``--outtype`` q8_0 / f32 / bf16, committed under tests/data/fp8/
by scripts/make_golden_fp8.py (docs/FP8.md). Every converter tensor is
compared byte for byte with ours (``ssm_a`` within 1 ulp, as in
test_golden_converter.py)."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hf2q
from hf2q import qwen35

DATA = Path(__file__).parent / "data" / "fp8"
OUTTYPES = ("q8_0", "f32", "bf16")
GGUF_TYPE = {"F32": "f32", "BF16": "bf16", "Q8_0": "q8_0", "F16": "f16"}
QWEN = ("qwen35moe_fp8_block128",)
GENERIC = ("qwen3_fp8_deepseek", "qwen3_fp8_ct_channel")


@lru_cache(maxsize=None)
def golden(variant: str) -> tuple[dict[str, Any], dict[str, bytes]]:
    meta = json.loads((DATA / variant / "converted.json").read_text())
    with np.load(DATA / variant / "converted.npz") as z:
        blobs = {k: z[k].tobytes() for k in z.files}
    return meta, blobs


@pytest.fixture
def dev() -> hf2q.Device:
    return hf2q.Device._isolated("host")


def test_fp8_golden_data_present_and_small() -> None:
    for v in QWEN + GENERIC:
        meta, blobs = golden(v)
        assert set(meta["outtypes"]) == set(OUTTYPES)
    total = sum(f.stat().st_size for f in DATA.rglob("*") if f.is_file())
    assert total < 3 << 20


def _same(name: str, ours: bytes, theirs: bytes, outtype: str) -> None:
    if name.endswith(".ssm_a"):
        a = np.frombuffer(ours, dtype="<i4").astype(np.int64)
        b = np.frombuffer(theirs, dtype="<i4").astype(np.int64)
        assert a.shape == b.shape and int(np.max(np.abs(a - b))) <= 1, name
    else:
        assert ours == theirs, f"{name} ({outtype}): bytes differ from the converter's"


@pytest.mark.parametrize("outtype", OUTTYPES)
@pytest.mark.parametrize("variant", QWEN)
def test_qwen_fp8_equals_converter(dev, variant, outtype) -> None:
    meta, blobs = golden(variant)
    cfg = json.loads((DATA / variant / "hf" / "config.json").read_text())
    assert cfg["quantization_config"]["weight_block_size"] == [128, 128]
    model = qwen35.load(DATA / variant / "hf", device=dev, dense_dtype=outtype, expert_dtype=outtype, progress=False)
    want = {t["name"]: t for t in meta["outtypes"][outtype]["tensors"]}
    assert sorted(model.names()) == sorted(want)
    for name, t in want.items():
        buf = model[name]
        assert buf.dtype == GGUF_TYPE[t["type"]], name
        assert list(buf.shape) == t["shape"], name
        _same(name, buf.numpy().view(np.uint8).tobytes(), blobs[t["blob"]], outtype)
    assert "fp8 block 128x128" in model.summary.extra["quantization"]


@pytest.mark.parametrize("outtype", OUTTYPES)
@pytest.mark.parametrize("variant", GENERIC)
def test_generic_fp8_equals_converter(dev, variant, outtype) -> None:
    meta, blobs = golden(variant)
    model = hf2q.load(DATA / variant / "hf", device=dev, dtype=outtype, progress=False)
    assert model.family == "generic"
    tensors = meta["outtypes"][outtype]["tensors"]
    assert all("hf_name" in t for t in tensors)
    # The same tensors: every weight, no scale tensor.
    assert sorted(model.names()) == sorted(t["hf_name"] for t in tensors)
    for t in tensors:
        buf = model[t["hf_name"]]
        assert buf.dtype == GGUF_TYPE[t["type"]], t["hf_name"]
        assert list(buf.shape) == t["shape"], t["hf_name"]
        _same(t["hf_name"], buf.numpy().view(np.uint8).tobytes(), blobs[t["blob"]], outtype)


@pytest.mark.parametrize("variant", GENERIC)
def test_generic_keep_holds_fp8_and_its_scale(dev, variant) -> None:
    """--dtype keep: FP8 stays FP8 on the device, its scale a buffer of its own."""
    from hf2q.safetensors import open_checkpoint

    model = hf2q.load(DATA / variant / "hf", device=dev, dtype="keep", progress=False)
    with open_checkpoint(DATA / variant / "hf") as ckpt:
        assert sorted(model.names()) == sorted(ckpt.keys())
        for name in ckpt.keys():
            a = ckpt.read_array(name)
            assert model[name].numpy().view(np.uint8).tobytes() == a.view(np.uint8).tobytes(), name
    fp8 = [n for n in model.names() if model[n].dtype == "f8_e4m3"]
    assert fp8 and all((n + "_scale_inv") in model or (n + "_scale") in model for n in fp8)
