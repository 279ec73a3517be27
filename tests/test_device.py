"""Device buffers, residency accounting and uploads on the host backend."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading

import ml_dtypes
import numpy as np
import pytest

import hf2q
from hf2q import ops
from hf2q.device import Device, FileReadError, reference_checksums, register_weight_buffer

BF16 = ml_dtypes.bfloat16
PAGE = os.sysconf("SC_PAGESIZE")


@pytest.fixture
def dev() -> Device:
    """A host device with its own residency accounting."""
    return Device._isolated("host")


def rng_bf16(shape, seed=0, scale=0.02):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(BF16)


# ------------------------------------------------------------------ devices


def test_default_and_host_devices():
    d = Device.default()
    assert d.kind in ("host", "metal", "cuda")  # Metal, then CUDA, then the host
    h = Device("host")
    assert h.kind == "host" and h.name
    assert Device("host") == h  # one native device per kind
    assert isinstance(h.residency_enabled, bool)


def test_metal_unavailable_is_a_device_error():
    if sys.platform == "darwin":
        pytest.skip("Metal may exist here")
    with pytest.raises(hf2q.DeviceError, match="Metal"):
        Device("metal")


def test_unknown_kind():
    with pytest.raises(ValueError, match="unknown device kind"):
        Device("cuda0")


# ------------------------------------------------------------------ buffers


@pytest.mark.parametrize(
    "dtype,shape,byte_len,np_dtype,view_shape",
    [
        ("f32", (3, 5), 60, np.float32, (3, 5)),
        ("f16", (7,), 14, np.float16, (7,)),
        ("bf16", (2, 3), 12, BF16, (2, 3)),
        ("u8", (10,), 10, np.uint8, (10,)),
        ("i32", (4, 1), 16, np.int32, (4, 1)),
        ("q8_0", (4, 64), 4 * 2 * 34, np.uint8, (4, 68)),
    ],
)
def test_alloc_shapes_dtypes_and_zero_fill(dev, dtype, shape, byte_len, np_dtype, view_shape):
    buf = dev.alloc(shape, dtype)
    assert buf.dtype == dtype and buf.shape == shape and buf.byte_len == byte_len
    assert buf.alloc_len % PAGE == 0 and buf.alloc_len >= byte_len
    assert buf.address % PAGE == 0
    v = buf.numpy()
    assert v.dtype == np.dtype(np_dtype) and v.shape == view_shape
    assert not v.view(np.uint8).any()


def test_q8_0_expert_stack_byte_len(dev):
    # docs/Q8_0.md: [256, 512, 2048] -> 285,212,672 bytes; computed without allocating much
    from hf2q._core import NativeDevice  # noqa: F401  (size arithmetic is native)

    buf = dev.alloc((2, 512, 2048), "q8_0")
    assert buf.byte_len == 2 * 512 * 2048 // 32 * 34
    assert 256 * 512 * 2048 // 32 * 34 == 285_212_672


@pytest.mark.parametrize(
    "shape,dtype,exc",
    [
        ((-1, 4), "f32", ValueError),  # ((0,) and (4, 0, 2) are empty buffers: tests/test_hardening_zero.py)
        ((2**62, 2**62), "f32", OverflowError),
        ((2**40, 2**30), "bf16", OverflowError),
        ((2**64,), "u8", OverflowError),
        ((3, 33), "q8_0", ValueError),
        ((4,), "f64", ValueError),
        ((1.5,), "f32", TypeError),
    ],
)
def test_bad_shapes_and_dtypes(dev, shape, dtype, exc):
    before = dev.residency.stats()
    with pytest.raises(exc):
        dev.alloc(shape, dtype)
    assert dev.residency.stats() == before


def test_allocation_failure_is_device_error_and_leaks_nothing(dev):
    before = dev.residency.stats()
    with pytest.raises(hf2q.DeviceError, match="cannot allocate"):
        dev.alloc((1 << 46,), "f32")  # 256 TiB
    assert dev.residency.stats() == before


def test_injected_allocation_failure(dev):
    keep = dev.alloc((16,), "f32")
    before = dev.residency.stats()
    hf2q._core.inject_alloc_failure(2)
    try:
        ok = dev.alloc((16,), "f32")
        with pytest.raises(hf2q.DeviceError, match="injected"):
            dev.alloc((16,), "f32")
        again = dev.alloc((16,), "f32")
    finally:
        hf2q._core.inject_alloc_failure(0)
    assert dev.residency.count == before["count"] + 2
    del ok, again
    gc.collect()
    assert dev.residency.stats() == before
    del keep


# ------------------------------------------------------------------ lifetimes


def test_view_outlives_buffer_object(dev):
    buf = dev.alloc((1024,), "f32")
    alloc_len = buf.alloc_len
    view = buf.numpy()
    view[:] = np.arange(1024, dtype=np.float32)
    del buf
    gc.collect()
    assert dev.residency.count == 1 and dev.residency.allocated_size == alloc_len
    assert view[1023] == 1023.0  # memory still valid
    view2 = view[10:20]
    del view
    gc.collect()
    assert view2[0] == 10.0 and dev.residency.count == 1
    del view2
    gc.collect()
    assert dev.residency.count == 0 and dev.residency.allocated_size == 0


def test_dlpack_into_numpy_is_zero_copy(dev):
    buf = dev.alloc((8, 4), "f32")
    arr = np.from_dlpack(buf)
    assert arr.shape == (8, 4) and arr.dtype == np.float32
    arr[2, 3] = 5.0
    assert buf.numpy()[2, 3] == 5.0
    assert buf.__dlpack_device__() == (1, 0)
    del buf
    gc.collect()
    arr[0, 0] = 1.0  # the DLPack view keeps the memory alive
    assert dev.residency.count == 1
    del arr
    gc.collect()
    assert dev.residency.count == 0


def test_dlpack_into_torch():
    torch = pytest.importorskip("torch")
    dev = Device._isolated("host")
    x = rng_bf16((16, 32))
    buf = dev.upload(x, to="bf16")
    t = torch.from_dlpack(buf)
    assert t.dtype == torch.bfloat16 and tuple(t.shape) == (16, 32)
    assert np.array_equal(t.view(torch.int16).numpy().view(np.uint16), x.view(np.uint16))
    q = dev.upload(x, to="f32")
    assert torch.equal(torch.from_dlpack(q), torch.from_numpy(x.astype(np.float32)))


# ------------------------------------------------------------------ residency


def test_residency_accounting_over_alloc_and_free(dev):
    assert dev.residency_enabled
    bufs = [dev.alloc((n * 1000,), "f32") for n in range(1, 6)]
    st = dev.residency
    assert st.count == 5
    assert st.allocated_size == sum(b.alloc_len for b in bufs)
    assert all(b.registered for b in bufs)
    assert st.sets == 1
    del bufs[1:3]
    gc.collect()
    assert st.count == 3 and st.allocated_size == sum(b.alloc_len for b in bufs)
    del bufs
    gc.collect()
    assert st.count == 0 and st.allocated_size == 0 and st.locked_bytes == 0


def test_register_is_idempotent_and_refuses_other_device(dev):
    buf = dev.alloc((100,), "u8")
    assert register_weight_buffer(dev, buf) is True
    assert register_weight_buffer(dev, buf) is True
    assert dev.residency.count == 1
    other = Device._isolated("host")
    with pytest.raises(hf2q.DeviceError, match="another device|belongs"):
        register_weight_buffer(other, buf)
    with pytest.raises(hf2q.DeviceError):
        other.write(buf, np.zeros(4, np.uint8))
    with pytest.raises(TypeError):
        register_weight_buffer(dev, np.zeros(4))


def test_end_and_request_residency(dev):
    buf = dev.alloc((4096,), "f32")
    if not buf.locked:
        pytest.skip("mlock refused in this environment")
    assert dev.residency.locked and dev.residency.locked_bytes == buf.alloc_len
    dev.residency.end()
    assert not buf.locked and dev.residency.locked_bytes == 0
    assert dev.residency.count == 1  # still tracked
    dev.residency.request()
    assert buf.locked and dev.residency.locked


def _run_py(code: str, env_extra: dict[str, str] | None = None, prefix: list[str] | None = None):
    env = dict(os.environ)
    env.pop("HF2Q_NO_RESIDENCY", None)
    env.update(env_extra or {})
    cmd = (prefix or []) + [sys.executable, "-c", code]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("value,enabled", [("1", False), ("0", True), ("true", True), ("", True), (None, True)])
def test_no_residency_env(value, enabled):
    code = (
        "import hf2q\n"
        "d = hf2q.Device('host')\n"
        "b = d.alloc((1000,), 'f32')\n"
        "b.numpy()[:] = 1\n"
        "print(d.residency_enabled, d.residency.count, b.registered, float(b.numpy().sum()))\n"
    )
    env = {} if value is None else {"HF2Q_NO_RESIDENCY": value}
    r = _run_py(code, env)
    assert r.returncode == 0, r.stderr
    count = 1 if enabled else 0
    assert r.stdout.split() == [str(enabled), str(count), str(enabled), "1000.0"]


@pytest.mark.skipif(
    os.environ.get("HF2Q_UNDER_SANITIZER") == "1",
    reason="AddressSanitizer intercepts mlock() as a no-op that always succeeds, so a refusal cannot happen",
)
def test_mlock_refused_is_tracked_unlocked_not_an_error():
    capsh = "/usr/sbin/capsh"
    if not os.path.exists(capsh) or os.geteuid() != 0:
        pytest.skip("needs root and capsh to drop CAP_IPC_LOCK")
    code = (
        "import resource, hf2q\n"
        "resource.setrlimit(resource.RLIMIT_MEMLOCK, (1 << 20, 1 << 20))\n"
        "d = hf2q.Device('host')\n"
        "b = d.alloc((8 << 20,), 'f32')\n"
        "b.numpy()[:] = 2\n"
        "print(d.residency.count, b.registered, b.locked, d.residency.locked)\n"
    )
    r = subprocess.run(
        [capsh, "--drop=cap_ipc_lock", "--", "-c", f"{sys.executable} -c \"$0\"", code],
        capture_output=True, text=True, timeout=120,
    )
    if r.returncode != 0 and "capsh" in r.stderr:
        pytest.skip(f"capsh unusable here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "True", "False", "False"]
    # One Python warning (native code prints nothing), which a caller can filter.
    assert "ResidencyWarning: mlock refused" in r.stderr and "RLIMIT_MEMLOCK" in r.stderr
    assert r.stderr.count("mlock refused") == 1
    filtered = "import warnings, hf2q\nwarnings.simplefilter('ignore', hf2q.ResidencyWarning)\n" + code
    quiet = subprocess.run(
        [capsh, "--drop=cap_ipc_lock", "--", "-c", f"{sys.executable} -c \"$0\"", filtered],
        capture_output=True, text=True, timeout=120,
    )
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr


# ------------------------------------------------------------------ uploads


@pytest.mark.parametrize("src_dtype", [np.float32, np.float16, BF16])
def test_upload_quantize_equals_ops(dev, src_dtype):
    x = (np.random.default_rng(1).standard_normal((64, 96)) * 0.05).astype(src_dtype)
    buf = dev.upload(x, to="q8_0")
    assert buf.dtype == "q8_0" and buf.shape == (64, 96) and buf.byte_len == 64 * 3 * 34
    assert np.array_equal(buf.numpy(), ops.quantize_q8_0(x))


@pytest.mark.parametrize("src_dtype,fn", [(np.float16, ops.f16_to_f32), (BF16, ops.bf16_to_f32)])
def test_upload_decode_equals_ops(dev, src_dtype, fn):
    bits = np.random.default_rng(2).integers(0, 1 << 16, size=(33, 17), dtype=np.uint16)
    x = bits.view(src_dtype)
    buf = dev.upload(x, to="f32")
    assert np.array_equal(buf.numpy().view(np.uint32), fn(x).view(np.uint32))


@pytest.mark.parametrize("to", ["bf16", "f16", "f32", "u8"])
def test_raw_uploads_copy_bytes(dev, to):
    raw = np.random.default_rng(3).integers(0, 256, size=4096, dtype=np.uint8)
    buf = dev.upload(raw.tobytes(), to=to)
    assert buf.numpy().view(np.uint8).tobytes() == raw.tobytes()
    assert buf.byte_len == 4096


def test_upload_shape_and_errors(dev):
    x = rng_bf16((4, 64))
    b = dev.upload(x, to="bf16", shape=(256,))
    assert b.shape == (256,)
    before = dev.residency.stats()
    with pytest.raises(ValueError, match="elements"):
        dev.upload(x, to="bf16", shape=(255,))
    with pytest.raises(TypeError, match="src_dtype"):
        dev.upload(x.view(np.uint8), to="q8_0")
    with pytest.raises(ValueError, match="cannot convert"):
        dev.upload(np.zeros(32, np.float32), to="bf16")
    with pytest.raises(ValueError, match="multiple of 32"):
        dev.upload(np.zeros((2, 48), np.float32), to="q8_0")
    with pytest.raises(TypeError):
        dev.upload(np.zeros(4, np.float64), to="f32")
    with pytest.raises(TypeError):
        dev.upload(np.zeros(4, np.float32), to="f32", src_dtype="bf16")
    # Byte-swapped arrays are refused, never uploaded as their little-endian
    # namesakes (">f4" is named "float32" too), with or without `to`.
    for swapped, native in ((">f4", "f32"), (">f2", "f16"), (">i4", "i32")):
        with pytest.raises(TypeError, match="got dtype >"):
            dev.upload(np.arange(4, dtype=swapped))
        with pytest.raises(TypeError, match="got dtype >"):
            dev.upload(np.arange(4, dtype=swapped), to=native)
    with pytest.raises(ValueError, match="C-contiguous"):
        dev.upload(np.zeros((64, 64), np.float32)[:, ::2], to="f32")
    gc.collect()
    assert dev.residency.stats() == before


def test_upload_nonfinite_raises_and_frees(dev):
    x = rng_bf16((8, 64))
    x[3, 17] = np.nan
    before = dev.residency.stats()
    with pytest.raises(hf2q.NonFiniteError) as ei:
        dev.upload(x, to="q8_0", name="blk.0.ffn_up_exps.weight")
    assert ei.value.index == 3 * 64 + 17 and ei.value.multi_index == (3, 17)
    assert "blk.0.ffn_up_exps.weight" in str(ei.value) and ei.value.value_class == "nan"
    assert dev.residency.stats() == before


def test_write_into_slices(dev):
    experts = [rng_bf16((64, 128), seed=e) for e in range(4)]
    buf = dev.alloc((4, 64, 128), "q8_0")
    for e, x in enumerate(experts):
        dev.write(buf, x, offset=e * 64 * 128)
    assert np.array_equal(buf.numpy(), ops.quantize_q8_0(np.stack(experts)))
    with pytest.raises(ValueError, match="multiple of 32"):
        dev.write(buf, experts[0][:, :32].copy(), offset=16)
    with pytest.raises(ValueError, match="overruns"):
        dev.write(buf, experts[0], offset=3 * 64 * 128 + 32)


def test_upload_from_file_equals_memory(dev, tmp_path):
    x = rng_bf16((96, 160), seed=4)
    path = tmp_path / "w.bin"
    head = b"\x01" * 13  # unaligned file offset
    path.write_bytes(head + x.tobytes() + b"tail")
    for to in ("bf16", "f32", "q8_0"):
        from_file = dev.upload_from_file(path, len(head), x.nbytes, "bf16", to, x.shape)
        from_mem = dev.upload(x, to=to)
        assert np.array_equal(from_file.numpy().view(np.uint8), from_mem.numpy().view(np.uint8)), to
    fd = os.open(path, os.O_RDONLY)
    try:
        b = dev.upload_from_file(fd, len(head), x.nbytes, "bf16", "f32", x.shape)
        assert np.array_equal(b.numpy(), x.astype(np.float32))
    finally:
        os.close(fd)


def test_upload_from_file_large_multichunk(dev, tmp_path):
    x = rng_bf16((3 << 20,), seed=5)  # several conversion chunks and copy chunks
    path = tmp_path / "big.bin"
    path.write_bytes(x.tobytes())
    q = dev.upload_from_file(path, 0, x.nbytes, "bf16", "q8_0", x.shape)
    assert np.array_equal(q.numpy(), ops.quantize_q8_0(x))
    f = dev.upload_from_file(path, 0, x.nbytes, "bf16", "f32", x.shape)
    assert np.array_equal(f.numpy(), x.astype(np.float32))


def test_upload_from_file_nonfinite_index(dev, tmp_path):
    x = rng_bf16((4, 1 << 20), seed=6)
    x[2, 5] = -np.inf
    x[3, 0] = np.nan
    path = tmp_path / "nan.bin"
    path.write_bytes(x.tobytes())
    before = dev.residency.stats()
    with pytest.raises(hf2q.NonFiniteError) as ei:
        dev.upload_from_file(path, 0, x.nbytes, "bf16", "q8_0", x.shape, name="t")
    assert ei.value.index == 2 * (1 << 20) + 5 and ei.value.multi_index == (2, 5)
    assert dev.residency.stats() == before


def test_short_read_is_an_error(dev, tmp_path):
    path = tmp_path / "short.bin"
    path.write_bytes(b"\0" * 1000)
    before = dev.residency.stats()
    for to in ("bf16", "f32"):
        with pytest.raises(FileReadError, match="end of file") as ei:
            dev.upload_from_file(path, 0, 2000, "bf16", to, (1000,))
        assert str(path) in str(ei.value)
        assert isinstance(ei.value, hf2q.Hf2qError)
        assert ei.value.code == "FileTruncated"  # set by the native reader, not read from the message
    with pytest.raises(FileReadError, match="cannot open"):
        dev.upload_from_file(tmp_path / "missing", 0, 4, "bf16", "bf16", (2,))
    gc.collect()
    assert dev.residency.stats() == before


def test_failed_write_from_file_keeps_no_reference_to_the_buffer(dev, tmp_path):
    # Regression (found by fuzz/fuzz_device.py): the re-raised FileReadError was
    # held in a local of write_from_file, a cycle through its traceback that
    # kept `buf` alive until the cycle collector ran.
    import weakref

    path = tmp_path / "short.bin"
    path.write_bytes(b"\0" * 100)
    buf = dev.alloc((1000,), "bf16")
    ref = weakref.ref(buf)
    gc.disable()
    try:
        with pytest.raises(FileReadError, match="end of file"):
            dev.write_from_file(buf, path, 0, 2000, "bf16")
        del buf
        assert ref() is None and dev.residency.count == 0
    finally:
        gc.enable()


@pytest.mark.parametrize("src_dtype", ["F32", None, "f64", ""])
def test_upload_from_file_unknown_src_dtype_is_value_error(dev, tmp_path, src_dtype):
    # Regression (found by fuzz/fuzz_device.py): the size check looked the
    # source dtype up before validating it and raised KeyError.
    path = tmp_path / "x.bin"
    path.write_bytes(b"\0" * 16)
    with pytest.raises(ValueError, match="unknown dtype"):
        dev.upload_from_file(path, 0, 16, src_dtype, "f32", (4,))
    assert dev.residency.count == 0


def test_concurrent_uploads_from_threads(dev):
    xs = [rng_bf16((512, 1024), seed=s) for s in range(8)]
    results: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            q = dev.upload(xs[i], to="q8_0")
            f = dev.upload(xs[i], to="f32")
            results[i] = (q.numpy().copy(), f.numpy().copy())
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i, x in enumerate(xs):
        assert np.array_equal(results[i][0], ops.quantize_q8_0(x))
        assert np.array_equal(results[i][1], x.astype(np.float32))
    gc.collect()
    assert dev.residency.count == 0


# ------------------------------------------------------------------ verify


@pytest.mark.parametrize("to", ["f32", "bf16", "f16", "q8_0"])
def test_verify_reads_back(dev, to):
    x = (np.random.default_rng(7).standard_normal((300, 64))).astype(np.float32)
    src = x if to in ("f32", "q8_0") else x.astype(BF16 if to == "bf16" else np.float16)
    buf = dev.upload(src, to=to)
    report = dev.verify(buf)
    assert report.ok and report.groups == -(-x.size // 256)


def test_checksums_match_definition(dev):
    x = np.random.default_rng(8).standard_normal(1000).astype(np.float32)
    buf = dev.upload(x, to="f32")
    bits = np.zeros(1024, np.uint64)
    bits[:1000] = x.view(np.uint32)
    w = (2 * np.arange(256, dtype=np.uint64) + 1)
    expect = ((bits.reshape(-1, 256) * w).sum(axis=1) % (1 << 32)).astype(np.uint32)
    assert np.array_equal(reference_checksums(buf), expect)
    assert np.array_equal(np.asarray(dev._native.checksums(buf._native)), expect)


def test_verify_detects_a_mismatch(dev):
    buf = dev.upload(np.ones(512, np.float32), to="f32")

    class Corrupt:
        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            return getattr(self._inner, name)

        def checksums(self, b):
            s = np.asarray(self._inner.checksums(b)).copy()
            s[1] ^= 1
            return s

    real = dev._native
    dev._native = Corrupt(real)
    try:
        with pytest.raises(hf2q.DeviceError, match="mismatch"):
            dev.verify(buf)
    finally:
        dev._native = real
