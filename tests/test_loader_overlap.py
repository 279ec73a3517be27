"""The loader's batch overlap (hf2q.loader.execute on a GPU: a batch's reads
and copies run in the load's batch queue, a native thread, while the loading
thread prepares the next). CI has no GPU, so these tests force it on the
host backend (``loader._OVERLAP``) with small batches: the same bytes as
without it, and every failure (an allocation, a file changed mid-load, a
KeyboardInterrupt on the loading thread, a queue that cannot start) leaves
the device as it was, with no thread left behind."""

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
from hf2q.device import Device, join_thread
from hf2q.errors import SafetensorsError
from hf2q.testing import make_qwen35_moe_checkpoint

from _helpers import QueueSpy


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
    made = QueueSpy.install(monkeypatch)
    want = _bytes(_load(ckpts[kind], dev))
    assert not made  # no queue without the overlap
    monkeypatch.setattr(loader, "_OVERLAP", True)
    before = threading.active_count()
    assert _bytes(_load(ckpts[kind], dev)) == want
    assert len(made) == 1 and len(made[0].threads) > 3  # many batches, all through the load's one queue
    assert threading.active_count() == before  # (the spy's own thread joined)


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
    """The entries of each batch, as it starts (in the queue or not)."""
    seen: list[list[Any]] = []
    real = loader._start_batch

    def start(device: Any, batch: Any, queue: Any = None, check_finite: bool = False) -> Any:
        seen.append(list(batch.entries))
        return real(device, batch, queue, check_finite)

    monkeypatch.setattr(loader, "_start_batch", start)
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


@pytest.mark.parametrize("where", ["_start_batch", "_finish_batch", "_write_jobs", "_prepare_batch",
                                   "_judge_scaled"])
def test_interrupt_at_each_step_leaves_nothing(where: str, ckpts: dict[str, Path], small_batches: None,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C while a batch is submitted, prepared (the one before it in
    the queue) or joined and judged: the batches in the queue are waited for
    before their buffers go."""
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


@pytest.mark.parametrize("where", ["queue", "submit"])
def test_a_queue_that_cannot_start_or_take_a_batch_leaves_nothing(where: str, ckpts: dict[str, Path],
                                                                  small_batches: None,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """No thread for the load's queue (RuntimeError: can't start new thread)
    fails the load before anything is allocated; a submission refused
    mid-load fails it with the batches before it waited for and every
    buffer freed."""
    dev = Device._isolated("host")
    monkeypatch.setattr(loader, "_OVERLAP", True)
    _load(ckpts["experts"], dev)
    before = _state(dev)
    if where == "queue":
        def refuse(self: Any) -> Any:
            raise RuntimeError("can't start new thread")

        monkeypatch.setattr(Device, "_batch_queue", refuse)
    else:
        real = Device._start_file_batch
        calls = [0]

        def start(self: Any, batch: Any, queue: Any = None, after: Any = None, transposes: Any = ()) -> Any:
            calls[0] += queue is not None
            if calls[0] == 3:
                raise RuntimeError("can't start new thread")
            return real(self, batch, queue, after, transposes)

        monkeypatch.setattr(Device, "_start_file_batch", start)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        _load(ckpts["experts"], dev)
    monkeypatch.undo()
    assert _state(dev) == before


def test_the_next_batch_is_queued_before_the_last_is_joined(ckpts: dict[str, Path], small_batches: None,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Batch N+1 is submitted before batch N is joined (the queue starts it
    as soon as N's reads end), and never more than two are outstanding."""
    dev = Device._isolated("host")
    monkeypatch.setattr(loader, "_OVERLAP", True)
    made = QueueSpy.install(monkeypatch)
    events: list[str] = []
    real_start, real_join = loader._start_batch, loader._InFlight.join

    def start(device: Any, batch: Any, queue: Any = None, check_finite: bool = False) -> Any:
        events.append("submit")
        return real_start(device, batch, queue, check_finite)

    def join(self: Any) -> Any:
        events.append("join")
        return real_join(self)

    monkeypatch.setattr(loader, "_start_batch", start)
    monkeypatch.setattr(loader._InFlight, "join", join)
    _load(ckpts["experts"], dev)
    assert len(made) == 1 and events.count("submit") > 3
    outstanding = 0
    for i, e in enumerate(events):
        outstanding += 1 if e == "submit" else -1
        assert 0 <= outstanding <= 2, events
        if e == "join" and i + 1 < len(events):  # every join but the last comes after the next batch's submission
            assert outstanding == 1, events
    assert events[0] == "submit" and events[-1] == "join" and outstanding == 0


@pytest.mark.parametrize("kind", ["experts", "fp8"])
def test_entries_filled_on_the_loading_thread_get_their_buffers_in_one_allocation(
        kind: str, ckpts: dict[str, Path], small_batches: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the overlap (a GPU), the transformed and staged entries get their
    buffers from one alloc_many made before the loop, not one allocation
    each (about 0.8 ms of the loading thread each on a GPU); same bytes."""
    dev = Device._isolated("host")
    if kind == "fp8":
        monkeypatch.setattr(loader, "_SCALED_ON_DEVICE", True)
    monkeypatch.setattr(loader, "_OVERLAP", False)
    want = _bytes(_load(ckpts[kind], dev))
    monkeypatch.setattr(loader, "_OVERLAP", True)
    calls = {"alloc": 0, "alloc_many": []}
    real_alloc, real_many = Device.alloc, Device.alloc_many

    def alloc(self: Any, *a: Any, **k: Any) -> Any:
        calls["alloc"] += 1
        return real_alloc(self, *a, **k)

    def alloc_many(self: Any, specs: Any, **k: Any) -> Any:
        calls["alloc_many"].append(len(specs))
        return real_many(self, specs, **k)

    monkeypatch.setattr(Device, "alloc", alloc)
    monkeypatch.setattr(Device, "alloc_many", alloc_many)
    assert _bytes(_load(ckpts[kind], dev)) == want
    assert calls["alloc"] == 0 and calls["alloc_many"][0] > 10, calls


def test_check_finite_names_the_same_element_with_the_overlap(ckpts: dict[str, Path], tmp_path: Path,
                                                            small_batches: None,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A Q8_0 block scale that overflows in a unit-transposed tensor is named
    at the element the file holds it, overlap or not: with check_finite the
    transposes stay on the loading thread, after the judging (the queue runs
    them with the read otherwise)."""
    import shutil

    from safetensors.numpy import load_file, save_file

    d = tmp_path / "ck"
    shutil.copytree(ckpts["experts"], d)
    name = next(n for f in sorted(d.glob("*.safetensors")) for n in load_file(str(f))
                if n.endswith("layers.0.linear_attn.out_proj.weight"))
    for f in sorted(d.glob("*.safetensors")):
        tensors = load_file(str(f))
        if name in tensors:
            t = tensors[name].copy()
            t.view(np.uint16)[0, 67] = 0x7149  # bf16 ~1e30: its Q8_0 block's float16 scale overflows
            tensors[name] = t
            save_file(tensors, str(f), metadata={"format": "pt"})
    dev = Device._isolated("host")
    messages = []
    for overlap in (False, True):
        monkeypatch.setattr(loader, "_OVERLAP", overlap)
        with pytest.raises(hf2q.NonFiniteError) as ei:
            _load(d, dev, check_finite=True)
        messages.append(str(ei.value))
    assert messages[0] == messages[1], messages


def test_a_queued_batch_owns_its_buffers_until_its_read_ended(tmp_path: Path) -> None:
    """The buffers of a queued batch may be let go by the caller while the
    batch waits behind a long read (a failure path that lost its ticket):
    the queue holds them until the read ended, then frees them (a use after
    free here is what the sanitizer job would report)."""
    import gc

    from hf2q import _core

    dev = Device._isolated("host")
    big = np.arange(16 << 20, dtype=np.float32)
    f = tmp_path / "d.bin"
    f.write_bytes(big.tobytes() + np.arange(1024, dtype=np.float32).tobytes())
    fd = os.open(f, os.O_RDONLY)
    try:
        gc.collect()
        before = dev.residency.stats()["count"]
        q = dev._batch_queue()
        slow = dev.alloc((16 << 20,), "f32")
        small = dev.alloc((1024,), "f32")
        t1 = q.submit(_core.NativeFileBatch([(slow._native, [(0, fd, 0, big.nbytes)], "f32", False, None)]))
        t2 = q.submit(_core.NativeFileBatch([(small._native, [(0, fd, big.nbytes, 4096)], "f32", False, None)]))
        del slow, small
        gc.collect()
        assert q.wait(t2, 30)[0] == [(-1, 0)] and q.wait(t1, 30)[0] == [(-1, 0)]
        q.close()
        gc.collect()
        assert dev.residency.stats()["count"] == before  # freed by the queue once read
    finally:
        os.close(fd)


def test_cancel_leaves_the_batches_not_started_unread(tmp_path: Path) -> None:
    """cancel(): every ticket then ends either read (it had started) or
    refused as cancelled, with its buffer untouched; behind a 64 MiB read the
    small batches submitted just before the cancel have not started."""
    from hf2q import _core

    dev = Device._isolated("host")
    data = np.arange(1024, dtype=np.float32) + 1
    big = np.zeros(16 << 20, np.float32)
    f = tmp_path / "d.bin"
    f.write_bytes(data.tobytes() + big.tobytes())
    fd = os.open(f, os.O_RDONLY)
    try:
        q = dev._batch_queue()
        slow = dev.alloc(big.shape, "f32")
        q.submit(_core.NativeFileBatch([(slow._native, [(0, fd, 4096, big.nbytes)], "f32", False, None)]))
        bufs = [dev.alloc((1024,), "f32") for _ in range(8)]
        tickets = [q.submit(_core.NativeFileBatch([(b._native, [(0, fd, 0, 4096)], "f32", False, None)]))
                   for b in bufs]
        q.cancel()
        cancelled = 0
        for t, b in zip(tickets, bufs):
            try:
                q.wait(t, 30)
                assert (b.to_host() == data).all()
            except RuntimeError as e:
                assert "cancelled" in str(e)
                assert not b.to_host().any()
                cancelled += 1
        assert cancelled > 0
        with pytest.raises(ValueError, match="not a ticket"):
            q.submit(_core.NativeFileBatch([(bufs[0]._native, [(0, fd, 0, 4096)], "f32", False, None)]), 10**6)
        t = q.submit(_core.NativeFileBatch([(bufs[0]._native, [(0, fd, 0, 4096)], "f32", False, None)]))
        assert q.wait(t, 30)[0] == [(-1, 0)]  # a batch submitted after the cancel is read
        q.close()
    finally:
        os.close(fd)


def test_queue_reads_in_order_and_refuses_misuse(tmp_path: Path) -> None:
    """The native queue on its own: tickets read in order, each waited for
    once; a batch after a failed one is not read; a closed queue takes no
    batch; an unknown ticket is refused rather than waited for forever."""
    from hf2q import _core

    dev = Device._isolated("host")
    data = np.arange(4096, dtype=np.float32)
    f = tmp_path / "d.bin"
    f.write_bytes(data.tobytes())
    fd = os.open(f, os.O_RDONLY)
    try:
        bufs = [dev.alloc((1024,), "f32") for _ in range(3)]

        def batch(i: int, nbytes: int = 4096) -> Any:
            return _core.NativeFileBatch([(bufs[i]._native, [(0, fd, 4096 * i, nbytes)], "f32", False, None)])

        q = dev._batch_queue()
        t1, t2 = q.submit(batch(0)), q.submit(batch(1))
        assert q.wait(t2, 5)[0] == [(-1, 0)] and q.wait(t1, 5)[0] == [(-1, 0)]
        with pytest.raises(ValueError, match="not a pending ticket"):
            q.wait(t1, 5)  # spent
        assert (bufs[0].to_host() == data[:1024]).all() and (bufs[1].to_host() == data[1024:2048]).all()
        os.ftruncate(os.open(f, os.O_WRONLY), 4096)  # batch 1's range now past the end of the file
        bad = q.submit(batch(1))
        skipped = q.submit(batch(2), bad)
        with pytest.raises(hf2q.FileReadError):
            q.wait(bad, 5)
        with pytest.raises(RuntimeError, match="not read: the batch it follows failed"):
            q.wait(skipped, 5)
        assert not bufs[2].to_host().any()
        with pytest.raises(ValueError, match="overruns the buffer"):  # refused as it is submitted
            q.submit(_core.NativeFileBatch([(bufs[0]._native, [(0, fd, 0, 8192)], "f32", False, None)]))
        q.close()
        q.close()
        with pytest.raises(RuntimeError, match="closed"):
            q.submit(batch(0))
    finally:
        os.close(fd)


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
        join_thread(t)
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
    monkeypatch.setattr(Device, "_batch_queue",  # the queue takes the native device itself
                        lambda self: hf2q._core.FileBatchQueue(getattr(self._native, "_native", self._native)))
    assert batches(gpu) == [1000]  # within GPU_BATCH_ENTRIES (and the first batch's byte bound)
    monkeypatch.setattr(loader, "GPU_BATCH_ENTRIES", 300)
    assert batches(gpu) == [300, 300, 300, 100]
    monkeypatch.setattr(loader, "_OVERLAP", True)  # the host itself: BATCH_ENTRIES, in the helper thread as on a GPU
    assert batches(Device._isolated("host")) == [256, 256, 256, 232]
