"""Random arguments from a FuzzedDataProvider: byte buffers reinterpreted
with random dtypes, shapes, strides, alignments and writability, in the
containers callers pass (ndarray, bytes, bytearray, memoryview, lists)."""

from __future__ import annotations

from typing import Any

import atheris
import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [
    np.dtype(np.uint8), np.dtype(np.int8), np.dtype(np.uint16), np.dtype(np.int16), np.dtype(np.float16), BF16,
    np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.uint32), np.dtype(np.float64), np.dtype(np.int64),
    np.dtype(np.bool_), np.dtype(np.complex64), np.dtype(">f4"), np.dtype(">u2"),
]
# Interesting element counts for sizes, offsets and dimensions.
EDGE_INTS = [0, 1, 2, 31, 32, 33, 34, 64, 68, 255, 256, 257, 1 << 20, (1 << 31) - 1, 1 << 31, 1 << 32,
             (1 << 46), (1 << 62), (1 << 63) - 1, 1 << 63, (1 << 64) - 1, 1 << 64, -1, -32, -(1 << 63)]


def pick(fdp: atheris.FuzzedDataProvider, items: list[Any] | tuple[Any, ...]) -> Any:
    return items[fdp.ConsumeIntInRange(0, len(items) - 1)]


def small_or_edge_int(fdp: atheris.FuzzedDataProvider, hi: int = 300) -> int:
    if fdp.ConsumeIntInRange(0, 7) == 0:
        return pick(fdp, EDGE_INTS)
    return fdp.ConsumeIntInRange(0, hi)


def raw_bytes(fdp: atheris.FuzzedDataProvider, max_len: int = 4096) -> bytes:
    n = fdp.ConsumeIntInRange(0, max_len)
    kind = fdp.ConsumeIntInRange(0, 3)
    if kind == 0:  # finite small floats: lets conversions succeed and results be compared
        rng = np.random.default_rng(fdp.ConsumeIntInRange(0, 255))
        return (rng.standard_normal(n // 4 + 1).astype(np.float32) * 3).tobytes()[:n]
    if kind == 1:  # the same, as bfloat16 / float16
        rng = np.random.default_rng(fdp.ConsumeIntInRange(0, 255))
        dt = BF16 if fdp.ConsumeBool() else np.dtype(np.float16)
        return rng.standard_normal(n // 2 + 1).astype(dt).tobytes()[:n]
    return fdp.ConsumeBytes(n)


def array(fdp: atheris.FuzzedDataProvider, data: bytes | None = None, *, base: bytearray | None = None) -> np.ndarray:
    """An ndarray over `data` (or fuzz bytes): random dtype, shape, offset
    (misalignment), strides and writability. With `base`, a view into that
    bytearray instead (to alias another argument)."""
    if base is not None:
        start = fdp.ConsumeIntInRange(0, max(0, len(base) - 1)) if len(base) else 0
        flat = np.frombuffer(base, dtype=np.uint8)[start:] if len(base) else np.empty(0, np.uint8)
    else:
        raw = raw_bytes(fdp) if data is None else data
        shift = fdp.ConsumeIntInRange(0, 7)
        buf = bytearray(shift + len(raw))
        buf[shift:] = raw
        flat = np.frombuffer(buf, dtype=np.uint8)[shift:]
    dt = pick(fdp, DTYPES)
    n = flat.size // dt.itemsize
    arr = flat[: n * dt.itemsize].view(dt) if n else np.empty(0, dt)
    rank = fdp.ConsumeIntInRange(0, 3)
    if rank == 0 and arr.size >= 1:
        arr = arr[:1].reshape(())
    elif rank >= 2 and arr.size:
        last = pick(fdp, [1, 2, 16, 32, 34, 64, 68, 96, 128])
        rows = arr.size // last
        if rows:
            arr = arr[: rows * last].reshape(rows, last)
            if rank == 3 and rows % 2 == 0:
                arr = arr.reshape(2, rows // 2, last)
    layout = fdp.ConsumeIntInRange(0, 9)
    if layout == 0 and arr.ndim >= 1:
        arr = arr[..., ::2]
    elif layout == 1 and arr.ndim >= 2:
        arr = arr.T
    elif layout == 2 and arr.ndim >= 1:
        arr = arr[..., ::-1]
    if fdp.ConsumeIntInRange(0, 5) == 0:
        arr.flags.writeable = False
    return arr


def container(fdp: atheris.FuzzedDataProvider, arr: np.ndarray) -> Any:
    """`arr` as one of the object types a caller might pass."""
    kind = fdp.ConsumeIntInRange(0, 11)
    if kind == 0:
        return arr.tobytes()
    if kind == 1:
        return bytearray(arr.tobytes())
    if kind == 2:
        try:
            return memoryview(arr)
        except (ValueError, TypeError):
            return arr
    if kind == 3:
        return arr.tolist() if arr.size < 64 else None
    if kind == 4:
        return pick(fdp, [None, 3, 2.5, "abc", object(), (1, 2)])
    return arr


def out_array(fdp: atheris.FuzzedDataProvider, dtype: np.dtype, count: int, alias: bytearray | None) -> Any:
    """None, a right or wrong `out` for `count` elements of `dtype`."""
    kind = fdp.ConsumeIntInRange(0, 9)
    if kind == 0:
        return None
    if kind == 1 and alias is not None:
        return array(fdp, base=alias)
    if kind == 2:
        return array(fdp)
    n = count if fdp.ConsumeIntInRange(0, 3) else max(0, count + fdp.ConsumeIntInRange(-3, 3))
    if n > (1 << 22):
        n = 1 << 22  # keep the harness's own allocations small
    dt = dtype if fdp.ConsumeIntInRange(0, 4) else pick(fdp, DTYPES)
    shift = fdp.ConsumeIntInRange(0, 7) if fdp.ConsumeIntInRange(0, 4) == 0 else 0
    buf = bytearray(shift + n * dt.itemsize)
    out = np.frombuffer(buf, dtype=np.uint8)[shift:].view(dt)
    if kind == 3 and out.size >= 2:
        out = out[::2]
    if kind == 4:
        out.flags.writeable = False
    if kind == 5 and out.size and out.size % 2 == 0:
        out = out.reshape(2, -1)
    return out
