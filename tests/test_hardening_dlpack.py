"""DLPack and bf16 (issue 11, row "docs"): numpy has no DLPack bfloat16, so
``np.from_dlpack`` refuses bf16 buffers; the documented ways are
``buf.numpy()`` (an ``ml_dtypes.bfloat16`` view), ``buf.numpy().view(np.uint16)``
(the raw bits) and ``torch.from_dlpack(buf)`` (``torch.bfloat16``: the capsule
carries DLPack's bfloat type, checked here field by field without torch)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from hf2q.device import Device

README = Path(__file__).resolve().parents[1] / "README.md"


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


def _dltensor(capsule: object) -> _DLTensor:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return _DLTensor.from_address(get(capsule, b"dltensor"))  # DLManagedTensor starts with its DLTensor


@pytest.fixture
def bf16_buf():
    dev = Device._isolated("host")
    x = np.arange(-6, 6, dtype=np.float32).reshape(3, 4).astype(ml_dtypes.bfloat16)
    return dev.upload(x), x


def test_bf16_numpy_ways(bf16_buf) -> None:
    buf, x = bf16_buf
    v = buf.numpy()
    assert v.dtype == ml_dtypes.bfloat16 and v.shape == (3, 4) and np.array_equal(v, x)
    bits = v.view(np.uint16)
    assert np.array_equal(bits, x.view(np.uint16))
    bits[0, 0] = 0x3F80  # zero-copy: writes reach the buffer
    assert float(buf.numpy()[0, 0]) == 1.0
    with pytest.raises((TypeError, BufferError, ValueError, RuntimeError)):
        np.from_dlpack(buf)  # numpy has no DLPack bfloat16 (what the README now says)


def test_bf16_dlpack_capsule_is_bfloat16_for_torch(bf16_buf) -> None:
    buf, _ = bf16_buf
    cap = buf.__dlpack__()
    t = _dltensor(cap)
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (4, 16, 1)  # kDLBfloat
    assert t.device_type == 1 and t.ndim == 2 and [t.shape[0], t.shape[1]] == [3, 4]
    assert t.data + t.byte_offset == buf.address
    del cap  # unconsumed capsule: its destructor releases the buffer reference


def test_other_dtypes_through_numpy_dlpack() -> None:
    dev = Device._isolated("host")
    for x in (np.ones((2, 32), np.float32), np.ones(5, np.float16), np.arange(4, dtype=np.int32)):
        buf = dev.upload(x)
        assert np.array_equal(np.from_dlpack(buf), x)


def test_torch_from_dlpack_bf16(bf16_buf) -> None:
    torch = pytest.importorskip("torch")
    buf, x = bf16_buf
    t = torch.from_dlpack(buf)
    assert t.dtype == torch.bfloat16 and tuple(t.shape) == (3, 4)
    assert np.array_equal(t.view(torch.int16).numpy().view(np.uint16), x.view(np.uint16))


def test_readme_promises_only_what_works() -> None:
    text = README.read_text()
    # np.from_dlpack is shown only with the bf16 caveat on the same line, and
    # the documented bf16 ways are shown.
    lines = [ln for ln in text.splitlines() if "np.from_dlpack" in ln]
    assert all("not for bf16" in ln for ln in lines), lines
    assert "torch.from_dlpack(buf)" in text and ".view(np.uint16)" in text
