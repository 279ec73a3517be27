"""Native conversion kernels: BF16/F16 -> F32 decode, ggml's block formats
(Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, and Q5_0 / Q5_1: llama-quantize's row
fallbacks) and scaled FP8 (docs/FP8.md).

Every function is multi-threaded (:func:`hf2q.set_num_threads`) and releases
the GIL; the decoders and Q8_0 use AVX2/F16C or NEON where the CPU has them
(the 4/5/6-bit quantizers are scalar for now). Results are bit-identical to
:mod:`hf2q.reference` for every input; quantized bytes equal ggml's reference
quantizers (``quantize_row_<type>_ref``, no importance matrix) for finite
input (docs/Q8_0.md, docs/KQUANTS.md).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from . import _core, formats
from ._arrays import (
    F32,
    U8,
    check_out,
    half_source,
    nonfinite_error,
    q8_0_shape,
    q8_source,
    quant_source,
)
from .errors import ScaleOverflowWarning

__all__ = [
    "bf16_to_f32",
    "f16_to_f32",
    "quantize_q8_0",
    "dequantize_q8_0",
    "dequantize_fp8",
    "FP8_OUTPUTS",
    "repack_mxfp4",
    "quantize",
    "dequantize",
    "BLOCK_FORMATS",
    "simd_isa",
    "best_isa",
    "set_simd_enabled",
]

_Q8 = formats.get("q8_0")
#: The block formats :func:`quantize` / :func:`dequantize` handle: the format
#: table's block rows whose kernels encode (:data:`hf2q.formats.ENCODED_BLOCK_FORMATS`).
#: :func:`dequantize` also decodes the decode-only block rows (``"mxfp4"``).
BLOCK_FORMATS: tuple[str, ...] = formats.ENCODED_BLOCK_FORMATS


def _aligned(raw: np.ndarray, align: int) -> np.ndarray:
    # A buffer at an odd address (a memoryview slice, say) is legal input; the
    # native kernels read aligned elements, so such input alone is copied.
    return raw if raw.ctypes.data % align == 0 else raw.copy()


def _decode(fn: Any, src: Any, out: np.ndarray | None) -> np.ndarray:
    raw, shape = half_source(src)
    raw = _aligned(raw, 2)
    count = raw.size // 2
    result = np.empty(shape, dtype=F32) if out is None else check_out(out, F32, count)
    fn(raw, result.reshape(-1).view(U8))
    return result


def bf16_to_f32(src: Any, out: np.ndarray | None = None) -> np.ndarray:
    """Widen bfloat16 values to float32 (``bits << 16``, exact).

    ``src``: any C-contiguous buffer of little-endian 16-bit values: bytes,
    memoryview, or an ndarray of uint16 / ``ml_dtypes.bfloat16`` / float16, or
    uint8 raw bytes of even length. Returns ``out`` (or a new array shaped like
    a typed ``src``; 1-D for raw bytes).
    """
    return _decode(_core.bf16_to_f32, src, out)


def f16_to_f32(src: Any, out: np.ndarray | None = None) -> np.ndarray:
    """Widen IEEE float16 values to float32 (exact; subnormals, +-Inf kept; NaN
    payload kept with the quiet bit set, as hardware converters do).
    ``src`` and ``out`` as for :func:`bf16_to_f32`."""
    return _decode(_core.f16_to_f32, src, out)


def quantize_q8_0(src: np.ndarray, out: np.ndarray | None = None, *, name: str | None = None) -> np.ndarray:
    """Quantize to ggml Q8_0 blocks (34 bytes per 32 values), byte-identical to
    ggml's ``quantize_row_q8_0_ref`` for finite input.

    ``src``: C-contiguous float32, float16 or ``ml_dtypes.bfloat16`` array whose
    last dimension is a multiple of 32 (BF16/F16 are widened inside the kernel,
    with no float32 staging array). Returns uint8 of shape
    ``src.shape[:-1] + (src.shape[-1] // 32 * 34,)`` (gguf-py's layout), or
    ``out``, which may have any shape holding ``numel / 32 * 34`` bytes.

    Raises :class:`hf2q.NonFiniteError` on NaN/Inf input, naming the first bad
    flat index (and ``name`` when given). Scales that overflow float16 are
    stored as +Inf, like the reference, with a :class:`hf2q.ScaleOverflowWarning`.
    """
    arr, dtype = quant_source(src)
    nbytes = _Q8.storage_bytes(arr.size)
    result = np.empty(q8_0_shape(arr.shape), dtype=U8) if out is None else check_out(out, U8, nbytes)
    raw = _aligned(arr.reshape(-1).view(U8), dtype.itemsize)
    src_format = formats.from_numpy(dtype)
    assert src_format is not None  # quant_source admits f32 / f16 / bf16 only
    first_bad, inf_scales = _core.quantize_q8_0(raw, src_format.name, result.reshape(-1))
    if first_bad >= 0:
        raise nonfinite_error(arr, first_bad, name)
    if inf_scales:
        where = f"'{name}'" if name else "tensor"
        warnings.warn(
            f"{where}: {inf_scales} Q8_0 block scale(s) overflow float16 (|x| >= 8321040) and are "
            "stored as +Inf, as ggml's reference quantizer does",
            ScaleOverflowWarning,
            stacklevel=2,
        )
    return result


def _block_format(fmt: str, known: tuple[str, ...] = BLOCK_FORMATS) -> str:
    name = formats.get(fmt).name
    if name not in known:
        raise ValueError(f"{fmt!r} is not a block format; expected one of {', '.join(BLOCK_FORMATS)}")
    return name


def quantize(src: np.ndarray, fmt: str, out: np.ndarray | None = None, *, name: str | None = None) -> np.ndarray:
    """Quantize to ggml block format ``fmt`` (one of :data:`BLOCK_FORMATS`),
    byte-identical to ggml's ``quantize_row_<fmt>_ref`` (no importance matrix)
    for finite input.

    ``src``: C-contiguous float32, float16 or ``ml_dtypes.bfloat16`` array
    whose last dimension is a multiple of the block (32 for q8_0 / q4_0, 256
    for the k-quants; blocks never span rows). Returns uint8 of shape
    ``src.shape[:-1] + (last // block_elems * block_bytes,)`` (gguf-py's
    layout), or ``out`` (any shape with that many bytes).

    Raises :class:`hf2q.NonFiniteError` on NaN/Inf input (first bad flat index,
    ``name`` when given). Blocks whose float16 scale overflows are written as
    ggml writes them (an Inf scale) with a :class:`hf2q.ScaleOverflowWarning`.
    """
    fmt = _block_format(fmt)
    if fmt == "q8_0":
        return quantize_q8_0(src, out, name=name)
    f = formats.get(fmt)
    arr, dtype = quant_source(src, fmt=fmt)
    nbytes = f.storage_bytes(arr.size)
    shape = formats.storage_shape(arr.shape, f)
    result = np.empty(shape, dtype=U8) if out is None else check_out(out, U8, nbytes)
    raw = _aligned(arr.reshape(-1).view(U8), dtype.itemsize)
    src_format = formats.from_numpy(dtype)
    assert src_format is not None  # quant_source admits f32 / f16 / bf16 only
    first_bad, inf_scales = _core.quantize_blocks(raw, src_format.name, fmt, result.reshape(-1))
    if first_bad >= 0:
        raise nonfinite_error(arr, first_bad, name)
    if inf_scales:
        where = f"'{name}'" if name else "tensor"
        warnings.warn(
            f"{where}: {inf_scales} {fmt.upper()} block(s) have a scale that overflows float16 and is "
            "stored as Inf, as ggml's reference quantizer does",
            ScaleOverflowWarning,
            stacklevel=2,
        )
    return result


def dequantize(blocks: Any, fmt: str, out: np.ndarray | None = None) -> np.ndarray:
    """ggml block-format bytes (also ``"mxfp4"``, 17-byte blocks) to float32,
    bit-identical to ggml's ``dequantize_row_<fmt>``. ``blocks``: uint8 array whose last dimension is
    a multiple of the block's byte size, or a bytes-like object. Returns shape
    ``blocks.shape[:-1] + (last // block_bytes * block_elems,)``, or ``out``."""
    fmt = _block_format(fmt, formats.DECODED_BLOCK_FORMATS)  # decode-only rows too (mxfp4)
    if fmt == "q8_0":
        return dequantize_q8_0(blocks, out)
    raw, shape = q8_source(blocks, fmt=fmt)
    count = formats.numel(shape)
    result = np.empty(shape, dtype=F32) if out is None else check_out(out, F32, count)
    _core.dequantize_blocks(raw, fmt, result.reshape(-1).view(U8))
    return result


def dequantize_q8_0(blocks: Any, out: np.ndarray | None = None) -> np.ndarray:
    """Q8_0 bytes to float32: ``y = q * f16(d)`` (exact). ``blocks``: uint8
    array whose last dimension is a multiple of 34, or a bytes-like object.
    Returns shape ``blocks.shape[:-1] + (last // 34 * 32,)``, or ``out``."""
    raw, shape = q8_source(blocks)
    count = formats.logical_shape((raw.size,), _Q8)[0]
    result = np.empty(shape, dtype=F32) if out is None else check_out(out, F32, count)
    _core.dequantize_q8_0(raw, result.reshape(-1).view(U8))
    return result


#: The formats :func:`dequantize_fp8` writes in one pass.
FP8_OUTPUTS: tuple[str, ...] = ("f32", "bf16", "f16", "q8_0")
_FP8_SCALES = ("f32", "bf16", "f16")


def _fp8_weight(weight: Any, fmt: str | None) -> tuple[np.ndarray, str]:
    arr = np.asarray(weight)
    if not arr.flags.c_contiguous:
        raise ValueError("weight must be C-contiguous")
    known = formats.from_numpy(arr.dtype)
    if known is not None and known.name in ("f8_e4m3", "f8_e5m2"):
        if fmt is not None and formats.get(fmt).name != known.name:
            raise TypeError(f"weight has dtype {arr.dtype} but fmt={fmt!r} was given")
        return arr.view(U8), known.name
    if arr.dtype != U8:
        raise TypeError(f"weight must be float8_e4m3fn / float8_e5m2, or uint8 bytes with fmt, got {arr.dtype}")
    name = formats.get(fmt or "f8_e4m3").name
    if name not in ("f8_e4m3", "f8_e5m2"):
        raise ValueError(f"fmt must be 'f8_e4m3' or 'f8_e5m2', got {fmt!r}")
    return arr, name


def dequantize_fp8(weight: Any, scale: Any, block: tuple[int, int], *, fmt: str | None = None, to: str = "f32",
                   name: str | None = None, check_finite: bool = False,
                   out: np.ndarray | None = None, scale_fmt: str | None = None) -> tuple[np.ndarray, int]:
    """A scaled FP8 tensor decoded into ``to`` (one of :data:`FP8_OUTPUTS`) in
    one pass: element ``w[..., r, c]`` times ``scale[..., r // br, c // bc]``
    for ``block = (br, bc)`` (edge blocks partial), one float32 multiply
    each, as llama.cpp's converter computes ``weight.float() * scale.float()``.

    ``weight``: C-contiguous ``ml_dtypes.float8_e4m3fn`` / ``float8_e5m2``
    array (or uint8 bytes with ``fmt``) of shape ``[..., R, C]`` (1-D: one
    row); ``scale``: float32 / bfloat16 / float16 array of shape
    ``[..., ceil(R / br), ceil(C / bc)]`` (the same leading dimensions; a
    per-channel scale is ``block = (1, C)``, a per-tensor one
    ``block = (R, C)``). Returns ``(array, first)``: the array of
    ``weight``'s shape in ``to`` (q8_0: uint8 in gguf-py's layout, ``C`` a
    multiple of 32) and the flat index of the first NaN/Inf product, or -1.
    A NaN/Inf raises :class:`hf2q.NonFiniteError` for q8_0 always (the
    quantizer refuses it), for the others when ``check_finite``. ``out``: a
    caller's C-contiguous array of the result's dtype and size, written
    instead of a new one (or its bits: unsigned integers of the output's
    width, uint8 for q8_0). ``scale_fmt`` (``"f32"``, ``"bf16"``, ``"f16"``):
    ``scale`` holds that format's bits as unsigned integers of its width
    (a loader's raw read: no ml_dtypes import for BF16 scales)."""
    w, wfmt = _fp8_weight(weight, fmt)
    if to not in FP8_OUTPUTS:
        raise ValueError(f"to must be one of {', '.join(FP8_OUTPUTS)}, got {to!r}")
    s = np.asarray(scale)
    if scale_fmt is not None:
        sfmt = formats.get(scale_fmt)
        own = formats.from_numpy(s.dtype)  # (the format's own dtype is fine; another float is never reinterpreted)
        if sfmt.name not in _FP8_SCALES or not (
                s.dtype == sfmt.bits_dtype or (own is not None and own.name == sfmt.name)):
            raise TypeError(f"scale_fmt={scale_fmt!r} takes f32 / bf16 / f16 bits as unsigned integers of the "
                            f"format's width, got {s.dtype}")
    else:
        sfmt = formats.from_numpy(s.dtype)
    if sfmt is None or sfmt.name not in _FP8_SCALES:
        raise TypeError(f"scale must be float32, bfloat16 or float16, got {s.dtype}")
    shape = tuple(int(d) for d in np.shape(weight))
    if len(shape) == 0:
        raise ValueError("weight must have at least one dimension")
    rows, cols = (1, shape[0]) if len(shape) == 1 else shape[-2:]
    lead = formats.numel(shape[:-2])
    br, bc = (int(block[0]), int(block[1]))
    if br < 1 or bc < 1:
        raise ValueError(f"block must be two positive sizes, got {tuple(block)}")
    grid = (-(-rows // br), -(-cols // bc))
    want = (*shape[:-2], *grid) if len(shape) >= 2 else grid
    if tuple(s.shape) != want and not (len(shape) == 1 and tuple(s.shape) == grid[1:]):
        raise ValueError(f"scale has shape {list(s.shape)}; block {br}x{bc} of a {list(shape)} weight needs "
                         f"{list(want)}")
    out_fmt = formats.get(to)
    if out_fmt.is_block:
        if cols % out_fmt.block_elems:
            raise ValueError(f"q8_0 rows are whole blocks of 32: the weight's rows hold {cols}")
        want_shape = formats.storage_shape(shape, out_fmt)
    else:
        want_shape = shape
    bits_dt = out_fmt.bits_dtype
    if out is None:
        result = np.empty(want_shape, dtype=U8 if out_fmt.is_block else out_fmt.numpy_dtype)
    else:
        # the result's dtype, or its bits as unsigned integers (a loader's
        # view of a device buffer: BF16 without ml_dtypes)
        want_dt = bits_dt if getattr(out, "dtype", None) == bits_dt else (out_fmt.storage_dtype)
        result = check_out(out, want_dt, formats.numel(want_shape))
    sraw = np.ascontiguousarray(s).reshape(-1).view(U8)
    first, _ = _core.scaled_fp8(w.reshape(-1), wfmt, sraw, sfmt.name, (lead, rows, cols), (br, bc), to,
                                result.reshape(-1).view(U8))
    if first >= 0 and (check_finite or out_fmt.is_block):
        from .errors import NonFiniteError

        multi = tuple(int(i) for i in np.unravel_index(first, shape)) if len(shape) > 1 else None
        where = f" in '{name}'" if name else ""
        raise NonFiniteError(f"non-finite weight{where} at flat index {first}: the FP8 value times its scale "
                             f"is not finite (NaN encoding, non-finite scale, or overflow)", index=first,
                             multi_index=multi, value_class="nan", tensor=name, step="fp8 scale")
    return result, int(first)


def repack_mxfp4(blocks: Any, scales: Any) -> np.ndarray:
    """MXFP4 as gpt-oss (and compressed-tensors' ``mxfp4-pack-quantized``)
    store it into ggml's ``block_mxfp4`` bytes, moving bits only (docs/FP8.md).

    ``blocks``: uint8 ``[..., nb, 16]`` (element 2i of a block in the low
    nibble of byte i, 2i + 1 in the high one); ``scales``: uint8 (or
    ``float8_e8m0fnu``) ``[..., nb]``, one E8M0 exponent per 32 elements.
    Returns uint8 ``[..., nb * 17]``: the rows of a ``[..., nb * 32]`` tensor
    in gguf-py's layout."""
    b = np.ascontiguousarray(blocks)
    s = np.ascontiguousarray(scales)
    if b.dtype != U8 or s.dtype.itemsize != 1 or s.dtype.kind not in "uV":
        raise TypeError(f"blocks must be uint8 and scales uint8 / float8_e8m0fnu, got {b.dtype} and {s.dtype}")
    if b.ndim < 1 or b.shape[-1] != 16 or tuple(s.shape) != tuple(b.shape[:-1]):
        raise ValueError(f"MXFP4 blocks {list(b.shape)} need a last dimension of 16 and scales of shape "
                         f"{list(b.shape[:-1])}, got {list(s.shape)}")
    nb = b.shape[-2] if b.ndim >= 2 else 1
    out = np.empty((*b.shape[:-2], nb * 17), dtype=U8)
    _core.mxfp4_repack(b.reshape(-1), s.reshape(-1).view(U8), out.reshape(-1))
    return out


def simd_isa() -> str:
    """The instruction set the kernels use now: ``"avx2"``, ``"neon"`` or ``"scalar"``."""
    return str(_core.simd_isa())


def best_isa() -> str:
    """The best instruction set this CPU offers to hf2q."""
    return str(_core.best_isa())


def set_simd_enabled(enabled: bool) -> None:
    """Testing hook: ``False`` forces the scalar kernels process-wide (also set
    by ``HF2Q_FORCE_SCALAR=1`` at import). Results are identical either way."""
    _core.set_simd_enabled(bool(enabled))
