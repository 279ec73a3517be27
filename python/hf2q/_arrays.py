"""Input normalisation and ``out`` validation shared by :mod:`hf2q.ops`,
:mod:`hf2q.reference` and the device uploads."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from . import formats
from .errors import NonFiniteError

if sys.byteorder != "little":  # pragma: no cover - no big-endian CI
    raise ImportError("hf2q supports little-endian hosts only")

F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
U8 = np.dtype(np.uint8)
U16 = np.dtype(np.uint16)
# 16-bit dtypes whose bytes are taken as raw little-endian halves (and bfloat16).
HALF_DTYPES = (U16, np.dtype(np.int16), F16)
QUANT_SOURCE_DTYPES = (F32, F16)

# bfloat16 is ml_dtypes' numpy dtype. ml_dtypes is imported only where a
# caller asks for a bfloat16 view (bf16(), ``_arrays.BF16``): importing it
# costs 1.3 s of CPU with ml_dtypes 0.7 (README, "Benchmarks"), and a load
# that never hands out numpy bfloat16 arrays does not need it. An array can
# only have that dtype once something imported ml_dtypes, so the checks
# below (is_bf16) look for it in sys.modules instead of importing it.
_bf16: np.dtype | None = None


def bf16() -> np.dtype:
    """numpy's bfloat16 dtype (``ml_dtypes.bfloat16``), importing ml_dtypes."""
    global _bf16
    if _bf16 is None:
        import ml_dtypes

        _bf16 = np.dtype(ml_dtypes.bfloat16)
    return _bf16


def is_bf16(dtype: Any) -> bool:
    """Whether ``dtype`` is ml_dtypes' bfloat16, without importing ml_dtypes
    (no array has that dtype before something else imported it)."""
    return isinstance(dtype, np.dtype) and "ml_dtypes" in sys.modules and dtype == bf16()


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 values (or values numpy casts to float32 exactly: float16)
    rounded to BF16, as uint16 bits, without ml_dtypes: the cast
    ``astype(ml_dtypes.bfloat16)`` does (Eigen's conversion), bit for bit.
    Round to nearest even by adding 0x7FFF plus the kept part's lowest bit;
    a NaN becomes the quiet NaN of its sign (0x7FC0 / 0xFFC0), so that no NaN
    rounds into an infinity; finite values past the largest BF16 round to
    +-Inf. Temporaries of the input's size (a staged chunk, not a tensor)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    out = ((u + (((u >> 16) & 1) + np.uint32(0x7FFF))) >> 16).astype(np.uint16)  # wraps only for NaNs
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if nan.any():
        out[nan] = np.where((u[nan] >> 31) != 0, np.uint16(0xFFC0), np.uint16(0x7FC0))
    return out


def __getattr__(name: str) -> Any:
    # ``from hf2q._arrays import BF16`` still works; it imports ml_dtypes.
    if name == "BF16":
        return bf16()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def as_byte_array(src: Any, what: str = "src") -> np.ndarray:
    """A C-contiguous buffer or ndarray as an ndarray, without copying."""
    if isinstance(src, np.ndarray):
        arr = src
    else:
        try:
            mv = memoryview(src)
        except TypeError:
            raise TypeError(
                f"{what} must be a bytes-like object or numpy.ndarray, got {type(src).__name__}"
            ) from None
        if not mv.c_contiguous:
            raise ValueError(f"{what} must be C-contiguous")
        arr = np.frombuffer(mv, dtype=U8) if mv.nbytes else np.empty(0, dtype=U8)
    if not arr.flags.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous (got strides {arr.strides} for shape {arr.shape})")
    return arr


def half_source(src: Any, what: str = "src") -> tuple[np.ndarray, tuple[int, ...]]:
    """16-bit little-endian input as (flat uint8 view, element shape)."""
    arr = as_byte_array(src, what)
    if arr.dtype == U8:
        if arr.size % 2:
            raise ValueError(f"{what} holds {arr.size} bytes: 16-bit input needs an even byte length")
        shape: tuple[int, ...] = (arr.size // 2,)
    elif arr.dtype in HALF_DTYPES or is_bf16(arr.dtype):
        shape = tuple(arr.shape)
    else:
        raise TypeError(
            f"{what} must hold little-endian 16-bit values (uint16, float16, bfloat16 or raw uint8 "
            f"bytes), got dtype {arr.dtype}"
        )
    return arr.reshape(-1).view(U8), shape


def quant_source(src: Any, what: str = "src", fmt: str = "q8_0") -> tuple[np.ndarray, np.dtype]:
    """Validate a quantizer input: C-contiguous F32/F16/BF16 whose last axis is
    a multiple of the block of ``fmt``."""
    if not isinstance(src, np.ndarray):
        raise TypeError(f"{what} must be a numpy.ndarray of float32, float16 or bfloat16, got {type(src).__name__}")
    if src.dtype not in QUANT_SOURCE_DTYPES and not is_bf16(src.dtype):
        raise TypeError(f"{what} must have dtype float32, float16 or bfloat16, got {src.dtype}")
    if not src.flags.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous")
    block = formats.get(fmt).block_elems
    if src.ndim == 0 or src.shape[-1] % block != 0:
        raise ValueError(
            f"{fmt.upper()} quantizes along the last axis in blocks of {block}: shape {tuple(src.shape)} "
            f"needs a last dimension that is a multiple of {block}"
        )
    return src, src.dtype


def q8_0_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Shape of the Q8_0 bytes of a tensor of `shape` (last axis in bytes), as gguf-py."""
    return formats.storage_shape(shape, "q8_0")


def q8_source(blocks: Any, what: str = "blocks", fmt: str = "q8_0") -> tuple[np.ndarray, tuple[int, ...]]:
    """Block-format bytes (Q8_0 by default) as (flat uint8 view, shape of the
    dequantized result)."""
    arr = as_byte_array(blocks, what)
    up = fmt.upper()
    if arr.dtype != U8:
        raise TypeError(f"{what} must hold raw {up} bytes (uint8), got dtype {arr.dtype}")
    block_bytes = formats.get(fmt).block_bytes
    if arr.ndim == 0 or arr.shape[-1] % block_bytes != 0:
        raise ValueError(
            f"{up} data of shape {tuple(arr.shape)}: the last dimension must be a multiple of {block_bytes} bytes"
        )
    return arr.reshape(-1), formats.logical_shape(arr.shape, fmt)


def check_out(out: Any, dtype: np.dtype, count: int, what: str = "out") -> np.ndarray:
    """Validate a caller-supplied output array; return it unchanged."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{what} must be a numpy.ndarray of {dtype}, got {type(out).__name__}")
    if out.dtype != dtype:
        raise TypeError(f"{what} must have dtype {dtype}, got {out.dtype}")
    if not out.flags.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous")
    if not out.flags.writeable:
        raise ValueError(f"{what} must be writeable (got a read-only array)")
    if not out.flags.aligned:
        raise ValueError(f"{what} must be aligned to its dtype")
    if out.size != count:
        raise ValueError(f"{what} must hold {count} elements of {dtype}, got {out.size} (shape {out.shape})")
    return out


def value_class(v: float) -> str:
    if np.isnan(v):
        return "nan"
    return "+inf" if v > 0 else "-inf"


def nonfinite_error(src: np.ndarray, index: int, tensor: str | None) -> NonFiniteError:
    flat = src.reshape(-1)
    cls = value_class(float(flat[index]))
    multi = tuple(int(i) for i in np.unravel_index(index, src.shape)) if src.ndim > 1 else None
    where = f" in '{tensor}'" if tensor else ""
    pos = f" {multi}" if multi is not None else ""
    return NonFiniteError(
        f"non-finite input{where} at flat index {index}{pos}: {cls}",
        index=index,
        multi_index=multi,
        value_class=cls,
        tensor=tensor,
    )
