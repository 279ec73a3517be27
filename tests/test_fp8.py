"""FP8: the element decoders on all 256 byte patterns (against ml_dtypes and
torch), the scaled decoder's arithmetic (one float32 multiply per element,
partial edge blocks), the NaN policy, and the typed refusals of bad FP8
checkpoints (docs/FP8.md)."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import hf2q
from hf2q import _core, formats, ops, reference
from hf2q.errors import (
    ConfigError,
    DtypeMismatchError,
    DuplicateTensorError,
    MissingTensorError,
    NonFiniteError,
    ShapeMismatchError,
)
from hf2q.testing.fp8_checkpoint import fp8_checkpoint, quantize_fp8, write_safetensors

ALL = np.arange(256, dtype=np.uint8)
ML = {"f8_e4m3": ml_dtypes.float8_e4m3fn, "f8_e5m2": ml_dtypes.float8_e5m2}


def _decode(fmt: str, raw: np.ndarray) -> np.ndarray:
    out = np.empty(raw.size, np.float32)
    _core.dequantize_blocks(raw, fmt, out.view(np.uint8))
    return out


@pytest.mark.parametrize("fmt", ["f8_e4m3", "f8_e5m2"])
def test_every_byte_decodes_as_ml_dtypes_and_torch(fmt) -> None:
    ours = _decode(fmt, ALL)
    ref = ALL.view(ML[fmt]).astype(np.float32)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(ours), nan)
    assert np.array_equal(ours.view(np.uint32)[~nan], ref.view(np.uint32)[~nan])  # bit for bit, signed zeros too
    # The numpy oracle agrees bit for bit everywhere.
    assert np.array_equal(ours.view(np.uint32), reference.f8_to_f32_bits(ALL, fmt))
    assert np.array_equal(np.signbit(ours[nan]), np.signbit(ref[nan]))
    import torch

    t = torch.from_numpy(ALL.copy()).view(torch.float8_e4m3fn if fmt == "f8_e4m3" else torch.float8_e5m2)
    tv = t.float().numpy()
    # torch's widening (the converter's dequant step) bit for bit, NaN
    # payloads included (E4M3 0x7F -> 0x7FF00000, E5M2 0x7D -> 0x7FE00000).
    assert np.array_equal(ours.view(np.uint32), tv.view(np.uint32))
    if fmt == "f8_e4m3":
        assert int(nan.sum()) == 2 and float(np.nanmax(ours)) == 448.0  # 0x7F / 0xFF; no Inf
    else:
        assert int(np.isinf(ours).sum()) == 2 and int(nan.sum()) == 6


@pytest.mark.parametrize("fmt", ["f8_e4m3", "f8_e5m2"])
def test_device_formats_hold_fp8_and_read_it_back(fmt) -> None:
    f = formats.get(fmt)
    assert f.is_device and f.itemsize == 1 and f.gguf_type == -1
    assert formats.can_convert(fmt, "f32") and not formats.can_convert(fmt, "q8_0")
    dev = hf2q.Device._isolated("host")
    buf = dev.upload(ALL.view(ML[fmt]))
    assert buf.dtype == fmt and buf.numpy().view(np.uint8).tobytes() == ALL.tobytes()
    assert dev.verify(buf).ok
    f32 = dev.alloc((256,), "f32")
    dev.write(f32, ALL, src_dtype=fmt)  # unscaled elements decode exactly
    assert np.array_equal(f32.numpy().view(np.uint32), reference.f8_to_f32_bits(ALL, fmt))
    with pytest.raises(NonFiniteError):  # the row's NaN mask (0x7F e4m3fn, 0x7C e5m2) finds NaN bytes
        dev.write(f32, ALL, src_dtype=fmt, name="x") if False else _checked_keep(fmt)


def _checked_keep(fmt: str) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        write_safetensors(d / "model.safetensors", {"x.weight": ALL.view(ML[fmt]).reshape(8, 32)})
        hf2q.load(d, dtype="keep", progress=False, check_finite=True)


def _blocks(s: np.ndarray, block: tuple[int, int], shape: tuple[int, ...]) -> np.ndarray:
    """The converter's dequant_simple scale: repeated over each block, cropped at the edges."""
    full = np.repeat(np.repeat(s.astype(np.float32), block[0], -2), block[1], -1)
    return full[..., : shape[-2], : shape[-1]]


@pytest.mark.parametrize("scale_dtype", [np.float32, ml_dtypes.bfloat16, np.float16])
@pytest.mark.parametrize("block", [(128, 128), (7, 5), (1, 64), (50, 64)])
def test_scaled_decode_is_one_multiply_per_element(scale_dtype, block) -> None:
    rng = np.random.default_rng(block[0] * 7 + block[1])
    shape = (2, 50, 64)
    w = rng.integers(0, 256, shape, dtype=np.uint8)
    w[(w & 0x7F) == 0x7F] = 1
    wf = w.view(ml_dtypes.float8_e4m3fn)
    grid = (2, -(-50 // block[0]), -(-64 // block[1]))
    # Scales whose products round: random float32 mantissas.
    s = (rng.random(grid, dtype=np.float32) * np.float32(3e-3) + np.float32(1e-4)).astype(scale_dtype)
    want = wf.astype(np.float32) * _blocks(s, block, shape)  # numpy: one IEEE multiply each
    for to, cast in (("f32", np.float32), ("bf16", ml_dtypes.bfloat16), ("f16", np.float16)):
        got, first = ops.dequantize_fp8(wf, s, block, to=to)
        assert first == -1 and got.dtype == np.dtype(cast)
        assert got.view(np.uint8).tobytes() == want.astype(cast).view(np.uint8).tobytes(), to
    got, _ = ops.dequantize_fp8(wf, s, block, to="q8_0")
    assert got.tobytes() == ops.quantize_q8_0(want).tobytes()
    # The SIMD and scalar paths give the same bytes.
    ops.set_simd_enabled(False)
    try:
        scalar, _ = ops.dequantize_fp8(wf, s, block, to="q8_0")
    finally:
        ops.set_simd_enabled(True)
    assert scalar.tobytes() == got.tobytes()


def test_scaled_decode_nan_policy() -> None:
    w = np.full((2, 32), 0x38, np.uint8)  # 1.0 in e4m3
    w[1, 5] = 0x7F  # NaN
    s = np.ones((1, 1), np.float32)
    y, first = ops.dequantize_fp8(w, s, (2, 32), fmt="f8_e4m3")
    assert first == 37 and np.isnan(y[1, 5])  # decoded as the converter would: NaN kept, reported
    with pytest.raises(NonFiniteError) as e:
        ops.dequantize_fp8(w, s, (2, 32), fmt="f8_e4m3", check_finite=True, name="w")
    assert e.value.index == 37 and e.value.multi_index == (1, 5) and e.value.tensor == "w"
    with pytest.raises(NonFiniteError):  # Q8_0 never quantizes a NaN
        ops.dequantize_fp8(w, s, (2, 32), fmt="f8_e4m3", to="q8_0")
    # An overflowing product (finite weight, huge scale) is non-finite too.
    w2 = np.full((1, 32), 0x7E, np.uint8)  # 448
    with pytest.raises(NonFiniteError):
        ops.dequantize_fp8(w2, np.full((1, 1), 1e37, np.float32), (1, 32), fmt="f8_e4m3", to="q8_0")



@pytest.mark.parametrize("fmt", ["f8_e4m3", "f8_e5m2"])
@pytest.mark.parametrize("scale_dtype", ["f32", "bf16"])
def test_kept_nans_have_the_converters_bits(fmt, scale_dtype) -> None:
    """A NaN kept in an f32 / bf16 / f16 tensor (no check_finite) has the
    bits llama.cpp's converter writes: torch's ``weight.float() *
    scale.float()``, then gguf-py's bf16 rounding or numpy's f16 cast, every
    NaN byte of the format with either sign, beside finite products and a
    NaN scale. (A NaN weight times a NaN scale is left out: IEEE leaves open
    which NaN that product is; torch's CPU kernel gives the scale's, hf2q
    the weight's on every path, fp8_product.h.)"""
    import gguf
    import torch

    nan_bytes = [b for b in range(256) if np.isnan(np.uint8(b).view(ML[fmt]).astype(np.float32))]
    rng = np.random.default_rng(11)
    w = rng.integers(0, 256, (8, 64), dtype=np.uint8)
    w[(w & 0x7F) >= (0x7C if fmt == "f8_e5m2" else 0x7F)] = 0x21  # no NaN / Inf but the ones placed below
    w.reshape(-1)[3:3 + len(nan_bytes)] = nan_bytes
    s = rng.uniform(0.5, 2.0, (2, 2)).astype(np.float32)
    s[1, 1] = np.float32("nan")
    sarr = s if scale_dtype == "f32" else s.astype(ml_dtypes.bfloat16)
    tw = torch.from_numpy(w.copy()).view(torch.float8_e4m3fn if fmt == "f8_e4m3" else torch.float8_e5m2)
    ts = torch.from_numpy(np.ascontiguousarray(sarr).view(np.uint16 if scale_dtype == "bf16" else np.float32).copy())
    ts = ts.view(torch.bfloat16) if scale_dtype == "bf16" else ts
    full = ts.float().repeat_interleave(4, 0).repeat_interleave(32, 1)  # the converter's dequant: scale per block
    want = (tw.float() * full).numpy()
    assert np.isnan(want).sum() > len(nan_bytes)
    with np.errstate(over="ignore"):  # E5M2 products past f16's range: Inf, as the converter's cast
        f16 = want.astype(np.float16).view(np.uint16)
    for to, ref in (("f32", want.view(np.uint32)),
                    ("bf16", gguf.quants.quantize(want, gguf.GGMLQuantizationType.BF16).view(np.uint16)),
                    ("f16", f16)):
        got, first = ops.dequantize_fp8(w.view(ML[fmt]), sarr, (4, 32), to=to)
        assert first == 3
        assert np.array_equal(got.view(ref.dtype), ref), to

def test_scaled_decode_checks_sizes() -> None:
    w = np.zeros((4, 32), np.uint8).view(ml_dtypes.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"scale has shape \[1, 1\]; block 2x32"):
        ops.dequantize_fp8(w, np.ones((1, 1), np.float32), (2, 32))
    with pytest.raises(ValueError, match="positive"):
        ops.dequantize_fp8(w, np.ones((1, 1), np.float32), (0, 32))
    with pytest.raises(TypeError, match="scale must be"):
        ops.dequantize_fp8(w, np.ones((1, 1), np.float64), (4, 32))
    with pytest.raises(TypeError, match="float8"):
        ops.dequantize_fp8(np.zeros((4, 32), np.float32), np.ones((1, 1), np.float32), (4, 32))
    with pytest.raises(ValueError, match="whole blocks of 32"):
        ops.dequantize_fp8(np.zeros((4, 30), np.uint8), np.ones((1, 1), np.float32), (4, 30), to="q8_0")
    # The native layer checks every length itself.
    with pytest.raises(ValueError, match="weight holds"):
        _core.scaled_fp8(np.zeros(10, np.uint8), "f8_e4m3", np.zeros(4, np.uint8), "f32", (1, 4, 4), (4, 4),
                         "f32", np.zeros(64, np.uint8))
    with pytest.raises(ValueError, match="overflows"):
        _core.scaled_fp8(np.zeros(16, np.uint8), "f8_e4m3", np.zeros(4, np.uint8), "f32",
                         (1 << 62, 1 << 62, 4), (1, 1), "f32", np.zeros(64, np.uint8))


def test_quantizer_is_amax_over_448() -> None:
    x = np.linspace(-3, 5, 40 * 70, dtype=np.float32).reshape(40, 70)
    w, s = quantize_fp8(x, block=(32, 64), scale_dtype="f32")
    assert s.shape == (2, 2) and s.dtype == np.float32
    assert s[0, 0] == np.float32(np.abs(x[:32, :64]).max()) / np.float32(448)
    assert float(np.abs(w.astype(np.float32)).max()) == 448.0
    y, _ = ops.dequantize_fp8(w, s, (32, 64))
    assert np.max(np.abs(y - x)) < 0.35  # e4m3: 3 mantissa bits


# ----------------------------------------------------------------------------- checkpoints
def _ckpt(tmp: Path, name: str, tensors: dict[str, np.ndarray], qc: dict | None) -> Path:
    d = tmp / name
    d.mkdir()
    write_safetensors(d / "model.safetensors", tensors)
    cfg: dict = {"architectures": ["TinyForCausalLM"], "model_type": "tiny"}
    if qc is not None:
        cfg["quantization_config"] = qc
    (d / "config.json").write_text(json.dumps(cfg))
    return d


FP8_QC = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [32, 32]}


def _w(shape=(64, 64)) -> np.ndarray:
    return (np.arange(np.prod(shape)) % 100).astype(np.uint8).reshape(shape).view(ml_dtypes.float8_e4m3fn)


def test_generic_without_scales_applied_was_wrong_and_now_refuses(tmp_path) -> None:
    # The old silent answer: F8 elements converted without their scales. With
    # scale tensors and no quantization_config the conversion is now refused.
    d = _ckpt(tmp_path, "noqc", {"a.weight": _w(), "a.weight_scale_inv": np.full((2, 2), 0.5, np.float32)}, None)
    with pytest.raises(ConfigError, match="quantization_config") as e:
        hf2q.load(d, dtype="f32", progress=False)
    assert e.value.key == "quantization_config"
    m = hf2q.load(d, dtype="keep", progress=False)  # the bytes as they are
    assert m["a.weight"].dtype == "f8_e4m3" and m["a.weight_scale_inv"].dtype == "f32"


MX_QC = {"quant_method": "mxfp4"}


def test_fp8_scales_under_mxfp4_are_refused(tmp_path) -> None:
    # An FP8 weight with its '_scale_inv' under quant_method mxfp4, which
    # pairs only '_blocks' with '_scales': converting it used to decode the
    # FP8 elements without their scale and load the scale as a tensor of its
    # own, with no word. (Under fp8 and compressed-tensors an FP8 weight
    # without the scale they name is a MissingTensorError.)
    tensors = {"a.weight": _w(), "a.weight_scale_inv": np.full((2, 2), 1e-3, np.float32),
               "m.down_proj_blocks": np.full((2, 8, 1, 16), 0x22, np.uint8),
               "m.down_proj_scales": np.full((2, 8, 1), 127, np.uint8)}
    d = _ckpt(tmp_path, "mx", tensors, MX_QC)
    for dtype in ("f32", "bf16", "q8_0"):
        with pytest.raises(ConfigError, match=r"'a\.weight' come with scale tensors but config\.json's "
                                              r"quantization_config \(mxfp4.*\) pairs them with none") as e:
            hf2q.load(d, dtype=dtype, progress=False)
        assert e.value.key == "quantization_config" and str(d) in str(e.value)
    m = hf2q.load(d, dtype="keep", progress=False)  # the bytes as they are
    assert m["a.weight"].dtype == "f8_e4m3" and m["a.weight_scale_inv"].dtype == "f32"


def test_qwen_fp8_without_quantization_config_says_so(tmp_path) -> None:
    # The scales are not unknown tensor names: how they apply is not stated.
    from hf2q.testing import make_qwen35_moe_checkpoint

    d = tmp_path / "q"
    make_qwen35_moe_checkpoint(d, fp8_block=(128, 128))
    cfg = json.loads((d / "config.json").read_text())
    assert cfg.pop("quantization_config", None) or cfg.get("text_config", {}).pop("quantization_config", None)
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"FP8 weight\(s\) .* come with scale tensors but config\.json has no "
                                          r"quantization_config.*qwen35moe loader cannot decode them") as e:
        hf2q.load(d, progress=False)
    assert e.value.key == "quantization_config" and str(d) in str(e.value)


def test_compressed_tensors_scale_of_a_non_weight_is_not_called_absent(tmp_path) -> None:
    qc = {"quant_method": "compressed-tensors", "format": "float-quantized",
          "config_groups": {"g": {"weights": {"type": "float", "num_bits": 8, "strategy": "tensor"}}}}
    d = _ckpt(tmp_path, "ct", {"foo.x": _w((32, 32)), "foo.x_scale": np.ones((1,), np.float32)}, qc)
    with pytest.raises(MissingTensorError, match=r"foo\.x_scale.*present, but 'foo\.x' is not a '\.weight' tensor"):
        hf2q.load(d, dtype="f32", progress=False)


def test_an_mxfp4_tensor_and_a_tensor_of_its_name_are_refused(tmp_path) -> None:
    # '<w>_blocks' + '<w>_scales' make the tensor '<w>': a checkpoint tensor
    # of that name too is two sources for one buffer (one was dropped, or the
    # load failed at its end with a layout error naming neither).
    d = _ckpt(tmp_path, "collide", {"m.down_proj_blocks": np.full((2, 8, 1, 16), 0x22, np.uint8),
                                    "m.down_proj_scales": np.full((2, 8, 1), 127, np.uint8),
                                    "m.down_proj": np.zeros((2, 8, 32), ml_dtypes.bfloat16)}, MX_QC)
    for dtype in ("keep", "f32", "bf16", "q8_0"):
        with pytest.raises(DuplicateTensorError, match=r"m\.down_proj: m\.down_proj, m\.down_proj_blocks, "
                                                       r"m\.down_proj_scales") as e:
            hf2q.load(d, dtype=dtype, progress=False)
        assert str(d) in str(e.value)
        assert e.value.groups == {"m.down_proj": ["m.down_proj", "m.down_proj_blocks", "m.down_proj_scales"]}


def test_missing_scale_is_named(tmp_path) -> None:
    d = _ckpt(tmp_path, "miss", {"a.weight": _w(), "b.weight": _w(),
                                 "a.weight_scale_inv": np.ones((2, 2), np.float32)}, FP8_QC)
    for dtype in ("keep", "q8_0"):
        with pytest.raises(MissingTensorError, match=r"b\.weight_scale_inv.*the scale of FP8 weight 'b\.weight'"):
            hf2q.load(d, dtype=dtype, progress=False)


def test_scale_of_wrong_shape_is_the_block_rule(tmp_path) -> None:
    d = _ckpt(tmp_path, "shape", {"a.weight": _w((70, 64)), "a.weight_scale_inv": np.ones((2, 2), np.float32)},
              FP8_QC)
    with pytest.raises(ShapeMismatchError, match=r"a\.weight_scale_inv.*\[3, 2\]: ceil\(70 / 32\) x ceil\(64 / 32\)"):
        hf2q.load(d, dtype="f32", progress=False)


def test_scale_of_wrong_dtype_and_unscaled_weight_with_scale(tmp_path) -> None:
    d = _ckpt(tmp_path, "dt", {"a.weight": _w(), "a.weight_scale_inv": np.ones((2, 2), np.int32)}, FP8_QC)
    with pytest.raises(DtypeMismatchError, match=r"a\.weight_scale_inv.*F32, BF16 or F16"):
        hf2q.load(d, dtype="f32", progress=False)
    d = _ckpt(tmp_path, "dt2", {"a.weight": np.ones((64, 64), np.float32),
                                "a.weight_scale_inv": np.ones((2, 2), np.float32)}, FP8_QC)
    with pytest.raises(DtypeMismatchError, match=r"'a\.weight'.*F8_E4M3"):
        hf2q.load(d, dtype="f32", progress=False)


class _Info:
    def __init__(self, dtype: str, shape: list[int]) -> None:
        self.dtype, self.shape = dtype, shape  # a list, as a plain mapping may give


class _Plain(dict):
    """name -> info with ``keys()`` and ``[name]`` only: no table()."""


@pytest.mark.parametrize("plain", [False, True])
def test_pairing_reports_every_problem_in_checkpoint_order(tmp_path, plain) -> None:
    # One of each problem, twice where a kind can repeat, among good pairs:
    # each kind's list in the order of the names, every problem named at
    # once; through a real checkpoint (its table()) and a plain mapping
    # (its [name], list shapes).
    from hf2q.models._quant import quant_scheme, scaled_tensors
    from hf2q.safetensors import open_checkpoint

    ones = np.ones((2, 2), np.float32)
    tensors = {
        "a.weight": _w(), "a.weight_scale_inv": ones,                              # good
        "b.weight_scale_inv": ones,                                                # weight absent
        "c.weight": np.ones((64, 64), np.float32), "c.weight_scale_inv": ones,     # weight not FP8
        "d.weight": _w(), "d.weight_scale_inv": np.ones((2, 2), np.int32),         # scale dtype
        "e.weight": _w((70, 64)), "e.weight_scale_inv": ones,                      # scale shape
        "f.weight": _w(),                                                          # scale absent
        "g.weight": _w(), "g.weight_scale_inv": ones,                              # good
        "h.weight": _w((70, 64)), "h.weight_scale_inv": ones,                      # scale shape again
        "i.weight_scale_inv": ones,                                                # weight absent again
    }
    scheme = quant_scheme({"quantization_config": FP8_QC})

    def pair(layers: str):  # type: ignore[no-untyped-def]
        """scaled_tensors over the tensors whose layer letter is in ``layers``."""
        with open_checkpoint(_ckpt(tmp_path, layers, {n: v for n, v in tensors.items() if n[0] in layers},
                                   FP8_QC)) as ck:
            src = _Plain({n: _Info(ck[n].dtype, list(ck[n].shape)) for n in ck.keys()}) if plain else ck
            return scaled_tensors(src, scheme)

    for layers, cls, problems, words in [
        ("abcdefghi", MissingTensorError,
         [("missing", "b.weight"), ("missing", "i.weight"), ("missing", "f.weight_scale_inv")],
         ["the weight scaled by 'b.weight_scale_inv'", "the scale of FP8 weight 'f.weight'"]),
        ("acdg", DtypeMismatchError, [("dtype", "c.weight"), ("dtype", "d.weight_scale_inv")],
         ["it has a scale 'c.weight_scale_inv'", "the scale of 'd.weight'"]),
        ("aegh", ShapeMismatchError, [("shape", "e.weight_scale_inv"), ("shape", "h.weight_scale_inv")],
         ["ceil(70 / 32) x ceil(64 / 32) blocks of [70, 64]"]),
    ]:
        with pytest.raises(cls) as e:
            pair(layers)
        assert [(p.kind, p.tensor) for p in e.value.problems] == problems
        assert all(w in str(e.value) for w in words), str(e.value)
    st = pair("ag")
    assert sorted(st.scales) == ["a.weight", "g.weight"]
    s = st.scales["g.weight"]
    assert (s.tensor, s.dtype, s.shape, s.block, s.grid, s.scheme) == (
        "g.weight_scale_inv", "f32", (2, 2), (32, 32), (2, 2), "block")
    assert st.consumed == {"a.weight_scale_inv", "g.weight_scale_inv"}


@pytest.mark.parametrize("qc, key", [
    ({"quant_method": "gptq", "bits": 4}, "quantization_config.quant_method"),
    ({"quant_method": "fp8", "weight_block_size": [128]}, "quantization_config.weight_block_size"),
    ({"quant_method": "fp8", "weight_block_size": [0, 128]}, "quantization_config.weight_block_size"),
    ({"quant_method": "fp8", "fmt": "e3m4"}, "quantization_config.fmt"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {}},
     "quantization_config.format"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized",
      "config_groups": {"g": {"weights": {"type": "float", "num_bits": 8, "strategy": "group", "group_size": 128}}}},
     "quantization_config.config_groups.g.weights.group_size"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized",
      "config_groups": {"g": {"weights": {"type": "int", "num_bits": 8, "strategy": "channel"}}}},
     "quantization_config.config_groups.g.weights"),
    ("fp8", "quantization_config"),
])
def test_unknown_quantization_config_is_refused(tmp_path, qc, key) -> None:
    d = _ckpt(tmp_path, "qc", {"a.weight": _w(), "a.weight_scale_inv": np.ones((2, 2), np.float32)}, qc)
    with pytest.raises(ConfigError) as e:
        hf2q.load(d, dtype="keep", progress=False)
    assert e.value.key == key
    assert "docs/FP8.md" in str(e.value) or "block sizes" in str(e.value) or key == "quantization_config"
    assert str(e.value).startswith(f"{d / 'config.json'}: ")  # the file to fix


@pytest.mark.parametrize("strategy", ["channel", "tensor", "block"])
def test_compressed_tensors_strategies(tmp_path, strategy) -> None:
    rng = np.random.default_rng(1)
    src = _ckpt(tmp_path, "src", {"m.l.weight": rng.standard_normal((48, 64)).astype(ml_dtypes.bfloat16),
                                  "m.norm.weight": np.ones(64, ml_dtypes.bfloat16)}, None)
    d = fp8_checkpoint(src, tmp_path / strategy, method="compressed-tensors", strategy=strategy, block=(32, 32),
                       scale_dtype="f32")
    m = hf2q.load(d, dtype="f32", progress=False)
    assert sorted(m.names()) == ["m.l.weight", "m.norm.weight"]
    from hf2q.safetensors import open_checkpoint

    with open_checkpoint(d) as c:
        w, s = c.read_array("m.l.weight"), c.read_array("m.l.weight_scale")
    block = {"channel": (1, 64), "tensor": (48, 64), "block": (32, 32)}[strategy]
    want = w.astype(np.float32) * _blocks(s.reshape(-1, s.shape[-1]) if strategy != "tensor" else s.reshape(1, 1),
                                          block, (48, 64))
    assert m["m.l.weight"].numpy().tobytes() == want.tobytes()
    # torch's product, as compressed-tensors' decompressor and the converter's dequant step compute it
    # (the converter itself refuses strategy "tensor": docs/FP8.md)
    import torch

    tw = torch.from_numpy(w.view(np.uint8).copy()).view(torch.float8_e4m3fn).float()
    ts = torch.from_numpy(s.astype(np.float32).reshape(-1, s.shape[-1]) if strategy != "tensor" else s.reshape(1, 1))
    full = ts.repeat_interleave(block[0], 0)[:48].repeat_interleave(block[1], 1)[:, :64]
    assert m["m.l.weight"].numpy().tobytes() == (tw * full).numpy().tobytes()


def test_sharded_fp8_load_is_the_full_loads_slice() -> None:
    from hf2q.shard import Shard

    d = Path(__file__).parent / "data" / "fp8" / "qwen3_fp8_deepseek" / "hf"
    dev = hf2q.Device._isolated("host")
    full = hf2q.load(d, device=dev, dtype="bf16", progress=False)
    for r in range(2):
        part = hf2q.load(d, device=dev, dtype="bf16", progress=False, shard=Shard(r, 2))
        for n in part.names():
            a, b = part[n], full[n]
            if a.shape == b.shape:
                assert a.numpy().tobytes() == b.numpy().tobytes(), n
            else:
                ax = next(i for i in range(len(a.shape)) if a.shape[i] != b.shape[i])
                k = a.shape[ax]
                want = np.take(hf2q.ops.dequantize(b.numpy(), "q8_0") if b.dtype == "q8_0" else b.numpy(),
                               range(r * k, (r + 1) * k), axis=ax)
                got = hf2q.ops.dequantize(a.numpy(), "q8_0") if a.dtype == "q8_0" else a.numpy()
                assert np.array_equal(got, want), n


def test_inspect_shows_source_format_scale_layout_and_device_format() -> None:
    import subprocess
    import sys

    d = Path(__file__).parent / "data" / "fp8"
    for variant, args, weight, device in (
            ("qwen3_fp8_deepseek", ["--dtype", "q8_0"], "model.layers.0.mlp.up_proj.weight", "q8_0"),
            ("qwen3_fp8_ct_channel", [], "model.layers.0.mlp.up_proj.weight", "f8_e4m3"),
            ("qwen35moe_fp8_block128", ["--dense-dtype", "bf16"], "model.layers.0.linear_attn.in_proj_qkv.weight",
             "bf16")):
        r = subprocess.run([sys.executable, "-m", "hf2q", "inspect", str(d / variant / "hf"), "--json", *args],
                           capture_output=True, text=True, check=True)
        rep = json.loads(r.stdout)
        rows = {t["name"]: t for t in rep["tensor_list"]}
        w = rows[weight]
        assert w["dtype"] == "F8_E4M3" and w["device_dtype"] == device
        assert w["scale"].startswith("fp8 ") and "scale '" in w["scale"]
        sname = w["scale"].split("scale '")[1].rstrip("'")
        assert rows[sname]["scale"] == f"scale of '{weight}'"
        # a converting policy applies the scale to its weight; keep loads it as its own buffer
        assert rows[sname]["device_dtype"] == (rows[sname]["dtype"].lower() if device == "f8_e4m3" else None)
        assert rep["quantization"]


def test_torch_state_dict_keeps_fp8_as_float8() -> None:
    torch = pytest.importorskip("torch")
    from hf2q import torch as ht

    d = Path(__file__).parent / "data" / "fp8" / "qwen3_fp8_deepseek" / "hf"
    model = hf2q.load(d, device=hf2q.Device._isolated("host"), dtype="keep", progress=False)
    sd = ht.state_dict(model.named_buffers())
    name = "model.layers.0.mlp.up_proj.weight"
    t, s = sd[name], sd[name + "_scale_inv"]
    assert t.dtype == torch.float8_e4m3fn and tuple(t.shape) == (160, 64) and s.dtype == torch.float32
    assert t.data_ptr() == model[name].address  # a view, no copy
    # The hand-off's FP8 with its scale: the converter's product, bit for bit.
    want = hf2q.load(d, device=hf2q.Device._isolated("host"), dtype="f32", progress=False)[name].numpy()
    deq = t.float() * s.repeat_interleave(32, 0).repeat_interleave(48, 1)[:160, :64]
    assert np.array_equal(deq.numpy(), want)


def test_bench_fp8_smoke() -> None:
    import subprocess
    import sys

    bench = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_fp8.py"
    p = subprocess.run([sys.executable, str(bench), "--rows", "300", "--cols", "256", "--json"], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert {x["case"] for x in r["results"]} == {f"fp8 e4m3 -> {t}" for t in ("q8_0", "bf16", "f16", "f32")}


@pytest.mark.parametrize("fmt", ["f8_e4m3", "f8_e5m2"])
def test_simd_and_scalar_decode_agree_on_every_byte(fmt) -> None:
    # Every byte pattern at every position of an 8-wide vector, times scales
    # whose products round, overflow and underflow: the same bits both ways.
    w = np.concatenate([np.roll(ALL, k) for k in range(8)]).reshape(64, 32)
    s = np.array([[3.0e-3], [1.7e36], [1e-40], [-0.75]] * 16, np.float32)
    for to in ("f32", "bf16", "f16"):
        simd, _ = ops.dequantize_fp8(w, s, (1, 32), fmt=fmt, to=to)
        ops.set_simd_enabled(False)
        try:
            scalar, _ = ops.dequantize_fp8(w, s, (1, 32), fmt=fmt, to=to)
        finally:
            ops.set_simd_enabled(True)
        assert simd.view(np.uint8).tobytes() == scalar.view(np.uint8).tobytes(), to


def test_mxfp4_row_is_ggmls() -> None:
    # gguf-py's GGMLQuantizationType.MXFP4 and its 17-byte blocks of 32 values.
    import gguf

    row = formats.get("mxfp4")
    assert row.gguf_type == int(gguf.GGMLQuantizationType.MXFP4) == 39
    assert (row.block_elems, row.block_bytes) == gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.MXFP4] == (32, 17)


def test_qwen_generator_writes_the_fp8_form(tmp_path) -> None:
    """hf2q.testing's Qwen3.5 generator with fp8_block (the benchmarks' FP8
    checkpoints): matrices F8_E4M3 with BF16 scale_inv, the BF16 tensors of
    the real repos kept; loads, each expert decoded with its own scale."""
    from hf2q import qwen35
    from hf2q.safetensors import open_checkpoint
    from hf2q.testing import make_qwen35_moe_checkpoint

    d = make_qwen35_moe_checkpoint(tmp_path / "q", "tiny", seed=3, fp8_block=(16, 16))
    with open_checkpoint(d) as c:
        dt = {n: c[n].dtype for n in c.keys()}
        w = c.read_array("model.layers.0.mlp.experts.1.down_proj.weight")
        s = c.read_array("model.layers.0.mlp.experts.1.down_proj.weight_scale_inv")
    assert dt["model.embed_tokens.weight"] == "BF16" and dt["model.layers.0.mlp.gate.weight"] == "BF16"
    assert dt["model.layers.0.mlp.experts.0.up_proj.weight"] == "F8_E4M3"
    m = qwen35.load(d, device=hf2q.Device._isolated("host"), expert_dtype="f32", progress=False)
    want = w.astype(np.float32) * _blocks(s, (16, 16), w.shape)
    assert m["blk.0.ffn_down_exps.weight"].numpy()[1].tobytes() == want.tobytes()


@pytest.mark.parametrize("qc", [
    {"quant_method": ["fp8"]}, {"quant_method": "fp8", "fmt": ["e4m3"]}, {"quant_method": "fp8", "fmt": None},
    {"quant_method": "fp8", "weight_block_size": [True, 1]}, {"quant_method": "fp8", "weight_block_size": "128"},
    {"quant_method": "compressed-tensors", "format": ["float-quantized"]},
    {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": []},
    {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g": 1}},
    {"quant_method": "compressed-tensors", "format": "float-quantized",
     "config_groups": {"g": {"weights": {"type": "float", "num_bits": 8, "strategy": ["channel"]}}}},
    {"quant_method": "compressed-tensors", "format": "float-quantized",
     "config_groups": {"g": {"weights": {"type": "float", "num_bits": 8, "strategy": "block",
                                         "block_structure": None}}}},
    {"quant_method": None}, [], 7,
])
def test_malformed_quantization_config_is_a_config_error(qc) -> None:
    from hf2q.models._quant import quant_scheme

    with pytest.raises(ConfigError):
        quant_scheme({"quantization_config": qc})


def test_device_scaled_fp8_op_equals_the_cpu_decoder(monkeypatch) -> None:
    """Device.scaled_fp8 (the path a GPU takes: weight and f32 scale grid
    uploaded, decoded by the device's kernels) on the host backend: the same
    bytes as the CPU decoder, and the golden loads through it unchanged."""
    from hf2q import loader

    dev = hf2q.Device._isolated("host")
    rng = np.random.default_rng(5)
    w = rng.integers(0, 256, (2, 40, 64), dtype=np.uint8)
    w[(w & 0x7F) == 0x7F] = 3
    wf = w.view(ml_dtypes.float8_e4m3fn)
    s = (rng.random((2, 2, 3), dtype=np.float32) * 1e-2).astype(np.float32)
    for to in ("f32", "bf16", "f16", "q8_0"):
        want, _ = ops.dequantize_fp8(wf, s, (32, 24), to=to)
        buf = dev.alloc((3, 40, 64), to)
        first, _ = dev._native.scaled_fp8(buf._native, 40 * 64, dev.upload(wf)._native, dev.upload(s)._native,
                                          (2, 40, 64), (32, 24))
        assert first == -1
        got = buf.numpy().reshape(-1).view(np.uint8)
        nb = formats.nbytes((2, 40, 64), to)
        off = formats.nbytes((40, 64), to)
        assert got[off:off + nb].tobytes() == want.view(np.uint8).tobytes(), to
    buf = dev.alloc((2, 40, 64), "f32")
    with pytest.raises(ValueError, match="scale buffer holds"):
        dev._native.scaled_fp8(buf._native, 0, dev.upload(wf)._native, dev.upload(s[:1])._native, (2, 40, 64),
                               (32, 24))
    with pytest.raises(ValueError, match="overrun"):
        dev._native.scaled_fp8(buf._native, 32, dev.upload(wf)._native, dev.upload(s)._native, (2, 40, 64), (32, 24))
    monkeypatch.setattr(loader, "_SCALED_ON_DEVICE", True)
    # A GPU decodes a run of per-expert FP8 tensors (an expert stack) as one stack while
    # their bytes are read: the golden bytes must come out of that path too, with
    # several pieces per stack.
    runs: list[int] = []
    judge = loader._judge_scaled

    def counted(scaled, *a):
        runs.extend(len(run) for _, _, run in scaled)  # the pieces each decoded stack covers
        return judge(scaled, *a)

    monkeypatch.setattr(loader, "_judge_scaled", counted)
    # ... and such entries share the loader's batches (one pipeline for many stacks' weights and scales).
    batched: list[int] = []
    fill_batch = loader._fill_batch

    def counted_batch(device, ckpt, entries, *a):
        batched.append(sum(any(p.scale is not None for p in e.sources) for e in entries))
        return fill_batch(device, ckpt, entries, *a)

    monkeypatch.setattr(loader, "_fill_batch", counted_batch)
    test_qwen_fp8_via_device = __import__("test_fp8_golden")
    for outtype in ("q8_0", "bf16"):
        test_qwen_fp8_via_device.test_qwen_fp8_equals_converter(dev, "qwen35moe_fp8_block128", outtype, "host")
        test_qwen_fp8_via_device.test_generic_fp8_equals_converter(dev, "qwen3_fp8_deepseek", outtype, "host")
    assert runs and max(runs) > 1, runs
    assert batched and max(batched) > 1, batched


def test_fp8_config_without_fmt_takes_either_kind(tmp_path) -> None:
    # llama.cpp's converter reads no "fmt": an E5M2 checkpoint whose quantization_config
    # omits it loads as with fmt "e5m2" (it was refused as not E4M3).
    import shutil

    src = Path(__file__).parent / "data" / "fp8" / "qwen3_fp8_e5m2_tensor" / "hf"
    ck = tmp_path / "ck"
    shutil.copytree(src, ck)
    cfg = json.loads((ck / "config.json").read_text())
    assert cfg["quantization_config"].pop("fmt") == "e5m2"
    (ck / "config.json").write_text(json.dumps(cfg))
    dev = hf2q.Device("host")
    a = hf2q.load(ck, dev, dtype="bf16", progress=False)
    b = hf2q.load(src, dev, dtype="bf16", progress=False)
    for name, buf in b.named_buffers():
        assert np.array_equal(np.asarray(a[name].to_host()).view(np.uint8), np.asarray(buf.to_host()).view(np.uint8))


def test_device_decoded_expert_run_names_the_expert_with_a_nan(monkeypatch, tmp_path) -> None:
    # A GPU decodes a whole expert stack as one while it is read: a NaN byte in one
    # expert's weight is still reported with that expert's tensor and its own flat index.
    from hf2q import loader, qwen35
    from hf2q.safetensors import open_checkpoint
    from hf2q.testing import make_qwen35_moe_checkpoint

    d = make_qwen35_moe_checkpoint(tmp_path / "ck", "tiny", fp8_block=(32, 32), sharded=False)
    with open_checkpoint(d) as ck:
        names = [n for n in ck.keys() if ".experts.2.up_proj.weight" in n and ck[n].dtype == "F8_E4M3"]
        info = ck[names[0]]
    target = names[0]
    with open(info.path, "r+b") as f:
        f.seek(info.offset + 37)
        f.write(b"\x7f")  # E4M3 NaN
    monkeypatch.setattr(loader, "_SCALED_ON_DEVICE", True)
    runs: list[int] = []
    judge = loader._judge_scaled
    monkeypatch.setattr(loader, "_judge_scaled",
                        lambda scaled, *a: (runs.extend(len(r) for _, _, r in scaled), judge(scaled, *a))[1])
    with pytest.raises(NonFiniteError) as e:
        qwen35.load(d, device=hf2q.Device._isolated("host"), expert_dtype="q8_0", progress=False)
    assert e.value.tensor == target and e.value.index == 37, (e.value.tensor, e.value.index)
    assert runs and max(runs) > 1


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_scale_values_read_in_one_pread_equal_the_general_reader(tmp_path, dtype) -> None:
    # The GPU stack path reads each expert's scale with one pread (the general reader
    # costs ~0.1 ms a tensor): the values must be the general reader's, NaN/Inf bits too.
    from safetensors.numpy import save_file

    from hf2q import loader
    from hf2q.safetensors import open_checkpoint

    v = np.array([1.5, -2.25e-3, np.inf, -np.inf, np.nan, 0.0, -0.0, 6.0e-8, 3.0e4], dtype=np.float32)
    arr = v.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    save_file({"a.weight_scale_inv": arr.reshape(3, 3), "pad": np.zeros(3, np.uint8)}, str(tmp_path / "model.safetensors"))
    with open_checkpoint(tmp_path) as ck:
        got = loader._scale_values(ck, "a.weight_scale_inv", ck["a.weight_scale_inv"].dtype)
        want = ck.read_array("a.weight_scale_inv").reshape(-1).astype(np.float32)
    assert got.dtype == np.float32 and got.view(np.uint32).tolist() == want.view(np.uint32).tolist()


def test_device_decoded_expert_run_refuses_overflowing_scales_under_check_finite(monkeypatch, tmp_path) -> None:
    # The one-call GPU decode of an expert stack: a Q8_0 block scale that overflows float16
    # is refused under check_finite (as on the host), a warning without it.
    import warnings

    from hf2q import loader, qwen35
    from hf2q.errors import ScaleOverflowWarning
    from hf2q.safetensors import open_checkpoint
    from hf2q.testing import make_qwen35_moe_checkpoint

    d = make_qwen35_moe_checkpoint(tmp_path / "ck", "tiny", fp8_block=(32, 32), sharded=False)
    with open_checkpoint(d) as ck:
        name = next(n for n in ck.keys() if ".experts.2.up_proj.weight_scale_inv" in n)
        info = ck[name]
        assert info.dtype == "BF16"
    with open(info.path, "r+b") as f:
        f.seek(info.offset)
        f.write(b"\x74\x49")  # bf16 1e6: every product of the first block x 1e6 / 127 passes 65504
    dev = hf2q.Device._isolated("host")
    # The host decodes each expert into the stack: the error's index, position and message
    # are the stack's (expert 2), all three alike.
    with pytest.raises(NonFiniteError) as e:
        qwen35.load(d, device=dev, expert_dtype="q8_0", progress=False, check_finite=True)
    err = e.value
    assert err.multi_index is not None and err.multi_index[0] == 2, err.multi_index
    shape = qwen35.load(d, device=dev, expert_dtype="bf16", progress=False)[err.tensor].shape
    assert err.index == int(np.ravel_multi_index(err.multi_index, shape))
    assert f"flat index {err.index} " in str(err)
    monkeypatch.setattr(loader, "_SCALED_ON_DEVICE", True)
    with pytest.raises(NonFiniteError):
        qwen35.load(d, device=dev, expert_dtype="q8_0", progress=False, check_finite=True)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        qwen35.load(d, device=dev, expert_dtype="q8_0", progress=False)
    assert any(issubclass(x.category, ScaleOverflowWarning) for x in w)


def test_one_piece_device_decode_equals_the_host_decode(monkeypatch, tmp_path) -> None:
    """A scaled piece that is no run of a stack (the GPU's `_scaled_on_device`:
    one weight and its scale uploaded from host memory, then decoded) gives
    the host decoder's bytes, and names a NaN's tensor and index as it does."""
    from hf2q import loader, qwen35
    from hf2q.safetensors import open_checkpoint
    from hf2q.testing import make_qwen35_moe_checkpoint

    d = make_qwen35_moe_checkpoint(tmp_path / "ck", "tiny", fp8_block=(32, 32), sharded=False)
    dev = hf2q.Device._isolated("host")
    want = {n: b.to_host().tobytes() for n, b in
            qwen35.load(d, device=dev, expert_dtype="q8_0", dense_dtype="bf16", progress=False).named_buffers()}
    monkeypatch.setattr(loader, "_SCALED_ON_DEVICE", True)
    monkeypatch.setattr(loader, "_scaled_run_on_device", lambda device, entry: [])  # every piece on its own
    calls: list[str] = []
    one = loader._scaled_on_device
    monkeypatch.setattr(loader, "_scaled_on_device", lambda *a: (calls.append(a[3].tensor), one(*a))[1])
    got = {n: b.to_host().tobytes() for n, b in
           qwen35.load(d, device=dev, expert_dtype="q8_0", dense_dtype="bf16", progress=False).named_buffers()}
    assert got == want and len(calls) > 10
    with open_checkpoint(d) as ck:
        target = next(n for n in ck.keys() if ".experts.1.down_proj.weight" in n and ck[n].dtype == "F8_E4M3")
        info = ck[target]
    with open(info.path, "r+b") as f:
        f.seek(info.offset + 41)
        f.write(b"\xff")  # E4M3 NaN (negative)
    with pytest.raises(NonFiniteError) as e:
        qwen35.load(d, device=dev, expert_dtype="q8_0", progress=False)
    assert e.value.tensor == target and e.value.index == 41 and e.value.multi_index == (41 // info.shape[1],
                                                                                       41 % info.shape[1])


@pytest.mark.parametrize("sfmt", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("to", ["f32", "bf16", "f16", "q8_0"])
def test_scales_and_outputs_as_bits(sfmt, to) -> None:
    """``scale_fmt``: the scale's bits as unsigned integers; ``out`` as the
    output's bits: the same bytes as the typed call; wrong widths refused."""
    rng = np.random.default_rng(5)
    w = rng.integers(0, 0x7E, (64, 64), dtype=np.uint8)
    typed = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16}[sfmt]
    s = rng.uniform(0.01, 2, (2, 2)).astype(typed)
    want, _ = ops.dequantize_fp8(w, s, (32, 32), fmt="f8_e4m3", to=to)
    bits = s.view(np.uint32 if sfmt == "f32" else np.uint16)
    out = np.empty(want.nbytes // (1 if to == "q8_0" else want.itemsize),
                   np.uint8 if to == "q8_0" else (np.uint32 if to == "f32" else np.uint16))
    got, first = ops.dequantize_fp8(w, bits, (32, 32), fmt="f8_e4m3", to=to, scale_fmt=sfmt, out=out)
    assert got is not None and first == -1 and out.tobytes() == want.tobytes()
    with pytest.raises(TypeError, match="scale_fmt"):
        ops.dequantize_fp8(w, bits.view(np.uint8), (32, 32), fmt="f8_e4m3", to=to, scale_fmt=sfmt)
    with pytest.raises(TypeError, match="scale_fmt"):  # big-endian bits are not the format's
        ops.dequantize_fp8(w, bits.astype(bits.dtype.newbyteorder(">")), (32, 32), fmt="f8_e4m3", to=to,
                           scale_fmt=sfmt)
    if sfmt == "bf16":  # another float type's bits are never taken as BF16
        with pytest.raises(TypeError, match="scale_fmt"):
            ops.dequantize_fp8(w, bits.view(np.float16), (32, 32), fmt="f8_e4m3", to=to, scale_fmt=sfmt)
    if sfmt != "bf16":  # the format's own dtype is taken as it is
        got2, _ = ops.dequantize_fp8(w, s, (32, 32), fmt="f8_e4m3", to=to, scale_fmt=sfmt)
        assert got2.tobytes() == want.tobytes()


@pytest.mark.parametrize("sshape", [(3,), (3, 1), (3, 1, 1)])
def test_fp8_one_scale_per_matrix_of_a_stack(tmp_path, sshape) -> None:
    """``quant_method: fp8`` without blocks, a stacked weight [E, R, C] and a
    scale of E values: one scale per matrix, as the converter aligns a scale
    with the weight's leading dimensions (its dequant_simple: the scale
    unsqueezed to [E, 1, 1], then ``weight.float() * scale``)."""
    import torch

    rng = np.random.default_rng(4)
    w = rng.integers(0, 0x7E, (3, 8, 64), dtype=np.uint8)
    s = rng.uniform(0.01, 2, sshape).astype(np.float32)
    d = _ckpt(tmp_path, "stack", {"m.experts.weight": w.view(ml_dtypes.float8_e4m3fn), "m.experts.weight_scale_inv": s},
              {"quant_method": "fp8", "fmt": "e4m3"})
    tw = torch.from_numpy(w.copy()).view(torch.float8_e4m3fn)
    ts = torch.from_numpy(s.copy())
    while ts.ndim < tw.ndim:
        ts = ts.unsqueeze(-1)
    want = (tw.float() * ts).numpy()
    m = hf2q.load(d, dtype="f32", progress=False)
    assert m["m.experts.weight"].numpy().tobytes() == want.tobytes()
    q = hf2q.load(d, dtype="q8_0", progress=False)
    assert q["m.experts.weight"].numpy().tobytes() == ops.quantize_q8_0(want).tobytes()
    # a per-row scale of the stack is [E, R] (or [E, R, 1]); anything else is refused, naming the rule
    d2 = _ckpt(tmp_path, "bad", {"m.experts.weight": w.view(ml_dtypes.float8_e4m3fn),
                                 "m.experts.weight_scale_inv": np.ones((3, 4), np.float32)},
               {"quant_method": "fp8", "fmt": "e4m3"})
    with pytest.raises(ShapeMismatchError, match="one scale per row"):
        hf2q.load(d2, dtype="f32", progress=False)
