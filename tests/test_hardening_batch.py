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
    wfd = os.open(bad, os.O_WRONLY)
    real = st.SafetensorsFile.fileno

    def fileno(self: st.SafetensorsFile) -> int:
        return wfd if Path(self.path).name == bad.name else real(self)

    monkeypatch.setattr(st.SafetensorsFile, "fileno", fileno)
    try:
        with pytest.raises(hf2q.SafetensorsError) as ei:
            hf2q.load(d, Device._isolated("host"), progress=False)
    finally:
        os.close(wfd)
    assert ei.value.tensor == "c.weight" and ei.value.path == str(bad), str(ei.value)  # was 'a.weight'
