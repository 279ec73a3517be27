"""PyTorch views of hf2q buffers: one of the two places hf2q imports torch
(the other is :mod:`hf2q.transformers`); ``import hf2q`` never does.

:func:`state_dict` turns a loaded model's buffers into ``torch.Tensor`` s
through DLPack: no byte is copied, the tensor lives where the buffer lives
(CPU for the host backend, ``cuda:<index>`` for CUDA), and each tensor holds
a reference to its buffer, so the memory stays valid as long as any tensor
(or any view of one) does, whatever happens to the model object.

Formats map to torch dtypes one to one (``f32`` float32, ``f16`` float16,
``bf16`` bfloat16, ``i32`` int32, ``u8`` uint8, ``f8_e4m3`` float8_e4m3fn,
``f8_e5m2`` float8_e5m2: DLPack carries their bytes, viewed as the float8
dtype without a copy), except ``q8_0``, which torch
has no dtype for: its bytes are a ``uint8`` tensor of shape
``(rows, row_bytes)`` (each row ``row_bytes // 34`` blocks of 34 bytes, see
docs/Q8_0.md); :func:`dequantize` decodes them, on any torch device, to the
same float32 values as :func:`hf2q.ops.dequantize_q8_0`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
import torch

from . import formats
from .device import Buffer

__all__ = ["tensor", "state_dict", "dequantize"]

_Q8 = formats.get("q8_0")
#: hf2q format -> torch dtype of the DLPack view (q8_0 travels as its bytes).
TORCH_DTYPES: dict[str, torch.dtype] = {
    "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "i32": torch.int32, "u8": torch.uint8,
    "q8_0": torch.uint8, "f8_e4m3": torch.float8_e4m3fn, "f8_e5m2": torch.float8_e5m2,
}
# Formats whose DLPack view is their bytes (DLPack 0.8 has no float8 code), viewed as their torch dtype.
_BYTE_VIEWS = {"f8_e4m3": torch.float8_e4m3fn, "f8_e5m2": torch.float8_e5m2}


class _Unwaited:
    """A buffer's DLPack export that does not wait for the device's uploads
    in flight. Only for a consumer that reads none of the memory before the
    load writing it has returned and the device is synchronized: the
    hand-off assembles transformers' model while the last batch of its load
    is still being written (docs/HANDOFF.md). Every other export waits."""

    __slots__ = ("_buf",)

    def __init__(self, buf: Buffer) -> None:
        self._buf = buf

    def __dlpack__(self, **kwargs: object) -> object:
        return self._buf._native.dlpack_view(False).__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._buf.__dlpack_device__()


def tensor(buf: Buffer) -> torch.Tensor:
    """The buffer as a torch tensor sharing its memory (``torch.from_dlpack``;
    the capsule holds a reference to the buffer). FP8 buffers come as
    ``torch.float8_e4m3fn`` / ``torch.float8_e5m2``. ``q8_0`` buffers come as
    ``uint8`` of shape ``(rows, row_bytes)``: rows are the logical shape's
    leading dimensions flattened, ``row_bytes = last // 32 * 34``."""
    return _tensor(buf, True)


def _tensor(buf: Buffer, wait: bool) -> torch.Tensor:
    t = torch.from_dlpack(buf if wait else _Unwaited(buf))
    if buf.dtype in _BYTE_VIEWS and t.dtype == torch.uint8:
        t = t.view(_BYTE_VIEWS[buf.dtype])  # same storage, the float8 dtype (state_dict keeps FP8 as FP8)
    if buf.dtype == "q8_0":
        row_bytes = _Q8.storage_bytes(buf.shape[-1]) if buf.shape else _Q8.block_bytes
        t = t.reshape(-1, row_bytes)  # a view: the DLPack storage is contiguous
    return t


def state_dict(buffers: Mapping[str, Buffer] | Iterable[tuple[str, Buffer]]) -> dict[str, torch.Tensor]:
    """``{name: tensor(buf)}`` for every buffer, in the given order."""
    return _state_dict(buffers, True)


def _state_dict(buffers: Mapping[str, Buffer] | Iterable[tuple[str, Buffer]], wait: bool) -> dict[str, torch.Tensor]:
    """:func:`state_dict`; ``wait=False``: views that do not wait for the
    uploads in flight (:class:`_Unwaited`: the hand-off only)."""
    items = buffers.items() if isinstance(buffers, Mapping) else buffers
    return {name: _tensor(buf, wait) for name, buf in items}


def dequantize(t: torch.Tensor, fmt: str = "q8_0") -> torch.Tensor:
    """Q8_0 bytes (``uint8``, last dimension a multiple of 34, on any device)
    to float32 of shape ``t.shape[:-1] + (last // 34 * 32,)``, on ``t``'s
    device: ``y = q * float32(d)`` per block, one rounding per element, so
    every result that is not NaN is bit for bit that of
    :func:`hf2q.ops.dequantize_q8_0`; NaN results (a NaN scale, or an
    infinite one times 0) are NaN there too, with the payload bits of the
    unit that computed them (x86, ARM and GPUs differ; torch canonicalises)."""
    if fmt != "q8_0":
        raise ValueError(f"hf2q.torch.dequantize decodes 'q8_0' only, got {fmt!r}")
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(t).__name__}")
    bb, be = _Q8.block_bytes, _Q8.block_elems
    if t.dtype != torch.uint8 or t.dim() == 0 or t.shape[-1] % bb:
        raise ValueError(f"Q8_0 data is uint8 with a last dimension that is a multiple of {bb}, "
                         f"got {t.dtype} of shape {tuple(t.shape)}")
    lead = tuple(t.shape[:-1])
    blocks = t.reshape(*lead, t.shape[-1] // bb, bb)
    # The scale's two bytes and the 32 quants as their own contiguous arrays:
    # a 34-byte stride cannot be viewed as float16 in place.
    d = blocks[..., :2].contiguous().view(torch.float16).to(torch.float32)
    q = blocks[..., 2:].contiguous().view(torch.int8).to(torch.float32)
    return (q * d).reshape(*lead, t.shape[-1] // bb * be)

