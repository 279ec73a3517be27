"""A strict safetensors reader and checkpoint opener (docs/SAFETENSORS.md).

hf2q parses safetensors headers itself and enforces the reference (Rust
``safetensors`` crate) rule set, plus duplicate-key rejection, before any
tensor byte is read. Tensor bytes are then moved with ``pread`` straight into a
caller-supplied buffer: no mmap (a file truncated under a mapping raises
SIGBUS), EINTR and short reads retried, EOF before the expected end reported as
:class:`~hf2q.SafetensorsError`.

::

    with hf2q.safetensors.open("model.safetensors") as f:
        info = f["fc.weight"]          # TensorInfo(name, dtype, shape, offset, nbytes, path)
        f.read_into("fc.weight", buf)  # any writable C-contiguous buffer of info.nbytes bytes

    with hf2q.safetensors.open_checkpoint("drafter/") as ckpt:   # file, directory or index
        for name in ckpt.keys(): ...
"""

from __future__ import annotations

import itertools
import json
import math
import operator
import os
import re
import stat
import sys
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Sequence, TypeVar, Union, cast

if TYPE_CHECKING:
    import numpy as np
else:  # numpy on first use (hf2q._lazy)
    from ._lazy import numpy as np

from . import _core, formats
from ._frozen import constructor
from ._gc import pausing
from ._files import INDEX_MAX_BYTES, FileIdentity, open_regular, read_capped
from .errors import FileReadError, SafetensorsError

__all__ = [
    "DTYPE_BITS",
    "INDEX_FILE_NAME",
    "MAX_HEADER_SIZE",
    "SINGLE_FILE_NAME",
    "Checkpoint",
    "SafetensorsFile",
    "TensorInfo",
    "open",
    "open_checkpoint",
]

PathLike = Union[str, "os.PathLike[str]"]
_Buf = TypeVar("_Buf")

#: Bits per element of every dtype code the format knows (docs/SAFETENSORS.md),
#: from the format table (:mod:`hf2q.formats`).
DTYPE_BITS: dict[str, int] = {code: formats.from_safetensors(code).bits for code in formats.safetensors_codes()}

#: Largest accepted header length N (decimal bytes), as the reference crate.
MAX_HEADER_SIZE = 100_000_000
U64_MAX = (1 << 64) - 1
INDEX_FILE_NAME = "model.safetensors.index.json"
SINGLE_FILE_NAME = "model.safetensors"
#: Large reads are split into chunks of this size, served in parallel by the
#: native reader (csrc/device/reader.cpp) on the kernels' thread pool.
READ_CHUNK_BYTES = int(_core.READ_CHUNK_BYTES)
_MAX_INDEX_BYTES = INDEX_MAX_BYTES

# Error codes (docs/SAFETENSORS.md), in rule order; DuplicateKey is hf2q's addition.
HEADER_TOO_SMALL = "HeaderTooSmall"
HEADER_TOO_LARGE = "HeaderTooLarge"
INVALID_HEADER_LENGTH = "InvalidHeaderLength"
INVALID_HEADER = "InvalidHeader"
INVALID_HEADER_DESERIALIZATION = "InvalidHeaderDeserialization"
DUPLICATE_KEY = "DuplicateKey"
INVALID_OFFSET = "InvalidOffset"
VALIDATION_OVERFLOW = "ValidationOverflow"
MISALIGNED_SLICE = "MisalignedSlice"
TENSOR_INVALID_INFO = "TensorInvalidInfo"
METADATA_INCOMPLETE_BUFFER = "MetadataIncompleteBuffer"
# I/O and checkpoint codes.
IO_ERROR = "Io"
NOT_A_FILE = "NotAFile"
FILE_CHANGED = "FileChanged"
NOT_REPRESENTABLE = "NotRepresentable"
FILE_TRUNCATED = "FileTruncated"
NO_CHECKPOINT = "NoCheckpoint"
INVALID_INDEX = "InvalidIndex"
INVALID_SHARD_NAME = "InvalidShardName"
MISSING_SHARD = "MissingShard"
TENSOR_NOT_IN_SHARD = "TensorNotInShard"
TENSOR_NOT_IN_INDEX = "TensorNotInIndex"
DUPLICATE_TENSOR = "DuplicateTensor"

def _numpy_dtype(code: str) -> np.dtype | None:
    try:
        dt = formats.from_safetensors(code).numpy_dtype
    except (KeyError, AttributeError):  # unknown code, or an ml_dtypes without that float8
        return None
    return dt.newbyteorder("<") if dt is not None else None


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives. ``offset`` is the **absolute** file offset of its
    first byte (``8 + N + begin``); ``nbytes`` its byte length; ``path`` the file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    path: Path | None = field(default=None, compare=False)

    @property
    def numel(self) -> int:
        """Number of elements (1 for rank 0, 0 for empty tensors)."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def end(self) -> int:
        """Absolute file offset one past the tensor's last byte."""
        return self.offset + self.nbytes

    @property
    def bits_per_element(self) -> int:
        return DTYPE_BITS[self.dtype]


# One per tensor of every header (_frozen: the dataclass __init__ costs 2x as much).
_new_tensor_info = constructor(TensorInfo)


def _err(code: str, path: str, reason: str, tensor: str | None = None) -> SafetensorsError:
    where = f" (tensor '{tensor}')" if tensor is not None else ""
    return SafetensorsError(f"{path}: {reason}{where}", code=code, path=path, tensor=tensor)


# ----------------------------------------------------------------------------- JSON


class _Obj(list):  # type: ignore[type-arg]
    """A JSON object as its ordered (key, value) pairs, duplicates kept."""


class _BadNumber:
    """A JSON number that cannot be a u64 (negative, -0, fraction, exponent, > 20 digits)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _parse_int(text: str) -> int | _BadNumber:
    # JSON forbids leading zeros, so > 20 digits is always > u64::MAX; this also
    # keeps Python's int-digit limit out of reach. "-0" is a float to serde_json.
    if text[0] == "-" or len(text) > 20:
        return _parse_float(text)
    return int(text)


def _parse_float(text: str) -> _BadNumber:
    # serde_json (the reference crate's parser) reads any other number as an
    # f64 and refuses one beyond its range ("number out of range"), wherever
    # it stands, an ignored key included; float() of the text says the same.
    if math.isinf(float(text)):
        raise ValueError(f"number out of range: {text[:40]}")
    return _BadNumber(text)


def _reject_constant(text: str) -> Any:
    raise ValueError(f"{text} is not valid JSON")


class _DuplicateTracker:
    def __init__(self) -> None:
        self.first: str | None = None

    def hook(self, pairs: list[tuple[str, Any]]) -> _Obj:
        # Called once per JSON object: dict() (C) tells whether a key repeats,
        # the loop finds the first one only then.
        if self.first is None and len(pairs) > 1 and len(dict(pairs)) != len(pairs):
            seen: set[str] = set()
            for k, _ in pairs:
                if k in seen:
                    self.first = k
                    break
                seen.add(k)
        return _Obj(pairs)


def _loads(text: str) -> tuple[Any, str | None]:
    """Parse JSON keeping every pair; returns (value, first duplicate key or None).
    Raises ValueError/RecursionError on invalid JSON."""
    tracker = _DuplicateTracker()
    value = json.loads(
        text,
        object_pairs_hook=tracker.hook,
        parse_int=_parse_int,
        parse_float=_parse_float,
        parse_constant=_reject_constant,
    )
    return value, tracker.first


#: A ``\uD800``-``\uDFFF`` escape in JSON text. The parsed tree can only
#: hold a lone surrogate where the text has one: the text comes from a strict
#: UTF-8 decode, which never yields a surrogate code point, so a surrogate in a
#: string can only be written as such an escape (JSON's ``\u`` is lower case,
#: its hex digits either case). A match is not proof of one (``\\uD800`` is an
#: escaped backslash and the letters ``uD800``; a ``\uD83D\uDE00`` pair decodes
#: to one valid character): then the tree walk decides. Scanning the text is
#: ~30x cheaper than walking the tree.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _has_lone_surrogate(text: str, value: Any) -> bool:
    """:func:`_lone_surrogate` of ``value``, the tree parsed from ``text``
    (strictly decoded UTF-8), walking it only when ``text`` has a surrogate escape."""
    return _SURROGATE_ESCAPE.search(text) is not None and _lone_surrogate(value)


def _lone_surrogate(value: Any) -> bool:
    """True if any string (key or value) in a parsed JSON tree holds a lone
    surrogate (``"\\ud800"``): not a Unicode scalar value, so not valid JSON text
    for strict parsers (serde_json)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if not v.isascii():
                try:
                    v.encode("utf-8")
                except UnicodeEncodeError:
                    return True
        elif isinstance(v, _Obj):
            for k, x in v:
                stack.append(k)
                stack.append(x)
        elif isinstance(v, list):
            stack.extend(v)
    return False


def _describe(v: Any) -> str:
    if isinstance(v, _BadNumber):
        return f"number {v.text}"
    if isinstance(v, _Obj):
        return "object"
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return type(v).__name__


def _show(v: Any) -> str:
    return str(v) if type(v) is int else _describe(v)


# ----------------------------------------------------------------------------- header


#: Sort key of the header's (begin, end, name, dtype, shape) tuples.
_BEGIN_END_NAME = operator.itemgetter(0, 1, 2)
_NAME = operator.itemgetter(2)


def _validate_header(
    n: int, header: bytes, file_size: int, path: str
) -> tuple[dict[str, str], list[tuple[int, int, str, str, tuple[int, ...]]]]:
    """Rules 4-11 of docs/SAFETENSORS.md (1-3 are the caller's, from the file length and N); the
    entries in name order."""
    # Rule 4: UTF-8.
    try:
        text = header.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _err(INVALID_HEADER, path, f"header is not valid UTF-8 ({e.reason} at byte {8 + e.start})") from None

    parsed = _scanned_header(header, file_size - 8 - n)
    if parsed is not None:
        metadata, entries, laid_out = parsed
        if laid_out:
            return metadata, entries
        return metadata, _named_order(_check_layout(n, entries, file_size, path))

    # Rule 5: JSON and schema.
    def bad(reason: str, tensor: str | None = None) -> SafetensorsError:
        return _err(INVALID_HEADER_DESERIALIZATION, path, reason, tensor)

    try:
        root, duplicate = _loads(text)
    except (ValueError, RecursionError) as e:
        raise bad(f"header is not valid JSON: {e}") from None
    if not isinstance(root, _Obj):
        raise bad(f"header must be a JSON object, got {_describe(root)}")
    if _has_lone_surrogate(text, root):
        raise bad("header holds a string with a lone UTF-16 surrogate escape")

    metadata: dict[str, str] = {}
    # (begin, end, name, dtype, shape) per tensor: plain tuples, as rules 7-10 walk them.
    entries: list[tuple[int, int, str, str, tuple[int, ...]]] = []
    for key, value in root:
        if key == "__metadata__":
            if value is None:  # serde's Option: null is "no metadata", as the reference crate
                continue
            if not isinstance(value, _Obj):
                raise bad(f"__metadata__ must be an object of string -> string, got {_describe(value)}")
            for mk, mv in value:
                if not isinstance(mv, str):
                    raise bad(f"__metadata__ value for key '{mk}' must be a string, got {_describe(mv)}")
                metadata.setdefault(mk, mv)
            continue
        if not isinstance(value, _Obj):
            raise bad(f"tensor entry must be an object, got {_describe(value)}", key)
        # Every occurrence of a field is checked, the first one kept (a repeated
        # field is a duplicate key, reported by rule 6). The parser yields str,
        # int and list exactly (a JSON object is an _Obj, a list subclass), so
        # the type tests are exact; a dimension or offset must be an int in
        # [0, 2^64) (a bool is not an int here), tested inline: this loop runs
        # once per tensor.
        dtype = shape = offsets = None
        for fk, fv in value:
            if fk == "dtype":
                if type(fv) is not str:
                    raise bad(f"dtype must be a string, got {_describe(fv)}", key)
                if fv not in DTYPE_BITS:
                    raise bad(f"unknown dtype {fv!r}", key)
                if dtype is None:
                    dtype = fv
            elif fk == "shape":
                if type(fv) is not list:
                    raise bad(f"shape must be an array of non-negative integers, got {_describe(fv)}", key)
                for d in fv:
                    if type(d) is not int or d < 0 or d > U64_MAX:
                        raise bad(f"shape holds {_show(d)}: dimensions must be integers in [0, 2^64)", key)
                if shape is None:
                    shape = fv
            elif fk == "data_offsets":
                if type(fv) is not list or len(fv) != 2:
                    desc = f"array of length {len(fv)}" if type(fv) is list else _describe(fv)
                    raise bad(f"data_offsets must be exactly two non-negative integers, got {desc}", key)
                for d in fv:
                    if type(d) is not int or d < 0 or d > U64_MAX:
                        raise bad(f"data_offsets holds {_show(d)}: offsets must be integers in [0, 2^64)", key)
                if offsets is None:
                    offsets = fv
            # unknown fields are ignored, as serde does
        if dtype is None:
            raise bad("tensor entry has no 'dtype'", key)
        if shape is None:
            raise bad("tensor entry has no 'shape'", key)
        if offsets is None:
            raise bad("tensor entry has no 'data_offsets'", key)
        entries.append((offsets[0], offsets[1], key, dtype, tuple(shape)))

    # Rule 6: duplicate keys anywhere.
    if duplicate is not None:
        raise _err(DUPLICATE_KEY, path, f"duplicate JSON key {duplicate!r} in header")
    return metadata, _named_order(_check_layout(n, entries, file_size, path))


class _Unusual(Exception):
    """JSON the fast parse leaves to the careful one (:func:`_parse_plain`)."""


def _unusual(_text: str) -> Any:
    raise _Unusual


def _plain_int(text: str) -> int:
    """An integer as the fast parse takes it: a negative one (or ``-0``),
    which the careful parser reads as a non-u64 number, and one of more
    digits than a u64 has (20), which it may refuse as beyond f64, are left
    to it."""
    if text[0] == "-" or len(text) > 20:
        raise _Unusual
    return int(text)


# (dtype, bits) pairs as the native layout check takes them, from DTYPE_BITS.
_DTYPE_BIT_PAIRS = list(DTYPE_BITS.items())


def _scanned_header(header: bytes, data_bytes: int | None = None
                    ) -> tuple[dict[str, str], list[tuple[int, int, str, str, tuple[int, ...]]], bool] | None:
    """Rules 5 and 6 by the native scan (``_core.scan_header``): a header of
    the plain subset it accepts, with every dtype known, gives the same
    metadata and entries as the careful path; None otherwise. The flag:
    rules 7-11 hold too over a data section of ``data_bytes`` (the native
    accept-path of :func:`_check_layout`), and the entries are in name order."""
    if data_bytes is not None and not 0 <= data_bytes <= U64_MAX:
        data_bytes = None  # no file is that long: the careful check words it
    scanned = _core.scan_header(header, data_bytes, _DTYPE_BIT_PAIRS)
    if scanned is None:
        return None
    metadata, entries, laid_out = scanned
    if not laid_out:
        for e in entries:
            if e[3] not in DTYPE_BITS:
                return None
        # The scan keeps a repeated tensor name (the layout check refuses one);
        # the careful parser words it (Python's hashing: no crafted collisions).
        if len(set(map(_NAME, entries))) != len(entries):
            return None
    return metadata, entries, laid_out


_TENSOR_INFO_FIELDS = tuple(f.name for f in dataclass_fields(TensorInfo))
if _TENSOR_INFO_FIELDS != ("name", "dtype", "shape", "offset", "nbytes", "path"):  # the order the native builder writes
    raise RuntimeError(f"TensorInfo's fields changed ({_TENSOR_INFO_FIELDS}): update _core.scan_header_infos")


def _built_infos(header: bytes, data_bytes: int, base: int, path: Path
                 ) -> tuple[dict[str, str], dict[str, TensorInfo]] | None:
    """Rules 4-11 by the native scan with every :class:`TensorInfo` made
    there (``_core.scan_header_infos``, as :func:`_new_tensor_info` makes
    them: a 60,000-tensor checkpoint's headers make that many), or None
    where :func:`_validate_header` must decide (and word the error). Rule 4
    first: the scan takes strings as bytes."""
    if not 0 <= data_bytes <= U64_MAX or not header.isascii() and not _is_utf8(header):
        return None
    return _core.scan_header_infos(header, data_bytes, _DTYPE_BIT_PAIRS, object.__new__, TensorInfo, base, path,
                                   _TENSOR_INFO_FIELDS)


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _parse_plain(text: str) -> Any:
    """``text`` parsed by the C JSON scanner with one Python call per
    integer (an index holds one: a scan of the text for negative numbers
    took longer, 20-40 ms for a 32,000-tensor index) and none per object
    (objects as :class:`_Obj` pairs, so repeated keys stay visible), or None
    where the careful parser must decide: a float, NaN / Infinity, a
    negative number or ``-0``, an integer of more than 20 digits, a lone
    surrogate escape, invalid JSON."""
    if "\\u" in text and _SURROGATE_ESCAPE.search(text) is not None:
        return None
    try:
        return json.loads(text, object_pairs_hook=_Obj, parse_float=_unusual, parse_constant=_unusual,
                          parse_int=_plain_int)
    except (_Unusual, ValueError, RecursionError):
        return None


def _loads_plain(text: str) -> Any:
    """:func:`_loads` for JSON that holds nothing unusual (see
    :func:`_parse_plain`), with no Python call per object: the
    same tree, or None where the careful parser must decide (a repeated key
    anywhere included)."""
    root = _parse_plain(text)
    if root is None:
        return None
    stack = [root]
    while stack:
        v = stack.pop()
        if type(v) is _Obj:
            if len(v) > 1 and len(dict(v)) != len(v):
                return None
            stack.extend(x for _, x in v if type(x) is _Obj or type(x) is list)
        elif type(v) is list:
            stack.extend(x for x in v if type(x) is _Obj or type(x) is list)
    return root


def _named_order(entries: list[tuple[int, int, str, str, tuple[int, ...]]]
                 ) -> list[tuple[int, int, str, str, tuple[int, ...]]]:
    entries.sort(key=_NAME)
    return entries


def _check_layout(n: int, entries: list[tuple[int, int, str, str, tuple[int, ...]]], file_size: int, path: str
                  ) -> list[tuple[int, int, str, str, tuple[int, ...]]]:
    """Rules 7-11 of docs/SAFETENSORS.md over the parsed entries; returns them."""
    # Rules 7-10, tensor by tensor in (begin, end) order; ties by name for determinism.
    entries.sort(key=_BEGIN_END_NAME)
    previous_end = 0
    for begin, end, name, dtype, shape in entries:
        if begin != previous_end:
            raise _err(
                INVALID_OFFSET,
                path,
                f"data_offsets [{begin}, {end}] must start at {previous_end} (the previous tensor's end): "
                "offsets must be contiguous, without gaps or overlaps",
                name,
            )
        if end < begin:
            raise _err(INVALID_OFFSET, path, f"data_offsets [{begin}, {end}] end before they begin", name)
        previous_end = end
        numel = math.prod(shape)
        if numel == 0 or numel > U64_MAX:
            # The running product decides: a prefix can overflow before a
            # zero dimension brings the total back to 0. With no zero and no
            # overflow at the end, no prefix overflowed (dimensions >= 1).
            numel = 1
            for d in shape:
                numel *= d
                if numel > U64_MAX:
                    raise _err(VALIDATION_OVERFLOW, path, f"element count of shape {list(shape)} overflows u64", name)
        dtype_bits = DTYPE_BITS[dtype]
        bits = numel * dtype_bits
        if bits > U64_MAX:
            raise _err(VALIDATION_OVERFLOW, path, f"bit size of {numel} x {dtype} overflows u64", name)
        if bits % 8:
            raise _err(
                MISALIGNED_SLICE,
                path,
                f"{numel} elements of {dtype} ({dtype_bits} bits) is {bits} bits, not a whole number of bytes",
                name,
            )
        if end - begin != bits // 8:
            raise _err(
                TENSOR_INVALID_INFO,
                path,
                f"data_offsets [{begin}, {end}] span {end - begin} bytes but {dtype} {list(shape)} "
                f"needs {bits // 8}",
                name,
            )

    # Rule 11: the tensors cover the data section exactly.
    expected = 8 + n + previous_end
    if expected != file_size:
        raise _err(
            METADATA_INCOMPLETE_BUFFER,
            path,
            f"header + tensors end at byte {expected} but the file is {file_size} bytes long"
            + ("; the file is cut short (an interrupted download or copy?): re-download it"
               if file_size < expected else ""),
        )
    return entries


# ----------------------------------------------------------------------------- I/O

def _pread_exact(fd: int, dest: memoryview, offset: int, path: str, what: str, tensor: str | None = None) -> None:
    """Fill ``dest`` (a writable byte memoryview) from ``fd`` at ``offset``
    with the native reader (parallel ``pread`` in :data:`READ_CHUNK_BYTES`
    chunks, GIL released, EINTR and short reads retried). The native error's
    code says why it failed: end of file first -> ``FileTruncated``, an OS
    error -> ``Io``; either is a SafetensorsError naming the file (and
    ``tensor``, the tensor being read, if any)."""
    total = len(dest)
    if total == 0:
        return
    try:
        _core.read_file(fd, offset, dest, READ_CHUNK_BYTES)  # the byte memoryview itself: no numpy here
    except FileReadError as e:
        code = FILE_TRUNCATED if getattr(e, "code", IO_ERROR) == FILE_TRUNCATED else IO_ERROR
        if code == FILE_TRUNCATED:
            msg = (f"{path}: file shrank/truncated while reading {what} "
                   f"(bytes {offset}..{offset + total}): {e}; re-download it")
        else:
            msg = f"{path}: reading {what} at offset {offset}: {e}"
        raise SafetensorsError(msg, code=code, path=path, tensor=tensor) from None


def _as_writable_bytes(out: Any, what: str = "out") -> memoryview:
    """A writable, C-contiguous buffer as a flat byte memoryview (no copy)."""
    if isinstance(out, np.ndarray):
        if not out.flags.c_contiguous:
            raise ValueError(f"{what} must be C-contiguous")
        if not out.flags.writeable:
            raise ValueError(f"{what} must be writeable")
        return memoryview(cast(Any, out.reshape(-1).view(np.uint8))) if out.size else memoryview(bytearray())
    try:
        mv = memoryview(out)
    except TypeError:
        raise TypeError(f"{what} must be a writable buffer (bytearray, numpy array, ...), got {type(out).__name__}") from None
    if mv.readonly:
        raise ValueError(f"{what} must be writable (got a read-only buffer)")
    if not mv.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous")
    return mv.cast("B") if mv.nbytes else memoryview(bytearray())


class SafetensorsFile:
    """One validated safetensors file with an open file descriptor.

    Create with :func:`open`. The whole header is validated in the constructor;
    tensor bytes are read only on request, with ``pread``.
    """

    def __init__(self, path: PathLike) -> None:
        self._path = Path(os.fspath(path))
        spath = str(self._path)

        def error(reason: str, e: OSError | None) -> SafetensorsError:
            code = IO_ERROR if e is not None else NOT_A_FILE
            return SafetensorsError(f"{spath}: {reason}", code=code, path=spath)

        fd = -1
        try:
            fd, st = open_regular(spath, error)  # non-blocking open, regular files only
            self._fd = fd
            self._finalizer = weakref.finalize(self, os.close, fd)
            # Not at interpreter exit: weakref.finalize's atexit hook would
            # close the descriptor under a daemon thread still reading it
            # (EBADF, or another file's bytes once the number is reused);
            # the process's exit closes it.
            self._finalizer.atexit = False
        except BaseException:  # e.g. KeyboardInterrupt before the finalizer owns fd
            if fd >= 0 and not hasattr(self, "_finalizer"):
                os.close(fd)
            raise
        try:
            self._init(spath, st)
        except BaseException:
            self.close()
            raise

    def _init(self, spath: str, st: os.stat_result) -> None:
        self._identity = FileIdentity.of(st)
        self._identity_key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        size = st.st_size
        if size < 8:
            raise _err(HEADER_TOO_SMALL, spath, f"file is {size} bytes, shorter than the 8-byte header length")
        prefix = bytearray(8)
        _pread_exact(self._fd, memoryview(prefix), 0, spath, "the header length")
        n = int.from_bytes(prefix, "little")
        if n > MAX_HEADER_SIZE:
            raise _err(HEADER_TOO_LARGE, spath, f"not a safetensors file: its first 8 bytes give a header length of {n:,}, "
                       f"over the {MAX_HEADER_SIZE:,}-byte limit")
        if 8 + n > size:
            raise _err(
                INVALID_HEADER_LENGTH, spath, f"not a safetensors file, or a truncated one: its header length {n:,} "
                f"runs past the end of the {size:,}-byte file"
            )
        header = bytearray(n)
        if n:
            _pread_exact(self._fd, memoryview(header), 8, spath, "the header")
        base = 8 + n
        path = self._path
        self._header_size = n
        self._file_size = size
        self._tensors: dict[str, TensorInfo]
        text = bytes(header)
        built = _built_infos(text, size - base, base, path)
        if built is not None:  # the common case: every TensorInfo made natively
            self._metadata, self._tensors = built
            return
        metadata, raw = _validate_header(n, text, size, spath)
        self._metadata = metadata
        make = _new_tensor_info
        self._tensors = {
            name: make(name, dtype, shape, base + begin, end - begin, path)
            for begin, end, name, dtype, shape in raw  # in name order
        }

    # -- metadata
    @property
    def path(self) -> Path:
        return self._path

    @property
    def header_size(self) -> int:
        """N, the header's byte length (padding included)."""
        return self._header_size

    @property
    def data_offset(self) -> int:
        """Absolute offset of the data section, ``8 + N``."""
        return 8 + self._header_size

    @property
    def file_size(self) -> int:
        """File length when it was opened and validated."""
        return self._file_size

    @property
    def metadata(self) -> dict[str, str]:
        """The ``__metadata__`` mapping ({} when absent)."""
        return dict(self._metadata)

    def keys(self) -> list[str]:
        """Tensor names, sorted."""
        return list(self._tensors)

    def tensors(self) -> list[TensorInfo]:
        """Every tensor's info, sorted by name."""
        return list(self._tensors.values())

    def table(self) -> Mapping[str, TensorInfo]:
        """Name -> :class:`TensorInfo` of every tensor, read-only (a view, no copy)."""
        return MappingProxyType(self._tensors)

    def items(self) -> list[tuple[str, TensorInfo]]:
        return list(self._tensors.items())

    def total_data_bytes(self) -> int:
        """Sum of tensor byte lengths (= file size - 8 - N)."""
        return self._file_size - self.data_offset

    def __getitem__(self, name: str) -> TensorInfo:
        try:
            return self._tensors[name]
        except KeyError:
            raise KeyError(f"no tensor {name!r} in {self._path}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._tensors

    def __len__(self) -> int:
        return len(self._tensors)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._tensors))

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self)} tensors"
        return f"<hf2q.safetensors.SafetensorsFile {str(self._path)!r} {state}>"

    # -- lifetime
    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        """Close the file descriptor (idempotent)."""
        self._finalizer()

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fileno(self) -> int:
        self._check_open()
        return self._fd

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError(f"I/O on closed safetensors file {self._path}")

    @property
    def identity(self) -> FileIdentity:
        """Device, inode, size and modification time recorded at open."""
        return self._identity

    def check_unchanged(self, tensor: str | None = None) -> None:
        """Raise :class:`~hf2q.SafetensorsError` (code ``FileChanged``) when
        the open file's device, inode, size or modification time
        differ from those recorded at open: the file was rewritten in place
        after it was validated, so bytes read from it may belong to another
        layout (code ``FileTruncated`` when it is shorter now). Called after
        every read; loaders that read through :meth:`fileno` call it before
        each tensor (``tensor``: the one about to be read, named in the
        error) and the device's file reads compare the identity around each
        read."""
        self._check_open()
        try:
            st = os.fstat(self._fd)
        except OSError as e:  # pragma: no cover - fstat of an open fd
            raise SafetensorsError(f"{self._path}: fstat: {e}", code=IO_ERROR, path=str(self._path)) from None
        if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) == self._identity_key:
            return  # the common case, kept cheap (twice per tensor in a load)
        now = FileIdentity.of(st)
        changed = self._identity.differences(now)
        if changed:
            code = FILE_TRUNCATED if now.size < self._identity.size else FILE_CHANGED
            where = f" (tensor '{tensor}')" if tensor is not None else ""
            raise SafetensorsError(
                f"{self._path}: the file was modified after it was opened and validated "
                f"({', '.join(changed)} changed); its tensors can no longer be trusted, open it again{where}",
                code=code,
                path=str(self._path),
                tensor=tensor,
            )

    # -- reading
    def read_into(self, name: str, out: Any) -> None:
        """Read tensor ``name``'s raw bytes into ``out``: any writable C-contiguous
        buffer of exactly ``nbytes`` bytes (numpy array of any dtype, bytearray,
        memoryview). Large tensors are read in parallel chunks; GIL released."""
        info = self[name]
        self._check_open()
        dest = _as_writable_bytes(out)
        if len(dest) != info.nbytes:
            raise ValueError(
                f"out holds {len(dest)} bytes but tensor '{name}' ({info.dtype} {list(info.shape)}) has {info.nbytes}"
            )
        self._read_range(dest, info.offset, name)
        self.check_unchanged()

    def read_slice_into(self, name: str, start: int, out: Any) -> None:
        """Bytes ``[start, start + len(out))`` of tensor ``name`` into ``out``
        (a writable C-contiguous buffer); the range must lie inside the tensor."""
        info = self[name]
        self._check_open()
        dest = _as_writable_bytes(out)
        if start < 0 or start + len(dest) > info.nbytes:
            raise ValueError(f"bytes [{start}, {start + len(dest)}) are outside tensor '{name}' ({info.nbytes} bytes)")
        self._read_range(dest, info.offset + start, name)

    def read_bytes(self, name: str, out: _Buf | None = None) -> bytearray | _Buf:
        """Tensor ``name``'s raw bytes: into ``out`` (returned) or a new bytearray."""
        if out is None:
            buf = bytearray(self[name].nbytes)
            self.read_into(name, buf)
            return buf
        self.read_into(name, out)
        return out

    def read_array(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a new numpy array of its dtype and shape (BF16 and
        F8 kinds via ``ml_dtypes``). Sub-byte dtypes (F4, F6) are not supported."""
        dt = _numpy_dtype(self[name].dtype)
        if dt is None:
            raise TypeError(f"tensor '{name}' has dtype {self[name].dtype}, which has no numpy equivalent")
        return self._new_array(name, dt)

    def read_bits(self, name: str) -> np.ndarray:
        """Tensor ``name``'s stored bits as a new array of its shape: unsigned
        integers of its element's width (``uint8`` for FP8, ``uint16`` for
        BF16 / F16, ...; :attr:`hf2q.formats.Format.bits_dtype`). Unlike
        :meth:`read_array`, reading BF16 or FP8 this way imports no
        ``ml_dtypes`` (0.5-1.3 s in a fresh process). Sub-byte dtypes (F4,
        F6) are not supported."""
        fmt = formats.from_safetensors(self[name].dtype)
        if fmt.itemsize == 0:
            raise TypeError(f"tensor '{name}' has dtype {self[name].dtype}, whose elements are not whole bytes")
        return self._new_array(name, fmt.bits_dtype)

    def _new_array(self, name: str, dt: np.dtype) -> np.ndarray:
        info = self[name]
        if not numpy_representable(info.shape, dt.itemsize):
            # Valid safetensors (a zero-element tensor may have a 2^64-1
            # dimension), but numpy cannot build the array.
            raise _err(NOT_REPRESENTABLE, str(self._path),
                       f"shape {list(info.shape)} cannot be a numpy array ({REPRESENTABLE_RULE})", name)
        arr = np.empty(info.shape, dtype=dt)
        self.read_into(name, arr)
        return arr

    def _read_range(self, dest: memoryview, offset: int, tensor: str) -> None:
        _pread_exact(self._fd, dest, offset, str(self._path), f"tensor '{tensor}'", tensor)


#: What numpy (and so a device buffer's view) can hold, in words.
REPRESENTABLE_RULE = ("dimensions < 2^63, rank <= 64, and the non-zero dimensions times the item size < 2^63, "
                      "zero-element tensors included")


def numpy_representable(shape: Sequence[int], itemsize: int) -> bool:
    """Whether numpy can make an array of ``shape`` (:data:`REPRESENTABLE_RULE`):
    it refuses a size over 2^63 - 1 bytes counted without the zero dimensions,
    so ``[0, 2^62]`` of float32 is refused though it has no element."""
    if len(shape) > 64:
        return False
    limit = sys.maxsize  # numpy's intp maximum: both are Py_ssize_t's
    size = max(1, itemsize)
    for d in shape:
        if d < 0 or d > limit:
            return False
        if d:
            size *= d
            if size > limit:
                return False
    return True


@pausing  # per-tensor objects, no cycles: no collection while they are made (hf2q._gc)
def open(path: PathLike) -> SafetensorsFile:
    """Open and fully validate one safetensors file (docs/SAFETENSORS.md). Raises
    :class:`~hf2q.SafetensorsError` with ``code`` set to the first rule broken."""
    return SafetensorsFile(path)


# ----------------------------------------------------------------------------- checkpoints


class Checkpoint:
    """A validated checkpoint: one safetensors file, or the shards of a
    ``model.safetensors.index.json``. Create with :func:`open_checkpoint`.

    ``keys()`` is deterministic: shards by sorted file name, tensors by sorted
    name within each shard. ``ckpt[name]`` is the tensor's :class:`TensorInfo`,
    whose ``path`` names the file holding it.
    """

    def __init__(
        self,
        shards: list[SafetensorsFile],
        directory: Path,
        index_path: Path | None = None,
        index_metadata: dict[str, Any] | None = None,
    ) -> None:
        self._shards = sorted(shards, key=lambda f: f.path.name)
        self._directory = directory
        self._index_path = index_path
        self._index_metadata = index_metadata
        self._where: dict[str, SafetensorsFile] = {}
        # Every tensor's info in one table too: a plan looks up each tensor
        # (60,000 in an FP8 checkpoint) and a shard's own lookup is a second
        # Python call. A later shard's name wins in both, as a loop would.
        self._info: dict[str, TensorInfo] = {}
        for f in self._shards:
            self._where.update(dict.fromkeys(f._tensors, f))
            self._info.update(f._tensors)

    @property
    def directory(self) -> Path:
        return self._directory

    @property
    def location(self) -> Path:
        """What a message about the whole checkpoint names: the safetensors
        file of a one-file checkpoint, else the folder of its index."""
        return self._shards[0].path if self._index_path is None and len(self._shards) == 1 else self._directory

    @property
    def index_path(self) -> Path | None:
        """The index file, or None for a single-file checkpoint."""
        return self._index_path

    @property
    def files(self) -> list[Path]:
        """The safetensors files, sorted by file name."""
        return [f.path for f in self._shards]

    @property
    def shards(self) -> list[SafetensorsFile]:
        return list(self._shards)

    @property
    def metadata(self) -> dict[str, Any]:
        """The index's ``metadata`` object, or the single file's ``__metadata__``."""
        if self._index_path is not None:
            return dict(self._index_metadata or {})
        return self._shards[0].metadata if self._shards else {}

    def keys(self) -> list[str]:
        return list(self._where)

    def tensors(self) -> list[TensorInfo]:
        # Straight from the table (a plan asks for all of them at once).
        return list(self._info.values())

    def table(self) -> Mapping[str, TensorInfo]:
        """Name -> :class:`TensorInfo` of every tensor, read-only (a view, no
        copy: planning looks up 60,000 names without a Python call each)."""
        return MappingProxyType(self._info)

    def __getitem__(self, name: str) -> TensorInfo:
        try:
            return self._info[name]
        except KeyError:
            raise KeyError(f"no tensor {name!r} in checkpoint {self._directory}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._where

    def __len__(self) -> int:
        return len(self._where)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._where))

    def file_for(self, name: str) -> SafetensorsFile:
        """The open shard holding tensor ``name``."""
        f = self._where.get(name)
        if f is None:
            raise KeyError(f"no tensor {name!r} in checkpoint {self._directory}")
        return f

    def total_data_bytes(self) -> int:
        """Sum of on-disk tensor bytes over all shards (headers excluded)."""
        return sum(f.total_data_bytes() for f in self._shards)

    def read_into(self, name: str, out: Any) -> None:
        self.file_for(name).read_into(name, out)

    def read_bytes(self, name: str, out: _Buf | None = None) -> bytearray | _Buf:
        return self.file_for(name).read_bytes(name, out)

    def read_array(self, name: str) -> np.ndarray:
        return self.file_for(name).read_array(name)

    def read_bits(self, name: str) -> np.ndarray:
        return self.file_for(name).read_bits(name)

    @property
    def closed(self) -> bool:
        return all(f.closed for f in self._shards)

    def close(self) -> None:
        for f in self._shards:
            f.close()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<hf2q.safetensors.Checkpoint {str(self._directory)!r} {len(self._shards)} files, {len(self)} tensors>"


def _index_error(code: str, path: str, reason: str, tensor: str | None = None) -> SafetensorsError:
    return _err(code, path, reason, tensor)


def _bad_shard_name(name: str) -> str | None:
    if name == "":
        return "is empty"
    if "/" in name or "\\" in name:
        return "contains a path separator"
    if name in (".", ".."):
        return "is not a file name"
    if "\x00" in name:
        return "contains a NUL byte"
    if os.path.isabs(name) or (len(name) >= 2 and name[1] == ":"):
        return "is an absolute path"
    return None


def _open_index(index_path: Path) -> Checkpoint:
    spath = str(index_path)

    def error(reason: str, e: OSError | None) -> SafetensorsError:
        if e is not None:
            return SafetensorsError(f"{spath}: cannot read index: {e.strerror or e}", code=IO_ERROR, path=spath)
        code = INVALID_INDEX if "bytes" in reason else NOT_A_FILE
        return SafetensorsError(f"{spath}: index {reason}", code=code, path=spath)

    raw = read_capped(spath, _MAX_INDEX_BYTES, "model.safetensors.index.json", error)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _index_error(INVALID_INDEX, spath, f"index is not valid UTF-8: {e.reason}") from None
    # The plain index every Hub repo has, in one native pass (a 62,303-tensor
    # index: 15 ms with its map, against 39 ms for the JSON tree); else the trees.
    # (A tensor named twice: the careful parse below names the repeated key.)
    scanned = _core.scan_index(raw)
    if scanned is not None:
        index_metadata, pairs = scanned
        weight_map = dict(pairs)
        if len(weight_map) == len(pairs):
            return _open_shards(index_path, spath, weight_map, pairs, index_metadata)
    root, duplicate = _loads_plain(text), None
    try:
        if root is None:
            root, duplicate = _loads(text)
    except (ValueError, RecursionError) as e:
        raise _index_error(INVALID_INDEX, spath, f"index is not valid JSON: {e}") from None
    if duplicate is not None:
        raise _index_error(DUPLICATE_KEY, spath, f"duplicate JSON key {duplicate!r} in index")
    if not isinstance(root, _Obj):
        raise _index_error(INVALID_INDEX, spath, f"index must be a JSON object, got {_describe(root)}")
    if _has_lone_surrogate(text, root):
        raise _index_error(INVALID_INDEX, spath, "index holds a string with a lone UTF-16 surrogate escape")
    top = dict(root)
    if "weight_map" not in top:
        raise _index_error(INVALID_INDEX, spath, "index has no 'weight_map'")
    wm = top["weight_map"]
    if not isinstance(wm, _Obj):
        raise _index_error(INVALID_INDEX, spath, f"'weight_map' must be an object of string -> string, got {_describe(wm)}")
    meta = top.get("metadata")
    return _open_shards(index_path, spath, dict(wm), wm, _plain(meta) if isinstance(meta, _Obj) else {})


def _open_shards(index_path: Path, spath: str, weight_map: dict[str, Any], wm: Sequence[tuple[str, Any]],
                 index_metadata: dict[str, Any]) -> Checkpoint:
    """The checkpoint of a parsed index: ``weight_map`` (its keys unique:
    a repeated one was refused before) and the same pairs in file order
    (``wm``); each shard opened and checked against it."""
    # The values are checked per distinct shard name (a few, against 60,000
    # tensors) at C speed; where one is not a string or not a plain file name,
    # the entries are walked in order so the first offending tensor is the one named.
    shard_names = set(weight_map.values()) if set(map(type, weight_map.values())) <= {str} else None
    if shard_names is None or any(_bad_shard_name(s) is not None for s in shard_names):
        for tensor, shard in wm:
            if not isinstance(shard, str):
                raise _index_error(
                    INVALID_INDEX, spath, f"weight_map value must be a shard file name (string), got {_describe(shard)}", tensor
                )
            why = _bad_shard_name(shard)
            if why is not None:
                raise _index_error(
                    INVALID_SHARD_NAME, spath, f"shard name {shard!r} {why}: shards must be plain file names in the index's directory", tensor
                )
        shard_names = set(weight_map.values())  # every value passed the walk's checks

    directory = index_path.parent
    by_shard_cache: dict[str, list[str]] = {}

    def by_shard(shard: str) -> list[str]:
        """The tensors the index maps to ``shard`` (error paths only)."""
        if not by_shard_cache:
            for tensor, s in weight_map.items():
                by_shard_cache.setdefault(s, []).append(tensor)
        return by_shard_cache.get(shard, [])

    opened: list[SafetensorsFile] = []
    try:
        for shard in sorted(shard_names):
            shard_path = directory / shard
            if not shard_path.is_file():
                raise _index_error(
                    MISSING_SHARD,
                    str(shard_path),
                    f"shard named by index {spath} does not exist or is not a regular file",
                    min(by_shard(shard)),
                )
            opened.append(open(shard_path))
        # The common case first, in one pass at C speed: every tensor of
        # every shard is mapped by the index to that shard. Then, with as
        # many index entries as shard tensors, no name is in two shards and
        # the index names no tensor a shard lacks (the full checks below find
        # those, in their order, only when this fails).
        total = sum(len(f._tensors) for f in opened)
        get = weight_map.get
        consistent = all(all(map(operator.eq, itertools.repeat(f.path.name), map(get, f._tensors))) for f in opened)
        problems: list[tuple[str, str, str, str]] = []  # (code, shard path, tensor, reason)
        if not consistent or total != len(weight_map):
            seen: dict[str, str] = {}
            for f in opened:
                fname = f.path.name
                for name in f.keys():
                    if name in seen:
                        problems.append((DUPLICATE_TENSOR, str(f.path), name, f"tensor is also in shard {seen[name]!r}"))
                    else:
                        seen[name] = fname
            for f in opened:
                for name in sorted(by_shard(f.path.name)):
                    if name not in f:
                        problems.append((TENSOR_NOT_IN_SHARD, str(f.path), name, f"index {spath} maps the tensor to this shard but it is not there"))
            for f in opened:
                fname = f.path.name
                for name in f.keys():
                    listed = weight_map.get(name)
                    if listed != fname:
                        why = "is not in the index's weight_map" if listed is None else f"is mapped by the index to shard {listed!r}"
                        problems.append((TENSOR_NOT_IN_INDEX, str(f.path), name, f"tensor in this shard {why}"))
        if problems:
            code, ppath, tensor, reason = problems[0]
            msg = f"{ppath}: {reason} (tensor '{tensor}')"
            if len(problems) > 1:
                more = "\n".join(f"  {p}: tensor '{t}' {r}" for c, p, t, r in problems[1:50])
                tail = f"\n  ... and {len(problems) - 50} more" if len(problems) > 50 else ""
                msg += f"\n{len(problems) - 1} more problem(s) in checkpoint {spath}:\n{more}{tail}"
            raise SafetensorsError(msg, code=code, path=ppath, tensor=tensor)
    except BaseException:
        for f in opened:
            f.close()
        raise
    return Checkpoint(opened, directory, index_path, index_metadata)


def _plain(v: Any) -> Any:
    """A parsed JSON tree with _Obj turned back into dicts (first key wins)."""
    if isinstance(v, _Obj):
        out: dict[str, Any] = {}
        for k, x in v:
            out.setdefault(k, _plain(x))
        return out
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, _BadNumber):
        try:
            return json.loads(v.text)
        except ValueError:  # pragma: no cover
            return v.text
    return v


@pausing  # per-tensor objects, no cycles: no collection while they are made (hf2q._gc)
def open_checkpoint(path: PathLike) -> Checkpoint:
    """Open a checkpoint: a ``.safetensors`` file, an index ``.json`` file, or a
    directory (``model.safetensors.index.json`` if present, else
    ``model.safetensors``). Every file is validated (docs/SAFETENSORS.md) and the index
    cross-checked (docs/SAFETENSORS.md); failures raise :class:`~hf2q.SafetensorsError`."""
    p = Path(os.fspath(path))
    try:
        return _open_checkpoint(p)
    except OSError as e:  # stat of the path or of the directory's entries
        raise SafetensorsError(f"{p}: {e.strerror or e}", code=IO_ERROR, path=str(p)) from None


def _no_checkpoint_message(p: Path) -> str:
    """Why the folder ``p`` is not a checkpoint, and what to do about the
    files it has instead: other ``.safetensors`` files (Mistral's
    ``consolidated.safetensors``, say) can be passed by path; PyTorch pickles
    (``pytorch_model.bin``, ``.pt``, ``.pth``) are not read at all."""
    msg = f"{p}: directory holds neither {INDEX_FILE_NAME} nor {SINGLE_FILE_NAME}"
    try:
        names = sorted(e.name for e in os.scandir(p) if e.is_file())
    except OSError:
        return msg
    others = [n for n in names if n.endswith(".safetensors")]
    pickles = [n for n in names if n.endswith((".bin", ".pt", ".pth"))]
    if others:
        listed = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        msg += f"; it has {listed}: pass the file's path instead (e.g. {p / others[0]})"
    if pickles:
        listed = ", ".join(pickles[:3]) + (", ..." if len(pickles) > 3 else "")
        msg += (f"; it has {listed}, but PyTorch pickle weights (.bin, .pt, .pth) are not supported, only "
                ".safetensors (transformers' save_pretrained writes them)")
    return msg


def checkpoint_entry(p: Path) -> tuple[bool, Path] | None:
    """The file a checkpoint path names and whether it is an index: a
    directory's ``model.safetensors.index.json`` if present, else its
    ``model.safetensors``; a ``.json`` file (an index); any other path (a
    safetensors file). None: a directory with neither. Nothing is opened."""
    if p.is_dir():
        index = p / INDEX_FILE_NAME
        if index.exists():
            return True, index
        single = p / SINGLE_FILE_NAME
        return (False, single) if single.exists() else None
    return p.name.endswith(".json"), p


def _open_checkpoint(p: Path) -> Checkpoint:
    if not p.is_dir():
        if not p.exists():
            raise SafetensorsError(f"{p}: no such file or directory", code=IO_ERROR, path=str(p))
        if p.name == "config.json":  # the usual slip: the model's config instead of its folder
            raise SafetensorsError(f"{p}: this is the model's config; pass its folder: {p.parent}",
                                   code=NO_CHECKPOINT, path=str(p))
    entry = checkpoint_entry(p)
    if entry is None:
        raise SafetensorsError(_no_checkpoint_message(p), code=NO_CHECKPOINT, path=str(p))
    is_index, file = entry
    if is_index:
        return _open_index(file)
    return Checkpoint([open(file)], file.parent)
