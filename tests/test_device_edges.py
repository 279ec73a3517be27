"""Edge cases of device writes found in review: overlap, alignment, offsets,
non-finite positions, sizes."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import hf2q

BF16 = ml_dtypes.bfloat16


@pytest.fixture
def dev() -> hf2q.Device:
    return hf2q.Device._isolated("host")


def test_raw_write_from_inside_the_buffer_is_refused(dev):
    n = 1 << 20
    buf = dev.upload(np.arange(n, dtype=np.float32), to="f32")
    before = buf.numpy().copy()
    with pytest.raises(ValueError, match="overlap"):
        dev.write(buf, buf.numpy()[: n - 4096], offset=4096)
    assert np.array_equal(buf.numpy(), before)


@pytest.mark.parametrize("dtype,to", [(np.float32, "q8_0"), (np.float16, "f32"), (BF16, "f32"), (BF16, "q8_0")])
def test_unaligned_typed_source_is_accepted(dev, dtype, to):
    x = (np.random.default_rng(0).standard_normal(64) * 0.1).astype(dtype)
    raw = bytearray(x.nbytes + 1)
    raw[1:] = x.tobytes()
    a = np.frombuffer(raw, dtype=dtype, offset=1, count=64)
    assert a.ctypes.data % np.dtype(dtype).itemsize != 0 or np.dtype(dtype).itemsize == 1
    got = dev.upload(a, to=to).numpy()
    want = dev.upload(x, to=to).numpy()
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


def test_int32_upload(dev):
    x = np.arange(-5, 5, dtype=np.int32)
    buf = dev.upload(x, to="i32")
    assert buf.dtype == "i32" and np.array_equal(buf.numpy(), x)


def test_nonfinite_positions_are_in_the_buffer_for_memory_and_files(dev, tmp_path):
    x = (np.random.default_rng(1).standard_normal((4, 64)) * 0.1).astype(BF16)
    x[1, 5] = -np.inf
    path = tmp_path / "x.bin"
    path.write_bytes(x.tobytes())
    buf = dev.alloc((8, 64), "q8_0")
    errors = []
    for write in (
        lambda: dev.write(buf, x, offset=128, name="t"),
        lambda: dev.write_from_file(buf, path, 0, x.nbytes, "bf16", offset=128, name="t"),
    ):
        with pytest.raises(hf2q.NonFiniteError) as ei:
            write()
        errors.append(ei.value)
    for e in errors:
        assert e.index == 128 + 64 + 5 and e.multi_index == (3, 5)
        assert e.value_class == "-inf" and "-inf" in str(e) and "'t'" in str(e)


def test_offsets_and_sizes_are_checked(dev, tmp_path):
    buf = dev.alloc((64,), "f32")
    with pytest.raises(ValueError, match="offset"):
        dev.write(buf, np.zeros(32, np.float32), offset=-32)
    with pytest.raises(TypeError):
        dev.write(buf, np.zeros(32, np.float32), offset=1.5)
    path = tmp_path / "w.bin"
    path.write_bytes(b"\0" * 256)
    with pytest.raises(ValueError, match="do not fill"):
        dev.upload_from_file(path, 0, 100, "bf16", "f32", (64,))
    before = dev.residency.count
    with pytest.raises(ValueError, match="do not fill"):
        dev.upload_from_file(path, 0, 256, "bf16", "q8_0", (64, 64))
    assert dev.residency.count == before


def test_thread_count_bounds():
    n = hf2q.get_num_threads()
    with pytest.raises(ValueError, match="1024"):
        hf2q.set_num_threads(2000)
    with pytest.raises(ValueError):
        hf2q._core.set_num_threads(0)
    assert hf2q.get_num_threads() == n
