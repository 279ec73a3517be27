"""The host device's scratch mode (hf2q convert): no residency, freed memory
kept for the next allocations, handed out zero-filled again, within its limit
(docs/RESIDENCY.md, "Scratch devices")."""

from __future__ import annotations

import numpy as np
import pytest

import hf2q
from hf2q.device import Device


def _scratch(limit: int) -> Device:
    dev = Device._isolated("host")
    assert dev._native.use_as_scratch(limit) is True
    return dev


def test_scratch_has_no_residency_and_reuses_zeroed_memory() -> None:
    dev = _scratch(64 << 20)
    assert not dev.residency_enabled
    a = dev.alloc([1 << 20], "f32")  # 4 MiB
    dev.write(a, np.full(1 << 20, 7.0, dtype=np.float32))
    assert not a.registered and not a.locked
    del a
    # The kept range is handed out again (split for the smaller one, the rest
    # kept), zero-filled, every time.
    b = dev.alloc([1 << 18], "f32")
    c = dev.alloc([3 << 18], "f32")
    assert not b.numpy().any() and not c.numpy().any()
    dev.write(b, np.arange(1 << 18, dtype=np.float32))
    dev.write(c, np.ones(3 << 18, dtype=np.float32))
    assert b.numpy()[-1] == (1 << 18) - 1 and c.numpy().sum() == 3 << 18
    del b, c
    d = dev.alloc([1 << 20], "f32")  # the two halves joined again
    assert not d.numpy().any()
    e = dev.alloc([5 << 20], "u8")  # larger than anything kept: fresh memory
    assert not e.numpy().any()
    dev.write(d, np.full(1 << 20, 3.0, dtype=np.float32))
    assert (d.numpy() == 3.0).all()


def test_scratch_memory_past_the_limit_is_unmapped() -> None:
    dev = _scratch(8 << 20)
    bufs = [dev.alloc([2 << 20], "u8") for _ in range(8)]  # 16 MiB in use: over the limit
    for b in bufs:
        dev.write(b, np.full(2 << 20, 1, dtype=np.uint8))
    del bufs  # at most 8 MiB of them kept
    again = [dev.alloc([2 << 20], "u8") for _ in range(8)]
    assert all(not b.numpy().any() for b in again)


def test_scratch_only_before_the_first_buffer() -> None:
    dev = Device._isolated("host")
    if not dev.residency_enabled:
        pytest.skip("residency disabled (HF2Q_NO_RESIDENCY=1): no buffer is tracked")
    keep = dev.alloc([16], "f32")
    with pytest.raises(hf2q.DeviceError, match="use_as_scratch"):
        dev._native.use_as_scratch(1 << 20)
    del keep
    dev2 = _scratch(1 << 20)
    with pytest.raises(hf2q.DeviceError, match="scratch already"):
        dev2._native.use_as_scratch(1 << 20)


@pytest.mark.parametrize("outtype", ["q8_0", "f16", "bf16"])
def test_convert_in_parts_writes_the_same_file(tmp_path, monkeypatch, outtype) -> None:
    """hf2q convert reads an expert stack of per-expert tensors in parts of
    whole experts (export._parts) when it is larger than a batch: the file is
    the one a whole-stack conversion writes, and the parts were used."""
    from pathlib import Path

    from hf2q import export

    qwen = Path(__file__).parent / "data" / "golden" / "qwen35moe_causal_lm" / "hf"
    ref = tmp_path / "ref.gguf"
    monkeypatch.setattr(export, "_parts", lambda entry, part_bytes: [entry])
    hf2q.convert(qwen, ref, outtype)
    monkeypatch.undo()
    split: list[int] = []
    real = export._parts

    def spy(entry, part_bytes):
        out = real(entry, part_bytes)
        if len(out) > 1:
            split.append(len(out))
            assert sum(p.nbytes for p in out) == entry.nbytes
        return out

    monkeypatch.setattr(export, "_parts", spy)
    monkeypatch.setattr(export, "BATCH_BYTES", 2048)
    out = tmp_path / "parts.gguf"
    hf2q.convert(qwen, out, outtype)
    assert split, "no stack was split"
    assert out.read_bytes() == ref.read_bytes()
