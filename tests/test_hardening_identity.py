"""Files changed under a load (issue 11, row "file replaced in place"): a
checkpoint rewritten in place after validation (same size, tensors' data
reordered) is refused with a typed error naming the file, instead of loading
another tensor's bytes. Identity = device, inode, size, mtime recorded at
open, compared before each tensor a loader reads and around every read.
(Replacement by rename keeps the opened inode and still loads the original
bytes: tests/test_fault_injection.py.)"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

import hf2q
from hf2q import dflash, qwen35
from hf2q.device import Device, FileReadError
from hf2q.errors import SafetensorsError
import importlib

dflash_mod = importlib.import_module("hf2q.models.dflash.manifest")  # where each loader opens its checkpoint
from hf2q.testing import make_dflash_checkpoint, make_qwen35_moe_checkpoint

# Linux file timestamps come from a coarse clock (one tick, 1-10 ms): a write
# within the same tick as the open leaves mtime unchanged (the window
# docs/RELIABILITY.md describes). The tests step past it.
TICK = 0.03


def _reorder_in_place(path: Path) -> None:
    """Same size, same header, data section reversed in 2-byte units."""
    with hf2q.safetensors.open(path) as f:
        start = f.data_offset
    raw = path.read_bytes()
    data = np.frombuffer(raw[start:], dtype=np.uint16)[::-1].tobytes()
    time.sleep(TICK)
    with open(path, "r+b") as fh:  # in place: same inode
        fh.seek(start)
        fh.write(data)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("identity")
    return {
        "dflash": make_dflash_checkpoint(base / "d", "tiny", seed=2),
        "dflash-sharded": make_dflash_checkpoint(base / "ds", "tiny", seed=2, sharded=True, num_shards=3),
        "qwen35": make_qwen35_moe_checkpoint(base / "q", "tiny", seed=2),
        "qwen35-sharded": make_qwen35_moe_checkpoint(base / "qs", "tiny", seed=2, sharded=True),
    }


@pytest.mark.parametrize("which", ["dflash", "dflash-sharded", "qwen35", "qwen35-sharded"])
def test_rewritten_in_place_after_validation_is_refused(which: str, ckpts: dict[str, Path], tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "ck"
    shutil.copytree(ckpts[which], d)
    victims = sorted(d.glob("*.safetensors"))
    # (qwen35.load opens the checkpoint through hf2q.models.load_with, which takes it from hf2q.safetensors)
    mod = dflash_mod if which.startswith("dflash") else hf2q.safetensors
    real_open = mod.open_checkpoint

    def open_then_rewrite(path, *a, **k):  # validated, then rewritten before any tensor is read
        ckpt = real_open(path, *a, **k)
        for v in victims:
            _reorder_in_place(v)
        return ckpt

    monkeypatch.setattr(mod, "open_checkpoint", open_then_rewrite)
    dev = Device._isolated("host")
    with pytest.raises(SafetensorsError) as ei:
        (dflash.load if which.startswith("dflash") else qwen35.load)(d, dev, progress=False)
    e = ei.value
    assert e.code == "FileChanged" and e.path is not None and Path(e.path) in victims
    assert str(e.path) in str(e) and "modified after it was opened" in str(e)
    assert dev.residency.count == 0


def test_read_into_after_an_in_place_rewrite(ckpts: dict[str, Path], tmp_path: Path) -> None:
    p = tmp_path / "m.safetensors"
    shutil.copy(ckpts["dflash"] / "model.safetensors", p)
    with hf2q.safetensors.open(p) as f:
        name = f.keys()[0]
        f.read_bytes(name)
        f.check_unchanged()
        _reorder_in_place(p)
        with pytest.raises(SafetensorsError) as ei:
            f.read_bytes(name)
        assert ei.value.code == "FileChanged" and str(p) in str(ei.value)
        with pytest.raises(SafetensorsError):
            f.check_unchanged()


def test_upload_from_file_fd_modified_during_the_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "raw.bin"
    p.write_bytes(np.arange(1 << 16, dtype=np.uint16).tobytes())
    dev = Device._isolated("host")
    real = dev._native.read_file

    class Native:  # the device's native calls, with a write landing mid-read
        def __getattr__(self, n):
            return getattr(real.__self__, n)

        def read_file(self, *a, **k):
            r = real(*a, **k)
            time.sleep(TICK)
            with open(p, "r+b") as fh:
                fh.write(b"\1\1")
            return r

    monkeypatch.setattr(dev, "_native", Native())
    with pytest.raises(FileReadError, match="modified while it was read"):
        dev.upload_from_file(p, 0, 1 << 17, "bf16", "bf16", (1 << 16,))


def test_renamed_over_is_not_a_change(ckpts: dict[str, Path], tmp_path: Path) -> None:
    # An atomic re-download (rename over the path) leaves the open inode intact.
    p = tmp_path / "m.safetensors"
    shutil.copy(ckpts["dflash"] / "model.safetensors", p)
    with hf2q.safetensors.open(p) as f:
        name = f.keys()[0]
        want = bytes(f.read_bytes(name))
        shutil.copy(p, tmp_path / "new")
        os.replace(tmp_path / "new", p)
        f.check_unchanged()
        assert bytes(f.read_bytes(name)) == want
