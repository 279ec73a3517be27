"""Pure-numpy reference implementations: the parity oracle for the native
kernels, and a readable specification of what they compute.

They take the same inputs as :mod:`hf2q.ops` and return bit-identical results;
they are slow and allocate freely.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from . import formats
from ._arrays import F32, check_out, half_source, nonfinite_error, q8_0_shape, q8_source, quant_source

__all__ = ["bf16_to_f32", "f16_to_f32", "quantize_q8_0", "dequantize_q8_0", "dequantize", "f32_to_f16_bits",
           "READBACK", "readback_bits"]


def _u16(src: Any) -> tuple[np.ndarray, tuple[int, ...]]:
    raw, shape = half_source(src)
    return raw.view(np.uint16).astype(np.uint32), shape


def _finish(bits: np.ndarray, shape: tuple[int, ...], out: np.ndarray | None) -> np.ndarray:
    values = bits.astype(np.uint32).view(F32).reshape(shape)
    if out is None:
        return values
    check_out(out, F32, values.size)
    out.reshape(-1)[...] = values.reshape(-1)
    return out


def bf16_to_f32(src: Any, out: np.ndarray | None = None) -> np.ndarray:
    """bfloat16 is the top half of a float32: ``bits << 16``."""
    h, shape = _u16(src)
    return _finish(h << 16, shape, out)


def f16_bits_to_f32_bits(h: np.ndarray) -> np.ndarray:
    """IEEE binary16 bits (uint32 array) to binary32 bits, field by field."""
    sign = (h & 0x8000) << 16
    exp = (h >> 10) & 0x1F
    mant = h & 0x3FF
    normal = sign | ((exp + 112) << 23) | (mant << 13)
    # Subnormal (and zero): mant * 2^-24, exact in float32.
    sub = sign | (mant.astype(np.float32) * np.float32(2.0**-24)).view(np.uint32)
    # Inf keeps a zero mantissa; NaN keeps its payload and gets the quiet bit,
    # as the F16C / arm64 hardware conversions do.
    special = sign | 0x7F800000 | (mant << 13) | np.where(mant != 0, 0x00400000, 0).astype(np.uint32)
    return np.where(exp == 0, sub, np.where(exp == 31, special, normal)).astype(np.uint32)


def f16_to_f32(src: Any, out: np.ndarray | None = None) -> np.ndarray:
    """IEEE binary16 to binary32, exact (NaN payload kept, quiet bit set)."""
    h, shape = _u16(src)
    return _finish(f16_bits_to_f32_bits(h), shape, out)


def f32_to_f16_bits(x: np.ndarray) -> np.ndarray:
    """float32 to binary16 bits, round to nearest even, overflow to Inf (numpy's
    own conversion is exactly that for non-NaN input)."""
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=np.float32).astype(np.float16).view(np.uint16)


def _widen(src: np.ndarray) -> np.ndarray:
    if src.dtype == F32:
        return src.reshape(-1)
    bits = src.reshape(-1).view(np.uint16).astype(np.uint32)
    if src.dtype == np.float16:
        return f16_bits_to_f32_bits(bits).view(F32)
    return (bits << 16).view(F32)


def _round_half_away(p: np.ndarray) -> np.ndarray:
    t = np.trunc(p)
    return t + np.where(np.abs(p - t) >= np.float32(0.5), np.copysign(np.float32(1.0), p), np.float32(0.0))


def quantize_q8_0(src: np.ndarray, out: np.ndarray | None = None, *, name: str | None = None) -> np.ndarray:
    """ggml ``quantize_row_q8_0_ref``, block by block of 32 along the last axis:

    1. ``amax = max |x|``; 2. ``d = amax / 127`` (float32); 3. ``id = 1/d`` if
    ``d != 0`` else 0 (the reciprocal of the rounded ``d``); 4. scale stored as
    float16 (round to nearest even); 5. ``q = round_half_away(x * id)`` as int8,
    0 where the product is not finite (``1/d`` overflowed).
    Non-finite input raises :class:`hf2q.NonFiniteError` (first flat index).
    """
    arr, _ = quant_source(src)
    x = _widen(arr)
    bad = np.flatnonzero((x.view(np.uint32) & 0x7F800000) == 0x7F800000)
    if bad.size:
        raise nonfinite_error(arr, int(bad[0]), name)
    blocks = x.reshape(-1, 32)
    amax = np.abs(blocks).max(axis=1, initial=np.float32(0.0))
    d = (amax / np.float32(127.0)).astype(F32)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inv = np.where(d != 0, np.float32(1.0) / np.where(d != 0, d, np.float32(1.0)), np.float32(0.0)).astype(F32)
        p = (blocks * inv[:, None]).astype(F32)
        q = np.where(np.isfinite(p), _round_half_away(p), np.float32(0.0)).astype(np.int8)
    result = np.empty((blocks.shape[0], 34), dtype=np.uint8)
    result[:, :2] = f32_to_f16_bits(d).reshape(-1, 1).view(np.uint8)
    result[:, 2:] = q.view(np.uint8)
    result = result.reshape(q8_0_shape(arr.shape))
    if out is None:
        return result
    check_out(out, np.dtype(np.uint8), result.size)
    out.reshape(-1)[...] = result.reshape(-1)
    return out


def dequantize_q8_0(blocks: Any, out: np.ndarray | None = None) -> np.ndarray:
    """``y = float(q) * float(d16)`` per block, in float32 (exact)."""
    raw, shape = q8_source(blocks)
    b = raw.reshape(-1, 34)
    d = f16_bits_to_f32_bits(b[:, :2].copy().view(np.uint16).reshape(-1).astype(np.uint32)).view(F32)
    with np.errstate(invalid="ignore", over="ignore"):
        y = (b[:, 2:].view(np.int8).astype(F32) * d[:, None]).astype(F32).reshape(shape)
    if out is None:
        return y
    check_out(out, F32, y.size)
    out.reshape(-1)[...] = y.reshape(-1)
    return out


#: The read-back value of each element of a device format, from its stored
#: bytes (uint8, whole blocks): the float32 bits of its decoded value, or for
def f8_to_f32_bits(raw: np.ndarray, fmt: str) -> np.ndarray:
    """FP8 bytes (OCP ``f8_e4m3`` = E4M3FN, ``f8_e5m2``) to float32 bits,
    field by field (docs/FP8.md). E4M3FN NaN (s.1111.111) is 0x7FF00000
    with its sign, as torch's widening gives it (and so llama.cpp's
    converter); E5M2 is the top byte of a binary16."""
    b = np.asarray(raw, dtype=np.uint8).astype(np.uint32)
    if fmt == "f8_e5m2":
        return f16_bits_to_f32_bits(b << 8)
    if fmt != "f8_e4m3":
        raise ValueError(f"not an FP8 format: {fmt!r}")
    sign = (b & 0x80) << 24
    exp = (b >> 3) & 0xF
    mant = b & 0x7
    normal = sign | ((exp + 120) << 23) | (mant << 20)
    sub = sign | (mant.astype(np.float32) * np.float32(2.0**-9)).view(np.uint32)  # exact
    out = np.where(exp == 0, sub, normal)
    return np.where((b & 0x7F) == 0x7F, sign | 0x7FF00000, out).astype(np.uint32)


_MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.float32)


def dequantize_mxfp4(raw: np.ndarray) -> np.ndarray:
    """ggml MXFP4 blocks (17 bytes: E8M0 exponent, 16 bytes of codes, byte j
    holding element j low and j + 16 high) to float32: the doubled E2M1 value
    times ``2^(e - 128)`` (e = 0, 1: the float32 subnormals; 255: 2^127), as
    ggml's ``dequantize_row_mxfp4``."""
    b = np.asarray(raw, dtype=np.uint8).reshape(-1, 17)
    e = b[:, 0].astype(np.uint32)
    half = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << 23).astype(np.uint32).view(np.float32)
    codes = np.concatenate([b[:, 1:] & 0x0F, b[:, 1:] >> 4], axis=1)
    return (_MXFP4_VALUES[codes] * half[:, None]).reshape(-1)


#: integers their own 32 bits (i32) / value (u8); the definition of
#: csrc/device/verify.h, which the native decoders of every backend must
#: match. One entry per device format of :mod:`hf2q.formats`.
READBACK: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "f32": lambda raw: raw.view(np.uint32),
    "f16": lambda raw: f16_to_f32(raw.view(np.uint16)).view(np.uint32),
    "bf16": lambda raw: bf16_to_f32(raw.view(np.uint16)).view(np.uint32),
    "u8": lambda raw: raw.astype(np.uint32),
    "i32": lambda raw: raw.view(np.uint32),
    "q8_0": lambda raw: dequantize_q8_0(raw).view(np.uint32),
    "q4_0": lambda raw: dequantize(raw, "q4_0").view(np.uint32),
    "q4_k": lambda raw: dequantize(raw, "q4_k").view(np.uint32),
    "q5_k": lambda raw: dequantize(raw, "q5_k").view(np.uint32),
    "q6_k": lambda raw: dequantize(raw, "q6_k").view(np.uint32),
    "q5_0": lambda raw: dequantize(raw, "q5_0").view(np.uint32),
    "q5_1": lambda raw: dequantize(raw, "q5_1").view(np.uint32),
    "f8_e4m3": lambda raw: f8_to_f32_bits(raw, "f8_e4m3"),
    "f8_e5m2": lambda raw: f8_to_f32_bits(raw, "f8_e5m2"),
    "mxfp4": lambda raw: dequantize_mxfp4(raw).view(np.uint32),
}


def readback_bits(dtype: str, raw: np.ndarray) -> np.ndarray:
    """:data:`READBACK` of ``dtype`` (a device format's name); a format
    without an oracle raises ValueError rather than being read as another."""
    fn = READBACK.get(dtype)
    if fn is None:
        raise ValueError(f"no numpy read-back oracle for dtype {dtype!r} (hf2q.reference.READBACK)")
    return fn(raw)


# ---------------------------------------------------------------- 4/5/6-bit
# ggml's dequantize_row_<type> (docs/KQUANTS.md), vectorized over blocks;
# every product is one float32 operation in ggml's order.


def _f16(b: np.ndarray) -> np.ndarray:
    """Little-endian float16 bits in the last axis (2 bytes) to float32."""
    bits = b[..., 0].astype(np.uint32) | (b[..., 1].astype(np.uint32) << 8)
    return f16_bits_to_f32_bits(bits).view(F32)


def _scale_min_k4(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: the eight 6-bit scales and mins packed in 12 bytes."""
    sc = sc.astype(np.uint8)
    d = np.empty(sc.shape[:-1] + (8,), dtype=np.uint8)
    m = np.empty_like(d)
    d[..., :4] = sc[..., 0:4] & 63
    m[..., :4] = sc[..., 4:8] & 63
    d[..., 4:] = (sc[..., 8:12] & 0xF) | ((sc[..., 0:4] >> 6) << 4)
    m[..., 4:] = (sc[..., 8:12] >> 4) | ((sc[..., 4:8] >> 6) << 4)
    return d, m


def _dequant_q4_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, 0:2])[:, None]
    qs = b[:, 2:18]
    lo = ((qs & 0xF).astype(np.int32) - 8).astype(F32)
    hi = ((qs >> 4).astype(np.int32) - 8).astype(F32)
    return np.concatenate([lo * d, hi * d], axis=1)


def _dequant_q5(b: np.ndarray, with_min: bool) -> np.ndarray:
    """Q5_0 (``(q - 16) * d``) and Q5_1 (``q * d + m``): 4 nibble bytes' fifth
    bits in a little-endian u32 ``qh`` (bit j: element j)."""
    d = _f16(b[:, 0:2])[:, None]
    o = 4 if with_min else 2
    qh = (b[:, o].astype(np.uint32) | (b[:, o + 1].astype(np.uint32) << 8) | (b[:, o + 2].astype(np.uint32) << 16)
          | (b[:, o + 3].astype(np.uint32) << 24))
    qs = b[:, o + 4:o + 20].astype(np.int32)
    bits = ((qh[:, None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.int32) << 4
    q = np.concatenate([qs & 0xF, qs >> 4], axis=1) | bits
    if not with_min:
        return (q - 16).astype(F32) * d
    return (q.astype(F32) * d).astype(F32) + _f16(b[:, 2:4])[:, None]


def _dequant_affine(b: np.ndarray, high_bits: bool) -> np.ndarray:
    """Q4_K (high_bits False) and Q5_K: d * scale_g * q - dmin * min_g."""
    nb = b.shape[0]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _scale_min_k4(b[:, 4:16])
    d_g = (d[:, None] * sc.astype(F32)).astype(F32)  # [nb, 8]
    m_g = (dmin[:, None] * mn.astype(F32)).astype(F32)
    if high_bits:
        qh = b[:, 16:48].astype(np.int32)
        ql = b[:, 48:176].reshape(nb, 4, 32).astype(np.int32)
    else:
        ql = b[:, 16:144].reshape(nb, 4, 32).astype(np.int32)
    y = np.empty((nb, 8, 32), dtype=F32)
    for c in range(4):
        lo, hi = ql[:, c] & 0xF, ql[:, c] >> 4
        if high_bits:
            lo = lo + ((qh >> (2 * c)) & 1) * 16
            hi = hi + ((qh >> (2 * c + 1)) & 1) * 16
        for g, q in ((2 * c, lo), (2 * c + 1, hi)):
            y[:, g] = d_g[:, g, None] * q.astype(F32) - m_g[:, g, None]
    return y.reshape(nb, 256)


def _dequant_q6_K(b: np.ndarray) -> np.ndarray:
    nb = b.shape[0]
    d = _f16(b[:, 208:210])
    sc = b[:, 192:208].view(np.int8).reshape(nb, 2, 8).astype(F32)
    ql = b[:, 0:128].reshape(nb, 2, 64).astype(np.int32)
    qh = b[:, 128:192].reshape(nb, 2, 32).astype(np.int32)
    y = np.empty((nb, 2, 4, 32), dtype=F32)
    for k, (lo, shift, nib) in enumerate(((0, 0, False), (32, 2, False), (0, 4, True), (32, 6, True))):
        low = ql[:, :, lo:lo + 32]
        low = (low >> 4) if nib else (low & 0xF)
        q = ((low | (((qh >> shift) & 3) << 4)) - 32).astype(F32)  # [nb, 2, 32]
        # group of element l in quarter k: 2k + l // 16 (ggml's is + 2k)
        s = np.repeat(sc[:, :, 2 * k:2 * k + 2], 16, axis=2)  # [nb, 2, 32]
        y[:, :, k] = (d[:, None, None] * s).astype(F32) * q
    return y.reshape(nb, 256)


_DEQUANT = {"q4_0": _dequant_q4_0, "q4_k": lambda b: _dequant_affine(b, False),
            "q5_k": lambda b: _dequant_affine(b, True), "q6_k": _dequant_q6_K,
            "q5_0": lambda b: _dequant_q5(b, False), "q5_1": lambda b: _dequant_q5(b, True)}


def dequantize(blocks: Any, fmt: str, out: np.ndarray | None = None) -> np.ndarray:
    """ggml's ``dequantize_row_<fmt>`` for q8_0, q4_0, q4_k, q5_k, q6_k, q5_0, q5_1:

    - q4_0: ``(q - 8) * d``; q8_0: ``q * d``; q5_0: ``(q - 16) * d``; q5_1: ``q * d + m``;
    - q4_k / q5_k: ``(d * scale_g) * q - (dmin * min_g)`` with 6-bit group
      scales and mins (groups of 32);
    - q6_k: ``(d * scale_g) * (q - 32)`` with signed 8-bit group scales
      (groups of 16).
    """
    if fmt == "q8_0":
        return dequantize_q8_0(blocks, out)
    if fmt not in _DEQUANT:
        raise ValueError(f"no reference dequantizer for {fmt!r}")
    raw, shape = q8_source(blocks, fmt=fmt)
    f = formats.get(fmt)
    with np.errstate(invalid="ignore", over="ignore"):
        y = _DEQUANT[fmt](raw.reshape(-1, f.block_bytes)).astype(F32).reshape(shape)
    if out is None:
        return y
    check_out(out, F32, y.size)
    out.reshape(-1)[...] = y.reshape(-1)
    return out
