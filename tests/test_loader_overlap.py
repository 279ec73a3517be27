"""The loader's batch overlap (hf2q.loader.execute on a GPU: a batch's reads
and copies run on a helper thread while the loading thread prepares the
next). CI has no GPU, so these tests force it on the host backend
(``loader._OVERLAP``) with small batches: the same bytes as without it, and
every failure (an allocation, a file changed mid-load, a KeyboardInterrupt
in either thread) leaves the device as it was, with no thread left behind."""

from __future__ import annotations

import gc
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hf2q
from hf2q import loader, qwen35
from hf2q.device import Device
from hf2q.errors import SafetensorsError
from hf2q.testing import make_qwen35_moe_checkpoint


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("overlap")
    return {
        "experts": make_qwen35_moe_checkpoint(base / "experts", "tiny", seed=9, sharded=True),
        "fused": make_qwen35_moe_checkpoint(base / "fused", "tiny", seed=9, fused_gate_up=True),
        "fp8": make_qwen35_moe_checkpoint(base / "fp8", "tiny", seed=9, fp8_block=(32, 32)),
    }


@pytest.fixture
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches of ~64 KiB, so that a tiny checkpoint is many of them."""
    monkeypatch.setattr(loader, "BATCH_BYTES", 64 << 10)
    monkeypatch.setattr(loader, "GPU_BATCH_BYTES", 64 << 10)
    monkeypatch.setattr(loader, "SCALED_BATCH_BYTES", 64 << 10)


def _load(path: Path, dev: Device, **kw: Any) -> Any:
    return qwen35.load(path, device=dev, progress=False, dense_dtype="q8_0", **kw)


def _bytes(model: Any) -> dict[str, bytes]:
    return {n: np.ascontiguousarray(b.to_host()).view(np.uint8).tobytes() for n, b in model.named_buffers()}


def _state(dev: Device) -> tuple[Any, ...]:
    gc.collect()
    st = dev.residency.stats()
    return st["count"], st["allocated_size"], st["locked_bytes"], threading.active_count()


@pytest.mark.parametrize("kind", ["experts", "fused", "fp8"])
def test_overlap_loads_the_same_bytes(kind: str, ckpts: dict[str, Path], small_batches: None,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    dev = Device._isolated("host")
    if kind == "fp8":  # the GPU's path: scale grids into transients, weights decoded as they are read
        monkeypatch.setattr(loader, "_SCALED_ON_DEVICE", True)
    monkeypatch.setattr(loader, "_OVERLAP", False)
    want = _bytes(_load(ckpts[kind], dev))
    runs: list[str] = []
    real = loader._InFlight._run

    def run(self: Any, *a: Any) -> None:
        runs.append(threading.current_thread().name)
        real(self, *a)

    monkeypatch.setattr(loader._InFlight, "_run", run)
    monkeypatch.setattr(loader, "_OVERLAP", True)
    assert _bytes(_load(ckpts[kind], dev)) == want
    assert len(runs) > 3 and set(runs) == {"hf2q-load-batch"}  # many batches, each on the helper thread


def _planner(path: Path) -> Any:
    """The family's plan_checkpoint for the checkpoint at ``path``."""
    import json

    from hf2q import models

    return models.detect(json.loads((path / "config.json").read_text())).impl().plan_checkpoint


@pytest.mark.parametrize("early", [False, True])
def test_a_model_made_early_gets_a_last_batch_of_a_batch_s_bytes(early: bool, ckpts: dict[str, Path],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """With make_early the model is made while the last batch is written:
    a tail smaller than a batch joins the batch before it, so that the last
    batch lasts a batch's time (here a batch fills at the entry before the
    last, which is a batch of its own when the model is made once
    everything landed)."""
    from hf2q.model import LoadedModel
    from hf2q.safetensors import open_checkpoint

    path = ckpts["fused"]
    plan_checkpoint = _planner(path)
    dev = Device._isolated("host")
    monkeypatch.setattr(loader, "_OVERLAP", True)
    batches: list[int] = []
    real_join = loader._InFlight.join

    def join(self: Any) -> Any:
        batches.append(sum(self.sizes))
        return real_join(self)

    monkeypatch.setattr(loader._InFlight, "join", join)
    with open_checkpoint(path) as ck:
        plan = plan_checkpoint(ck, config=None)
        streamed = [e.source_nbytes for e in plan if e.streamed]
        bound = sum(streamed) - streamed[-1]  # a batch fills at the entry before the last, which is a tail
        assert streamed[-1] < bound
        monkeypatch.setattr(loader, "GPU_BATCH_BYTES", bound)
        monkeypatch.setattr(loader, "BATCH_BYTES", bound)
        monkeypatch.setattr(loader, "BATCH_ENTRIES", 10**6)
        model = loader.execute(plan, ck, dev, lambda bufs: LoadedModel(dev, None, bufs), make_early=early)
    assert len(model) == len(plan)
    if early:
        assert batches == [sum(streamed)], (batches, bound)
    else:
        assert len(batches) == 2 and batches[-1] < bound, (batches, bound)


def _count_batches(monkeypatch: pytest.MonkeyPatch) -> list[list[Any]]:
    """The entries of each batch run on the helper thread, as they start."""
    seen: list[list[Any]] = []
    real = loader._run_batch

    def run(device: Any, ckpt: Any, batch: Any, check_finite: bool = False) -> Any:
        seen.append(list(batch.entries))
        return real(device, ckpt, batch, check_finite)

    monkeypatch.setattr(loader, "_run_batch", run)
    return seen


def test_tail_merge_keeps_the_fp8_and_entry_bounds(ckpts: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The tail joining the last batch of a model made early is bounded by
    bytes only: FP8 transients (scale grids in device memory beside the
    model's) and the entry count still end a batch."""
    from hf2q.model import LoadedModel
    from hf2q.safetensors import open_checkpoint

    dev = Device._isolated("host")
    monkeypatch.setattr(loader, "_OVERLAP", True)
    monkeypatch.setattr(loader, "_SCALED_ON_DEVICE", True)
    monkeypatch.setattr(loader, "GPU_BATCH_BYTES", 1 << 40)  # every tail is smaller than a batch
    monkeypatch.setattr(loader, "BATCH_BYTES", 1 << 40)
    plan_checkpoint = _planner(ckpts["fp8"])
    with open_checkpoint(ckpts["fp8"]) as ck:
        grid = max(loader._scaled_grid_bytes(e) for e in plan_checkpoint(ck, config=None))
    assert grid > 0
    for limit in ("SCALED_BATCH_BYTES", "BATCH_ENTRIES"):
        with monkeypatch.context() as mp:
            if limit == "SCALED_BATCH_BYTES":
                mp.setattr(loader, "SCALED_BATCH_BYTES", 4 * grid)
            else:
                mp.setattr(loader, "BATCH_ENTRIES", 4)
            seen = _count_batches(mp)
            with open_checkpoint(ckpts["fp8"]) as ck:
                plan = plan_checkpoint(ck, config=None)
                loader.execute(plan, ck, dev, lambda bufs: LoadedModel(dev, None, bufs), make_early=True)
            assert len(seen) > 3, limit
            if limit == "BATCH_ENTRIES":
                assert max(len(b) for b in seen) <= 4
            else:  # scale grid bytes of a batch: within the (halved, overlapped) bound plus one entry
                assert max(sum(loader._scaled_grid_bytes(e) for e in b if not e.streamed) for b in seen) \
                    < 4 * grid // 2 + grid


def test_landed_seconds_count_entries_filled_after_the_last_batch(ckpts: dict[str, Path],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry filled on the loading thread after the last batch was sent
    off is written after that batch may have landed: landed_seconds waits
    for both."""
    import dataclasses
    import time

    from hf2q.model import LoadedModel
    from hf2q.safetensors import open_checkpoint

    dev = Device._isolated("host")
    monkeypatch.setattr(loader, "_OVERLAP", True)
    monkeypatch.setattr(loader, "BATCH_ENTRIES", 1)  # each streamed entry leaves at once: no tail merge
    real_fill = loader._fill

    def slow_fill(device: Any, ckpt: Any, entry: Any, *a: Any) -> Any:
        if entry.name == "output_norm.weight":
            time.sleep(0.3)
        return real_fill(device, ckpt, entry, *a)

    monkeypatch.setattr(loader, "_fill", slow_fill)
    plan_checkpoint = _planner(ckpts["fused"])
    with open_checkpoint(ckpts["fused"]) as ck:
        plan = plan_checkpoint(ck, config=None)
        names = [e.name for e in plan]
        assert names[-2:] == ["output_norm.weight", "output.weight"]
        entries = list(plan)
        entries[-2], entries[-1] = entries[-1], entries[-2]  # the last streamed entry, then an inline one
        plan = dataclasses.replace(plan, entries=entries)
        model = loader.execute(plan, ck, dev, lambda bufs: LoadedModel(dev, None, bufs), make_early=True)
    assert model.summary.landed_seconds >= 0.3


def _fails_on_second_call(monkeypatch: pytest.MonkeyPatch, name: str, action: Any) -> None:
    real = getattr(loader, name)
    calls = [0]

    def wrapped(*a: Any, **kw: Any) -> Any:
        calls[0] += 1
        if calls[0] == 2:
            action()
        return real(*a, **kw)

    monkeypatch.setattr(loader, name, wrapped)


def _interrupt() -> None:
    raise KeyboardInterrupt("injected")


@pytest.mark.parametrize("where", ["_run_batch", "_write_jobs", "_prepare_batch", "_transpose_batch"])
def test_interrupt_in_either_thread_leaves_nothing(where: str, ckpts: dict[str, Path], small_batches: None,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """_run_batch / _write_jobs / _transpose_batch run on the helper thread,
    _prepare_batch on the loading thread while a batch is in flight."""
    dev = Device._isolated("host")
    monkeypatch.setattr(loader, "_OVERLAP", True)
    _load(ckpts["experts"], dev)  # one-time costs paid
    before = _state(dev)
    _fails_on_second_call(monkeypatch, where, _interrupt)
    with pytest.raises(KeyboardInterrupt, match="injected"):
        _load(ckpts["experts"], dev)
    assert _state(dev) == before


def test_allocation_failure_at_every_allocation(ckpts: dict[str, Path], small_batches: None,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    dev = Device._isolated("host")
    monkeypatch.setattr(loader, "_OVERLAP", True)
    want = _bytes(_load(ckpts["experts"], dev))
    before = _state(dev)
    failed = 0
    for k in range(1, 200):
        hf2q._core.inject_alloc_failure(k)
        try:
            model = _load(ckpts["experts"], dev)
        except hf2q.DeviceError:
            failed += 1
            assert _state(dev) == before, k
            continue
        finally:
            hf2q._core.inject_alloc_failure(0)
        assert _bytes(model) == want
        del model
        break
    assert failed > 5


def test_file_truncated_while_a_batch_runs(ckpts: dict[str, Path], small_batches: None, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    d = tmp_path / "ck"
    shutil.copytree(ckpts["experts"], d)
    dev = Device._isolated("host")
    monkeypatch.setattr(loader, "_OVERLAP", True)
    _load(d, dev)
    before = _state(dev)
    shard = sorted(d.glob("*.safetensors"))[-1]

    def truncate() -> None:
        with open(shard, "r+b") as f:
            f.truncate(os.path.getsize(shard) // 2)

    _fails_on_second_call(monkeypatch, "_write_jobs", truncate)
    with pytest.raises(SafetensorsError) as ei:
        _load(d, dev)
    assert ei.value.path is not None and Path(ei.value.path).name == shard.name
    assert _state(dev) == before


def test_no_thread_to_run_a_batch_leaves_nothing(ckpts: dict[str, Path], small_batches: None,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A helper thread that cannot start (RuntimeError: can't start new
    thread) fails the load with that error, its prepared batch freed."""
    dev = Device._isolated("host")
    monkeypatch.setattr(loader, "_OVERLAP", True)
    _load(ckpts["experts"], dev)
    before = _state(dev)
    starts = [0]
    real = threading.Thread.start

    def start(self: threading.Thread) -> None:
        if self.name == "hf2q-load-batch":
            starts[0] += 1
            if starts[0] == 2:
                raise RuntimeError("can't start new thread")
        real(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        _load(ckpts["experts"], dev)
    monkeypatch.setattr(threading.Thread, "start", real)
    assert _state(dev) == before


def test_join_thread_waits_out_an_interrupt_then_raises_it() -> None:
    """A Ctrl-C while waiting for a helper thread (a batch, the hand-off's
    device opening) does not leave the thread running: the wait goes on
    until it is done, then the KeyboardInterrupt is raised."""
    release = threading.Event()
    finished = threading.Event()

    def work() -> None:
        release.wait(5)
        finished.set()

    class Interrupted(threading.Thread):
        joins = 0

        def join(self, timeout: float | None = None) -> None:
            Interrupted.joins += 1
            if Interrupted.joins == 1:
                release.set()  # the thread may finish now, but the caller is interrupted first
                raise KeyboardInterrupt
            super().join(timeout)

    t = Interrupted(target=work)
    t.start()
    with pytest.raises(KeyboardInterrupt):
        loader.join_thread(t)
    assert finished.is_set() and not t.is_alive() and Interrupted.joins >= 2


def test_gpu_batches_end_at_their_own_entry_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the CPU does not address the memory (a GPU), a batch ends at
    GPU_BATCH_ENTRIES entries, not BATCH_ENTRIES: a checkpoint of a buffer
    per tensor was 244 drained batches of 256 (docs/CUDA.md). A host device
    stand-in that says its memory is not CPU-visible takes the GPU path."""
    import json

    from safetensors.numpy import save_file

    from hf2q import models
    from hf2q.safetensors import open_checkpoint

    save_file({f"t.{i}.weight": np.full((4, 8), i, np.float32) for i in range(1000)},
              str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["FooForCausalLM"]}))

    class NotCpuVisible:
        cpu_visible = False

        def __init__(self, native: Any) -> None:
            self._native = native

        def __getattr__(self, name: str) -> Any:
            return getattr(self._native, name)

    fam = models.family("generic").impl()

    def batches(dev: Device) -> list[int]:
        seen = _count_batches(monkeypatch)
        with open_checkpoint(tmp_path) as ck:
            plan = fam.plan_checkpoint(ck, config=None, dtype="keep")
            model = fam.load_planned(plan, ck, dev, progress=False)
        assert all((model[f"t.{i}.weight"].to_host() == i).all() for i in range(1000))
        return [len(b) for b in seen]

    gpu = Device._isolated("host")
    gpu._native = NotCpuVisible(gpu._native)
    assert batches(gpu) == [1000]  # within GPU_BATCH_ENTRIES (and the first batch's byte bound)
    monkeypatch.setattr(loader, "GPU_BATCH_ENTRIES", 300)
    assert batches(gpu) == [300, 300, 300, 100]
    monkeypatch.setattr(loader, "_OVERLAP", True)  # the host itself: BATCH_ENTRIES, in the helper thread as on a GPU
    assert batches(Device._isolated("host")) == [256, 256, 256, 232]
