"""The format table: every storage format hf2q knows, read from the native core.

One row per format (``hf2q._core.format_table()``, defined once in
``csrc/kernels/formats.h``): a format stores ``block_elems`` logical elements
in ``block_bytes`` bytes. Plain dtypes are blocks of one element; ggml Q8_0 is
32 elements in 34 bytes (docs/Q8_0.md); safetensors' sub-byte F4 / F6 codes
are 2-in-1 and 4-in-3 (docs/SAFETENSORS.md). Device buffers hold the formats
with a native ``id``; the rest only appear in checkpoint files.

Everything that needs a size, a numpy dtype, a safetensors code or a GGUF
type id asks this module::

    >>> from hf2q import formats
    >>> formats.nbytes((256, 512, 2048), "q8_0")
    285212672
    >>> formats.from_safetensors("BF16").name
    'bf16'
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Sequence

from . import _core

if TYPE_CHECKING:
    import numpy as np
else:  # numpy on first use (hf2q._lazy): `import hf2q; Device("host")` does not import it
    from ._lazy import numpy as np

__all__ = [
    "Format",
    "FORMATS",
    "DEVICE_FORMATS",
    "ENCODED_BLOCK_FORMATS",
    "DECODED_BLOCK_FORMATS",
    "get",
    "from_safetensors",
    "from_numpy",
    "safetensors_codes",
    "nbytes",
    "storage_shape",
    "logical_shape",
    "numel",
    "can_convert",
    "sources_of",
]


@functools.lru_cache(maxsize=None)
def _numpy_dtype(name: str) -> np.dtype | None:
    # Cached: a load asks per tensor, and a name numpy lacks (the float8
    # family) costs an attribute miss and an ml_dtypes lookup each time.
    if not name:
        return None
    if hasattr(np, name) and name not in ("bool",):
        return np.dtype(name)
    if name == "bool":
        return np.dtype(np.bool_)
    import ml_dtypes  # bfloat16 and the float8 family

    return np.dtype(getattr(ml_dtypes, name))


@dataclass(frozen=True)
class Format:
    """One row of the format table."""

    name: str
    #: native DType id of a device format, -1 for file-only formats
    id: int
    block_elems: int
    block_bytes: int
    #: numpy / ml_dtypes dtype name of one element ("" for block formats)
    numpy_name: str
    #: safetensors dtype code ("" when no file stores it)
    safetensors: str
    #: ggml type id (-1 when GGUF has none)
    gguf_type: int
    #: the row's kernels encode sources into it (a quantizer: ``sources_of`` lists them)
    encodes: bool = False
    #: the row's kernels decode it to float32 (``to_f32``)
    decodes: bool = False

    @property
    def is_device(self) -> bool:
        """Whether a device buffer can hold this format."""
        return self.id >= 0

    @property
    def is_block(self) -> bool:
        """Block-quantized (more than one element per block, whole bytes per block)."""
        return self.block_elems > 1 and self.numpy_name == ""

    @property
    def bits(self) -> int:
        """Bits per logical element (sub-byte formats: 4, 6; Q8_0: 8.5 is not an int, so 0)."""
        b, r = divmod(self.block_bytes * 8, self.block_elems)
        return b if r == 0 else 0

    @property
    def itemsize(self) -> int:
        """Bytes per element of a plain dtype; 0 for block and sub-byte formats."""
        return self.block_bytes if self.block_elems == 1 else 0

    @property
    def bits_dtype(self) -> np.dtype:
        """The stored bytes as little-endian unsigned integers of the element's
        width (uint8 for block formats): the format's bits without its numpy
        type (bf16 without importing ml_dtypes)."""
        return np.dtype(f"<u{self.itemsize}") if self.itemsize else np.dtype(np.uint8)

    @property
    def storage_dtype(self) -> np.dtype:
        """The numpy dtype of the stored bytes: the element dtype, or uint8 for block formats."""
        dt = _numpy_dtype(self.numpy_name)
        return dt if dt is not None else np.dtype(np.uint8)

    @property
    def numpy_dtype(self) -> np.dtype | None:
        """The numpy dtype of one logical element (None for block / sub-byte formats)."""
        return _numpy_dtype(self.numpy_name)

    def storage_bytes(self, n: int) -> int:
        """Bytes holding ``n`` logical elements (``n`` a multiple of ``block_elems``)."""
        if n % self.block_elems:
            raise ValueError(f"{self.name} needs a multiple of {self.block_elems} elements, got {n}")
        return n // self.block_elems * self.block_bytes

    def __str__(self) -> str:
        return self.name


FORMATS: dict[str, Format] = {
    row[0]: Format(*row) for row in _core.format_table()
}
#: Names of the formats a device buffer can hold, in native id order.
DEVICE_FORMATS: tuple[str, ...] = tuple(f.name for f in sorted(FORMATS.values(), key=lambda f: f.id) if f.is_device)
_BY_SAFETENSORS: dict[str, Format] = {f.safetensors: f for f in FORMATS.values() if f.safetensors}
# Device rows first, so float32 -> f32 (not a file-only row of the same dtype).
_BY_NUMPY: dict[str, Format] = {}
for _f in FORMATS.values():
    if _f.numpy_name:
        _BY_NUMPY.setdefault(_f.numpy_name, _f)


#: Block formats with an encoder, in native id order (what ``hf2q.ops.quantize`` takes).
ENCODED_BLOCK_FORMATS: tuple[str, ...] = tuple(n for n in DEVICE_FORMATS if FORMATS[n].is_block and FORMATS[n].encodes)
#: Block formats with a decoder, in native id order (what ``hf2q.ops.dequantize`` takes).
DECODED_BLOCK_FORMATS: tuple[str, ...] = tuple(n for n in DEVICE_FORMATS if FORMATS[n].is_block and FORMATS[n].decodes)


def get(dtype: str | Format) -> Format:
    """The row of ``dtype``: an hf2q name (``"bf16"``), a safetensors code
    (``"BF16"``) or a :class:`Format`. Unknown names raise ValueError."""
    if isinstance(dtype, Format):
        return dtype
    f = FORMATS.get(dtype)
    if f is None:
        f = _BY_SAFETENSORS.get(dtype)
    if f is None:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(FORMATS)}")
    return f


def from_safetensors(code: str) -> Format:
    """The row of a safetensors dtype code (``"BF16"``); KeyError if none."""
    return _BY_SAFETENSORS[code]


def from_numpy(dtype: object) -> Format | None:
    """The row whose element dtype is the numpy dtype ``dtype`` (None if no row).

    Rows store little-endian elements: a byte-swapped dtype (``">f4"``, whose
    name is still "float32") has no row, so that its bytes are never taken
    as the row's."""
    dt = np.dtype(dtype)  # type: ignore[call-overload]
    if not dt.isnative:  # hf2q runs on little-endian hosts only (_arrays)
        return None
    return _BY_NUMPY.get(dt.name)


def safetensors_codes() -> tuple[str, ...]:
    """Every dtype code the safetensors format knows."""
    return tuple(_BY_SAFETENSORS)


def numel(shape: Iterable[int]) -> int:
    """Element count of ``shape`` (exact Python ints, no overflow)."""
    n = 1
    for d in shape:
        n *= int(d)
    return n


def nbytes(shape: Sequence[int], dtype: str | Format) -> int:
    """Bytes a C-ordered tensor of logical ``shape`` takes in ``dtype``.
    Block formats need a last dimension that is a multiple of the block."""
    f = get(dtype)
    if f.block_elems == 1:  # plain dtypes (the common case, asked per tensor and per piece)
        return numel(shape) * f.block_bytes
    shape = tuple(int(d) for d in shape)
    if f.is_block and (not shape or shape[-1] % f.block_elems):
        raise ValueError(
            f"{f.name} needs a last dimension that is a multiple of {f.block_elems}, got shape {shape}"
        )
    return f.storage_bytes(numel(shape))


def storage_shape(shape: Sequence[int], dtype: str | Format) -> tuple[int, ...]:
    """Shape of the stored bytes as numpy sees them: the logical shape, except
    that a block format's last axis counts bytes (gguf-py's layout for Q8_0)."""
    f = get(dtype)
    shape = tuple(int(d) for d in shape)
    if not f.is_block:
        return shape
    return (*shape[:-1], shape[-1] // f.block_elems * f.block_bytes)


def logical_shape(stored: Sequence[int], dtype: str | Format) -> tuple[int, ...]:
    """Inverse of :func:`storage_shape`: the logical shape of stored bytes."""
    f = get(dtype)
    stored = tuple(int(d) for d in stored)
    if not f.is_block:
        return stored
    return (*stored[:-1], stored[-1] // f.block_bytes * f.block_elems)


def can_convert(src: str | Format, dst: str | Format) -> bool:
    """Whether a device write turns ``src`` data into a ``dst`` buffer in
    native code: a raw copy, or ``src`` among the sources of ``dst``'s row
    (bf16/f16 -> f32 decode, f32/f16/bf16 -> q8_0)."""
    s, d = get(src), get(dst)
    return s.is_device and d.is_device and _can_convert(s.name, d.name)


@functools.lru_cache(maxsize=None)
def _can_convert(src: str, dst: str) -> bool:
    # The native conversion table is fixed when the core is built: ask it
    # once per pair (a plan asks per source piece, a load per tensor).
    return bool(_core.can_convert(src, dst))


def sources_of(dst: str | Format) -> tuple[str, ...]:
    """The other device formats a write converts into ``dst``, in native id order."""
    d = get(dst)
    return tuple(n for n in DEVICE_FORMATS if n != d.name and can_convert(n, d))


# llama-quantize's replacement when a tensor's rows (GGUF ne[0]) do not divide
# the block of the type asked for (llama-quant.cpp, tensor_type_fallback);
# when the replacement does not divide either, F16.
_ROW_FALLBACK = {"q6_k": "q8_0", "q4_k": "q5_0", "q5_k": "q5_1"}


def for_row(fmt: str | Format, ncols: int, tensor: str | None = None) -> str:
    """The format a tensor with rows of ``ncols`` values gets when ``fmt`` is
    asked for: ``fmt`` when its block divides the row, else llama-quantize's
    fallback (``tensor_type_fallback``): q4_k -> q5_0, q5_k -> q5_1,
    q6_k -> q8_0 when 32 divides the row; q8_0 / q4_0 / q5_0 / q5_1 (or a
    fallback that does not divide either) -> f16. ``tensor`` is unused (kept
    for callers that name it)."""
    f = get(fmt)
    ncols = int(ncols)
    if not f.is_block or ncols % f.block_elems == 0:
        return f.name
    nxt = _ROW_FALLBACK.get(f.name)
    if nxt is not None and ncols % get(nxt).block_elems == 0:
        return nxt
    return "f16"
