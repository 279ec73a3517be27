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
QWEN = ("qwen35moe_fp8_block128", "qwen35moe_fp8_fused", "qwen35moe_cond_fp8_block128")
GENERIC = ("qwen3_fp8_deepseek", "qwen3_fp8_ct_channel", "qwen3_fp8_ct_block", "qwen3_fp8_e5m2_tensor")
GEMMA = ("gemma4_moe_fp8_ct_channel",)


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
    for v in QWEN + GENERIC + GEMMA + ("gptoss_mxfp4",):
        meta, blobs = golden(v)
        assert set(meta["outtypes"]) == set(OUTTYPES)
    assert sorted(p.name for p in DATA.iterdir() if p.is_dir()) == sorted(QWEN + GENERIC + GEMMA + ("gptoss_mxfp4",))
    total = sum(f.stat().st_size for f in DATA.rglob("*") if f.is_file())
    assert total < 7 << 20


def _same(name: str, ours: bytes, theirs: bytes, outtype: str) -> None:
    if name.endswith(".ssm_a"):
        a = np.frombuffer(ours, dtype="<i4").astype(np.int64)
        b = np.frombuffer(theirs, dtype="<i4").astype(np.int64)
        assert a.shape == b.shape and int(np.max(np.abs(a - b))) <= 1, name
    else:
        assert ours == theirs, f"{name} ({outtype}): bytes differ from the converter's"


GATHERED: list[int] = []  # entries decoded from a prefetched shard's copy ("prefetched" load path)


@pytest.fixture(params=["host", "gpu path", "prefetched"])
def load_path(request, monkeypatch) -> str:
    """The host's load, or a GPU's forced on the host (CI has no GPU): small
    batches read by the load's batch queue, scaled FP8 stacks decoded as the
    batches read them, unit transposes run by the queue; "prefetched": the
    checkpoint's file read ahead onto the device while it is opened and
    planned, its scaled runs decoded from that copy (hf2q.prefetch)."""
    if request.param != "host":
        from hf2q import loader, prefetch

        monkeypatch.setattr(loader, "_OVERLAP", True)
        monkeypatch.setattr(loader, "_SCALED_ON_DEVICE", True)
        for k in ("BATCH_BYTES", "GPU_BATCH_BYTES", "GPU_FIRST_BATCH_BYTES", "SCALED_BATCH_BYTES"):
            monkeypatch.setattr(loader, k, 64 << 10)
        if request.param == "prefetched":
            monkeypatch.setattr(prefetch, "_FORCE", True)
            decode = loader._decode_prefetched
            GATHERED.clear()

            def spy(device, ckpt, pf, group, check_finite):  # type: ignore[no-untyped-def]
                GATHERED.append(len(group))
                return decode(device, ckpt, pf, group, check_finite)

            monkeypatch.setattr(loader, "_decode_prefetched", spy)
    return request.param


@pytest.mark.parametrize("outtype", OUTTYPES)
@pytest.mark.parametrize("variant", QWEN)
def test_qwen_fp8_equals_converter(dev, variant, outtype, load_path) -> None:
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
    if load_path == "prefetched":
        assert sum(GATHERED) > 0


@pytest.mark.parametrize("outtype", OUTTYPES)
@pytest.mark.parametrize("variant", GEMMA)
def test_gemma4_fp8_equals_converter(dev, variant, outtype, load_path) -> None:
    from hf2q import gemma4

    meta, blobs = golden(variant)
    cfg = json.loads((DATA / variant / "hf" / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "compressed-tensors"
    model = gemma4.load(DATA / variant / "hf", device=dev, dense_dtype=outtype, expert_dtype=outtype, progress=False)
    want = {t["name"]: t for t in meta["outtypes"][outtype]["tensors"]}
    assert sorted(model.names()) == sorted(want)
    for name, t in want.items():
        buf = model[name]
        assert buf.dtype == GGUF_TYPE[t["type"]] and list(buf.shape) == t["shape"], name
        _same(name, buf.numpy().view(np.uint8).tobytes(), blobs[t["blob"]], outtype)
    assert "compressed-tensors channel" in model.summary.extra["quantization"]
    if load_path == "prefetched":
        assert sum(GATHERED) > 0


@pytest.mark.parametrize("outtype", OUTTYPES)
@pytest.mark.parametrize("variant", GENERIC)
def test_generic_fp8_equals_converter(dev, variant, outtype, load_path) -> None:
    meta, blobs = golden(variant)
    model = hf2q.load(DATA / variant / "hf", device=dev, dtype=outtype, progress=False)
    assert model.family == "generic"
    tensors = meta["outtypes"][outtype]["tensors"]
    assert all("hf_name" in t for t in tensors)
    # The same tensors: every weight, no scale tensor.
    assert sorted(model.names()) == sorted(t["hf_name"] for t in tensors)
    if load_path == "prefetched":  # the FP8 matrices decoded from the shard's copy
        assert sum(GATHERED) > 0
    for t in tensors:
        buf = model[t["hf_name"]]
        assert buf.dtype == GGUF_TYPE[t["type"]], t["hf_name"]
        assert list(buf.shape) == t["shape"], t["hf_name"]
        _same(t["hf_name"], buf.numpy().view(np.uint8).tobytes(), blobs[t["blob"]], outtype)


@pytest.mark.parametrize("variant", QWEN + GEMMA)
def test_family_f16_is_the_converters_f16(dev, variant, load_path) -> None:
    """``dense_dtype="f16", expert_dtype="f16"`` of an FP8 checkpoint: the
    tensors the converter makes BF16 at ``--outtype bf16`` are F16, holding
    its F32 tensor (the decoded product) cast as its ``--outtype f16`` casts
    (numpy, nearest even); the others as at bf16 (F32). On every load path:
    the decode writes F16 itself there."""
    from hf2q import gemma4

    meta, blobs = golden(variant)
    family = gemma4 if variant in GEMMA else qwen35
    model = family.load(DATA / variant / "hf", device=dev, dense_dtype="f16", expert_dtype="f16", progress=False)
    at_bf16 = {t["name"]: t for t in meta["outtypes"]["bf16"]["tensors"]}
    at_f32 = {t["name"]: t for t in meta["outtypes"]["f32"]["tensors"]}
    assert sorted(model.names()) == sorted(at_bf16)
    halves = 0
    for name, other in at_bf16.items():
        buf = model[name]
        if other["type"] == "BF16":
            with np.errstate(over="ignore"):
                want = np.frombuffer(blobs[at_f32[name]["blob"]], np.float32).astype(np.float16).tobytes()
            assert buf.dtype == "f16", name
            halves += 1
        else:
            want = blobs[other["blob"]]
            assert buf.dtype == GGUF_TYPE[other["type"]], name
        _same(name, buf.numpy().view(np.uint8).tobytes(), want, "f16")
    assert halves >= 10
    if load_path == "prefetched":
        assert sum(GATHERED) > 0


@pytest.mark.parametrize("variant", GENERIC + ("gptoss_mxfp4",))
def test_generic_f16_is_the_converters_f16(dev, variant) -> None:
    """``--dtype f16``: the tensors the converter makes BF16 at ``--outtype
    bf16`` are F16 (its rule is the same for both outtypes), holding its F32
    tensor cast as its ``--outtype f16`` casts (numpy, nearest even); the
    others as at bf16 (F32). The gpt-oss router: F32 for the converter, a
    weight for the generic family (docs/GENERIC.md)."""
    meta, blobs = golden(variant)
    model = hf2q.load(DATA / variant / "hf", device=dev, dtype="f16", progress=False)
    at_bf16 = {t.get("hf_name"): t for t in meta["outtypes"]["bf16"]["tensors"]}
    compared = 0
    for t in meta["outtypes"]["f32"]["tensors"]:
        name = t.get("hf_name")
        if name is None or name not in model or name.endswith("mlp.router.weight"):
            continue
        buf, other = model[name], at_bf16[name]
        if other["type"] == "BF16":
            with np.errstate(over="ignore"):
                want = np.frombuffer(blobs[t["blob"]], np.float32).astype(np.float16).tobytes()
            assert buf.dtype == "f16", name
        else:
            want = blobs[other["blob"]]
            assert buf.dtype == GGUF_TYPE[other["type"]], name
        assert buf.numpy().view(np.uint8).tobytes() == want, name
        compared += 1
    assert compared >= 20


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
    fp8 = [n for n in model.names() if model[n].dtype in ("f8_e4m3", "f8_e5m2")]
    assert fp8 and all((n + "_scale_inv") in model or (n + "_scale") in model for n in fp8)


# ----------------------------------------------------------------------------- MXFP4 (gpt-oss)
MX = "gptoss_mxfp4"


def _converter_tensor(outtype: str, name: str) -> tuple[dict[str, Any], bytes]:
    meta, blobs = golden(MX)
    t = next(t for t in meta["outtypes"][outtype]["tensors"] if t["name"] == name)
    return t, blobs[t["blob"]]


def test_mxfp4_kept_is_the_converters_repack(dev) -> None:
    model = hf2q.load(DATA / MX / "hf", device=dev, dtype="keep", progress=False)
    assert model.family == "generic"
    for b in range(2):
        gu = model[f"model.layers.{b}.mlp.experts.gate_up_proj"]
        down = model[f"model.layers.{b}.mlp.experts.down_proj"]
        assert gu.dtype == "mxfp4" and gu.shape == (4, 128, 64) and down.shape == (4, 64, 64)
        raw = gu.numpy().reshape(4, 128, 2 * 17)
        # The converter splits gpt-oss's interleaved gate/up rows: gate = rows 0::2, up = 1::2.
        for half, rows in (("gate", raw[:, 0::2]), ("up", raw[:, 1::2])):
            t, theirs = _converter_tensor("q8_0", f"blk.{b}.ffn_{half}_exps.weight")
            assert t["type"] == "MXFP4" and np.ascontiguousarray(rows).tobytes() == theirs
        t, theirs = _converter_tensor("f32", f"blk.{b}.ffn_down_exps.weight")
        assert down.numpy().tobytes() == theirs
    assert not any(n.endswith(("_blocks", "_scales")) for n in model.names())
    assert dev.verify(model["model.layers.0.mlp.experts.down_proj"]).ok


@pytest.mark.parametrize("dtype", ["f32", "bf16", "q8_0"])
def test_mxfp4_decoded_equals_ggml_dequantize(dev, dtype) -> None:
    """Every expert matrix decoded (each layer, gate and up halves, down)
    equals gguf-py's dequantization of the converter's MXFP4 blocks, then
    converted as any F32 weight (gguf-py's BF16, our Q8_0 against ggml's)."""
    import gguf
    from gguf.quants import dequantize

    from hf2q import ops

    model = hf2q.load(DATA / MX / "hf", device=dev, dtype=dtype, progress=False)

    def converted(ref: np.ndarray) -> bytes:
        if dtype == "q8_0":
            return ops.quantize_q8_0(ref).tobytes()
        if dtype == "bf16":
            return gguf.quants.quantize(ref, gguf.GGMLQuantizationType.BF16).tobytes()
        return ref.tobytes()

    for b in range(2):
        gu = model[f"model.layers.{b}.mlp.experts.gate_up_proj"]
        down = model[f"model.layers.{b}.mlp.experts.down_proj"]
        assert gu.dtype == dtype and gu.shape == (4, 128, 64) and down.shape == (4, 64, 64)
        row = _row_bytes(dtype, 64)
        ours = gu.numpy().view(np.uint8).reshape(4, 128, row)
        for half, rows in (("gate", ours[:, 0::2]), ("up", ours[:, 1::2])):  # the converter's split
            _, theirs = _converter_tensor("q8_0", f"blk.{b}.ffn_{half}_exps.weight")
            ref = dequantize(np.frombuffer(theirs, np.uint8).reshape(4, 64, 34), gguf.GGMLQuantizationType.MXFP4)
            assert np.ascontiguousarray(rows).tobytes() == converted(ref.astype(np.float32)), (b, half)
        _, theirs = _converter_tensor("q8_0", f"blk.{b}.ffn_down_exps.weight")
        ref = dequantize(np.frombuffer(theirs, np.uint8).reshape(4, 64, 34), gguf.GGMLQuantizationType.MXFP4)
        assert down.numpy().view(np.uint8).tobytes() == converted(ref.astype(np.float32)), (b, "down")


def _row_bytes(dtype: str, cols: int) -> int:
    from hf2q import formats

    return formats.nbytes((1, cols), dtype)


@pytest.mark.parametrize("outtype", OUTTYPES)
def test_mxfp4_checkpoints_other_tensors_equal_the_converters(dev, outtype) -> None:
    """Everything but the expert matrices, byte for byte with the converter:
    attention, norms, embeddings, sinks, the expert biases (gate / up split
    as it splits them). The router (``ffn_gate_inp``) the converter keeps F32;
    the generic family converts it as any 2-D weight (docs/GENERIC.md), so
    it is compared at f32 only."""
    meta, blobs = golden(MX)
    model = hf2q.load(DATA / MX / "hf", device=dev, dtype=outtype, progress=False)
    compared = 0
    for t in meta["outtypes"][outtype]["tensors"]:
        name, theirs = t["name"], blobs[t["blob"]]
        if "_exps.weight" in name or (name.endswith("ffn_gate_inp.weight") and outtype != "f32"):
            continue
        b = name.split(".")[1]
        if name.endswith("attn_sinks.weight"):
            ours = model[f"model.layers.{b}.self_attn.sinks"].numpy()
        elif "_exps.bias" in name:
            if "down" in name:
                ours = model[f"model.layers.{b}.mlp.experts.down_proj_bias"].numpy()
            else:
                gu = model[f"model.layers.{b}.mlp.experts.gate_up_proj_bias"].numpy()
                ours = gu[:, 0::2] if "gate" in name else gu[:, 1::2]
        else:
            ours = model[t["hf_name"]].numpy()
            assert model[t["hf_name"]].dtype == GGUF_TYPE[t["type"]], name
        _same(name, np.ascontiguousarray(ours).view(np.uint8).tobytes(), theirs, outtype)
        compared += 1
    assert compared >= 30


def test_mxfp4_bad_checkpoints_are_refused(tmp_path) -> None:
    from hf2q.errors import MissingTensorError, ShapeMismatchError
    from hf2q.testing.fp8_checkpoint import write_safetensors

    cfg = json.dumps({"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
                      "quantization_config": {"quant_method": "mxfp4"}})
    d = tmp_path / "miss"
    d.mkdir()
    write_safetensors(d / "model.safetensors", {"e.w_blocks": np.zeros((2, 4, 2, 16), np.uint8)})
    (d / "config.json").write_text(cfg)
    with pytest.raises(MissingTensorError, match=r"e\.w_scales"):
        hf2q.load(d, progress=False)
    d = tmp_path / "shape"
    d.mkdir()
    write_safetensors(d / "model.safetensors", {"e.w_blocks": np.zeros((2, 4, 2, 16), np.uint8),
                                                "e.w_scales": np.zeros((2, 4, 3), np.uint8)})
    (d / "config.json").write_text(cfg)
    with pytest.raises(ShapeMismatchError, match=r"e\.w_scales") as ei:
        hf2q.load(d, dtype="f32", progress=False)
    assert ei.value.problems[0].tensor == "e.w_scales" and ei.value.problems[0].expected.startswith("[2, 4, 2]: ")
    # the codes themselves not laid out as [..., blocks, 16]: the codes are named, not their scales
    for shape in ((16,), (2, 17)):
        d = tmp_path / f"codes{len(shape)}{shape[-1]}"
        d.mkdir()
        write_safetensors(d / "model.safetensors", {"e.w_blocks": np.zeros(shape, np.uint8),
                                                    "e.w_scales": np.zeros(shape[:-1] or (1,), np.uint8)})
        (d / "config.json").write_text(cfg)
        with pytest.raises(ShapeMismatchError) as ei:
            hf2q.load(d, dtype="f32", progress=False)
        p = ei.value.problems[0]
        assert p.tensor == "e.w_blocks" and p.expected.startswith("[..., blocks, 16]") and p.actual == str(list(shape))


def test_convert_writes_the_converters_tensors_for_fp8(tmp_path) -> None:
    """hf2q convert runs the same plan: an FP8 checkpoint's GGUF holds the
    converter's tensors byte for byte (ssm_a within 1 ulp)."""
    import subprocess
    import sys

    import gguf

    out = tmp_path / "o.gguf"
    hf = DATA / "qwen35moe_fp8_block128" / "hf"
    r = subprocess.run([sys.executable, "-m", "hf2q", "convert", str(hf), str(out), "--outtype", "q8_0",
                        "--no-progress"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    ours = {t.name: bytes(np.asarray(t.data).view(np.uint8).reshape(-1)) for t in gguf.GGUFReader(out).tensors}
    meta, blobs = golden("qwen35moe_fp8_block128")
    want = meta["outtypes"]["q8_0"]["tensors"]
    assert sorted(ours) == sorted(t["name"] for t in want)
    for t in want:
        _same(t["name"], ours[t["name"]], blobs[t["blob"]], "q8_0")
