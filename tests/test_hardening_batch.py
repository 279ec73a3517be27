"""A read that fails in the middle of a batch names the tensor that failed,
not the batch's first (issue 26). The failure is a read the kernel refuses
(EBADF: a descriptor opened for writing only), so it is not a truncation the
old fallback could find by comparing sizes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import hf2q
from hf2q import safetensors as st
from hf2q.device import Device, FileReadError

from _helpers import why_no_cuda


@pytest.mark.parametrize("kind", ["host", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_device_batch_names_the_failing_job(kind: str, tmp_path: Path) -> None:
    if kind == "cuda" and why_no_cuda():
        pytest.skip(f"no CUDA device: {why_no_cuda()}")
    f = tmp_path / "x.bin"
    f.write_bytes(np.arange(64, dtype=np.float32).tobytes())
    dev = Device._isolated(kind)
    a, b, c = dev.alloc((16,), "f32"), dev.alloc((16,), "f32"), dev.alloc((16,), "f32")
    wfd = os.open(f, os.O_WRONLY)
    try:
        with pytest.raises(FileReadError) as ei:
            dev.write_from_file_batch([(a, f, [(0, 0, 64)], "f32", "first"),
                                       (b, wfd, [(0, 64, 64)], "f32", "second"),
                                       (c, f, [(0, 128, 64)], "f32", "third")])
    finally:
        os.close(wfd)
    assert "'second'" in str(ei.value) and "'first'" not in str(ei.value), str(ei.value)
    assert ei.value.job == 1  # type: ignore[attr-defined]
    assert not ei.value.system_failure  # EBADF: how the file was given, not the machine


def test_loader_batch_names_the_failing_tensor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "ck"
    d.mkdir()
    names = {"model-00001-of-00002.safetensors": ["a.weight", "b.weight"],
             "model-00002-of-00002.safetensors": ["c.weight", "d.weight"]}
    weight_map = {}
    for shard, tensors in names.items():
        save_file({t: np.full((8, 8), i, np.float32) for i, t in enumerate(tensors)}, str(d / shard))
        weight_map.update({t: shard for t in tensors})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (d / "config.json").write_text("{}")
    bad = d / "model-00002-of-00002.safetensors"
    wfd = _unreadable(bad, monkeypatch)
    try:
        with pytest.raises(hf2q.SafetensorsError) as ei:
            hf2q.load(d, Device._isolated("host"), progress=False)
    finally:
        os.close(wfd)
    assert ei.value.tensor == "c.weight" and ei.value.path == str(bad), str(ei.value)  # was 'a.weight'


@pytest.mark.parametrize("on_device", [False, True])
def test_failed_read_of_an_fp8_scale_in_its_own_file_names_the_scale(tmp_path: Path, on_device: bool,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """An FP8 weight's scale stored in another shard than the weight: a read
    of that shard that fails names the scale tensor and its file (on the
    host's decoder, and through the GPU's batched transients: ``on_device``)."""
    from hf2q import loader, qwen35
    from hf2q.testing import make_qwen35_moe_checkpoint

    d = make_qwen35_moe_checkpoint(tmp_path / "ck", "tiny", seed=1, fp8_block=(32, 32), sharded=True)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    wm = index["weight_map"]
    scale = "model.layers.1.mlp.experts.2.down_proj.weight_scale_inv"
    home = d / wm[scale]
    with st.open(home) as f:  # raw bytes (numpy has no FP8 dtype for safetensors' own reader)
        raw = {t.name: (t.dtype, list(t.shape), bytes(f.read_bytes(t.name))) for t in f.tensors()}
    _write_raw(d / "model-scales.safetensors", {scale: raw.pop(scale)})
    _write_raw(home, raw)
    wm[scale] = "model-scales.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    if on_device:
        monkeypatch.setattr(loader, "_SCALED_ON_DEVICE", True)
    dev = Device._isolated("host")
    qwen35.load(d, device=dev, progress=False)  # loads while the file reads
    bad = d / "model-scales.safetensors"
    if not on_device:
        # The host's decoder reads a scale through its file's own descriptor:
        # the file cut short after it was opened and validated.
        from hf2q.models.qwen35 import FAMILY

        with st.open_checkpoint(d) as ck:
            plan = FAMILY.plan_checkpoint(ck, config=None)
            os.truncate(bad, os.path.getsize(bad) - 8)
            with pytest.raises(hf2q.SafetensorsError) as ei:
                FAMILY.load_planned(plan, ck, dev, progress=False)
        assert ei.value.tensor == scale and ei.value.path == str(bad), str(ei.value)
        return
    wfd = _unreadable(bad, monkeypatch)
    try:
        with pytest.raises(hf2q.SafetensorsError) as ei:
            qwen35.load(d, device=dev, progress=False)
    finally:
        os.close(wfd)
    assert ei.value.tensor == scale and ei.value.path == str(bad), str(ei.value)


def _write_raw(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> None:
    """A safetensors file of raw tensor bytes, in the order given."""
    header, at = {}, 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(data)]}
        at += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + b"".join(d for _, _, d in tensors.values()))


def _unreadable(path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """The loader's reads of ``path`` given a descriptor opened for writing
    only (EBADF: a read the kernel refuses, not a truncation); returns it, to close."""
    wfd = os.open(path, os.O_WRONLY)
    real = st.SafetensorsFile.fileno

    def fileno(self: st.SafetensorsFile) -> int:
        return wfd if Path(self.path).name == path.name else real(self)

    monkeypatch.setattr(st.SafetensorsFile, "fileno", fileno)
    return wfd


def test_a_scale_read_the_kernel_refuses_goes_to_the_general_reader(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``loader._scale_values`` (a per-tensor scale of an expert stack, read on
    the CPU on a GPU's path): an ``os.pread`` that raises is not a bare
    OSError: the general reader reads it again and words its own failure."""
    from hf2q import loader

    f = tmp_path / "model.safetensors"
    save_file({"w_scale": np.array([0.5, 2.0], np.float32)}, str(f))
    ck = st.open_checkpoint(f)

    def refused(*_: object) -> bytes:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(loader.os, "pread", refused)
    assert loader._scale_values(ck, "w_scale", "F32").tolist() == [0.5, 2.0]
    monkeypatch.setattr(st.SafetensorsFile, "read_array", lambda *_: (_ for _ in ()).throw(
        hf2q.SafetensorsError("x: tensor 'w_scale': Input/output error", code="Io", path=str(f), tensor="w_scale")))
    with pytest.raises(hf2q.SafetensorsError):
        loader._scale_values(ck, "w_scale", "F32")
    ck.close()
