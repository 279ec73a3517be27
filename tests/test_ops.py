"""Native kernels (hf2q.ops) against hf2q.reference and gguf-py, byte for byte.

Conformance target: docs/Q8_0.md. Every Q8_0 comparison checks
three implementations: the native kernels (SIMD and forced-scalar paths, 1 and
N threads), the numpy reference, and gguf-py's quantizer on ``x.astype(f32)``.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import subprocess
import sys
import threading
import warnings
import zlib

import gguf
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hf2q
from hf2q import _core, ops
from hf2q import reference as ref

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
Q8 = gguf.GGMLQuantizationType.Q8_0

# Work split of the native kernels (csrc/kernels/dispatch.cpp): 131072 elements
# per chunk for decode and quantize alike.
GRAIN = 1 << 17

HYP = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------- helpers


@contextlib.contextmanager
def simd(enabled: bool):
    before = _core.simd_enabled()
    ops.set_simd_enabled(enabled)
    try:
        yield
    finally:
        ops.set_simd_enabled(before)


@pytest.fixture(params=["simd", "scalar"])
def isa(request):
    """Run the test on the best SIMD path and on the forced scalar path."""
    with simd(request.param == "simd"):
        if request.param == "scalar":
            assert ops.simd_isa() == "scalar"
        else:
            assert ops.simd_isa() == ops.best_isa()
        yield request.param


def f32(bits) -> np.float32:
    return np.array(bits, dtype=np.uint32).view(F32)[()]


def bits32(x) -> int:
    return int(np.array(x, dtype=F32).view(np.uint32))


def gguf_q8(x: np.ndarray) -> np.ndarray:
    """gguf-py's Q8_0 of the float32 widening of x (silencing its numpy warnings
    on the inf-scale and 1/d-overflow rows)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return np.asarray(gguf.quants.quantize(np.asarray(x).astype(F32), Q8))


def gguf_deq(q: np.ndarray) -> np.ndarray:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return np.asarray(gguf.quants.dequantize(q, Q8))


def quantize_native(x: np.ndarray, **kw) -> tuple[np.ndarray, list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        q = ops.quantize_q8_0(x, **kw)
    return q, [m for m in w if issubclass(m.category, hf2q.ScaleOverflowWarning)]


def inf_scale_blocks(q: np.ndarray) -> int:
    d16 = q.reshape(-1, 34)[:, :2].copy().view(np.uint16)
    return int(np.count_nonzero(d16 == 0x7C00))


def check_q8_all(x: np.ndarray, name: str | None = None) -> np.ndarray:
    """Native (SIMD + scalar) == reference == gguf-py; warning iff +Inf scales."""
    expected = gguf_q8(x)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        r = ref.quantize_q8_0(x)
    assert r.dtype == np.uint8 and r.shape == expected.shape
    np.testing.assert_array_equal(r, expected)
    for enabled in (True, False):
        with simd(enabled):
            q, w = quantize_native(x, name=name)
        assert q.dtype == np.uint8
        assert q.shape == expected.shape == (*x.shape[:-1], x.shape[-1] // 32 * 34)
        diff = np.flatnonzero(q.reshape(-1, 34) != expected.reshape(-1, 34))
        assert diff.size == 0, f"simd={enabled}: {diff.size} bytes differ, first block {diff[0] // 34}"
        n_inf = inf_scale_blocks(q)
        if n_inf:
            assert len(w) == 1, "one ScaleOverflowWarning per call"
            msg = str(w[0].message)
            assert str(n_inf) in msg
            if name:
                assert name in msg
        else:
            assert not w
    return expected


def assert_same_f32(a: np.ndarray, b: np.ndarray) -> None:
    """Bitwise float32 equality (NaN payloads included)."""
    assert a.dtype == b.dtype == F32
    assert a.shape == b.shape
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def assert_same_f32_nan_eq(a: np.ndarray, b: np.ndarray) -> None:
    """Bitwise equality, except that any NaN equals any NaN."""
    assert a.shape == b.shape
    an, bn = np.isnan(a), np.isnan(b)
    np.testing.assert_array_equal(an, bn)
    np.testing.assert_array_equal(a.view(np.uint32)[~an], b.view(np.uint32)[~bn])


def make_data(kind: str, rng: np.random.Generator, shape: tuple[int, ...], log_scale: float) -> np.ndarray:
    """Float32 test data of one of several families (all finite)."""
    n = int(np.prod(shape))
    scale = np.float32(np.exp(log_scale)) if np.isfinite(np.float32(np.exp(log_scale))) else np.float32(1e30)
    pow2 = np.float32(2.0) ** int(np.clip(round(log_scale / np.log(2)), -120, 100))
    if kind == "randn":
        x = rng.standard_normal(n) * scale
    elif kind == "uniform":
        x = rng.uniform(-1, 1, n) * scale
    elif kind == "bf16like":
        x = (rng.standard_normal(n) * 0.02 * scale).astype(F32).astype(BF16).astype(F32)
    elif kind == "halfint":
        # Every block holds +-127 (d = 1, id = 1 before the power-of-two scale),
        # so every other element is an exact tie k + 0.5.
        v = rng.integers(-127, 127, n) + 0.5
        v = v.reshape(-1, 32)
        v[:, rng.integers(0, 32)] = 127.0 * rng.choice([-1, 1])
        x = v.reshape(-1) * pow2
    elif kind == "ints":
        v = rng.integers(-127, 128, n).astype(np.float64)
        v = v.reshape(-1, 32)
        v[:, rng.integers(0, 32)] = 127.0
        x = v.reshape(-1) * pow2
    elif kind == "signed_zeros":
        x = rng.standard_normal(n) * scale
        m = rng.random(n)
        x[m < 0.3] = 0.0
        x[m > 0.7] = -0.0
        xb = x.reshape(-1, 32)
        xb[rng.integers(0, xb.shape[0])] = -0.0  # an all -0.0 block
        if xb.shape[0] > 1:
            xb[rng.integers(0, xb.shape[0])] = 0.0  # an all +0.0 block
    elif kind == "subnormal":
        b = rng.integers(0, 0x00800000, n, dtype=np.uint32) | (rng.integers(0, 2, n, dtype=np.uint32) << 31)
        return b.view(F32).reshape(shape)
    elif kind == "bits":
        # Any finite float32: exponent field 0..254, any mantissa and sign.
        b = rng.integers(0, 0xFFFFFFFF, n, dtype=np.uint32, endpoint=True)
        exp = rng.integers(0, 255, n, dtype=np.uint32)
        b = (b & 0x807FFFFF) | (exp << 23)
        return b.view(F32).reshape(shape)
    elif kind == "blockscale":
        # Each block with its own scale over the whole float32 range.
        x = rng.standard_normal((n // 32, 32)) * np.exp(rng.uniform(-100, 88, (n // 32, 1)))
        x = x.reshape(-1)
    else:  # pragma: no cover
        raise AssertionError(kind)
    with np.errstate(over="ignore"):
        x = np.asarray(x, dtype=np.float64).astype(F32)
    x = np.nan_to_num(x, posinf=np.finfo(F32).max, neginf=-np.finfo(F32).max)
    return x.reshape(shape)


def as_dtype(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Cast finite float32 data to dtype, keeping it finite."""
    if dtype == F32:
        return x
    lim = 65504.0 if dtype == F16 else float(ml_dtypes.finfo(BF16).max)
    y = np.clip(x, -lim, lim).astype(dtype)
    assert np.isfinite(y.astype(F32)).all()
    return y


KINDS = ["randn", "uniform", "bf16like", "halfint", "ints", "signed_zeros", "subnormal", "bits", "blockscale"]


# --------------------------------------------------------------------------- environment


def test_no_flush_to_zero():
    """Importing hf2q must not switch the process to FTZ/DAZ (docs/Q8_0.md, build rules)."""
    tiny = np.float32(1e-45)
    assert tiny != 0
    assert np.float32(1e-38) / np.float32(4.0) != 0
    assert ops.simd_isa() in ("avx2", "neon", "scalar")
    assert ops.best_isa() in ("avx2", "neon", "scalar")


def test_simd_toggle_and_threads_api():
    best = ops.best_isa()
    with simd(False):
        assert ops.simd_isa() == "scalar"
    assert ops.simd_isa() == best
    n = hf2q.get_num_threads()
    assert n >= 1
    for bad in (0, -1):
        with pytest.raises(ValueError):
            hf2q.set_num_threads(bad)
    for bad in (True, 1.5, "2", None):
        with pytest.raises(TypeError):
            hf2q.set_num_threads(bad)
    assert hf2q.get_num_threads() == n


def test_environment_variables():
    code = (
        "import hf2q; from hf2q import ops; "
        "print(hf2q.get_num_threads(), ops.simd_isa())"
    )
    env = dict(os.environ, HF2Q_NUM_THREADS="3", HF2Q_FORCE_SCALAR="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["3", "scalar"]
    # Invalid values fall back to the CPUs this process may use.
    env = dict(os.environ, HF2Q_NUM_THREADS="0", HF2Q_FORCE_SCALAR="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(len(os.sched_getaffinity(0))), ops.best_isa()]


# --------------------------------------------------------------------------- BF16 / F16 decode


ALL16 = np.arange(65536, dtype=np.uint32).astype(np.uint16)


def test_bf16_all_patterns(isa):
    expected = (ALL16.astype(np.uint32) << 16).view(F32)
    assert_same_f32(ops.bf16_to_f32(ALL16), expected)
    assert_same_f32(ref.bf16_to_f32(ALL16), expected)
    assert_same_f32(ops.bf16_to_f32(ALL16.view(BF16)), ALL16.view(BF16).astype(F32))


def test_f16_all_patterns(isa):
    got = ops.f16_to_f32(ALL16)
    assert_same_f32(got, ref.f16_to_f32(ALL16))
    assert_same_f32(ops.f16_to_f32(ALL16.view(F16)), got)
    h = ALL16.view(F16)
    nan = np.isnan(h)
    assert nan.sum() == 2 * 1023
    # Non-NaN: exactly numpy's IEEE conversion (subnormals, +-0, +-Inf).
    np.testing.assert_array_equal(got.view(np.uint32)[~nan], h[~nan].astype(F32).view(np.uint32))
    # NaN: sign and payload kept, quiet bit set.
    hb = ALL16[nan].astype(np.uint32)
    gb = got.view(np.uint32)[nan]
    np.testing.assert_array_equal(gb >> 31, hb >> 15)
    np.testing.assert_array_equal((gb >> 23) & 0xFF, 0xFF)
    np.testing.assert_array_equal(gb & 0x00400000, 0x00400000)
    np.testing.assert_array_equal((gb >> 13) & 0x1FF, hb & 0x1FF)
    np.testing.assert_array_equal(gb & 0x1FFF, 0)


@pytest.mark.parametrize("fn", ["bf16_to_f32", "f16_to_f32"])
def test_decode_lengths_and_offsets(isa, fn):
    """Every tail length and every output alignment (head loop) of the SIMD path."""
    rng = np.random.default_rng(1)
    src = rng.integers(0, 65536, 4096 + 64, dtype=np.uint32).astype(np.uint16)
    big = np.empty(4096 + 64, dtype=F32)
    for n in list(range(0, 70)) + [255, 256, 257, 1000, 4095]:
        for off in (0, 1, 3, 7):
            s = src[off : off + n]
            out = big[off : off + n]
            r = getattr(ops, fn)(s, out=out)
            assert r is out
            assert_same_f32(r, getattr(ref, fn)(s))


@pytest.mark.parametrize("fn", ["bf16_to_f32", "f16_to_f32"])
def test_decode_input_kinds(fn):
    u16 = np.array([[0x3F80, 0xC000, 0x0001], [0x7F80, 0xFF80, 0x7FC1]], dtype=np.uint16)
    expected = getattr(ref, fn)(u16)
    assert expected.shape == (2, 3)
    f = getattr(ops, fn)
    flat = expected.reshape(-1)
    raw = u16.tobytes()
    assert_same_f32(f(u16), expected)
    assert_same_f32(f(u16.view(np.int16)), expected)
    assert_same_f32(f(u16.view(F16)), expected)
    assert_same_f32(f(u16.view(BF16)), expected)
    assert_same_f32(f(raw), flat)
    assert_same_f32(f(bytearray(raw)), flat)
    assert_same_f32(f(memoryview(raw)), flat)
    assert_same_f32(f(np.frombuffer(raw, dtype=np.uint8)), flat)
    assert_same_f32(f(memoryview(u16)), flat)  # typed buffer: raw bytes, 1-D result
    # Read-only sources are accepted.
    ro = u16.copy()
    ro.flags.writeable = False
    assert_same_f32(f(ro), expected)
    # 0-d typed input keeps its shape; empty inputs give empty results.
    zero_d = f(np.array(0x3C00, dtype=np.uint16))
    assert zero_d.shape == () and zero_d.dtype == F32
    assert f(b"").shape == (0,)
    assert f(np.zeros((3, 0), dtype=np.uint16)).shape == (3, 0)
    e = np.empty((0,), dtype=F32)
    assert f(b"", out=e) is e
    # out of another shape but the right size: filled and returned.
    out = np.empty((3, 2), dtype=F32)
    assert f(u16, out=out) is out
    assert_same_f32(out.reshape(-1), flat)


@pytest.mark.parametrize("mod", [ops, ref], ids=["ops", "ref"])
@pytest.mark.parametrize("fn", ["bf16_to_f32", "f16_to_f32"])
def test_decode_errors(mod, fn):
    f = getattr(mod, fn)
    with pytest.raises(ValueError, match="even byte length"):
        f(b"\x00\x01\x02")
    with pytest.raises(ValueError, match="even byte length"):
        f(np.zeros(5, dtype=np.uint8))
    for bad in (np.zeros(4, dtype=F32), np.zeros(4, dtype=np.int32), np.zeros(4, dtype=np.float64)):
        with pytest.raises(TypeError, match="16-bit"):
            f(bad)
    for bad in (123, 1.5, "abcd", [1, 2], None):
        with pytest.raises(TypeError, match="bytes-like object or numpy.ndarray"):
            f(bad)
    with pytest.raises(ValueError, match="C-contiguous"):
        f(np.zeros(8, dtype=np.uint16)[::2])
    with pytest.raises(ValueError, match="C-contiguous"):
        f(memoryview(bytes(8))[::2])
    src = np.zeros(4, dtype=np.uint16)
    check_out_errors(lambda out: f(src, out=out), F32, 4)


def check_out_errors(call, dtype: np.dtype, count: int) -> None:
    """Every kind of wrong `out` is refused with a message saying what was expected."""
    good = np.zeros(count, dtype=dtype)
    ro = good.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        call(ro)
    if count:
        with pytest.raises(ValueError, match="C-contiguous"):
            call(np.zeros(2 * count, dtype=dtype)[::2])
    other = np.dtype(np.float64) if dtype == F32 else np.dtype(np.int8)
    with pytest.raises(TypeError, match=f"dtype {dtype}"):
        call(np.zeros(count, dtype=other))
    with pytest.raises(TypeError, match=f"dtype {dtype}"):
        call(np.zeros(count * dtype.itemsize, dtype=np.uint8 if dtype != np.uint8 else np.int8))
    for n in (count + 1, max(count - 1, 0) if count else 1):
        with pytest.raises(ValueError, match=f"must hold {count} elements"):
            call(np.zeros(n, dtype=dtype))
    for bad in (bytearray(count * dtype.itemsize), [0] * count, memoryview(good)):
        with pytest.raises(TypeError, match="numpy.ndarray"):
            call(bad)
    if dtype.itemsize > 1:
        buf = np.zeros(count * dtype.itemsize + 1, dtype=np.uint8)
        mis = np.ndarray((count,), dtype=dtype, buffer=buf, offset=1)
        assert not mis.flags.aligned
        with pytest.raises(ValueError, match="aligned"):
            call(mis)
    # A correct out of any shape works.
    assert call(good) is good


def test_decode_misaligned_out_of_simd_head(isa):
    """out 4-byte aligned but not 32-byte aligned: the scalar head then SIMD body."""
    src = np.arange(100, dtype=np.uint16)
    big = np.zeros(101, dtype=F32)
    assert_same_f32(ops.f16_to_f32(src, out=big[1:]), ref.f16_to_f32(src))


@pytest.mark.parametrize("fn", ["bf16_to_f32", "f16_to_f32"])
def test_decode_source_at_odd_address(isa, fn):
    """A raw byte buffer (memoryview slice, uint8 array) or even a uint16 array
    at an odd address is legal input (no alignment applies to bytes)."""
    vals = np.random.default_rng(12).integers(0, 65536, 1000, dtype=np.uint32).astype(np.uint16)
    raw = bytearray(b"\x00" + vals.tobytes())
    expected = getattr(ref, fn)(vals)
    mv = memoryview(raw)[1:]
    assert_same_f32(getattr(ops, fn)(mv), expected)
    assert_same_f32(getattr(ref, fn)(mv), expected)
    u8 = np.frombuffer(raw, dtype=np.uint8)[1:]
    assert_same_f32(getattr(ops, fn)(u8), expected)
    odd = np.ndarray((1000,), dtype=np.uint16, buffer=raw, offset=1)
    assert not odd.flags.aligned
    assert_same_f32(getattr(ops, fn)(odd), expected)


def test_decode_overlapping_out_refused():
    buf = np.zeros(64, dtype=F32)
    src = buf.view(np.uint16)[:64]
    with pytest.raises(ValueError, match="overlap"):
        ops.bf16_to_f32(src, out=buf)


@HYP
@given(n=st.integers(0, 3000), seed=st.integers(0, 2**32 - 1), fn=st.sampled_from(["bf16_to_f32", "f16_to_f32"]))
def test_decode_hypothesis(n, seed, fn):
    src = np.random.default_rng(seed).integers(0, 65536, n, dtype=np.uint32).astype(np.uint16)
    expected = getattr(ref, fn)(src)
    for enabled in (True, False):
        with simd(enabled):
            assert_same_f32(getattr(ops, fn)(src), expected)
            assert_same_f32(getattr(ops, fn)(src.tobytes()), expected)


# --------------------------------------------------------------------------- f32 -> f16 scale conversion


def f16_native(bits: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(bits, dtype=np.uint32)
    out = np.empty(bits.size, dtype=np.uint16)
    _core.f32_to_f16_rne(bits, out)
    return out


def f16_numpy(bits: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.ascontiguousarray(bits, dtype=np.uint32).view(F32).astype(F16).view(np.uint16)


def test_f32_to_f16_spec_table():
    cases = {
        65504.0: 0x7BFF,
        float(np.nextafter(np.float32(65520), np.float32(0))): 0x7BFF,
        65519.99: 0x7BFF,
        65520.0: 0x7C00,
        65536.0: 0x7C00,
        3.0e38: 0x7C00,
        float("inf"): 0x7C00,
        2.0**-25: 0x0000,
        float(np.nextafter(np.float32(2.0**-25), np.float32(1))): 0x0001,
        2.0**-24: 0x0001,
        1.5 * 2.0**-24: 0x0002,  # tie -> even
        2.5 * 2.0**-24: 0x0002,  # tie -> even
        2.0**-14: 0x0400,
        float(np.nextafter(np.float32(2.0**-14), np.float32(0))): 0x0400,
        1.0: 0x3C00,
        1.0 + 2.0**-11: 0x3C00,  # tie -> even
        1.0 + 3 * 2.0**-11: 0x3C02,  # tie -> even (up)
        0.0: 0x0000,
        1e-45: 0x0000,
    }
    src = np.array(list(cases), dtype=F32).view(np.uint32)
    got = f16_native(src)
    np.testing.assert_array_equal(got, np.array(list(cases.values()), dtype=np.uint16))
    np.testing.assert_array_equal(f16_numpy(src), got)
    np.testing.assert_array_equal(ref.f32_to_f16_bits(src.view(F32)), got)
    # Negative inputs mirror (d is never negative, but the function is general).
    np.testing.assert_array_equal(f16_native(src | 0x80000000), got | 0x8000)


def test_f32_to_f16_sampled_and_boundaries():
    sample = np.arange(0, 0x7F800001, 97, dtype=np.uint32)
    specials = np.array([0x7F800000, 0x7F7FFFFF, 0, 1, 0x00800000], dtype=np.uint32)
    # Dense neighbourhoods of every range boundary of spec section 3.
    centres = [65504.0, 65520.0, 65536.0, 2.0**-25, 2.0**-24, 2.0**-14, 1.0]
    dense = [np.arange(bits32(c) - 4096, bits32(c) + 4096, dtype=np.uint32) for c in centres]
    # Every fp16 rounding midpoint (a tie) and its float32 neighbours.
    h = np.arange(0, 0x7C00, dtype=np.uint32).astype(np.uint16).view(F16).astype(np.float64)
    mids = ((h[:-1] + h[1:]) / 2).astype(F32)
    assert np.array_equal(mids.astype(np.float64), (h[:-1] + h[1:]) / 2)  # exact
    mb = mids.view(np.uint32)
    ties = np.concatenate([mb, mb - 1, mb + 1])
    allb = np.concatenate([sample, specials, *dense, ties])
    allb = np.concatenate([allb, allb[::5] | 0x80000000])
    got = f16_native(allb)
    expected = f16_numpy(allb)
    bad = np.flatnonzero(got != expected)
    assert bad.size == 0, f"{bad.size} differ, e.g. {allb[bad[0]]:#x} -> {got[bad[0]]:#x} != {expected[bad[0]]:#x}"


def test_f32_to_f16_nan_stays_nan():
    nan_bits = np.array([0x7FC00000, 0x7F800001, 0xFFC12345, 0x7FFFFFFF], dtype=np.uint32)
    got = f16_native(nan_bits)
    assert ((got & 0x7C00) == 0x7C00).all() and ((got & 0x3FF) != 0).all()


def test_f32_to_f16_size_mismatch():
    with pytest.raises(ValueError):
        _core.f32_to_f16_rne(np.zeros(3, dtype=np.uint32), np.zeros(2, dtype=np.uint16))


# --------------------------------------------------------------------------- rounding, exhaustive


def _exhaustive_rounding(sign: int) -> None:
    """Products x * id with id = 1 (each block holds 127 -> amax = 127, d = 1,
    id = 1): q must be round-half-away(x) for every float32 x in [-127, 127].
    (|product| never exceeds 127 in Q8_0, so (127, 128] is unreachable here;
    test_reference.py covers the reference rounding over [-128, 128].)

    The expected q comes from the definition of rounding half away from zero:
    |q| = k exactly for k - 0.5 <= |x| < k + 0.5. Every k - 0.5 (k <= 127) is a
    float32, and non-negative float32s are ordered as their bit patterns, so
    each chunk (consecutive bit patterns in order) is a run of 0s, a run of
    1s, ..., cut where the patterns reach those of k - 0.5: exact integer
    comparisons, no floating-point arithmetic in the oracle."""
    nblk = 1 << 20
    per = 31 * nblk
    x = np.zeros((nblk, 32), dtype=F32)
    x[:, 0] = 127.0
    xb = x.view(np.uint32)
    offs = np.arange(per, dtype=np.uint32).reshape(nblk, 31)
    out = np.empty((nblk, 34), dtype=np.uint8)
    top = bits32(127.0) + 1  # exclusive
    half = bits32(0.5)
    sbit = np.uint32(0x80000000 if sign < 0 else 0)
    cut_bits = np.array([bits32(k - 0.5) for k in range(1, 128)], dtype=np.int64)  # |q| >= k from here
    assert (np.diff(cut_bits) > 0).all()
    expected = np.empty(per, dtype=np.int8)
    for start in range(0, top, per):
        np.add(offs, np.uint32(start), out=xb[:, 1:])
        n = min(per, top - start)  # x's 31 columns, row by row: bit patterns start .. start + n - 1
        if n < per:  # last chunk: pad with zeros
            sub = xb[:, 1:]
            sub[offs >= np.uint32(n)] = 0
        if sbit:
            np.bitwise_or(xb[:, 1:], sbit, out=xb[:, 1:])
        ops.quantize_q8_0(x, out=out)
        assert (out[:, :2].view(np.uint16) == 0x3C00).all()  # d = 1.0
        assert (out[:, 2] == 127).all()
        q = out[:, 3:].view(np.int8)
        if start + per <= half:
            # |x| < 0.5 everywhere: every product rounds to 0 (also -0.0 -> 0x00).
            assert not q.any(), f"non-zero q for |x| < 0.5 in chunk at {start:#x}"
            continue
        cuts = np.clip(cut_bits - start, 0, n)  # in the chunk, the first x with |x| >= k - 0.5
        runs = np.diff(np.concatenate(([0], cuts, [n])))  # how many x have |q| = 0, 1, ..., 127
        expected[:n] = np.repeat(np.arange(128, dtype=np.int8), runs)
        expected[n:] = 0  # the zero padding
        if sign < 0:
            np.negative(expected, out=expected)
        bad = np.flatnonzero(q != expected.reshape(nblk, 31))
        if bad.size:
            i = int(bad[0])
            v = f32(int(sbit) | (start + i)) if i < n else -0.0 if sign < 0 else 0.0
            raise AssertionError(f"x={v!r}: q={q.reshape(-1)[i]} != {expected[i]}")


@pytest.mark.slow
@pytest.mark.parametrize("sign", [1, -1], ids=["pos", "neg"])
def test_rounding_exhaustive_via_quantizer(isa, sign):
    _exhaustive_rounding(sign)


# --------------------------------------------------------------------------- Q8_0 vs reference vs gguf-py


@HYP
@given(
    kind=st.sampled_from(KINDS),
    seed=st.integers(0, 2**32 - 1),
    rows=st.integers(1, 3),
    blocks=st.integers(1, 6),
    log_scale=st.one_of(st.floats(-69.1, 69.1), st.sampled_from([-60.0, 60.0, 0.0])),
    dtype=st.sampled_from([F32, F32, BF16, F16]),
)
def test_q8_hypothesis(kind, seed, rows, blocks, log_scale, dtype):
    rng = np.random.default_rng(seed)
    x = as_dtype(make_data(kind, rng, (rows, blocks * 32), log_scale), dtype)
    check_q8_all(x, name="blk.0.test.weight")


@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("kind", KINDS)
def test_q8_families(kind, dtype):
    """Each data family at e^-60, 1 and e^60 (bf16/f16 clipped to their range)."""
    rng = np.random.default_rng(zlib.crc32(f"{kind}{dtype}".encode()))
    for log_scale in (-60.0, 0.0, 60.0):
        x = as_dtype(make_data(kind, rng, (8, 256), log_scale), dtype)
        check_q8_all(x)


def test_q8_powers_of_ten():
    rng = np.random.default_rng(3)
    base = rng.standard_normal((1, 512)).astype(np.float64)
    x = np.concatenate([(base * 10.0**e).astype(F32) for e in range(-30, 31)])
    check_q8_all(x)


def test_q8_bf16_like_ties_are_common_and_exact():
    """bf16 weights: many exact .5 products; half-away must win over ties-to-even."""
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((4096, 32)) * 0.02).astype(F32).astype(BF16)
    xf = x.astype(F32)
    amax = np.abs(xf).max(axis=1, keepdims=True)
    d = (amax / np.float32(127)).astype(F32)
    p = xf * (np.float32(1) / d)
    ties = np.count_nonzero(np.abs(p - np.trunc(p)) == 0.5)
    assert ties > 100
    expected = check_q8_all(x)
    check_q8_all(xf)
    assert np.array_equal(ops.quantize_q8_0(x), expected)


def test_q8_integers_and_half_integers():
    k = np.arange(-127, 128, dtype=F32)
    ints = np.concatenate([k, np.full(288 - 255, 127, dtype=F32)]).reshape(-1, 32)
    check_q8_all(ints)
    halves = np.arange(-126.5, 127.0, 1.0, dtype=F32)  # 254 ties
    # 31 halves per block plus a +-127 so that d = 1 and id = 1 in every block.
    h = np.concatenate([halves, np.full(9 * 31 - 254, 0.5, dtype=F32)]).reshape(9, 31)
    h = np.concatenate([np.array([[127.0], [-127.0]] * 5, dtype=F32)[:9], h], axis=1)
    q = check_q8_all(h).reshape(-1, 34)
    assert (q[:, :2].copy().view(np.uint16) == 0x3C00).all()
    qs = q[:, 3:].view(np.int8).reshape(-1)[:254]
    np.testing.assert_array_equal(qs, np.sign(halves) * np.floor(np.abs(halves) + 0.5))
    # Specific table row: 0.5->1, -0.5->-1, 1.5->2, 2.5->3, -2.5->-3, 126.5->127.
    row = np.zeros(32, dtype=F32)
    row[:7] = [0.5, -0.5, 1.5, 2.5, -2.5, 126.5, 127.0]
    q = check_q8_all(row)
    assert list(q[2:9].view(np.int8)) == [1, -1, 2, 3, -3, 127, 127]
    assert q[0] == 0x00 and q[1] == 0x3C


def test_q8_zero_blocks():
    x = np.zeros((3, 32), dtype=F32)
    x[1] = -0.0
    x[2, ::2] = -0.0
    x[2, 5] = 3.0
    q = check_q8_all(x).reshape(-1, 34)
    assert not q[0].any()
    assert not q[1].any()  # all -0.0: amax = +0, id = 0, -0.0 products store 0x00
    assert q[2, 2 + 4] == 0 and q[2, 2 + 5] == 127
    for dtype in (BF16, F16):
        np.testing.assert_array_equal(ops.quantize_q8_0(x.astype(dtype)), q.reshape(3, 34))


def test_q8_element_equal_to_amax():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2000, 32)).astype(F32) * np.exp(rng.uniform(-80, 80, (2000, 1))).astype(F32)
    i = rng.integers(0, 32, 2000)
    amax = np.abs(x).max(axis=1)
    neg = rng.random(2000) < 0.5
    x[np.arange(2000), i] = np.where(neg, -amax, amax)
    q = check_q8_all(x).reshape(-1, 34)
    qs = q[:, 2:].view(np.int8)[np.arange(2000), i]
    ok = (amax >= np.float32(127 * 2.0**-128))  # 1/d finite
    np.testing.assert_array_equal(qs[ok], np.where(neg, -127, 127)[ok])
    assert (q[:, 2:].view(np.int8) != -128).all()


def _first_amax(pred) -> np.float32:
    """Smallest positive float32 a with pred(a) (pred monotone in a)."""
    lo, hi = 0, 0x7F7FFFFF
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(f32(mid)):
            hi = mid
        else:
            lo = mid + 1
    return f32(lo)


def _d(a):
    return np.float32(a) / np.float32(127.0)


def _inv(a):
    d = _d(a)
    with np.errstate(divide="ignore", over="ignore"):
        return np.float32(1.0) / d if d != 0 else np.float32(0.0)


# Thresholds of spec section 4, computed in float32 arithmetic.
T_D_NONZERO = _first_amax(lambda a: _d(a) != 0)  # amax/127 no longer rounds to 0
T_ID_FINITE = _first_amax(lambda a: _d(a) != 0 and np.isfinite(_inv(a)))
T_D16_NONZERO = _first_amax(lambda a: f16_numpy(np.array([bits32(_d(a))]))[0] != 0)
T_D16_NORMAL = _first_amax(lambda a: f16_numpy(np.array([bits32(_d(a))]))[0] >= 0x0400)
T_D16_INF = _first_amax(lambda a: f16_numpy(np.array([bits32(_d(a))]))[0] == 0x7C00)


def test_section4_thresholds_match_spec():
    assert T_D_NONZERO == pytest.approx(8.97e-44, rel=2e-3)
    assert T_ID_FINITE == pytest.approx(3.73e-37, rel=2e-3)
    assert T_D16_NONZERO == pytest.approx(3.79e-6, rel=2e-3)
    assert T_D16_NORMAL == pytest.approx(7.75e-3, rel=2e-3)
    assert T_D16_INF == np.float32(8321040.0)
    assert _d(T_D16_INF) == np.float32(65520.0)


def _blocks_with_amax(amaxes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One block per amax: random values in [-amax, amax] plus +-amax itself."""
    a = amaxes.astype(F32)[:, None]
    x = (rng.uniform(-1, 1, (a.shape[0], 32)).astype(F32) * a).astype(F32)
    x[:, 7] = a[:, 0]
    x[:, 20] = -a[:, 0] * (rng.random(a.shape[0]) < 0.5)
    x[:, 3] = 0.0
    x[:, 4] = -0.0
    return x


def _around(t: np.float32, k: int = 40) -> np.ndarray:
    b = bits32(t)
    return np.arange(b - k, b + k, dtype=np.uint32).view(F32)


@pytest.mark.parametrize(
    "row",
    ["d16_subnormal", "d16_zero_q_nonzero", "inv_overflow", "d_zero", "d16_inf", "boundaries"],
)
def test_section4_rows(row):
    rng = np.random.default_rng(zlib.crc32(row.encode()))
    if row == "d16_subnormal":  # 3.79e-6 < amax < 7.75e-3
        amax = np.exp(rng.uniform(np.log(3.8e-6), np.log(7.7e-3), 500))
    elif row == "d16_zero_q_nonzero":  # 3.73e-37 < amax <= 3.79e-6
        amax = np.exp(rng.uniform(np.log(3.8e-37), np.log(3.78e-6), 500))
    elif row == "inv_overflow":  # 8.97e-44 <= amax <= 3.73e-37
        amax = np.concatenate(
            [np.exp(rng.uniform(np.log(9e-44), np.log(3.7e-37), 500)), [T_D_NONZERO], [np.nextafter(T_ID_FINITE, np.float32(0))]]
        )
    elif row == "d_zero":  # amax < 8.97e-44
        amax = np.concatenate([np.arange(1, 64) * 1.4e-45, [np.nextafter(T_D_NONZERO, np.float32(0))]])
    elif row == "d16_inf":  # amax >= 8,321,040
        amax = np.concatenate([np.exp(rng.uniform(np.log(8321040), np.log(3.4e38), 500)), [8321040.0]])
    else:
        amax = np.concatenate(
            [_around(t) for t in (T_D_NONZERO, T_ID_FINITE, T_D16_NONZERO, T_D16_NORMAL, T_D16_INF)]
        )
    amax = amax.astype(F32)
    x = _blocks_with_amax(amax, rng)
    q = check_q8_all(x, name="blk.7.row.weight").reshape(-1, 34)
    d16 = q[:, :2].copy().view(np.uint16)[:, 0]
    qs = q[:, 2:].view(np.int8)
    nz = np.count_nonzero(qs, axis=1)
    if row == "d16_subnormal":
        assert ((d16 > 0) & (d16 < 0x0400)).all()
        assert (np.abs(qs[:, 7]) == 127).all()
    elif row == "d16_zero_q_nonzero":
        assert (d16 == 0).all()
        assert (qs[:, 7] == 127).all() and (nz > 1).all()
    elif row in ("inv_overflow", "d_zero"):
        assert (d16 == 0).all()
        assert not qs.any()
    elif row == "d16_inf":
        assert (d16 == 0x7C00).all()
        assert (qs[:, 7] == 127).all()
        # Dequantizes to +-Inf / NaN, exactly like gguf-py.
        y = ops.dequantize_q8_0(q)
        assert np.isinf(y[:, 7]).all()
        assert_same_f32_nan_eq(y, gguf_deq(q))
    assert (qs != -128).all()


def test_scale_overflow_warning_names_tensor():
    x = np.ones((2, 64), dtype=F32)
    x[1, 40] = 1e7
    with pytest.warns(hf2q.ScaleOverflowWarning, match=r"'blk\.3\.ffn_down_exps\.weight'.*\b1\b"):
        q = ops.quantize_q8_0(x, name="blk.3.ffn_down_exps.weight")
    np.testing.assert_array_equal(q, gguf_q8(x))
    assert inf_scale_blocks(q) == 1
    x[0, 0] = -9e6
    with pytest.warns(hf2q.ScaleOverflowWarning, match=r"\b2\b"):
        ops.quantize_q8_0(x)
    assert issubclass(hf2q.ScaleOverflowWarning, UserWarning)
    # No warning just below the threshold.
    x = np.full((1, 32), np.nextafter(np.float32(8321040.0), np.float32(0)), dtype=F32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        q = ops.quantize_q8_0(x)
    assert q.reshape(-1)[:2].view(np.uint16)[0] == 0x7BFF


def test_q8_float32_subnormals():
    rng = np.random.default_rng(6)
    b = rng.integers(1, 0x00800000, (64, 32), dtype=np.uint32) | (rng.integers(0, 2, (64, 32), dtype=np.uint32) << 31)
    q = check_q8_all(b.view(F32))
    assert not q.reshape(-1, 34).any()  # all rows: 1/d overflow or d == 0
    # Subnormals mixed into normal blocks: they quantize to 0.
    x = rng.standard_normal((64, 32)).astype(F32)
    x[:, ::3] = b[:, ::3].view(F32)
    check_q8_all(x)
    check_q8_all(x.astype(BF16))
    check_q8_all(np.array([[6e-8] * 16 + [-6e-8] * 16], dtype=F16))  # f16 subnormals


def test_q8_concurrent_python_threads():
    """Several Python threads quantizing at once (GIL released, pool busy)."""
    rng = np.random.default_rng(8)
    xs = [rng.standard_normal((4 * GRAIN // 1024, 1024)).astype(F32) for _ in range(4)]
    expected = [ref.quantize_q8_0(x) for x in xs]
    results: list = [None] * 4

    def work(i):
        for _ in range(3):
            results[i] = ops.quantize_q8_0(xs[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r, e in zip(results, expected):
        np.testing.assert_array_equal(r, e)


# --------------------------------------------------------------------------- non-finite input


NONFINITE = {
    F32: [(np.float32(np.nan), "nan"), (np.float32(np.inf), "+inf"), (np.float32(-np.inf), "-inf")],
    BF16: [(np.float32(np.nan), "nan"), (np.float32(np.inf), "+inf"), (np.float32(-np.inf), "-inf")],
    F16: [(np.float32(np.nan), "nan"), (np.float32(np.inf), "+inf"), (np.float32(-np.inf), "-inf")],
}


def _bad_bits(dtype):
    """Unusual non-finite bit patterns per dtype (signalling NaN, negative NaN...)."""
    if dtype == F32:
        return [(0x7F800001, "nan"), (0xFFC00000, "nan"), (0x7FFFFFFF, "nan"), (0x7F800000, "+inf"), (0xFF800000, "-inf")]
    if dtype == BF16:
        return [(0x7F81, "nan"), (0xFFC0, "nan"), (0x7FFF, "nan"), (0x7F80, "+inf"), (0xFF80, "-inf")]
    return [(0x7C01, "nan"), (0xFE00, "nan"), (0x7FFF, "nan"), (0x7C00, "+inf"), (0xFC00, "-inf")]


NONFINITE_SHAPE = (4, 3, 65536 + 32)  # ~786k elements: six chunks; rows cross chunk borders
NONFINITE_FIRST = 3 * GRAIN + 17


def nonfinite_case(dtype: np.dtype, k: int) -> tuple[np.ndarray, str]:
    """Bad values in many chunks; the smallest index (NONFINITE_FIRST, holding
    pattern k) sits in chunk 3 before a larger one in the same block, later
    chunks hold more, so a per-chunk minimum is not enough."""
    n = int(np.prod(NONFINITE_SHAPE))
    x = np.ones(n, dtype=dtype)
    xb = x.view(np.uint32 if dtype == F32 else np.uint16)
    patterns = _bad_bits(dtype)
    for p in (n - 1, 5 * GRAIN + 3, 4 * GRAIN, NONFINITE_FIRST + 5, NONFINITE_FIRST + 23):
        xb[p] = patterns[(k + 1) % len(patterns)][0]
    bits, cls = patterns[k]
    xb[NONFINITE_FIRST] = bits
    return x.reshape(NONFINITE_SHAPE), cls


@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=["f32", "bf16", "f16"])
def test_nonfinite_first_index(dtype, isa):
    name = "blk.7.ffn_down_exps.weight"
    multi = tuple(int(i) for i in np.unravel_index(NONFINITE_FIRST, NONFINITE_SHAPE))
    for k in range(len(_bad_bits(dtype))):
        arr, cls = nonfinite_case(dtype, k)
        with pytest.raises(hf2q.NonFiniteError) as ei:
            ops.quantize_q8_0(arr, name=name)
        e = ei.value
        assert (e.index, e.multi_index, e.value_class, e.tensor) == (NONFINITE_FIRST, multi, cls, name)
        msg = str(e)
        assert msg == f"non-finite input in '{name}' at flat index {NONFINITE_FIRST} {multi}: {cls}"
        with pytest.raises(hf2q.NonFiniteError) as er:
            ref.quantize_q8_0(arr, name=name)
        assert str(er.value) == msg
        assert (er.value.index, er.value.multi_index, er.value.value_class) == (NONFINITE_FIRST, multi, cls)
        # Also with out= given (nothing returned, error raised).
        with pytest.raises(hf2q.NonFiniteError):
            ops.quantize_q8_0(arr, out=np.empty(arr.size // 32 * 34, dtype=np.uint8))


@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=["f32", "bf16", "f16"])
def test_nonfinite_every_position_small(dtype, isa):
    """A single bad value at every position of 3 blocks, 1-D input (no multi-index)."""
    for value, cls in NONFINITE[dtype]:
        for pos in range(96):
            x = np.zeros(96, dtype=dtype)
            x[pos] = value.astype(dtype)
            if pos + 1 < 96:
                x[pos + 1 :: 7] = np.float32(np.nan).astype(dtype)
            with pytest.raises(hf2q.NonFiniteError) as ei:
                ops.quantize_q8_0(x)
            e = ei.value
            assert (e.index, e.value_class, e.multi_index, e.tensor) == (pos, cls, None, None)
            assert str(e) == f"non-finite input at flat index {pos}: {cls}"
            assert isinstance(e, hf2q.Hf2qError) and isinstance(e, ValueError)


def test_nonfinite_with_out_and_big_values():
    """Rejection wins over scale overflow: no warning, error raised."""
    x = np.full((2, 32), 1e9, dtype=F32)
    x[1, 31] = np.inf
    out = np.zeros(68, dtype=np.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(hf2q.NonFiniteError) as ei:
            ops.quantize_q8_0(x, out=out)
    assert ei.value.index == 63 and ei.value.multi_index == (1, 31)


# --------------------------------------------------------------------------- quantize API


def test_quantize_shapes_out_and_empty():
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 3, 64)).astype(F32)
    q = ops.quantize_q8_0(x)
    assert q.shape == (2, 3, 68) and q.dtype == np.uint8
    np.testing.assert_array_equal(q, gguf_q8(x))
    out = np.empty((6, 68), dtype=np.uint8)  # any shape of the right size
    assert ops.quantize_q8_0(x, out=out) is out
    np.testing.assert_array_equal(out.reshape(q.shape), q)
    out1 = np.empty(408, dtype=np.uint8)
    assert ops.quantize_q8_0(x, out=out1) is out1
    # Read-only sources are accepted.
    ro = x.copy()
    ro.flags.writeable = False
    np.testing.assert_array_equal(ops.quantize_q8_0(ro), q)
    # Empty inputs.
    for shape, qshape in (((0,), (0,)), ((3, 0), (3, 0)), ((0, 64), (0, 68)), ((2, 0, 32), (2, 0, 34))):
        for dtype in (F32, BF16, F16):
            e = np.zeros(shape, dtype=dtype)
            assert ops.quantize_q8_0(e).shape == qshape
            assert ref.quantize_q8_0(e).shape == qshape
            if dtype == F32 and shape[-1]:  # gguf-py cannot reshape a zero-length last axis
                assert gguf_q8(e).shape == qshape
    assert ops.dequantize_q8_0(np.zeros((0, 68), dtype=np.uint8)).shape == (0, 64)
    assert ops.dequantize_q8_0(b"").shape == (0,)


@pytest.mark.parametrize("mod", [ops, ref], ids=["ops", "ref"])
def test_quantize_errors(mod):
    f = mod.quantize_q8_0
    for bad in (np.zeros(32, dtype=np.float64), np.zeros(32, dtype=np.int32), np.zeros(32, dtype=np.uint16)):
        with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
            f(bad)
    for bad in (b"\x00" * 128, [0.0] * 32, memoryview(np.zeros(32, dtype=F32)), np.float32(1.0), None):
        with pytest.raises(TypeError, match="numpy.ndarray"):
            f(bad)
    with pytest.raises(ValueError, match="C-contiguous"):
        f(np.zeros((64, 64), dtype=F32)[:, :32])
    with pytest.raises(ValueError, match="C-contiguous"):
        f(np.zeros((32, 64), dtype=F32).T)
    with pytest.raises(ValueError, match="multiple of 32"):
        f(np.array(1.0, dtype=F32))  # 0-d
    for shape in ((48,), (2, 33), (32, 3), (1,)):
        with pytest.raises(ValueError, match=r"multiple of 32") as ei:
            f(np.zeros(shape, dtype=F32))
        assert str(shape) in str(ei.value)
    x = np.zeros((2, 64), dtype=F32)
    check_out_errors(lambda out: f(x, out=out), np.dtype(np.uint8), 136)


def test_quantize_overlap_refused():
    buf = np.zeros(64, dtype=F32)
    with pytest.raises(ValueError, match="overlap"):
        ops.quantize_q8_0(buf, out=buf.view(np.uint8)[:68])


@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=["f32", "bf16", "f16"])
def test_quantize_misaligned_source(dtype):
    """Sources not aligned to their element size are accepted (copied first)."""
    x0 = as_dtype(np.random.default_rng(13).standard_normal((3, 64)).astype(F32), dtype)
    buf = np.zeros(x0.nbytes + 1, dtype=np.uint8)
    x = np.ndarray(x0.shape, dtype=dtype, buffer=buf, offset=1)
    assert not x.flags.aligned
    x[...] = x0
    expected = ref.quantize_q8_0(x0)
    np.testing.assert_array_equal(ops.quantize_q8_0(x), expected)
    np.testing.assert_array_equal(ref.quantize_q8_0(x), expected)
    np.testing.assert_array_equal(expected, gguf_q8(x0))
    x[1, 5] = np.float32(np.inf).astype(dtype)
    with pytest.raises(hf2q.NonFiniteError) as ei:
        ops.quantize_q8_0(x)
    assert (ei.value.index, ei.value.multi_index, ei.value.value_class) == (69, (1, 5), "+inf")


# --------------------------------------------------------------------------- dequantize


def test_dequantize_every_scale_pattern(isa):
    """All 65536 d16 patterns x q in {0, +-1, +-127, -128, random}: native ==
    reference bit for bit (NaN payloads included), == gguf-py up to NaN bits."""
    rng = np.random.default_rng(10)
    q = np.zeros((65536, 34), dtype=np.uint8)
    q[:, :2] = ALL16.view(np.uint8).reshape(-1, 2)
    qs = rng.integers(-128, 128, (65536, 32)).astype(np.int8)
    qs[:, :6] = [0, 1, -1, 127, -127, -128]
    q[:, 2:] = qs.view(np.uint8)
    got = ops.dequantize_q8_0(q)
    assert got.shape == (65536, 32)
    assert_same_f32(got, ref.dequantize_q8_0(q))
    assert_same_f32_nan_eq(got, gguf_deq(q))
    finite = np.isfinite(ALL16.view(F16))
    exact = qs[finite].astype(np.float64) * ALL16.view(F16)[finite].astype(np.float64)[:, None]
    np.testing.assert_array_equal(got[finite].astype(np.float64), exact)  # the product is exact


def test_dequantize_inputs_and_errors():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 64)).astype(F32)
    q = ops.quantize_q8_0(x)
    y = ops.dequantize_q8_0(q)
    assert y.shape == (3, 64)
    assert_same_f32(ops.dequantize_q8_0(q.tobytes()), y.reshape(-1))
    assert_same_f32(ops.dequantize_q8_0(bytearray(q.tobytes())), y.reshape(-1))
    assert_same_f32(ops.dequantize_q8_0(memoryview(q.tobytes())), y.reshape(-1))
    ro = q.copy()
    ro.flags.writeable = False
    assert_same_f32(ops.dequantize_q8_0(ro), y)
    out = np.empty(192, dtype=F32)
    assert ops.dequantize_q8_0(q, out=out) is out
    for mod in (ops, ref):
        f = mod.dequantize_q8_0
        with pytest.raises(TypeError, match="uint8"):
            f(q.view(np.int8))
        with pytest.raises(TypeError, match="bytes-like object or numpy.ndarray"):
            f([1, 2, 3])
        with pytest.raises(ValueError, match="multiple of 34"):
            f(np.zeros((2, 35), dtype=np.uint8))
        with pytest.raises(ValueError, match="multiple of 34"):
            f(np.array(1, dtype=np.uint8))
        with pytest.raises(ValueError, match="multiple of 34"):
            f(b"\x00" * 35)
        with pytest.raises(ValueError, match="C-contiguous"):
            f(np.zeros((2, 68), dtype=np.uint8)[:, :34])
        check_out_errors(lambda o: f(q, out=o), F32, 192)


@HYP
@given(
    kind=st.sampled_from(KINDS),
    seed=st.integers(0, 2**32 - 1),
    blocks=st.integers(1, 40),
    log_scale=st.floats(-69.1, 69.1),
)
def test_round_trip_matches_gguf(kind, seed, blocks, log_scale):
    x = make_data(kind, np.random.default_rng(seed), (blocks * 32,), log_scale)
    q, _ = quantize_native(x)
    np.testing.assert_array_equal(q, gguf_q8(x))
    y = ops.dequantize_q8_0(q)
    assert_same_f32(y, ref.dequantize_q8_0(q))
    assert_same_f32_nan_eq(y, gguf_deq(q).reshape(-1))
    with simd(False):
        assert_same_f32(ops.dequantize_q8_0(q), y)
    # Round-trip error bound for normal-scale blocks: |x - y| <= d/2 (+ f16 scale error).
    xb = x.reshape(-1, 32)
    amax = np.abs(xb).max(axis=1)
    ok = (amax > 1e-2) & (amax < 8e6)
    if ok.any():
        err = np.abs(xb - y.reshape(-1, 32))[ok].max(axis=1)
        assert (err <= amax[ok] / 127 * 0.51 + amax[ok] * 2.0**-10).all()


# --------------------------------------------------------------------------- 1 thread vs N threads
#
# Everything that must not depend on the thread count (decode, quantize from each
# dtype, dequantize, the first non-finite index), computed with 1..4 threads:
# in this process via set_num_threads (restored afterwards, with a faulthandler
# watchdog so that a pool deadlock ends the run with a traceback instead of
# hanging it), and in child processes started with HF2Q_NUM_THREADS=t. Rapid
# set_num_threads switching runs in a child with a timeout (a worker restarted
# with a stale generation once deadlocked the pool there: fixed in eac32a0).

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
DTYPES = {"f32": F32, "bf16": BF16, "f16": F16}
TENSOR = "blk.7.ffn_down_exps.weight"


def thread_inputs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    n = 5 * GRAIN + 32 * 7  # six quantize chunks, the last short
    x = (rng.standard_normal(n) * np.exp(rng.uniform(-30, 30, n // 32).repeat(32))).astype(F32).reshape(-1, 96)
    src16 = rng.integers(0, 65536, 5 * GRAIN + 77, dtype=np.uint32).astype(np.uint16)  # six decode chunks
    return x, src16


def digest(a: np.ndarray) -> str:
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def _error_info(f, arr) -> list:
    try:
        f(arr, name=TENSOR)
    except hf2q.NonFiniteError as e:
        return [e.index, list(e.multi_index or ()), e.value_class, e.tensor, str(e)]
    return ["no error"]


def thread_results(mod) -> dict[str, object]:
    """Everything that must not depend on the thread count (or on the ISA)."""
    x, src16 = thread_inputs()
    res: dict[str, object] = {}
    tags = ("simd", "scalar") if mod is ops else ("ref",)
    for tag in tags:
        with simd(tag != "scalar"):
            for fn in ("bf16_to_f32", "f16_to_f32"):
                res[f"{tag}/{fn}"] = digest(getattr(mod, fn)(src16))
                out = np.full(src16.size + 1, np.nan, dtype=F32)[1:]  # not 32-byte aligned
                getattr(mod, fn)(src16, out=out)
                res[f"{tag}/{fn}/out"] = digest(out)
            for dname, dtype in DTYPES.items():
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", hf2q.ScaleOverflowWarning)
                    q = mod.quantize_q8_0(as_dtype(x, dtype))
                res[f"{tag}/q8/{dname}"] = digest(q)
                res[f"{tag}/deq/{dname}"] = digest(mod.dequantize_q8_0(q))
                for k in range(len(_bad_bits(dtype))):
                    res[f"{tag}/bad/{dname}/{k}"] = _error_info(mod.quantize_q8_0, nonfinite_case(dtype, k)[0])
    return res


def _child_main() -> None:  # run by the child processes
    import json

    print(json.dumps({"threads": hf2q.get_num_threads(), "results": thread_results(ops)}))


_REF_THREAD_RESULTS: dict = {}


def _ref_thread_results() -> dict:
    if not _REF_THREAD_RESULTS:
        x, _ = thread_inputs()
        np.testing.assert_array_equal(ref.quantize_q8_0(x[:700]), gguf_q8(x[:700]))
        _REF_THREAD_RESULTS.update(thread_results(ref))
        bad = _REF_THREAD_RESULTS["ref/bad/bf16/0"]
        assert bad[0] == NONFINITE_FIRST and bad[2] == "nan" and bad[3] == TENSOR
    return _REF_THREAD_RESULTS


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_threads_identical_child_process(threads):
    """HF2Q_NUM_THREADS=t in a fresh process (also checks the variable)."""
    import json

    _ref_thread_results()
    code = f"import sys; sys.path.insert(0, {TESTS_DIR!r}); import test_ops; test_ops._child_main()"
    env = dict(os.environ, HF2Q_NUM_THREADS=str(threads))
    env.pop("HF2Q_FORCE_SCALAR", None)
    try:
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"child with HF2Q_NUM_THREADS={threads} hung")
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["threads"] == threads
    for key, value in got["results"].items():
        tag, rest = key.split("/", 1)
        assert value == _REF_THREAD_RESULTS[f"ref/{rest}"], f"{key} differs with {threads} threads"
    assert len(got["results"]) == 2 * len(_REF_THREAD_RESULTS)


@contextlib.contextmanager
def num_threads(n: int):
    """set_num_threads(n), restored afterwards; a 120 s watchdog dumps the
    stacks and exits if a native call never returns."""
    before = hf2q.get_num_threads()
    faulthandler.dump_traceback_later(120, exit=True)
    hf2q.set_num_threads(n)
    try:
        yield
    finally:
        hf2q.set_num_threads(before)
        faulthandler.cancel_dump_traceback_later()
    assert hf2q.get_num_threads() == before


def test_threads_identical_in_process():
    expected = _ref_thread_results()
    for t in (1, 2, 3, 4, 1):
        with num_threads(t):
            assert hf2q.get_num_threads() == t
            got = thread_results(ops)
        for key, value in got.items():
            assert value == expected[f"ref/{key.split('/', 1)[1]}"], f"{key} differs with {t} threads"


SWITCH_CODE = """
import numpy as np, hf2q
from hf2q import ops
x = np.ones(6 * 131072, dtype=np.float32)
expected = ops.quantize_q8_0(x)
n0 = hf2q.get_num_threads()
for i in range(400):
    n = 1 + i % 4
    hf2q.set_num_threads(n)
    assert hf2q.get_num_threads() == n
    assert np.array_equal(ops.quantize_q8_0(x), expected), i
hf2q.set_num_threads(n0)
assert hf2q.get_num_threads() == n0
print("ok")
"""


def test_set_num_threads_switching():
    """set_num_threads between parallel calls (and restoring it) keeps results
    identical and never hangs. Run in a child so that a deadlock is a failure."""
    try:
        p = subprocess.run([sys.executable, "-c", SWITCH_CODE], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("deadlock: quantize_q8_0 never returned after set_num_threads")
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip() == "ok"
