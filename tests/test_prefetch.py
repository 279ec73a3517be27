"""Shards read onto the device while the checkpoint is opened and planned
(hf2q.prefetch, docs/CUDA.md "Prefetching shards"): a GPU's path, forced on
the host here (CI has no GPU; test_fp8_cuda.py runs it on one). The
scaled FP8 runs that lie in a prefetched shard are decoded from its copy
(Device.scaled_fp8_gather) with the bytes the ring's decode gives; a shard
that is not the opened file is not used; a failed read is a typed error
naming the shard; the copy is dropped where the plan would not fit beside
it; the gather's arguments are checked."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hf2q
from hf2q import loader, prefetch, qwen35
from hf2q.errors import FileReadError, SafetensorsError
from hf2q.testing import make_qwen35_moe_checkpoint
from _helpers import why_no_cuda

_NO_CUDA = why_no_cuda()
_CUDA = [pytest.mark.cuda, pytest.mark.skipif(bool(_NO_CUDA), reason=f"no CUDA device: {_NO_CUDA}")]
KINDS = ["host", pytest.param("cuda", marks=_CUDA)]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_qwen35_moe_checkpoint(tmp_path_factory.mktemp("pf") / "ck", "tiny", fp8_block=(32, 32),
                                      sharded=True, num_shards=3)


@pytest.fixture
def gathered(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The GPU's path on the host; the number of entries each gathered decode took."""
    monkeypatch.setattr(prefetch, "_FORCE", True)
    monkeypatch.setattr(loader, "_SCALED_ON_DEVICE", True)
    monkeypatch.setattr(loader, "_OVERLAP", True)
    for k in ("GPU_BATCH_BYTES", "GPU_FIRST_BATCH_BYTES"):
        monkeypatch.setattr(loader, k, 64 << 10)
    seen: list[int] = []
    decode = loader._decode_prefetched

    def spy(device: Any, ckpt: Any, pf: Any, group: list[Any], check_finite: bool) -> Any:
        seen.append(len(group))
        return decode(device, ckpt, pf, group, check_finite)

    monkeypatch.setattr(loader, "_decode_prefetched", spy)
    return seen


def _bytes(model: Any) -> dict[str, bytes]:
    return {n: b.to_host().view(np.uint8).tobytes() for n, b in model.named_buffers()}


def _plain(d: Path, outtype: str) -> dict[str, bytes]:
    """The host's own load (nothing forced, whatever the test patched): the reference."""
    saved = prefetch._FORCE, loader._SCALED_ON_DEVICE, loader._OVERLAP
    prefetch._FORCE, loader._SCALED_ON_DEVICE, loader._OVERLAP = False, False, None
    try:
        return _bytes(qwen35.load(d, device=hf2q.Device._isolated("host"), expert_dtype=outtype, dense_dtype="bf16",
                                  progress=False))
    finally:
        prefetch._FORCE, loader._SCALED_ON_DEVICE, loader._OVERLAP = saved


@pytest.mark.parametrize("outtype", ["q8_0", "bf16", "f32"])
def test_prefetched_load_equals_the_plain_load(ckpt, gathered, outtype) -> None:
    want = _plain(ckpt, outtype)
    assert gathered == []  # (the reference is the host's own path)
    got = _bytes(qwen35.load(ckpt, device=hf2q.Device._isolated("host"), expert_dtype=outtype, dense_dtype="bf16",
                             progress=False))
    assert got.keys() == want.keys()
    assert [n for n in want if got[n] != want[n]] == []
    assert sum(gathered) > 0  # the expert stacks came from the shards' copies


def test_only_the_shards_within_the_budget_are_read_ahead(ckpt, gathered, monkeypatch) -> None:
    from hf2q.safetensors import open_checkpoint

    with open_checkpoint(ckpt) as ck:
        first = ck.shards[0]
        data = first.file_size - first.data_offset
    monkeypatch.setattr(prefetch, "PREFETCH_BYTES", data)
    dev = hf2q.Device._isolated("host")
    pf = prefetch.start(dev, ckpt)
    assert pf is not None
    try:
        assert [s.path.name for s in pf.shards] == [first.path.name] and pf.nbytes == data
    finally:
        pf.close()
    want = _plain(ckpt, "q8_0")
    got = _bytes(qwen35.load(ckpt, device=dev, expert_dtype="q8_0", dense_dtype="bf16", progress=False))
    assert got == want and sum(gathered) > 0


def test_no_prefetch_without_a_budget_or_on_the_host(ckpt, monkeypatch) -> None:
    dev = hf2q.Device._isolated("host")
    assert prefetch.start(dev, ckpt) is None  # the CPU addresses the memory: read in place
    monkeypatch.setattr(prefetch, "_FORCE", True)
    monkeypatch.setattr(prefetch, "PREFETCH_BYTES", 0)
    assert prefetch.start(dev, ckpt) is None
    assert prefetch.start("host", ckpt) is None  # (not an open Device)
    assert prefetch.start(hf2q.Device._isolated("host"), ckpt / "missing") is None


def test_a_shard_rewritten_after_its_read_is_not_used(ckpt, gathered, tmp_path) -> None:
    from hf2q.models.qwen35 import plan_checkpoint
    from hf2q.safetensors import open_checkpoint

    d = tmp_path / "ck"
    shutil.copytree(ckpt, d)
    dev = hf2q.Device._isolated("host")
    pf = prefetch.start(dev, d)
    assert pf is not None and len(pf.shards) == 3
    names = sorted(p.name for p in d.glob("*.safetensors"))
    victim = d / names[0]
    copy = d / "tmp"
    shutil.copyfile(victim, copy)
    os.replace(copy, victim)  # the same bytes, another file (an atomic re-download)
    with open_checkpoint(d) as ck:
        pf.match(ck)
        assert sorted(s.path.name for s in pf.shards if s.files) == names[1:]
        plan = plan_checkpoint(ck, config=None, expert_dtype="q8_0", dense_dtype="bf16")
        from hf2q.models.qwen35.load import FAMILY

        got = _bytes(FAMILY.load_planned(plan, ck, dev, progress=False, prefetch=pf))
    assert got == _plain(ckpt, "q8_0")
    assert sum(gathered) > 0
    assert all(s.file.closed and s.buf is None for s in pf.shards)  # the load closed it


def test_a_failed_shard_read_is_a_typed_error_naming_it(ckpt, gathered, monkeypatch) -> None:
    from hf2q.device import Device

    finish = Device._finish_file_batch

    def failing(self: Device, batch: Any) -> Any:
        if any(str(p[4]).endswith(".safetensors") for p in batch.planned):  # a shard read ahead
            finish(self, batch)
            raise FileReadError("short read (injected)")
        return finish(self, batch)

    monkeypatch.setattr(Device, "_finish_file_batch", failing)
    dev = hf2q.Device._isolated("host")
    with pytest.raises(SafetensorsError) as e:
        qwen35.load(ckpt, device=dev, expert_dtype="q8_0", dense_dtype="bf16", progress=False)
    from hf2q.safetensors import open_checkpoint

    with open_checkpoint(ckpt) as ck:  # the shard, and an FP8 weight the load took from its copy
        assert str(ck.file_for(e.value.tensor).path) == e.value.path
        assert ck[e.value.tensor].dtype == "F8_E4M3"
    assert gathered  # it failed where the copy was used


def test_a_prefetch_dropped_when_the_plan_would_not_fit(ckpt, gathered, monkeypatch) -> None:
    # 2 GiB free: the shards fit its quarter, the plan and the margin beside them do not.
    monkeypatch.setattr(prefetch, "_memory", lambda device: 2 << 30)
    dev = hf2q.Device._isolated("host")
    pf = prefetch.start(dev, ckpt)
    assert pf is not None and not pf.fits(1)
    pf.close()
    got = _bytes(qwen35.load(ckpt, device=dev, expert_dtype="q8_0", dense_dtype="bf16", progress=False))
    assert got == _plain(ckpt, "q8_0") and gathered == []


def test_a_bad_checkpoint_with_a_prefetch_started_raises_the_opening_error(ckpt, gathered, tmp_path) -> None:
    d = tmp_path / "ck"
    shutil.copytree(ckpt, d)
    index = (d / "model.safetensors.index.json").read_text()
    (d / "model.safetensors.index.json").write_text(index.replace("model.layers.0.", "model.layers.9.", 1))
    with pytest.raises(SafetensorsError):
        qwen35.load(d, device=hf2q.Device._isolated("host"), progress=False)


# ------------------------------------------------------------------------------------------- the gather's checks

def _gather_case(rng: np.random.Generator, lead: int = 3, rows: int = 64, cols: int = 64,
                 block: tuple[int, int] = (32, 32)) -> tuple[Any, ...]:
    w = rng.integers(0, 256, (lead, rows, cols), dtype=np.uint8)
    w[(w & 0x7F) == 0x7F] = 0x21  # no NaN
    grid = (rng.random((lead, -(-rows // block[0]), -(-cols // block[1])), dtype=np.float32) * 1e-2 + 1e-4)
    # The matrices scattered in a source with junk between them, at offsets of every alignment.
    offsets, parts, at = [], [], 0
    for k in range(lead):
        gap = (16, 5, 11)[k % 3]  # (16-byte aligned, not, aligned again: a GPU copies the second first)
        parts.append(b"\xaa" * gap)
        at += gap
        offsets.append(at)
        parts.append(w[k].tobytes())
        at += w[k].nbytes
    return w, grid, np.frombuffer(b"".join(parts), dtype=np.uint8), offsets


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("out", ["q8_0", "bf16", "f32", "f16"])
def test_gather_equals_the_contiguous_decode(out, kind) -> None:
    import ml_dtypes

    dev = hf2q.Device._isolated(kind)
    rng = np.random.default_rng(3)
    w, grid, raw, offsets = _gather_case(rng)
    lead, rows, cols = w.shape
    src = dev.alloc((raw.size,), "f8_e4m3")
    dev.write(src, raw.view(ml_dtypes.float8_e4m3fn))
    whole = dev.alloc((w.size,), "f8_e4m3")
    dev.write(whole, w.reshape(-1).view(ml_dtypes.float8_e4m3fn))
    sbuf = dev.alloc((grid.size,), "f32")
    dev.write(sbuf, grid.reshape(-1))
    a, b = dev.alloc((lead, rows, cols), out), dev.alloc((lead, rows, cols), out)
    assert dev._native.scaled_fp8(a._native, 0, whole._native, sbuf._native, (lead, rows, cols), (32, 32)) == (-1, 0)
    pieces = [(offsets[0], 1), (offsets[1], 1), (offsets[2], 1)]
    (res,) = dev._native.scaled_fp8_gather(src._native, "f8_e4m3",
                                           [(b._native, 0, sbuf._native, (rows, cols), (32, 32), pieces, "", [])])
    assert res == (-1, 0)
    assert a.to_host().view(np.uint8).tobytes() == b.to_host().view(np.uint8).tobytes()


@pytest.mark.parametrize("kind", KINDS)
def test_gather_reports_a_nan_at_its_stack_index(kind) -> None:
    import ml_dtypes

    dev = hf2q.Device._isolated(kind)
    w, grid, raw, offsets = _gather_case(np.random.default_rng(5))
    lead, rows, cols = w.shape
    raw = raw.copy()
    raw[offsets[2] + 70] = 0x7F  # matrix 2, element 70
    src = dev.alloc((raw.size,), "f8_e4m3")
    dev.write(src, raw.view(ml_dtypes.float8_e4m3fn))
    sbuf = dev.alloc((grid.size,), "f32")
    dev.write(sbuf, grid.reshape(-1))
    dst = dev.alloc((lead, rows, cols), "bf16")
    (res,) = dev._native.scaled_fp8_gather(src._native, "f8_e4m3", [(dst._native, 0, sbuf._native, (rows, cols),
                                                                     (32, 32), [(o, 1) for o in offsets], "", [])])
    assert res[0] == 2 * rows * cols + 70


@pytest.mark.parametrize("kind", KINDS)
def test_gather_refuses_bad_arguments(kind) -> None:
    dev = hf2q.Device._isolated(kind)
    src = dev.alloc((1100,), "f8_e4m3")
    dst = dev.alloc((2, 16, 32), "q8_0")
    sbuf = dev.alloc((2,), "f32")
    bf = dev.alloc((2,), "bf16")

    def call(*stack: Any, weight: str = "f8_e4m3", scales: tuple[str, list[tuple[int, int]]] = ("", [])) -> Any:
        return dev._native.scaled_fp8_gather(src._native, weight, [(*stack, *scales)])

    ok = [(0, 1), (512, 1)]
    assert call(dst._native, 0, sbuf._native, (16, 32), (16, 32), ok) == [(-1, 0)]
    with pytest.raises(ValueError, match="overruns the source"):
        call(dst._native, 0, sbuf._native, (16, 32), (16, 32), [(0, 1), (600, 1)])
    with pytest.raises(ValueError, match="overruns the source"):
        call(dst._native, 0, sbuf._native, (16, 32), (16, 32), [(2**63, 2**62)])
    with pytest.raises(ValueError, match="must be f32"):
        call(dst._native, 0, bf._native, (16, 32), (16, 32), ok)
    with pytest.raises(ValueError, match="scale buffer holds"):
        call(dst._native, 0, sbuf._native, (16, 32), (8, 32), ok)
    with pytest.raises(ValueError, match="overrun the destination"):
        call(dst._native, 32, sbuf._native, (16, 32), (16, 32), ok)
    with pytest.raises(ValueError, match="destination is a source"):
        call(src._native, 0, sbuf._native, (16, 32), (16, 32), ok)
    with pytest.raises(ValueError):
        call(dst._native, 0, sbuf._native, (16, 32), (16, 32), ok, weight="bf16")
    with pytest.raises(ValueError, match="has no elements"):  # (a zero dimension: once a division by zero)
        call(dst._native, 0, sbuf._native, (0, 32), (16, 32), ok)
    with pytest.raises(ValueError, match="scale buffer is the source"):
        dev._native.scaled_fp8_gather(sbuf._native, "f8_e4m3", [(dst._native, 0, sbuf._native, (16, 32), (16, 32),
                                                                 [(0, 0)], "", [])])
    # Scale tensors in the source: within it, exactly the grids' values, a widening format.
    assert call(dst._native, 0, sbuf._native, (16, 32), (16, 32), ok, scales=("bf16", [(1090, 1), (1095, 1)])) == [
        (-1, 0)]
    with pytest.raises(ValueError, match="scale tensor of 1 values at byte 1099 overruns"):
        call(dst._native, 0, sbuf._native, (16, 32), (16, 32), ok, scales=("bf16", [(1090, 1), (1099, 1)]))
    with pytest.raises(ValueError, match="hold 3 values, the grids 2"):
        call(dst._native, 0, sbuf._native, (16, 32), (16, 32), ok, scales=("bf16", [(1090, 1), (1092, 2)]))
    with pytest.raises(ValueError, match="f32, bf16 or f16"):
        call(dst._native, 0, sbuf._native, (16, 32), (16, 32), ok, scales=("f8_e4m3", [(1090, 1), (1092, 1)]))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("scale_dtype", ["bf16", "f16", "f32"])
def test_gather_widens_scale_tensors_from_the_source(kind, scale_dtype) -> None:
    # The grids as the checkpoint stores them (bf16 / f16 / f32 scale tensors
    # between the weights, at odd offsets), widened on the device: the bytes
    # of a decode given those values as an f32 grid.
    import ml_dtypes

    dev = hf2q.Device._isolated(kind)
    w, grid, raw, offsets = _gather_case(np.random.default_rng(11))
    lead, rows, cols = w.shape
    np_dtype = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "f32": np.float32}[scale_dtype]
    stored = grid.astype(np_dtype)
    per = stored[0].size
    blob, scale_at = bytearray(raw.tobytes()), []
    for k in range(lead):
        blob += b"\x01" * (3 + k)  # odd offsets
        scale_at.append((len(blob), per))
        blob += stored[k].tobytes()
    src = dev.alloc((len(blob),), "f8_e4m3")
    dev.write(src, np.frombuffer(bytes(blob), dtype=ml_dtypes.float8_e4m3fn))
    exact = dev.alloc((grid.size,), "f32")
    dev.write(exact, stored.astype(np.float32).reshape(-1))
    widened = dev.alloc((grid.size,), "f32")
    a, b = dev.alloc((lead, rows, cols), "q8_0"), dev.alloc((lead, rows, cols), "q8_0")
    pieces = [(o, 1) for o in offsets]
    assert dev._native.scaled_fp8_gather(src._native, "f8_e4m3", [
        (a._native, 0, exact._native, (rows, cols), (32, 32), pieces, "", []),
        (b._native, 0, widened._native, (rows, cols), (32, 32), pieces, scale_dtype, scale_at)]) == [(-1, 0), (-1, 0)]
    assert widened.to_host().tobytes() == exact.to_host().tobytes()
    assert a.to_host().view(np.uint8).tobytes() == b.to_host().view(np.uint8).tobytes()


@pytest.mark.cuda
@pytest.mark.skipif(bool(_NO_CUDA), reason=f"no CUDA device: {_NO_CUDA}")
@pytest.mark.parametrize("outtype", ["q8_0", "bf16"])
def test_prefetched_load_on_a_gpu_equals_the_hosts(ckpt, outtype, monkeypatch) -> None:
    # The GPU's own path (nothing forced): the shards read ahead, the stacks
    # gathered from their copies (pieces at any alignment), the bytes the host's.
    seen: list[int] = []
    decode = loader._decode_prefetched
    monkeypatch.setattr(loader, "_decode_prefetched", lambda *a: (seen.append(len(a[3])), decode(*a))[1])  # (group)
    gpu = hf2q.Device._isolated("cuda")
    got = _bytes(qwen35.load(ckpt, device=gpu, expert_dtype=outtype, dense_dtype="bf16", progress=False))
    assert got == _plain(ckpt, outtype) and sum(seen) > 0


def test_a_nan_in_a_prefetched_expert_names_it(gathered, tmp_path) -> None:
    # Decoded from the shard's copy, a NaN byte in one expert's weight is still
    # reported with that expert's tensor and its own flat index (the file named).
    from hf2q.errors import NonFiniteError
    from hf2q.safetensors import open_checkpoint

    d = make_qwen35_moe_checkpoint(tmp_path / "ck", "tiny", fp8_block=(32, 32), sharded=True, num_shards=3)
    with open_checkpoint(d) as ck:
        target = next(n for n in ck.keys() if ".experts.2.up_proj.weight" in n and ck[n].dtype == "F8_E4M3")
        info = ck[target]
    with open(info.path, "r+b") as f:
        f.seek(info.offset + 37)
        f.write(b"\x7f")  # E4M3 NaN
    with pytest.raises(NonFiniteError) as e:
        qwen35.load(d, device=hf2q.Device._isolated("host"), expert_dtype="q8_0", progress=False)
    assert (e.value.tensor, e.value.index) == (target, 37)
    assert str(info.path) in str(e.value)
    assert sum(gathered) > 0


def test_no_prefetch_for_a_checkpoint_without_scaled_fp8(gathered, tmp_path, monkeypatch) -> None:
    # A BF16 checkpoint (no quantization_config): nothing is read ahead.
    started: list[Any] = []
    start = prefetch.start
    monkeypatch.setattr(prefetch, "start", lambda *a: (started.append(a), start(*a))[1])
    d = make_qwen35_moe_checkpoint(tmp_path / "bf16", "tiny", sharded=True)
    qwen35.load(d, device=hf2q.Device._isolated("host"), progress=False)
    assert started == [] and gathered == []


def test_a_prefetch_with_nothing_to_decode_is_let_go(ckpt, gathered, monkeypatch) -> None:
    # FP8 kept as FP8 (no decode): the shards read ahead are dropped before the loop.
    released: list[int] = []
    release = prefetch.Prefetch.release
    monkeypatch.setattr(prefetch.Prefetch, "release", lambda self: (released.append(self.nbytes), release(self))[1])
    hf2q.load(ckpt, device=hf2q.Device._isolated("host"), dtype="keep", progress=False, family="generic")
    assert released and released[0] > 0 and gathered == []


def test_a_fifo_among_the_shards_is_the_openings_error(ckpt, gathered, tmp_path) -> None:
    # The prefetch opens files without blocking and only regular ones: a FIFO
    # in a shard's place is left to the opening, which refuses it (no hang).
    d = tmp_path / "ck"
    shutil.copytree(ckpt, d)
    victim = sorted(d.glob("*.safetensors"))[1]
    victim.unlink()
    os.mkfifo(victim)
    with pytest.raises(SafetensorsError):
        qwen35.load(d, device=hf2q.Device._isolated("host"), progress=False)


def test_a_shard_read_that_failed_on_a_changed_file_says_so(ckpt, gathered, tmp_path, monkeypatch) -> None:
    # As for a batch: a failed read of a file rewritten since it was validated
    # is that (FileChanged, naming the file), not a bare read error.
    from hf2q.device import Device
    from hf2q.safetensors import FILE_CHANGED

    d = tmp_path / "ck"
    shutil.copytree(ckpt, d)
    finish = Device._finish_file_batch

    def failing(self: Device, batch: Any) -> Any:
        shard = next((str(p[4]) for p in batch.planned if str(p[4]).endswith(".safetensors")), None)
        if shard is None:
            return finish(self, batch)
        finish(self, batch)
        st = os.stat(shard)
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # rewritten in place, say
        raise FileReadError("short read (injected)")

    monkeypatch.setattr(Device, "_finish_file_batch", failing)
    with pytest.raises(SafetensorsError) as e:
        qwen35.load(d, device=hf2q.Device._isolated("host"), expert_dtype="q8_0", progress=False)
    assert e.value.code == FILE_CHANGED and e.value.path is not None and e.value.path.endswith(".safetensors")
    assert gathered


def test_no_room_for_the_shards_is_no_prefetch_and_nothing_left_open(ckpt, monkeypatch) -> None:
    from hf2q.errors import DeviceError

    monkeypatch.setattr(prefetch, "_FORCE", True)
    dev = hf2q.Device._isolated("host")

    def no_room(*a: Any, **k: Any) -> Any:
        raise DeviceError("cannot allocate (injected)")

    monkeypatch.setattr(dev, "alloc_many", no_room)
    fds = len(os.listdir("/proc/self/fd"))
    assert prefetch.start(dev, ckpt) is None
    assert len(os.listdir("/proc/self/fd")) == fds


def test_a_host_load_reads_no_config_for_the_prefetch(ckpt, monkeypatch) -> None:
    from hf2q import models

    asked: list[Any] = []
    monkeypatch.setattr(models, "_scaled_fp8", lambda *a: asked.append(a) or False)
    qwen35.load(ckpt, device=hf2q.Device._isolated("host"), progress=False)
    assert asked == []
