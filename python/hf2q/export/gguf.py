"""GGUF v3 serialization: header, key/values and tensor infos as bytes, and
the data section's layout (docs/CONVERT.md).

Our own encoder of the format llama.cpp's ``gguf.h`` reads (gguf-py is the
test oracle, never imported here). All integers little-endian:

- header: magic ``GGUF`` (u32 0x46554747), version u32 = 3, tensor count
  u64, key/value count u64;
- each key/value: key (string), value type (u32), value; a string is its
  UTF-8 byte length (u64) then the bytes; an array is the element type
  (u32), the count (u64), then the elements;
- each tensor info: name (string), dimension count (u32), dimensions (u64
  each, ggml order: the fastest-varying first, i.e. numpy's shape reversed),
  ggml type (u32), offset (u64) from the start of the data section;
- padding to the alignment (``general.alignment``, 32 when absent, which is
  what llama.cpp's converter writes), then the data section: every tensor at
  an offset that is a multiple of the alignment, each tensor's bytes followed
  by zero padding up to the next multiple (the last one too).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

__all__ = ["ValueType", "KV", "TensorInfo", "ALIGNMENT", "MAGIC", "VERSION", "encode_header", "padded",
           "GGUFEncodeError"]

MAGIC = 0x46554747  # b"GGUF" read as a little-endian u32
VERSION = 3
#: The converter's (gguf-py's default) data alignment, used when no
#: ``general.alignment`` key is written.
ALIGNMENT = 32


class GGUFEncodeError(ValueError):
    """A key/value or tensor info that GGUF cannot hold as given."""


class ValueType(IntEnum):
    """GGUF value type codes (gguf.h ``gguf_type``)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


_SCALAR = {
    ValueType.UINT8: "B", ValueType.INT8: "b", ValueType.UINT16: "H", ValueType.INT16: "h",
    ValueType.UINT32: "I", ValueType.INT32: "i", ValueType.FLOAT32: "f", ValueType.BOOL: "?",
    ValueType.UINT64: "Q", ValueType.INT64: "q", ValueType.FLOAT64: "d",
}


@dataclass(frozen=True)
class KV:
    """One key/value: ``type`` is the value's type; for an ARRAY,
    ``sub_type`` is the elements' type (arrays of arrays are not used by
    llama.cpp and not supported here)."""

    key: str
    type: ValueType
    value: Any
    sub_type: ValueType | None = None


@dataclass(frozen=True)
class TensorInfo:
    """A tensor's entry in the file: ``shape`` in numpy order (slowest axis
    first), ``ggml_type`` the ggml type id, ``nbytes`` its data length."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    nbytes: int


def padded(n: int, alignment: int = ALIGNMENT) -> int:
    """``n`` rounded up to a multiple of ``alignment``."""
    return (n + alignment - 1) // alignment * alignment


def _string(s: str, what: str) -> bytes:
    try:
        b = s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise GGUFEncodeError(f"{what}: not encodable as UTF-8 ({e.reason})") from None
    return struct.pack("<Q", len(b)) + b


def _scalar(t: ValueType, v: Any, what: str) -> bytes:
    if t == ValueType.STRING:
        if not isinstance(v, str):
            raise GGUFEncodeError(f"{what}: a string value expected, got {type(v).__name__}")
        return _string(v, what)
    fmt = _SCALAR.get(t)
    if fmt is None:
        raise GGUFEncodeError(f"{what}: value type {t!r} is not a scalar type")
    if t == ValueType.BOOL:
        if not isinstance(v, bool):
            raise GGUFEncodeError(f"{what}: a bool value expected, got {type(v).__name__}")
    elif t in (ValueType.FLOAT32, ValueType.FLOAT64):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise GGUFEncodeError(f"{what}: a number expected, got {type(v).__name__}")
    elif isinstance(v, bool) or not isinstance(v, int):
        raise GGUFEncodeError(f"{what}: an integer expected, got {type(v).__name__}")
    try:
        return struct.pack("<" + fmt, v)
    except (struct.error, OverflowError) as e:
        raise GGUFEncodeError(f"{what}: {v!r} does not fit {t.name} ({e})") from None


def _value(kv: KV) -> bytes:
    what = f"key {kv.key!r}"
    if kv.type != ValueType.ARRAY:
        return struct.pack("<I", int(kv.type)) + _scalar(kv.type, kv.value, what)
    if kv.sub_type is None or kv.sub_type == ValueType.ARRAY:
        raise GGUFEncodeError(f"{what}: an array needs a scalar element type")
    items = list(kv.value)
    out = [struct.pack("<IIQ", int(ValueType.ARRAY), int(kv.sub_type), len(items))]
    fmt = _SCALAR.get(kv.sub_type)
    if fmt is not None and kv.sub_type != ValueType.BOOL and items and all(
            type(x) is (float if kv.sub_type in (ValueType.FLOAT32, ValueType.FLOAT64) else int) for x in items):
        # A token list of 200k ids in one pack call, not 200k.
        try:
            out.append(struct.pack(f"<{len(items)}{fmt}", *items))
        except struct.error as e:
            raise GGUFEncodeError(f"{what}: an element does not fit {kv.sub_type.name} ({e})") from None
    else:
        out.extend(_scalar(kv.sub_type, x, f"{what}[{i}]") for i, x in enumerate(items))
    return b"".join(out)


def encode_header(kvs: Sequence[KV], tensors: Sequence[TensorInfo], alignment: int = ALIGNMENT) -> tuple[bytes, list[int]]:
    """The bytes before the data section (header, key/values, tensor infos,
    padding to ``alignment``) and each tensor's offset within the data
    section. Duplicate keys or tensor names are refused (llama.cpp refuses
    such files)."""
    if alignment <= 0 or alignment & (alignment - 1):
        raise GGUFEncodeError(f"alignment {alignment} is not a power of two")
    seen: set[str] = set()
    parts = [struct.pack("<IIQQ", MAGIC, VERSION, len(tensors), len(kvs))]
    for kv in kvs:
        if kv.key in seen:
            raise GGUFEncodeError(f"key {kv.key!r} given twice")
        seen.add(kv.key)
        parts.append(_string(kv.key, "a key"))
        parts.append(_value(kv))
    names: set[str] = set()
    offsets: list[int] = []
    offset = 0
    for t in tensors:
        if t.name in names:
            raise GGUFEncodeError(f"tensor {t.name!r} given twice")
        names.add(t.name)
        if not 1 <= len(t.shape) <= 4 or any(d < 0 for d in t.shape):
            raise GGUFEncodeError(f"tensor {t.name!r}: shape {t.shape} is not 1 to 4 non-negative dimensions")
        if math.prod(t.shape) >= 1 << 63 or t.nbytes < 0:
            raise GGUFEncodeError(f"tensor {t.name!r}: size out of range")
        parts.append(_string(t.name, "a tensor name"))
        parts.append(struct.pack(f"<I{len(t.shape)}QIQ", len(t.shape), *reversed(t.shape), t.ggml_type, offset))
        offsets.append(offset)
        offset += padded(t.nbytes, alignment)
    head = b"".join(parts)
    return head + bytes(padded(len(head), alignment) - len(head)), offsets


def data_size(tensors: Iterable[TensorInfo], alignment: int = ALIGNMENT) -> int:
    """Bytes of the data section (every tensor padded)."""
    return sum(padded(t.nbytes, alignment) for t in tensors)
