"""Q4_0 / Q4_K / Q5_K / Q6_K (and the fallbacks Q5_0 / Q5_1) against ggml's own C code.

tests/data/kquants/ggml_ref.npz holds what ggml-quants.c from the pinned
llama.cpp (scripts/make_kquant_golden.py: -O2 -DNDEBUG -ffp-contract=off)
wrote for adversarial and random rows, and what its dequantizers give for
random blocks. hf2q must give the same bytes, block for block.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import hf2q
from hf2q import formats, ops, reference

DATA = Path(__file__).parent / "data" / "kquants"
FMTS = ("q4_0", "q4_k", "q5_k", "q6_k", "q5_0", "q5_1")


@pytest.fixture(scope="module")
def golden() -> dict[str, np.ndarray]:
    with np.load(DATA / "ggml_ref.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def meta() -> dict:
    return json.loads((DATA / "ggml_ref.json").read_text())


def _row_names(meta: dict) -> list[str]:
    return meta["adversarial_rows"] + [f"random_{i}" for i in range(meta["random_rows"])]


def _mismatches(got: np.ndarray, want: np.ndarray, names: list[str]) -> list[str]:
    return [names[i] for i in range(want.shape[0]) if not np.array_equal(got[i], want[i])]


def _quiet_quantize(x: np.ndarray, fmt: str, **kw) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hf2q.ScaleOverflowWarning)
        return ops.quantize(x, fmt, **kw)


@pytest.mark.parametrize("fmt", FMTS)
def test_table_rows(fmt: str) -> None:
    f = formats.get(fmt)
    want = {"q4_0": (32, 18, 2), "q4_k": (256, 144, 12), "q5_k": (256, 176, 13), "q6_k": (256, 210, 14),
            "q5_0": (32, 22, 6), "q5_1": (32, 24, 7)}[fmt]
    assert (f.block_elems, f.block_bytes, f.gguf_type) == want
    assert f.is_block


@pytest.fixture(params=["simd", "scalar"])
def isa(request):
    """Run a test on the best vector path and on the forced scalar path."""
    old = hf2q.ops._core.simd_enabled()
    ops.set_simd_enabled(request.param == "simd")
    try:
        yield request.param
    finally:
        ops.set_simd_enabled(old)


@pytest.mark.parametrize("fmt", FMTS)
def test_rows_byte_identical_to_ggml(golden, meta, fmt: str, isa: str) -> None:
    rows = golden["rows"]
    got = _quiet_quantize(rows, fmt)
    assert got.shape == golden[fmt].shape
    assert _mismatches(got, golden[fmt], _row_names(meta)) == []


@pytest.mark.parametrize("fmt", FMTS)
def test_one_row_at_a_time_and_thread_counts(golden, meta, fmt: str, isa: str) -> None:
    rows = golden["rows"]
    names = _row_names(meta)
    one = np.stack([_quiet_quantize(np.ascontiguousarray(r), fmt) for r in rows[:40]])
    assert _mismatches(one, golden[fmt][:40], names) == []
    # A large tensor (many chunks over the pool) of the rows repeated: every
    # copy equals ggml's bytes whatever the thread count.
    big = np.tile(rows, (12, 1))
    want = np.tile(golden[fmt], (12, 1))
    old = hf2q.get_num_threads()
    try:
        for n in (1, 3):
            hf2q.set_num_threads(n)
            assert np.array_equal(_quiet_quantize(big, fmt), want)
    finally:
        hf2q.set_num_threads(old)


@pytest.mark.parametrize("fmt", FMTS)
def test_half_sources_widen_exactly(golden, fmt: str, isa: str) -> None:
    rows = golden["rows"]
    finite = np.all(np.isfinite(rows.astype(ml_dtypes.bfloat16).astype(np.float32)), axis=1)
    x = rows[finite].astype(ml_dtypes.bfloat16)
    assert np.array_equal(_quiet_quantize(x, fmt), _quiet_quantize(x.astype(np.float32), fmt))
    with np.errstate(over="ignore"):
        h = rows.astype(np.float16)
    h = h[np.all(np.isfinite(h), axis=1)]
    assert np.array_equal(_quiet_quantize(h, fmt), _quiet_quantize(h.astype(np.float32), fmt))


@pytest.mark.parametrize("fmt", FMTS)
def test_dequantize_bit_identical_to_ggml(golden, fmt: str) -> None:
    blocks = golden[f"{fmt}_rand"]
    want = golden[f"{fmt}_rand_deq"]
    for impl in (ops.dequantize, reference.dequantize):
        got = impl(blocks, fmt)
        assert got.shape == want.shape and got.dtype == np.float32
        same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
        assert same.all(), f"{impl.__module__}: {int((~same).sum())} values differ"


@pytest.mark.parametrize("fmt", FMTS)
def test_dequantize_of_quantized_rows_matches_reference(golden, fmt: str) -> None:
    q = golden[fmt]
    got = ops.dequantize(q, fmt)
    want = reference.dequantize(q, fmt)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)) or np.array_equal(got, want, equal_nan=True)
    assert got.shape == golden["rows"].shape


@pytest.mark.parametrize("fmt", FMTS)
def test_roundtrip_error_is_small(golden, fmt: str) -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((64, 512)).astype(np.float32)
    y = ops.dequantize(ops.quantize(x, fmt), fmt)
    # Bits per weight 4.5 .. 6.6: relative RMS error well under 1/8.
    err = np.sqrt(np.mean((y - x) ** 2)) / np.sqrt(np.mean(x**2))
    assert err < {"q4_0": 0.12, "q4_k": 0.1, "q5_k": 0.05, "q6_k": 0.025, "q5_0": 0.06, "q5_1": 0.05}[fmt]


@pytest.mark.parametrize("fmt", FMTS)
def test_nonfinite_input_raises(golden, fmt: str) -> None:
    rows = golden["rows"][:8].copy()
    rows[5, 77] = np.nan
    rows[6, 3] = np.inf
    with pytest.raises(hf2q.NonFiniteError) as e:
        ops.quantize(rows, fmt, name="blk.0.w")
    assert e.value.index == 5 * 256 + 77
    assert e.value.value_class == "nan"
    assert "blk.0.w" in str(e.value)
    x = rows.astype(ml_dtypes.bfloat16)
    x[5, 77] = 1.0
    with pytest.raises(hf2q.NonFiniteError) as e:
        ops.quantize(x, fmt)
    assert e.value.index == 6 * 256 + 3 and e.value.value_class == "+inf"


def test_ggml_nonfinite_bytes_are_as_documented(golden, meta) -> None:
    # docs/KQUANTS.md, "Non-finite input": what a release ggml writes, the
    # reason hf2q raises instead.
    names = meta["nonfinite_rows"]
    all_nan, all_inf = names.index("all_nan"), names.index("all_pinf")
    for fmt in ("q4_k", "q5_k", "q6_k"):
        assert not golden[f"{fmt}_nonfinite"][all_nan].any()
    for fmt in ("q4_k", "q5_k"):
        b = golden[f"{fmt}_nonfinite"][all_inf]
        assert b[:2].tobytes() == b"\x00\x7c" and not b[2:].any()
    q40 = golden["q4_0_nonfinite"][all_nan].reshape(8, 18)
    assert (q40[:, :2].tobytes() == b"\x00\x80" * 8) and not q40[:, 2:].any()


@pytest.mark.parametrize("fmt", FMTS)
def test_scale_overflow_warns(fmt: str) -> None:
    x = np.zeros((1, 256), dtype=np.float32)
    x[0, ::2] = 1e9
    x[0, 1::2] = -1e9
    with pytest.warns(hf2q.ScaleOverflowWarning, match="overflows float16"):
        ops.quantize(x, fmt, name="t")


@pytest.mark.parametrize("fmt", FMTS)
def test_shape_and_argument_errors(fmt: str) -> None:
    block = formats.get(fmt).block_elems
    with pytest.raises(ValueError, match=f"multiple of {block}"):
        ops.quantize(np.zeros((2, block + 16), dtype=np.float32), fmt)
    with pytest.raises(TypeError):
        ops.quantize(np.zeros((1, 256), dtype=np.float64), fmt)
    x = np.ones((2, 256), dtype=np.float32)
    with pytest.raises(ValueError):
        ops.quantize(x, fmt, out=np.empty(7, dtype=np.uint8))
    out = np.empty(formats.nbytes(x.shape, fmt), dtype=np.uint8)
    assert ops.quantize(x, fmt, out=out) is out
    with pytest.raises(ValueError, match="multiple of"):
        ops.dequantize(np.zeros((1, formats.get(fmt).block_bytes + 1), dtype=np.uint8), fmt)
    with pytest.raises(ValueError, match="not a block format"):
        ops.quantize(x, "bf16")
    with pytest.raises(ValueError, match="unknown dtype"):
        ops.quantize(x, "q3_k")


def test_quantize_q8_0_is_the_same_as_the_generic_entry() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 256)).astype(np.float32)
    assert np.array_equal(ops.quantize(x, "q8_0"), ops.quantize_q8_0(x))
    q = ops.quantize_q8_0(x)
    assert np.array_equal(ops.dequantize(q, "q8_0"), ops.dequantize_q8_0(q))
    assert np.array_equal(reference.dequantize(q, "q8_0"), ops.dequantize_q8_0(q))


@pytest.mark.parametrize("fmt", FMTS)
def test_device_upload_quantizes_like_ops(golden, fmt: str) -> None:
    dev = hf2q.Device("host")
    rows = golden["rows"][60:124]  # random rows, finite scales
    want = ops.quantize(rows, fmt)
    for src in (rows, rows.astype(ml_dtypes.bfloat16)):
        buf = dev.upload(src, to=fmt, name="w")
        assert buf.dtype == fmt and buf.shape == rows.shape
        assert buf.byte_len == formats.nbytes(rows.shape, fmt)
        got = buf.numpy()
        expect = want if src.dtype == np.float32 else ops.quantize(src, fmt)
        assert np.array_equal(got.reshape(-1), expect.reshape(-1))
    # A write at a whole-block offset; the read-back checksum decodes the format.
    buf = dev.alloc(rows.shape, fmt)
    dev.write(buf, rows[32:], offset=32 * 256)
    assert np.array_equal(buf.numpy().reshape(rows.shape[0], -1)[32:], want[32:])
    assert dev.verify(buf).ok
    bad = rows.copy()
    bad[3, 9] = np.nan
    with pytest.raises(hf2q.NonFiniteError):
        dev.upload(bad, to=fmt, name="w")


def test_for_row_follows_llama_quantize_fallbacks() -> None:
    assert formats.for_row("q4_k", 512) == "q4_k"
    assert formats.for_row("q6_k", 96) == "q8_0"  # llama-quantize: Q6_K -> Q8_0
    assert formats.for_row("q6_k", 40) == "f16"  # ... and F16 when Q8_0 does not divide either
    assert formats.for_row("q4_0", 40) == "f16"
    assert formats.for_row("q8_0", 40) == "f16"
    assert formats.for_row("bf16", 40) == "bf16"
    assert formats.for_row("q4_k", 40) == "f16"  # Q5_0 would not divide either
    assert formats.for_row("q4_k", 704) == "q5_0"  # Gemma 4's ffn_down_exps rows
    assert formats.for_row("q5_k", 704) == "q5_1"
    assert formats.for_row("q5_0", 40) == "f16"


def _generic_checkpoint(d: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import save_file

    rng = np.random.default_rng(3)
    t = {
        "w512.weight": (rng.standard_normal((4, 512), dtype=np.float32) * 0.05).astype(ml_dtypes.bfloat16),
        "w96.weight": (rng.standard_normal((4, 96), dtype=np.float32) * 0.05).astype(ml_dtypes.bfloat16),
        "w40.weight": (rng.standard_normal((4, 40), dtype=np.float32) * 0.05).astype(ml_dtypes.bfloat16),
        "out_norm.weight": rng.standard_normal(512, dtype=np.float32),
    }
    save_file(t, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    return t


@pytest.mark.parametrize("policy,want", [
    ("q6_k", {"w512.weight": "q6_k", "w96.weight": "q8_0", "w40.weight": "f16", "out_norm.weight": "f32"}),
    ("q4_0", {"w512.weight": "q4_0", "w96.weight": "q4_0", "w40.weight": "f16", "out_norm.weight": "f32"}),
    ("q5_k", {"w512.weight": "q5_k", "w96.weight": "q5_1", "w40.weight": "f16", "out_norm.weight": "f32"}),
])
def test_generic_load_with_a_k_quant_policy(tmp_path: Path, policy: str, want: dict | None) -> None:
    t = _generic_checkpoint(tmp_path)
    if want is None:
        with pytest.raises(ValueError, match="w96.weight.*Q5_1"):
            hf2q.load(tmp_path, hf2q.Device("host"), dtype=policy, progress=False)
        return
    model = hf2q.load(tmp_path, hf2q.Device("host"), dtype=policy, progress=False)
    for name, arr in t.items():
        buf = model[name]
        assert buf.dtype == want[name], name
        f32 = arr.astype(np.float32)
        if buf.dtype in FMTS or buf.dtype == "q8_0":
            expect = ops.quantize(f32, buf.dtype)
        else:
            expect = f32.astype(np.float16 if buf.dtype == "f16" else np.float32)
        assert buf.numpy().tobytes() == expect.tobytes(), name
