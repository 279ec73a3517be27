"""The backend interface seen from Python: the registry, copy-out and the
DLPack device every backend reports (issue 13, "backends for any memory")."""

import numpy as np
import pytest

import hf2q
from hf2q import _core
from hf2q.device import Device, reference_checksums
from hf2q.errors import DeviceError


def test_registry_lists_the_known_kinds():
    kinds = _core.backend_kinds()
    assert kinds[:2] == ["host", "metal"]
    assert len(kinds) == len(set(kinds))


@pytest.mark.parametrize("spec", ["gpu", "host:1", "metal:0", "", "cuda:x" if "cuda" in _core.backend_kinds() else "vulkan"])
def test_bad_device_specs_raise_value_error(spec):
    with pytest.raises(ValueError):
        Device(spec)


def test_native_open_rejects_unknown_kinds_naming_the_registered_ones():
    with pytest.raises(ValueError, match="expected one of 'host', 'metal'"):
        _core.NativeDevice.open("tpu")
    with pytest.raises(ValueError, match="takes no index"):
        _core.NativeDevice.open("host:0")


@pytest.mark.parametrize("dtype,src", [
    ("f32", np.linspace(-3, 3, 1000, dtype=np.float32)),
    ("i32", np.arange(-500, 500, dtype=np.int32)),
    ("u8", np.arange(777, dtype=np.uint8)),
])
def test_to_host_is_a_copy_equal_to_the_view(dtype, src):
    dev = Device("host")
    buf = dev.upload(src, to=dtype)
    host = buf.to_host()
    assert host.dtype == buf.numpy().dtype and host.shape == buf.numpy().shape
    assert np.array_equal(host, buf.numpy())
    host[...] = 0
    assert np.array_equal(buf.numpy(), src)  # a copy, not a view


def test_to_host_q8_0_and_bf16_keep_the_storage_layout():
    dev = Device("host")
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    q = dev.upload(x, to="q8_0")
    assert q.to_host().shape == (4, 68) and np.array_equal(q.to_host(), q.numpy())
    from hf2q._arrays import BF16

    b = dev.upload(x.astype(BF16))
    assert b.to_host().dtype == BF16 and np.array_equal(b.to_host().view(np.uint16), b.numpy().view(np.uint16))


def test_copy_out_is_bounds_checked():
    buf = Device("host").upload(np.zeros(16, dtype=np.float32))
    out = np.empty(8, dtype=np.uint8)
    with pytest.raises(ValueError, match="overruns"):
        buf._native.copy_out(60, out)
    buf._native.copy_out(56, out)


def test_dlpack_device_comes_from_the_backend():
    buf = Device("host").upload(np.ones(8, dtype=np.float32))
    assert buf.__dlpack_device__() == (1, 0)
    assert buf._native.dlpack_device == (1, 0)


def test_reference_checksums_match_the_device_read_back_in_small_chunks():
    dev = Device("host")
    x = np.random.default_rng(2).standard_normal(256 * 7 + 5).astype(np.float32)
    for to in ("f32", "q8_0"):
        n = x.size // 32 * 32
        buf = dev.upload(x[:n], to=to)
        assert np.array_equal(reference_checksums(buf, chunk_groups=2), np.asarray(dev._native.checksums(buf._native)))


def test_metal_unavailable_off_apple_is_a_device_error():
    import sys

    if sys.platform == "darwin":
        pytest.skip("Apple: Metal may exist")
    with pytest.raises(DeviceError, match="no Metal backend"):
        Device("metal")
    assert isinstance(hf2q.Device.default(), Device)


@pytest.mark.parametrize("src_dtype,to", [("f32", "q8_0"), ("bf16", "q8_0"), ("f16", "q8_0"), ("bf16", "f32"),
                                          ("f16", "f32"), ("f32", "f32")])
def test_convert_on_the_device_equals_an_upload(src_dtype, to):
    from hf2q._arrays import BF16

    dev = Device("host")
    x = np.random.default_rng(3).standard_normal((16, 128)).astype(np.float32)
    x = x.astype({"f32": np.float32, "f16": np.float16, "bf16": BF16}[src_dtype])
    src = dev.upload(x)
    out = dev.convert(src, to)
    assert out.dtype == to and out.shape == src.shape
    assert np.array_equal(out.numpy().view(np.uint8), dev.upload(x, to=to).numpy().view(np.uint8))


def test_convert_refuses_other_devices_and_bad_pairs():
    dev, other = Device("host"), Device._isolated("host")
    buf = dev.upload(np.ones(64, dtype=np.float32))
    with pytest.raises(DeviceError):
        other.convert(buf, "q8_0")
    with pytest.raises(ValueError, match="cannot convert"):
        dev.convert(buf, "bf16")


def test_segments_from_one_file_equal_separate_writes(tmp_path):
    from hf2q._arrays import BF16

    dev = Device("host")
    x = np.random.default_rng(4).standard_normal((6, 64)).astype(BF16)
    f = tmp_path / "x.bin"
    f.write_bytes(b"\0" * 10 + x.tobytes())
    # rows in reverse order, each 64 bf16 = 128 bytes
    segs = [(r * 64, 10 + (5 - r) * 128, 128) for r in range(6)]
    for to in ("bf16", "f32", "q8_0"):
        a = dev.alloc((6, 64), to)
        dev.write_from_file_segments(a, f, segs, "bf16")
        assert np.array_equal(a.numpy().view(np.uint8), dev.upload(x[::-1].copy(), to=to).numpy().view(np.uint8))
    x[3, 7] = np.nan
    f.write_bytes(b"\0" * 10 + x.tobytes())
    with pytest.raises(hf2q.NonFiniteError) as e:
        dev.write_from_file_segments(dev.alloc((6, 64), "q8_0"), f, segs, "bf16", name="t")
    assert e.value.index == (5 - 3) * 64 + 7 and e.value.value_class == "nan"
