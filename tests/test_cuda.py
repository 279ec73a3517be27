"""CUDA backend: every conversion and family byte-equal to the host backend,
DLPack with torch, failures. Marked ``cuda``; skipped where no CUDA device
opens (no GPU, driver or NVRTC: CI). Run on a GPU machine with
``pytest -m cuda``."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import hf2q
from hf2q import dflash, qwen35
from hf2q._arrays import BF16
from hf2q.device import Device, FileReadError
from hf2q.errors import DeviceError, NonFiniteError, ScaleOverflowWarning
from hf2q.testing import make_dflash_checkpoint, make_qwen35_moe_checkpoint
from _helpers import why_no_cuda



_NO_CUDA = why_no_cuda()
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(bool(_NO_CUDA), reason=f"no CUDA device: {_NO_CUDA}")]


@pytest.fixture
def gpu() -> Device:
    return Device._isolated("cuda")


@pytest.fixture
def host() -> Device:
    return Device._isolated("host")


def _raw(buf: hf2q.Buffer) -> bytes:
    return np.ascontiguousarray(buf.to_host()).view(np.uint8).tobytes()


def _special_f16() -> np.ndarray:
    """Every binary16 bit pattern (NaN payloads, subnormals, infinities)."""
    return np.arange(65536, dtype=np.uint32).astype(np.uint16)


RNG = np.random.default_rng(1234)


def _q8_inputs() -> dict[str, np.ndarray]:
    """float32 blocks that exercise every row of the Q8_0 edge-case table."""
    blocks = [
        RNG.standard_normal(32 * 4096).astype(np.float32),
        np.zeros(32, np.float32),
        -np.zeros(32, np.float32),
        (np.arange(32, dtype=np.float32) - 16) * 0.5,  # exact ties after scaling
        np.full(32, 3.0e-6, np.float32) * np.linspace(-1, 1, 32, dtype=np.float32),  # d16 == 0
        np.full(32, 1e-40, np.float32) * np.linspace(-1, 1, 32, dtype=np.float32),  # 1/d overflows
        np.full(32, 1e-44, np.float32),
        np.float32(1e-3) * RNG.standard_normal(32).astype(np.float32),  # fp16 subnormal scale
        np.float32(3e38) * np.linspace(-1, 1, 32, dtype=np.float32),  # d16 == +Inf
        np.float32(9e6) * RNG.standard_normal(32).astype(np.float32),
    ]
    x = np.concatenate(blocks)
    return {"f32": x}


# ------------------------------------------------------------------ basics


def test_device_identity(gpu):
    d = Device("cuda")
    assert d == Device("cuda:0") and d.kind == "cuda" and d.index == 0
    assert "cuda:0" in repr(d) and d.name
    assert Device.default().kind in ("cuda", "metal")
    with pytest.raises(DeviceError, match="no CUDA GPU 99"):
        Device("cuda:99")


@pytest.mark.parametrize("dtype,src", [
    ("f32", RNG.standard_normal(3 * 1024 * 1024 + 7).astype(np.float32)),  # > one 4 MiB staging slot
    ("f16", _special_f16().view(np.float16)),
    ("bf16", _special_f16().view(BF16)),
    ("i32", RNG.integers(-2**31, 2**31, 100_003, dtype=np.int64).astype(np.int32)),
    ("u8", RNG.integers(0, 256, 1_000_001, dtype=np.int64).astype(np.uint8)),
])
def test_raw_uploads_equal_host(gpu, host, dtype, src):
    a, b = gpu.upload(src, to=dtype), host.upload(src, to=dtype)
    assert a.shape == b.shape and _raw(a) == _raw(b)
    assert gpu.verify(a).ok


@pytest.mark.parametrize("src_dtype", ["bf16", "f16"])
def test_decode_to_f32_equals_host_for_every_bit_pattern(gpu, host, tmp_path, src_dtype):
    bits = np.tile(_special_f16(), 80)  # 5.2M elements: several slots
    src = bits.view(BF16 if src_dtype == "bf16" else np.float16)
    a, b = gpu.upload(src, to="f32"), host.upload(src, to="f32")
    assert _raw(a) == _raw(b)
    f = tmp_path / "x.bin"
    f.write_bytes(b"\0" * 100 + bits.tobytes())
    c = gpu.upload_from_file(f, 100, bits.nbytes, src_dtype, "f32", bits.shape)
    assert _raw(c) == _raw(b)
    assert gpu.verify(c).ok


@pytest.mark.parametrize("src_dtype", ["f32", "f16", "bf16"])
def test_q8_0_equals_host_byte_for_byte(gpu, host, tmp_path, src_dtype):
    x = _q8_inputs()["f32"]
    if src_dtype == "f16":
        with np.errstate(over="ignore"):
            x = np.where(np.abs(x) < 6e4, x, 0).astype(np.float16)
    elif src_dtype == "bf16":
        x = x.astype(BF16)
    x = np.tile(x, 40)  # several staging slots
    with pytest.warns(ScaleOverflowWarning) if src_dtype != "f16" else _no_warning():
        a = gpu.upload(x, to="q8_0")
    with pytest.warns(ScaleOverflowWarning) if src_dtype != "f16" else _no_warning():
        b = host.upload(x, to="q8_0")
    assert _raw(a) == _raw(b)
    f = tmp_path / "x.bin"
    f.write_bytes(x.tobytes())
    with pytest.warns(ScaleOverflowWarning) if src_dtype != "f16" else _no_warning():
        c = gpu.upload_from_file(f, 0, x.nbytes, src_dtype, "q8_0", x.shape)
    assert _raw(c) == _raw(b)
    assert gpu.verify(c).ok


class _no_warning:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("src_dtype,to", [("f32", "q8_0"), ("bf16", "q8_0"), ("f16", "q8_0"), ("bf16", "f32"),
                                          ("f16", "f32"), ("u8", "u8")])
def test_convert_on_the_gpu_equals_host(gpu, host, src_dtype, to):
    x = np.tile(_special_f16(), 64) if src_dtype in ("bf16", "f16", "u8") else _q8_inputs()["f32"]
    if to == "q8_0" and src_dtype != "f32":  # finite values only
        x = RNG.standard_normal(1 << 20).astype(np.float32).astype(np.float16 if src_dtype == "f16" else BF16)
    elif src_dtype == "bf16":
        x = x.view(BF16)
    elif src_dtype == "f16":
        x = x.view(np.float16)
    elif src_dtype == "u8":
        x = x.view(np.uint8)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScaleOverflowWarning)
        a = gpu.convert(gpu.upload(x, to=src_dtype), to)
        b = host.convert(host.upload(x, to=src_dtype), to)
    assert _raw(a) == _raw(b)
    y = np.ones(1 << 16, dtype=np.float32)
    y[40_001] = -np.inf
    with pytest.raises(NonFiniteError) as e:
        gpu.convert(gpu.upload(y), "q8_0")
    assert e.value.index == 40_001 and e.value.value_class == "-inf"


def test_segments_equal_host(gpu, host, tmp_path):
    x = RNG.standard_normal((64, 512, 256)).astype(np.float32).astype(BF16)  # 64 "experts" of 256 KiB
    f = tmp_path / "x.bin"
    f.write_bytes(x.tobytes())
    per = 512 * 256
    segs = [(e * per, (63 - e) * per * 2, per * 2) for e in range(64)]
    for to in ("bf16", "f32", "q8_0"):
        a, b = gpu.alloc(x.shape, to), host.alloc(x.shape, to)
        gpu.write_from_file_segments(a, f, segs, "bf16")
        host.write_from_file_segments(b, f, segs, "bf16")
        assert _raw(a) == _raw(b), to


def test_q8_0_matches_gguf_py(gpu):
    gguf = pytest.importorskip("gguf")
    x = RNG.standard_normal((64, 4096)).astype(np.float32)
    q = gpu.upload(x, to="q8_0")
    ref = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0)
    assert np.array_equal(q.to_host(), ref)


def test_writes_at_offsets_equal_host(gpu, host):
    x = RNG.standard_normal((8, 4096)).astype(np.float32)
    for to in ("f32", "q8_0"):
        a, b = gpu.alloc(x.shape, to), host.alloc(x.shape, to)
        for r in range(8):
            gpu.write(a, x[r], offset=r * 4096)
            host.write(b, x[r], offset=r * 4096)
        assert _raw(a) == _raw(b)


@pytest.mark.parametrize("src_dtype", ["f32", "bf16", "f16"])
def test_nonfinite_raises_with_the_host_index(gpu, tmp_path, src_dtype):
    dt = {"f32": np.float32, "f16": np.float16, "bf16": BF16}[src_dtype]
    x = np.ones(5 * 1024 * 1024, dtype=np.float32)
    x[3_000_017] = np.nan
    x[4_000_000] = np.inf
    x = x.astype(dt)
    with pytest.raises(NonFiniteError) as e:
        gpu.upload(x, to="q8_0", name="w")
    assert e.value.index == 3_000_017 and e.value.value_class == "nan"
    f = tmp_path / "x.bin"
    f.write_bytes(x.tobytes())
    with pytest.raises(NonFiniteError) as e:
        gpu.upload_from_file(f, 0, x.nbytes, src_dtype, "q8_0", x.shape, name="w")
    assert e.value.index == 3_000_017


# ------------------------------------------------------------------ interop


def test_numpy_refuses_and_to_host_copies(gpu):
    buf = gpu.upload(np.arange(10, dtype=np.float32))
    with pytest.raises(DeviceError, match="to_host"):
        buf.numpy()
    assert np.array_equal(buf.to_host(), np.arange(10, dtype=np.float32))
    assert buf.__dlpack_device__() == (2, 0)


def test_dlpack_into_torch_shares_memory_and_keeps_the_buffer_alive(gpu):
    torch = pytest.importorskip("torch")
    x = RNG.standard_normal((128, 256)).astype(np.float32)
    buf = gpu.upload(x)
    t = torch.from_dlpack(buf)
    assert t.is_cuda and t.device.index == 0 and t.data_ptr() == buf.address
    assert torch.equal(t.cpu(), torch.from_numpy(x))
    t.mul_(2)
    torch.cuda.synchronize()
    assert np.array_equal(buf.to_host(), x * 2)
    before = gpu.residency.count
    del buf
    assert gpu.residency.count == before  # the view holds it
    assert torch.equal(t.cpu(), torch.from_numpy(x * 2))
    del t
    assert gpu.residency.count == before - 1
    q = gpu.upload(x.astype(BF16))
    tq = torch.from_dlpack(q)
    assert tq.dtype == torch.bfloat16 and torch.equal(tq.float().cpu(), torch.from_numpy(x.astype(BF16).astype(np.float32)))


# ------------------------------------------------------------------ residency, failures


def test_residency_tracks_device_buffers(gpu):
    bufs = [gpu.alloc((1000,), "f32") for _ in range(3)]
    st = gpu.residency.stats()
    assert st["count"] == 3 and st["allocated_size"] == sum(b.alloc_len for b in bufs)
    assert gpu.residency.locked and st["locked_bytes"] == st["allocated_size"]
    del bufs
    assert gpu.residency.count == 0


def test_allocation_failure_is_a_device_error(gpu):
    with pytest.raises(DeviceError, match="cannot allocate"):
        gpu.alloc((1 << 50,), "u8")
    hf2q._core.inject_alloc_failure(1)
    with pytest.raises(DeviceError, match="injected"):
        gpu.alloc((16,), "f32")
    assert gpu.alloc((16,), "f32").numel == 16


def test_file_truncated_during_an_upload(gpu, tmp_path):
    x = RNG.standard_normal(6 * 1024 * 1024).astype(np.float32)  # 24 MiB: six slots
    f = tmp_path / "x.bin"
    f.write_bytes(x.tobytes())
    os.truncate(f, 17 * 1024 * 1024)  # the file shrank after its header was read
    for to, src in (("f32", "f32"), ("q8_0", "f32")):
        with pytest.raises(FileReadError, match="end of file"):
            gpu.upload_from_file(f, 0, x.nbytes, src, to, x.shape, name="w")
    assert gpu.residency.count == 0
    ok = gpu.upload(x[:1024])  # still usable
    assert np.array_equal(ok.to_host(), x[:1024])


def test_concurrent_uploads_on_two_threads(gpu, host, tmp_path):
    xs = [RNG.standard_normal(4 * 1024 * 1024).astype(np.float32).astype(BF16) for _ in range(4)]
    paths = []
    for i, x in enumerate(xs):
        p = tmp_path / f"{i}.bin"
        p.write_bytes(x.tobytes())
        paths.append(p)
    out: dict[tuple[int, str], hf2q.Buffer] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for to in ("bf16", "f32", "q8_0"):
                out[(i, to)] = gpu.upload_from_file(paths[i], 0, xs[i].nbytes, "bf16", to, xs[i].shape)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for (i, to), buf in out.items():
        assert _raw(buf) == _raw(host.upload(xs[i], to=to)), (i, to)


def test_a_forked_child_gets_typed_errors_not_a_hang(gpu, dflash_ckpt):
    """CUDA cannot be used in a child forked from a process that uses it (the
    driver's state does not survive fork): the child's calls on the parent's
    device and a new Device("cuda") fail with a DeviceError that says so and
    what to do, before any driver call; the host backend works; the child
    exits (no hang, no crash, no driver call at exit). The parent's device is
    unharmed."""
    x = RNG.standard_normal(1 << 20).astype(np.float32)
    buf = gpu.upload(x)
    gpu.synchronize()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report on the pipe, never return into pytest
        os.close(r)
        report = []
        try:
            h = Device._isolated("host")
            model = dflash.load(dflash_ckpt, device=h, progress=False)
            report.append(f"host:{len(model.names())}")
            for what, fn in (("read", lambda: buf.to_host()), ("upload", lambda: gpu.upload(x)),
                             ("open", lambda: Device._isolated("cuda"))):
                try:
                    fn()
                    report.append(f"{what}:ok")
                except DeviceError as e:
                    report.append(f"{what}:DeviceError" + (":fork" if "fork()" in str(e) else ""))
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            report.append(f"error:{type(e).__name__}:{e}")
        os.write(w, " ".join(report).encode())
        os._exit(0)
    os.close(w)
    import select
    import signal
    import time as _time

    deadline = _time.monotonic() + 120
    status = None
    while _time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        _time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung")
    ready, _, _ = select.select([r], [], [], 1)
    report = os.read(r, 4096).decode() if ready else ""
    os.close(r)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (status, report)
    words = report.split()
    assert words and words[0].startswith("host:") and not any(w.startswith("error:") for w in words), report
    assert words[1:] == ["read:DeviceError:fork", "upload:DeviceError:fork", "open:DeviceError:fork"], report
    assert np.array_equal(buf.to_host(), x)  # the parent's device still works
    assert np.array_equal(gpu.upload(x).to_host(), x)


def test_a_gpu_index_this_machine_lacks_is_named():
    from hf2q._core import NativeDevice

    n = 0
    while True:
        try:
            NativeDevice.open(f"cuda:{n}")
        except DeviceError as e:
            assert f"no CUDA GPU {n}" in str(e) and "cuda:0" in str(e)
            break
        n += 1
        assert n < 64
    assert n >= 1


# ------------------------------------------------------------------ families


@pytest.fixture(scope="module")
def dflash_ckpt(tmp_path_factory):
    return make_dflash_checkpoint(tmp_path_factory.mktemp("dflash"), "tiny")


@pytest.fixture(scope="module")
def qwen_ckpt(tmp_path_factory):
    return make_qwen35_moe_checkpoint(tmp_path_factory.mktemp("qwen"), fused_gate_up=True)


def test_dflash_loads_on_cuda_with_host_bytes(gpu, host, dflash_ckpt):
    a = dflash.load(dflash_ckpt, device=gpu, progress=False)
    b = dflash.load(dflash_ckpt, device=host, progress=False)
    assert a.names() == b.names()
    for n in a.names():
        assert _raw(a[n]) == _raw(b[n]), n
    a.verify()


@pytest.mark.parametrize("dense_dtype", ["f32", "bf16", "f16", "q8_0"])
def test_qwen35_loads_on_cuda_with_host_bytes(gpu, host, qwen_ckpt, dense_dtype):
    a = qwen35.load(qwen_ckpt, device=gpu, dense_dtype=dense_dtype, progress=False)
    b = qwen35.load(qwen_ckpt, device=host, dense_dtype=dense_dtype, progress=False)
    assert a.names() == b.names()
    for n in a.names():
        assert a[n].dtype == b[n].dtype and _raw(a[n]) == _raw(b[n]), n
    a.verify()
    assert a.gpu_resident_bytes() == b.gpu_resident_bytes()


GOLDEN_GEMMA4 = Path(__file__).parent / "data" / "gemma4"


@pytest.mark.parametrize("variant", ["gemma4_moe_causal_lm", "gemma4_moe_conditional_generation"])
@pytest.mark.parametrize("dense_dtype", ["f32", "bf16", "f16", "q8_0"])
def test_gemma4_loads_on_cuda_with_host_bytes(gpu, host, variant, dense_dtype):
    from hf2q import gemma4

    path = GOLDEN_GEMMA4 / variant / "hf"
    a = gemma4.load(path, device=gpu, dense_dtype=dense_dtype, progress=False)
    b = gemma4.load(path, device=host, dense_dtype=dense_dtype, progress=False)
    assert a.names() == b.names()
    for n in a.names():
        assert a[n].dtype == b[n].dtype and _raw(a[n]) == _raw(b[n]), n
    a.verify()
    assert a.gpu_resident_bytes() == b.gpu_resident_bytes()


@pytest.mark.parametrize("dtype", ["keep", "f32", "bf16", "f16", "q8_0"])
def test_generic_loads_on_cuda_with_host_bytes(gpu, host, tmp_path, dtype):
    import json

    from safetensors.numpy import save_file

    from hf2q.models import generic

    rng = np.random.default_rng(7)

    def w(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * 0.05).astype(ml_dtypes.bfloat16)

    tensors = {"model.embed_tokens.weight": w(64, 64), "model.norm.weight": w(64),
               "model.layers.0.mlp.up_proj.weight": w(96, 64), "model.layers.0.mlp.odd.weight": w(8, 40),
               "model.layers.0.self_attn.q_proj.bias": w(64)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    a = generic.load(tmp_path, device=gpu, dtype=dtype, progress=False)
    b = generic.load(tmp_path, device=host, dtype=dtype, progress=False)
    assert a.names() == b.names() and len(a.names()) == len(tensors)
    for n in a.names():
        assert a[n].dtype == b[n].dtype and _raw(a[n]) == _raw(b[n]), n
    a.verify()
