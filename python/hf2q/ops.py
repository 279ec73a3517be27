"""Native conversion kernels: BF16/F16 -> F32 decode and ggml's block formats
(Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, and Q5_0 / Q5_1: llama-quantize's row fallbacks).

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
    "quantize",
    "dequantize",
    "BLOCK_FORMATS",
    "simd_isa",
    "best_isa",
    "set_simd_enabled",
]

_Q8 = formats.get("q8_0")
#: The block formats :func:`quantize` / :func:`dequantize` handle.
BLOCK_FORMATS: tuple[str, ...] = ("q8_0", "q4_0", "q4_k", "q5_k", "q6_k", "q5_0", "q5_1")


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


def _block_format(fmt: str) -> str:
    name = formats.get(fmt).name
    if name not in BLOCK_FORMATS:
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
    """ggml block-format bytes to float32, bit-identical to ggml's
    ``dequantize_row_<fmt>``. ``blocks``: uint8 array whose last dimension is
    a multiple of the block's byte size, or a bytes-like object. Returns shape
    ``blocks.shape[:-1] + (last // block_bytes * block_elems,)``, or ``out``."""
    fmt = _block_format(fmt)
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
