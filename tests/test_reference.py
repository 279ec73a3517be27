"""hf2q.reference (the numpy oracle) against independent implementations and
gguf-py: exhaustive rounding, every 16-bit pattern, the scale conversion and
the rows of docs/Q8_0.md (edge cases)."""

from __future__ import annotations

import warnings

import gguf
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hf2q import reference as ref
from hf2q.reference import _round_half_away

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
ALL16 = np.arange(65536, dtype=np.uint32).astype(np.uint16)


def gguf_q8(x: np.ndarray) -> np.ndarray:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return np.asarray(gguf.quants.quantize(np.asarray(x).astype(F32), gguf.GGMLQuantizationType.Q8_0))


def bits32(x) -> int:
    return int(np.array(x, dtype=F32).view(np.uint32))


def half_away_f64(x: np.ndarray) -> np.ndarray:
    """Independent round-half-away: in float64, |x| + 0.5 is exact for float32 x."""
    v = x.astype(np.float64)
    return np.copysign(np.floor(np.abs(v) + 0.5), v)


@pytest.mark.slow
@pytest.mark.parametrize("sign", [0, 0x80000000], ids=["pos", "neg"])
def test_rounding_every_float_in_128(sign):
    """Every float32 with 0.25 <= |x| <= 128 (the range where rounding can give
    a non-zero result), plus every 61st pattern below 0.25 and the boundaries."""
    lo, hi = bits32(0.25), bits32(128.0) + 1
    step = 1 << 24
    # The expected values from the definition: |result| = k exactly for
    # k - 0.5 <= |x| < k + 0.5. Each k - 0.5 is a float32 and non-negative
    # float32s order as their bit patterns, so a chunk of consecutive patterns
    # is a run of 0s, of 1s, ... cut where the patterns reach k - 0.5's
    # (integer comparisons only; half_away_f64 checks the edges below).
    cut_bits = np.array([bits32(k - 0.5) for k in range(1, 129)], dtype=np.int64)
    mags = np.arange(129, dtype=F32) * (np.float32(-1.0) if sign else np.float32(1.0))
    for start in range(lo, hi, step):
        n = min(start + step, hi) - start
        b = np.arange(start, start + n, dtype=np.uint32) | np.uint32(sign)
        x = b.view(F32)
        got = _round_half_away(x)
        assert got.dtype == F32
        runs = np.diff(np.concatenate(([0], np.clip(cut_bits - start, 0, n), [n])))
        bad = np.flatnonzero(got != np.repeat(mags, runs))
        assert bad.size == 0, f"x={x[bad[0]]!r} -> {got[bad[0]]!r}"
    b = np.arange(0, lo, 61, dtype=np.uint32) | np.uint32(sign)
    b = np.concatenate([b, np.arange(lo - 4096, lo, dtype=np.uint32) | np.uint32(sign)])
    got = _round_half_away(b.view(F32))
    assert not got.any()
    # Signs of zero results do not matter for int8, but the value must be 0.
    edge = np.array([0.5, 1.5, 2.5, 126.5, 127.5, 128.0, 0.49999997, 1.4999999], dtype=F32)
    edge = np.concatenate([edge, -edge])
    np.testing.assert_array_equal(_round_half_away(edge), half_away_f64(edge))
    np.testing.assert_array_equal(_round_half_away(edge)[:6], [1, 2, 3, 127, 128, 128])
    # Ties-to-even would differ here: the reference must not use np.round/rint.
    assert not np.array_equal(np.rint(edge), _round_half_away(edge))


def test_bf16_every_pattern():
    got = ref.bf16_to_f32(ALL16)
    np.testing.assert_array_equal(got.view(np.uint32), ALL16.astype(np.uint32) << 16)
    np.testing.assert_array_equal(got.view(np.uint32), ALL16.view(BF16).astype(F32).view(np.uint32))


def test_f16_every_pattern():
    got = ref.f16_to_f32(ALL16).view(np.uint32)
    h = ALL16.view(F16)
    nan = np.isnan(h)
    np.testing.assert_array_equal(got[~nan], h[~nan].astype(F32).view(np.uint32))
    hb = ALL16[nan].astype(np.uint32)
    np.testing.assert_array_equal(got[nan], ((hb & 0x8000) << 16) | 0x7FC00000 | ((hb & 0x3FF) << 13))
    # Field-by-field helper on uint32 input, as the Q8_0 scale decode uses it.
    np.testing.assert_array_equal(ref.f16_bits_to_f32_bits(ALL16.astype(np.uint32)), got)


def test_f32_to_f16_bits_spec_table():
    cases = {
        65504.0: 0x7BFF, 65519.99: 0x7BFF, 65520.0: 0x7C00, 1e30: 0x7C00,
        2.0**-25: 0x0000, 2.0**-24: 0x0001, 1.5 * 2.0**-24: 0x0002, 2.0**-14: 0x0400, 0.0: 0x0000,
        float(np.nextafter(np.float32(2.0**-25), np.float32(1))): 0x0001,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # overflow must not warn
        got = ref.f32_to_f16_bits(np.array(list(cases), dtype=F32))
    np.testing.assert_array_equal(got, np.array(list(cases.values()), dtype=np.uint16))


def test_reference_block_math_by_hand():
    """One block computed step by step as in section 2."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(32).astype(F32)
    amax = np.float32(np.abs(x).max())
    d = np.float32(amax / np.float32(127))
    inv = np.float32(np.float32(1) / d)
    qs = np.array([np.floor(abs(float(np.float32(v * inv))) + 0.5) * np.sign(v) for v in x]).astype(np.int8)
    d16 = np.float32(d).astype(F16).view(np.uint16)
    expected = np.concatenate([np.array([d16], dtype=np.uint16).view(np.uint8), qs.view(np.uint8)])
    np.testing.assert_array_equal(ref.quantize_q8_0(x), expected)
    # 127/amax differs from 1/d in the last bit for some blocks; the reference uses 1/d.
    amax = rng.uniform(1e-3, 1e3, 100000).astype(F32)
    d = (amax / np.float32(127)).astype(F32)
    assert np.count_nonzero((np.float32(1) / d) != (np.float32(127) / amax)) > 0


@pytest.mark.parametrize(
    "amax, d16, zero_qs",
    [
        (1.0, None, False),
        (5e-3, "subnormal", False),  # fp16-subnormal scale
        (1e-7, 0x0000, False),  # d <= 2^-25: d16 = 0, q non-zero
        (1e-38, 0x0000, True),  # 1/d overflows: q all 0
        (9.0e-44, 0x0000, True),
        (5e-44, 0x0000, True),  # d rounds to 0
        (8321040.0, 0x7C00, False),
        (3e38, 0x7C00, False),
    ],
)
def test_section4_rows_reference(amax, d16, zero_qs):
    rng = np.random.default_rng(1)
    x = (rng.uniform(-1, 1, (16, 32)) * amax).astype(F32)
    x[:, 0] = np.float32(amax)
    x[:, 1] = -0.0
    q = ref.quantize_q8_0(x)
    np.testing.assert_array_equal(q, gguf_q8(x))
    got16 = q[:, :2].copy().view(np.uint16)[:, 0]
    if d16 == "subnormal":
        assert ((got16 > 0) & (got16 < 0x400)).all()
    elif d16 is not None:
        assert (got16 == d16).all()
    qs = q[:, 2:].view(np.int8)
    assert (qs[:, 1] == 0).all()
    if zero_qs:
        assert not qs.any()
    else:
        assert (qs[:, 0] == 127).all()


def _data(rng: np.random.Generator, log_scale: float, ties: bool, dtype: np.dtype) -> np.ndarray:
    """Finite test data: randn * e^log_scale, or exact ties (k + 0.5) * 2^e."""
    if ties:
        v = rng.integers(-127, 127, (8, 32)) + 0.5
        v[:, 0] = 127
        x = (v * 2.0 ** round(log_scale / np.log(2) / 2)).astype(F32)
    else:
        x = (rng.standard_normal((8, 32)) * np.exp(log_scale)).astype(F32)
    if dtype != F32:
        lim = 65504.0 if dtype == F16 else 3.3e38
        x = np.clip(np.nan_to_num(x, posinf=lim, neginf=-lim), -lim, lim).astype(dtype)
    x = np.where(np.isfinite(x.astype(F32)), x, np.zeros((), dtype=x.dtype)).astype(x.dtype)
    return x


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    log_scale=st.floats(-100, 88),
    ties=st.booleans(),
    dtype=st.sampled_from([F32, BF16, F16]),
)
def test_reference_vs_gguf(seed, log_scale, ties, dtype):
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore"):
        x = _data(rng, log_scale, ties, dtype)
    q = ref.quantize_q8_0(x)
    np.testing.assert_array_equal(q, gguf_q8(x))
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        y_g = np.asarray(gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0))
        y = ref.dequantize_q8_0(q)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(y_g))
    ok = ~np.isnan(y)
    np.testing.assert_array_equal(y.view(np.uint32)[ok], y_g.view(np.uint32)[ok])


def test_reference_out_and_errors():
    x = np.full((2, 32), 127.0, dtype=F32)  # d = 1: exact round trip
    out = np.empty(68, dtype=np.uint8)
    assert ref.quantize_q8_0(x, out=out) is out
    np.testing.assert_array_equal(out.reshape(2, 34), ref.quantize_q8_0(x))
    y = np.empty((64,), dtype=F32)
    assert ref.dequantize_q8_0(out, out=y) is y
    np.testing.assert_array_equal(y, np.full(64, 127.0, dtype=F32))
    x[1, 3] = np.nan
    with pytest.raises(ValueError, match=r"flat index 35 \(1, 3\): nan"):
        ref.quantize_q8_0(x)
