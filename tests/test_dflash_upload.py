"""hf2q.dflash device upload (docs/DFLASH.md, docs/SAFETENSORS.md):
raw BF16 projections byte-identical to the file, the six norm kinds decoded to
F32, field names, byte accounting, residency, the always-on dtype invariant,
read-back verification, and cleanup after truncated files, interrupts and
failures. Tiny drafters only; every test uses an isolated host device."""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from _helpers import InterruptingBar

import hf2q
from hf2q import dflash, ops
from hf2q.device import Buffer, Device
from hf2q.dflash import (
    NORM_SUFFIXES,
    TINY_DRAFTER_CONFIG,
    DFlashConfig,
    DFlashLayerTensors,
    DFlashModelTensors,
    DFlashWeights,
    DTypeInvariantError,
    expected_manifest,
    expected_resident_bytes,
    expected_total_data_bytes,
)
from hf2q.errors import ConfigError, ExtraTensorError, MissingTensorError, SafetensorsError, ShapeMismatchError
from hf2q.testing import make_dflash_checkpoint
from safetensors.numpy import load_file, save_file

import hf2q.loader as hf2q_loader

BF16 = ml_dtypes.bfloat16
TINY = DFlashConfig.from_dict(TINY_DRAFTER_CONFIG)
N_TENSORS = TINY.num_tensors  # 25
LAYER_FIELDS = {
    "q_proj": "self_attn.q_proj.weight",
    "k_proj": "self_attn.k_proj.weight",
    "v_proj": "self_attn.v_proj.weight",
    "o_proj": "self_attn.o_proj.weight",
    "q_norm": "self_attn.q_norm.weight",
    "k_norm": "self_attn.k_norm.weight",
    "input_layernorm": "input_layernorm.weight",
    "post_attention_layernorm": "post_attention_layernorm.weight",
    "mlp_gate": "mlp.gate_proj.weight",
    "mlp_up": "mlp.up_proj.weight",
    "mlp_down": "mlp.down_proj.weight",
}


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dflash_checkpoint(tmp_path_factory.mktemp("single"), "tiny", seed=3)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dflash_checkpoint(tmp_path_factory.mktemp("sharded"), "tiny", seed=3, sharded=True, num_shards=3)


@pytest.fixture(params=["single", "sharded"])
def ckpt(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(request.param)


@pytest.fixture
def dev() -> Device:
    """A host device with its own residency accounting."""
    return Device._isolated("host")


def file_tensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a (possibly sharded) checkpoint, read by the safetensors package."""
    files = sorted(path.glob("*.safetensors"))
    out: dict[str, np.ndarray] = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


def count(dev: Device) -> int:
    return dev.residency.count


def copy_ckpt(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def all_ones_norm_checkpoint(directory: Path) -> Path:
    """A tiny drafter whose every norm is BF16 1.0 (projections random)."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    tensors = {}
    for e in expected_manifest(TINY):
        if e.is_norm:
            tensors[e.name] = np.ones(e.shape, BF16)
        else:
            tensors[e.name] = (rng.standard_normal(e.shape) * 0.02).astype(BF16)
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(TINY_DRAFTER_CONFIG))
    return directory


# --------------------------------------------------------------------------- contents


def test_projections_are_byte_identical_and_norms_f32(ckpt: Path, dev: Device) -> None:
    ref = file_tensors(ckpt)
    model = dflash.load(ckpt, dev, progress=False)
    bufs = model.buffers_by_name()
    assert list(bufs) == [e.name for e in expected_manifest(TINY)] == model.names()
    assert set(bufs) == set(ref)
    n_norm = 0
    for e in expected_manifest(TINY):
        buf, want = bufs[e.name], ref[e.name]
        assert want.dtype == BF16 and want.shape == e.shape
        assert buf.shape == e.shape
        if e.is_norm:
            n_norm += 1
            assert e.name.endswith(NORM_SUFFIXES)
            assert buf.dtype == "f32" and buf.byte_len == 4 * e.numel
            host = buf.numpy()
            assert host.dtype == np.float32
            expect = ops.bf16_to_f32(want.tobytes()).reshape(e.shape)
            assert host.tobytes() == expect.tobytes()
            # bits << 16, exactly
            np.testing.assert_array_equal(host.view(np.uint32), want.view(np.uint16).astype(np.uint32) << 16)
        else:
            assert buf.dtype == "bf16" and buf.byte_len == 2 * e.numel
            assert buf.numpy().dtype == BF16
            assert buf.numpy().tobytes() == want.tobytes()
    assert n_norm == 2 + 4 * TINY.num_hidden_layers


def test_bytes_match_hf2q_reader(single: Path, dev: Device) -> None:
    model = dflash.load(single, dev, progress=False)
    with hf2q.open_checkpoint(single) as ck:
        for name, buf in model.named_buffers():
            raw = bytes(ck.read_bytes(name))
            if buf.dtype == "bf16":
                assert buf.numpy().tobytes() == raw
            else:
                assert buf.numpy().tobytes() == ops.bf16_to_f32(raw).tobytes()


def test_sharded_equals_single(single: Path, sharded: Path, dev: Device) -> None:
    a = dflash.load(single, dev, progress=False)
    b = dflash.load(sharded, dev, progress=False)
    for (na, ba), (nb, bb) in zip(a.named_buffers(), b.named_buffers()):
        assert na == nb and ba.dtype == bb.dtype and ba.numpy().tobytes() == bb.numpy().tobytes()
    assert count(dev) == 2 * N_TENSORS


def test_field_names_map_to_tensors(ckpt: Path, dev: Device) -> None:
    ref = file_tensors(ckpt)
    model = dflash.load(ckpt, dev, progress=False)

    def same(buf: Buffer, name: str) -> bool:
        want = ref[name]
        got = buf.numpy()
        if buf.dtype == "f32":
            return got.tobytes() == want.astype(np.float32).tobytes()
        return got.tobytes() == want.tobytes()

    # every tensor's bytes are distinct, so a match identifies the tensor
    assert len({v.tobytes() for v in ref.values()}) == len(ref)
    assert same(model.fc, "fc.weight") and model.fc.shape == (64, 128)
    assert same(model.hidden_norm, "hidden_norm.weight")
    assert same(model.final_norm, "norm.weight")
    assert not same(model.final_norm, "hidden_norm.weight")
    assert len(model.layers) == TINY.num_hidden_layers
    for i, layer in enumerate(model.layers):
        assert isinstance(layer, DFlashLayerTensors)
        assert list(layer.buffers()) == list(LAYER_FIELDS)
        for field, suffix in LAYER_FIELDS.items():
            name = f"layers.{i}.{suffix}"
            buf = getattr(layer, field)
            assert same(buf, name), (field, name)
            assert model[name] is buf
            others = [f"layers.{j}.{s}" for j in range(TINY.num_hidden_layers) for s in LAYER_FIELDS.values()]
            assert [n for n in others if same(buf, n)] == [name]
    assert model.layers[0].q_proj.shape == (TINY.q_width, 64)
    assert model.layers[0].k_proj.shape == (TINY.kv_width, 64)
    assert model.layers[1].o_proj.shape == (64, TINY.q_width)
    assert model.layers[1].mlp_down.shape == (64, 128) and model.layers[1].mlp_gate.shape == (128, 64)
    assert model.layers[0].q_norm.shape == (16,) and model.layers[0].q_norm.dtype == "f32"
    assert model["fc.weight"] is model.fc and model["norm.weight"] is model.final_norm
    with pytest.raises(KeyError):
        model["lm_head.weight"]


# --------------------------------------------------------------------------- accounting and residency


def test_resident_bytes(ckpt: Path, dev: Device) -> None:
    model = dflash.load(ckpt, dev, progress=False)
    with DFlashWeights.load(ckpt) as w:
        total, resident = w.total_data_bytes(), w.gpu_resident_bytes()
    assert model.gpu_resident_bytes() == resident == total + 2 * TINY.n_norm_elements
    assert resident == expected_resident_bytes(TINY) and total == expected_total_data_bytes(TINY)
    assert model.allocated_bytes() == dev.residency.allocated_size
    assert all(b.alloc_len % dev.page_size == 0 and b.alloc_len >= b.byte_len for b in model.buffers_by_name().values())
    s = model.summary
    assert s is not None
    d = s.as_dict()
    assert d["model"] == "dflash" and d["device"] == "host" and d["tensors"] == N_TENSORS
    assert d["resident_bytes"] == resident and d["data_bytes"] == total
    assert d["layers"] == 2 and d["hidden_size"] == 64 and d["seconds"] >= 0
    assert d["residency"]["buffers"] == N_TENSORS and d["residency"]["enabled"] is True
    assert f"{resident:,} resident bytes on host" in repr(model)


def test_residency_count_and_release(ckpt: Path, dev: Device) -> None:
    assert count(dev) == 0
    model = dflash.load(ckpt, dev, progress=False)
    assert count(dev) == N_TENSORS == len(model.buffers_by_name())
    assert all(b.registered for b in model.buffers_by_name().values())
    assert dev.residency.allocated_size == model.allocated_bytes()
    del model
    gc.collect()
    assert count(dev) == 0 and dev.residency.allocated_size == 0


def test_two_models_share_accounting(single: Path, dev: Device) -> None:
    a = dflash.load(single, dev, progress=False)
    b = dflash.load(single, dev, progress=False)
    assert count(dev) == 2 * N_TENSORS
    del a
    gc.collect()
    assert count(dev) == N_TENSORS
    assert b.verify()["buffers"] == N_TENSORS


# --------------------------------------------------------------------------- dtype invariant (docs/DFLASH.md)


def test_misread_value_pinned() -> None:
    """BF16 1.0, 1.0 (bytes 80 3F 80 3F) read as one float32 is 0x3f803f80."""
    raw = bytes([0x80, 0x3F, 0x80, 0x3F])
    assert np.array([1.0, 1.0], BF16).tobytes() == raw
    misread = np.frombuffer(raw, dtype="<f4")[0]
    assert misread.view(np.uint32) == 0x3F803F80
    assert float(misread) == pytest.approx(1.0019379, abs=1e-7)
    assert float(misread) != 1.0
    decoded = ops.bf16_to_f32(raw)
    assert decoded.dtype == np.float32 and decoded.tolist() == [1.0, 1.0]
    assert decoded.view(np.uint32).tolist() == [0x3F800000, 0x3F800000]


def test_f32_norm_of_bf16_one_is_exactly_one(tmp_path: Path, dev: Device) -> None:
    d = all_ones_norm_checkpoint(tmp_path / "ones")
    model = dflash.load(d, dev, progress=False)
    norms = [model.hidden_norm, model.final_norm] + [
        getattr(layer, f) for layer in model.layers for f in ("q_norm", "k_norm", "input_layernorm",
                                                              "post_attention_layernorm")
    ]
    assert len(norms) == 2 + 4 * TINY.num_hidden_layers
    for buf in norms:
        v = buf.numpy()
        assert buf.dtype == "f32" and v.dtype == np.float32
        assert buf.byte_len == 4 * buf.numel  # a kernel reading float* stays in bounds
        assert (v == 1.0).all()
        assert (v.view(np.uint32) == 0x3F800000).all()
        # read as F32, the buffer holds no misread value
        assert not (v.view(np.uint32) == 0x3F803F80).any()
    model.verify()


def _wrong_bf16_norm(dev: Device, shape: tuple[int, ...]) -> Buffer:
    return dev.upload(np.ones(shape, BF16), to="bf16")


def test_dtype_invariant_raises_on_bf16_norm(single: Path, dev: Device) -> None:
    model = dflash.load(single, dev, progress=False)
    bad = _wrong_bf16_norm(dev, (64,))
    with pytest.raises(DTypeInvariantError) as ei:
        DFlashModelTensors(dev, TINY, model.fc, model.hidden_norm, bad, model.layers)
    e = ei.value
    assert isinstance(e, hf2q.Hf2qError) and not isinstance(e, AssertionError)
    assert "norm.weight" in str(e) and "expected f32" in str(e) and "found bf16" in str(e)


@pytest.mark.parametrize(
    "field,replacement",
    [
        ("q_norm", lambda dev: dev.upload(np.ones(16, BF16), to="bf16")),
        ("input_layernorm", lambda dev: dev.upload(np.ones(64, BF16), to="bf16")),
        ("q_proj", lambda dev: dev.alloc((64, 64), "f32")),  # projection widened by mistake
        ("mlp_down", lambda dev: dev.alloc((128, 64), "bf16")),  # transposed
        ("k_norm", lambda dev: dev.alloc((8,), "f32")),  # wrong length
    ],
)
def test_dtype_invariant_per_field(single: Path, dev: Device, field: str, replacement: Any) -> None:
    model = dflash.load(single, dev, progress=False)
    layers = [DFlashLayerTensors(**layer.buffers()) for layer in model.layers]
    setattr(layers[1], field, replacement(dev))
    with pytest.raises(DTypeInvariantError, match=rf"layers\.1\.{LAYER_FIELDS[field].replace('.', '[.]')}"):
        DFlashModelTensors(dev, TINY, model.fc, model.hidden_norm, model.final_norm, layers)
    # swapping a buffer after construction is caught by the explicit check
    setattr(model.layers[0], field, replacement(dev))
    with pytest.raises(DTypeInvariantError):
        model.check_dtypes()


def test_dtype_invariant_is_not_an_assert(single: Path, tmp_path: Path) -> None:
    """The check still runs under ``python -O`` (asserts stripped)."""
    code = (
        "import sys, numpy as np, ml_dtypes\n"
        "from hf2q.device import Device\n"
        "from hf2q import dflash\n"
        "dev = Device._isolated('host')\n"
        f"m = dflash.load({str(single)!r}, dev, progress=False)\n"
        "bad = dev.upload(np.ones(64, ml_dtypes.bfloat16), to='bf16')\n"
        "try:\n"
        "    dflash.DFlashModelTensors(dev, m.config, m.fc, bad, m.final_norm, m.layers)\n"
        "except dflash.DTypeInvariantError as e:\n"
        "    print('raised', 'hidden_norm.weight' in str(e))\n"
    )
    out = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "raised True"


def test_upload_rejects_bf16_norms_and_frees_everything(
    single: Path, dev: Device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Re-create the original loader bug (norms uploaded as BF16): the
    always-on check in upload refuses the model and frees every buffer."""
    real = Device.alloc

    def buggy(self: Device, shape: Any, dtype: str) -> Buffer:  # every buffer BF16, as the file
        return real(self, shape, "bf16")

    real_many = Device.alloc_many

    def buggy_many(self: Device, specs: Any, **kw: Any) -> list[Buffer]:
        return real_many(self, [(shape, "bf16") for shape, _ in specs], **kw)

    monkeypatch.setattr(Device, "alloc", buggy)
    monkeypatch.setattr(Device, "alloc_many", buggy_many)
    with DFlashWeights.load(single) as w:
        with pytest.raises(DTypeInvariantError) as ei:
            DFlashModelTensors.upload(dev, w.config, w)
    msg = str(ei.value)
    assert msg.count("expected f32") == 2 + 4 * TINY.num_hidden_layers
    assert count(dev) == 0
    gc.collect()
    assert count(dev) == 0


# --------------------------------------------------------------------------- verify


def test_verify_passes(ckpt: Path, dev: Device) -> None:
    model = dflash.load(ckpt, dev, progress=False)
    rep = model.verify()
    assert rep["buffers"] == N_TENSORS and rep["groups"] > 0 and rep["seconds"] >= 0
    # groups cover every element
    assert rep["groups"] >= sum(-(-b.numel // int(hf2q._core.VERIFY_GROUP)) for b in model.buffers_by_name().values())


# --------------------------------------------------------------------------- failures leave nothing behind


def test_truncated_after_validation(tmp_path: Path, single: Path, dev: Device) -> None:
    d = copy_ckpt(single, tmp_path / "ck")
    f = d / "model.safetensors"
    keep = dflash.load(single, dev, progress=False)  # unrelated buffers stay
    prior = count(dev)
    with DFlashWeights.load(d) as w:
        # the tensor stored last in the file (file order is by name, not manifest order)
        by_offset = max(w, key=lambda t: t.info.offset)
        os.truncate(f, os.path.getsize(f) - by_offset.info.nbytes // 2)
        with pytest.raises(SafetensorsError) as ei:
            DFlashModelTensors.upload(dev, w.config, w)
        assert count(dev) == prior  # freed at once, without a gc pass
    e = ei.value
    assert e.code == "FileTruncated"
    # The file's size changed since it was validated: refused before the first
    # tensor in manifest order is read (issue 11, file identity).
    reached = next(iter(w)).entry.name
    assert e.tensor == reached and e.path is not None and Path(e.path) == f
    assert str(f) in str(e) and f"'{reached}'" in str(e)
    assert e.__traceback__ is not None and e.__context__ is None
    gc.collect()
    assert count(dev) == prior
    del keep


def test_truncated_shard_after_validation(tmp_path: Path, sharded: Path, dev: Device) -> None:
    d = copy_ckpt(sharded, tmp_path / "ck")
    with DFlashWeights.load(d) as w:
        files = sorted({t.path for t in w})
        victim = files[1]
        in_victim = [t for t in w if t.path == victim]
        first = min(in_victim, key=lambda t: t.info.offset)
        os.truncate(victim, first.info.offset + 2)  # only the first element of its first tensor survives
        with pytest.raises(SafetensorsError) as ei:
            DFlashModelTensors.upload(dev, w.config, w)
    e = ei.value
    assert e.code == "FileTruncated" and Path(e.path) == victim
    # manifest order: the first tensor of the victim shard that upload reaches
    reached = next(t for t in w if t.path == victim)
    assert e.tensor == reached.entry.name and victim.name in str(e)
    assert count(dev) == 0


def test_truncated_before_load_is_a_header_error(tmp_path: Path, single: Path, dev: Device) -> None:
    d = copy_ckpt(single, tmp_path / "ck")
    f = d / "model.safetensors"
    os.truncate(f, os.path.getsize(f) - 10)
    with pytest.raises(SafetensorsError) as ei:
        dflash.load(d, dev, progress=False)
    assert ei.value.code == "MetadataIncompleteBuffer" and str(f) in str(ei.value)
    assert count(dev) == 0


@pytest.mark.parametrize("after", [0, 1, 11, N_TENSORS - 1])
def test_keyboard_interrupt_from_progress_bar(
    single: Path, dev: Device, monkeypatch: pytest.MonkeyPatch, after: int
) -> None:
    bars: list[InterruptingBar] = []

    def make_bar(total: int, desc: str, enabled: bool) -> InterruptingBar:
        assert enabled and total == expected_total_data_bytes(TINY)
        bars.append(InterruptingBar(after))
        return bars[-1]

    monkeypatch.setattr(hf2q_loader, "progress_bar", make_bar)  # the one loader's bar
    with pytest.raises(KeyboardInterrupt) as ei:
        dflash.load(single, dev, progress=True)
    assert count(dev) == 0  # freed while the exception (and its traceback) is still alive
    del ei
    assert bars[0].closed and bars[0].updates == after + 1
    assert count(dev) == 0
    gc.collect()
    assert count(dev) == 0 and dev.residency.allocated_size == 0


def test_keyboard_interrupt_from_real_tqdm(single: Path, dev: Device, monkeypatch: pytest.MonkeyPatch) -> None:
    tqdm = pytest.importorskip("tqdm")
    calls = {"n": 0}

    def update(self: Any, n: int = 1) -> None:
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt

    monkeypatch.setattr(tqdm.tqdm, "update", update)
    monkeypatch.setattr("hf2q._progress.progress_enabled", lambda requested=True, stream=None: requested)  # a terminal
    with pytest.raises(KeyboardInterrupt) as ei:
        dflash.load(single, dev, progress=True)
    assert count(dev) == 0
    assert ei.value is not None


@pytest.mark.parametrize("exc", [KeyboardInterrupt, MemoryError, hf2q.DeviceError])
@pytest.mark.parametrize("after", [0, 1, 12, N_TENSORS - 1])
def test_failure_in_write_from_file_leaves_nothing(
    sharded: Path, dev: Device, monkeypatch: pytest.MonkeyPatch, after: int, exc: type
) -> None:
    # What the loader streams through: one tensor at a time, or a run of
    # them in one batch (a failure there comes before any of its tensors).
    real = Device.write_from_file_segments
    real_batch = Device._finish_file_batch  # every batch of file jobs is read (or waited for) here
    calls = {"n": 0}

    def flaky(self: Device, *a: Any, **kw: Any) -> None:
        if calls["n"] == after:
            raise exc("injected")
        calls["n"] += 1
        return real(self, *a, **kw)

    def flaky_batch(self: Device, prepared: Any) -> Any:
        jobs = prepared.planned
        if calls["n"] <= after < calls["n"] + len(jobs):
            calls["n"] = after
            raise exc("injected")
        calls["n"] += len(jobs)
        return real_batch(self, prepared)

    keep = dev.alloc((10,), "f32")
    monkeypatch.setattr(Device, "write_from_file_segments", flaky)
    monkeypatch.setattr(Device, "_finish_file_batch", flaky_batch)
    with pytest.raises(exc) as ei:
        dflash.load(sharded, dev, progress=False)
    assert calls["n"] == after
    assert count(dev) == 1  # only `keep`, while the exception is still alive
    assert ei.traceback is not None
    monkeypatch.undo()
    model = dflash.load(sharded, dev, progress=False)  # the device is still usable
    assert count(dev) == 1 + N_TENSORS
    del model, keep
    gc.collect()
    assert count(dev) == 0


def test_injected_allocation_failure_leaves_nothing(single: Path, dev: Device) -> None:
    hf2q._core.inject_alloc_failure(7)
    try:
        with pytest.raises(hf2q.DeviceError, match="injected") as ei:
            dflash.load(single, dev, progress=False)
    finally:
        hf2q._core.inject_alloc_failure(0)
    assert count(dev) == 0 and ei.value is not None


def test_failed_load_closes_files(tmp_path: Path, single: Path, dev: Device, monkeypatch: pytest.MonkeyPatch) -> None:
    fd_dir = Path("/proc/self/fd")
    if not fd_dir.is_dir():
        pytest.skip("needs /proc/self/fd")
    before = len(os.listdir(fd_dir))
    model = dflash.load(single, dev, progress=False)
    assert len(os.listdir(fd_dir)) == before  # files closed after a successful load

    def boom(self: Device, *a: Any, **kw: Any) -> Buffer:
        raise KeyboardInterrupt

    monkeypatch.setattr(Device, "write_from_file_segments", boom)
    monkeypatch.setattr(Device, "_finish_file_batch", boom)
    with pytest.raises(KeyboardInterrupt):
        dflash.load(single, dev, progress=False)
    assert len(os.listdir(fd_dir)) == before
    del model


# --------------------------------------------------------------------------- hf2q.dflash.load end to end


def test_load_end_to_end(ckpt: Path, dev: Device) -> None:
    model = dflash.load(ckpt, dev, progress=False)
    assert isinstance(model, DFlashModelTensors)
    assert model.device == dev and model.config == TINY
    assert model.summary is not None and model.summary.tensors == N_TENSORS
    model.check_dtypes()
    assert model.verify()["buffers"] == N_TENSORS
    # a file path works too (config.json next to it)
    if (ckpt / "model.safetensors").exists():
        m2 = dflash.load(ckpt / "model.safetensors", dev, progress=False)
        assert m2.names() == model.names()


def test_load_with_progress_bar(single: Path, dev: Device, capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    dflash.load(single, dev, progress=True)
    assert capsys.readouterr().err == ""  # stderr is not a terminal here: no bar
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    dflash.load(single, dev, progress=True)
    err = capsys.readouterr().err
    assert "hf2q load" in err and "/165kB" in err


def test_load_explicit_config_and_default_device(single: Path) -> None:
    model = dflash.load(single, config=TINY, progress=False)
    assert model.device.kind in ("host", "metal", "cuda") and model.config == TINY


def test_upload_refuses_a_different_config(single: Path, dev: Device) -> None:
    other = dict(TINY_DRAFTER_CONFIG, block_size=8)
    with DFlashWeights.load(single) as w:
        with pytest.raises(ConfigError, match="different config"):
            DFlashModelTensors.upload(dev, DFlashConfig.from_dict(other), w)
    assert count(dev) == 0


def _tiny_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {e.name: (rng.standard_normal(e.shape) * 0.02).astype(BF16) for e in expected_manifest(TINY)}


def _write(d: Path, tensors: dict[str, np.ndarray], cfg: dict[str, Any] | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(cfg if cfg is not None else TINY_DRAFTER_CONFIG))
    return d


def test_manifest_errors_surface_from_load(tmp_path: Path, dev: Device) -> None:
    t = _tiny_tensors()
    t["lm_head.weight"] = np.zeros((4, 64), BF16)
    with pytest.raises(ExtraTensorError, match="lm_head.weight"):
        dflash.load(_write(tmp_path / "extra", t), dev, progress=False)

    t = _tiny_tensors()
    del t["layers.1.self_attn.k_norm.weight"]
    with pytest.raises(MissingTensorError, match=r"layers\.1\.self_attn\.k_norm\.weight"):
        dflash.load(_write(tmp_path / "missing", t), dev, progress=False)

    t = _tiny_tensors()
    t["fc.weight"] = np.zeros((64, 192), BF16)  # T*H wrong (3 taps instead of 2)
    with pytest.raises(ShapeMismatchError, match=r"expected \[64, 128\], actual \[64, 192\]"):
        dflash.load(_write(tmp_path / "shape", t), dev, progress=False)

    t = _tiny_tensors()
    t["norm.weight"] = t["norm.weight"].astype(np.float32)  # a pre-widened norm is still refused: BF16 only
    with pytest.raises(hf2q.DtypeMismatchError, match="norm.weight"):
        dflash.load(_write(tmp_path / "dtype", t), dev, progress=False)
    assert count(dev) == 0


def test_config_errors_surface_from_load(tmp_path: Path, dev: Device) -> None:
    cfg = dict(TINY_DRAFTER_CONFIG, block_size=1)
    with pytest.raises(ConfigError) as ei:
        dflash.load(_write(tmp_path / "rule3", _tiny_tensors(), cfg), dev, progress=False)
    assert ei.value.rule == 3 and "config.json" in str(ei.value)
    d = tmp_path / "nocfg"
    d.mkdir()
    save_file(_tiny_tensors(), str(d / "model.safetensors"))
    with pytest.raises(ConfigError, match="config file not found"):
        dflash.load(d, dev, progress=False)
    with pytest.raises(SafetensorsError):
        dflash.load(tmp_path / "does-not-exist", dev, progress=False)
    assert count(dev) == 0
