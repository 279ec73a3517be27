"""The hand-off to PyTorch and transformers (docs/HANDOFF.md): hf2q's
buffers as torch tensors with no copy, and transformers' own models running
on them, compared bit for bit with transformers' own ``from_pretrained`` of
the same checkpoints (written by transformers' ``save_pretrained``: see
scripts/make_golden_handoff.py, scripts/make_golden.py,
scripts/make_golden_gemma4.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
import transformers

import hf2q
import hf2q.torch as htorch
import hf2q.transformers as htf
from hf2q import ops
from hf2q.device import Device

DATA = Path(__file__).resolve().parent / "data"
#: name -> checkpoint directory (all written by transformers' save_pretrained)
CHECKPOINTS = {
    "llama_tied": DATA / "handoff" / "llama_tied",
    "qwen3_moe_per_expert": DATA / "handoff" / "qwen3_moe",
    "qwen35moe_causal_lm": DATA / "golden" / "qwen35moe_causal_lm" / "hf",
    "qwen35moe_conditional_generation": DATA / "golden" / "qwen35moe_conditional_generation" / "hf",
    "qwen35moe_conditional_generation_fused": DATA / "golden" / "qwen35moe_conditional_generation_fused" / "hf",
    "gemma4_moe_causal_lm": DATA / "gemma4" / "gemma4_moe_causal_lm" / "hf",
    "gemma4_moe_conditional_generation": DATA / "gemma4" / "gemma4_moe_conditional_generation" / "hf",
    "gemma4_dense_ple": DATA / "gemma4" / "gemma4_dense_ple" / "hf",
}
IDS = torch.tensor([[2, 17, 5, 33, 8, 61, 40, 3, 11, 25]])
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


# ---------------------------------------------------------------- state_dict

@pytest.fixture
def host() -> Device:
    return Device._isolated("host")


def test_state_dict_every_dtype_shares_memory(host: Device) -> None:
    x = np.linspace(-3, 3, 4 * 64, dtype=np.float32).reshape(4, 64)
    bufs = {
        "f32": host.upload(x),
        "f16": host.upload(x.astype(np.float16)),
        "bf16": host.upload(x.astype(ml_dtypes.bfloat16)),
        "i32": host.upload(np.arange(6, dtype=np.int32).reshape(2, 3)),
        "u8": host.upload(np.arange(5, dtype=np.uint8)),
        "q8_0": host.upload(x, to="q8_0"),
        "q8_0_3d": host.upload(x.reshape(2, 2, 64), to="q8_0"),
    }
    from hf2q.model import LoadedModel

    model = LoadedModel(host, None, bufs)
    sd = model.state_dict()
    assert list(sd) == list(bufs)
    want = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "i32": torch.int32,
            "u8": torch.uint8, "q8_0": torch.uint8, "q8_0_3d": torch.uint8}
    for name, t in sd.items():
        assert t.dtype == want[name], name
        assert t.data_ptr() == bufs[name].address, name  # the buffer's memory, not a copy
        assert t.device.type == "cpu"
    assert tuple(sd["q8_0"].shape) == (4, 68) and tuple(sd["q8_0_3d"].shape) == (4, 68)
    assert torch.equal(sd["f32"], torch.from_numpy(x))
    assert torch.equal(sd["bf16"].float(), torch.from_numpy(x.astype(ml_dtypes.bfloat16).astype(np.float32)))
    # writes through the tensor reach the buffer
    sd["f32"][0, 0] = 42.0
    assert bufs["f32"].numpy()[0, 0] == 42.0
    with pytest.raises(ValueError):
        model.state_dict(framework="jax")


def test_state_dict_keeps_buffers_alive(host: Device) -> None:
    from hf2q.model import LoadedModel

    x = np.arange(1024, dtype=np.float32)
    model = LoadedModel(host, None, {"w": host.upload(x)})
    t = model.state_dict()["w"][512:]  # a view of the tensor: it too holds the buffer
    del model
    import gc

    gc.collect()
    junk = [host.upload(np.full(1024, 7.0, np.float32)) for _ in range(8)]  # reuse freed memory if any was freed
    assert torch.equal(t, torch.arange(512, 1024, dtype=torch.float32))
    del junk


def test_torch_dequantize_bit_identical(host: Device) -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((8, 96)) * np.logspace(-6, 4, 8)[:, None]).astype(np.float32)
    q = ops.quantize_q8_0(x)
    ref = ops.dequantize_q8_0(q)
    got = htorch.dequantize(torch.from_numpy(q))
    assert got.dtype == torch.float32 and tuple(got.shape) == (8, 96)
    assert np.array_equal(got.numpy().view(np.uint32), ref.view(np.uint32))
    buf = host.upload(x, to="q8_0")  # through a buffer's (rows, row_bytes) view
    got2 = htorch.dequantize(htorch.tensor(buf))
    assert np.array_equal(got2.numpy().view(np.uint32), ref.view(np.uint32))
    # scale classes: subnormal, largest finite, +-inf (q = 0 gives NaN), NaN: every non-NaN result has the
    # reference's bits, and NaN is NaN where the reference has NaN (NaN payloads are the arithmetic unit's)
    blocks = np.zeros((6, 34), np.uint8)
    blocks[:, 2:] = rng.integers(0, 256, (6, 32), dtype=np.uint8)
    blocks[:, 2] = 0
    blocks[:, :2] = np.array([0x0001, 0x7BFF, 0x7C00, 0xFC00, 0x7E00, 0x8001], np.uint16).view(np.uint8).reshape(6, 2)
    ref = ops.dequantize_q8_0(blocks)
    got = htorch.dequantize(torch.from_numpy(blocks)).numpy()
    nan = np.isnan(ref)
    assert nan.sum() == 2 + 32 and np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), ref[~nan].view(np.uint32))
    with pytest.raises(ValueError):
        htorch.dequantize(torch.zeros(33, dtype=torch.uint8))
    with pytest.raises(ValueError):
        htorch.dequantize(torch.zeros(34, dtype=torch.uint8), "q4_0")


# ---------------------------------------------------------------- transformers

def _reference(path: Path, dtype: torch.dtype):
    cfg = transformers.AutoConfig.from_pretrained(path)
    cls = getattr(transformers, cfg.architectures[0])
    return cls.from_pretrained(path, dtype=dtype).eval()


@pytest.fixture(scope="module")
def models():
    """(checkpoint, dtype) -> (hf2q hand-off, transformers' own), made once."""
    cache: dict = {}

    def get(name: str, dtype: str):
        key = (name, dtype)
        if key not in cache:
            path = CHECKPOINTS[name]
            cache[key] = (htf.from_pretrained(path, "host", dtype=dtype), _reference(path, DTYPES[dtype]))
        return cache[key]

    return get


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_logits_bit_identical(models, name: str, dtype: str) -> None:
    ours, theirs = models(name, dtype)
    assert type(ours) is type(theirs) and not ours.training
    with torch.no_grad():
        a = ours(IDS).logits
        b = theirs(IDS).logits
    assert a.dtype == b.dtype == DTYPES[dtype]
    assert torch.isfinite(a).all() and a.float().std() > 0  # a comparison of something
    assert torch.equal(a, b), f"max |diff| {(a.float() - b.float()).abs().max()}"


def test_f16_keeps_the_modules_transformers_keeps_in_float32(tmp_path: Path) -> None:
    """``dtype="f16"`` of a model whose class keeps modules in float32 under
    float16 only (gpt-oss: its norms, ``_keep_in_fp32_modules``): those stay
    float32, as in ``from_pretrained(dtype=torch.float16)``, and the logits
    are the same bits. (A tiny gpt-oss saved by transformers, bf16.)"""
    cfg = transformers.GptOssConfig(vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                                    num_experts_per_tok=2, max_position_embeddings=128, sliding_window=8,
                                    layer_types=["sliding_attention", "full_attention"])
    assert transformers.GptOssForCausalLM._keep_in_fp32_modules  # what this test is about
    torch.manual_seed(0)
    transformers.GptOssForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp_path / "gptoss")
    ours = htf.from_pretrained(tmp_path / "gptoss", Device._isolated("host"), dtype="f16")
    theirs = _reference(tmp_path / "gptoss", torch.float16)
    kept = {n for n, p in theirs.named_parameters() if p.dtype == torch.float32}
    assert len(kept) == 5  # two norms a layer and the last one
    assert {n: p.dtype for n, p in ours.named_parameters()} == {n: p.dtype for n, p in theirs.named_parameters()}
    with torch.no_grad():
        a, b = ours(IDS).logits, theirs(IDS).logits
    assert a.dtype == torch.float16 and a.float().std() > 0
    assert torch.equal(a, b), f"max |diff| {(a.float() - b.float()).abs().max()}"


@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_names_shapes_dtypes_and_storage(models, name: str) -> None:
    ours, theirs = models(name, "bf16")
    mine = dict(ours.named_parameters())
    ref = dict(theirs.named_parameters())
    assert list(mine) == list(ref)
    for n, p in mine.items():
        assert p.shape == ref[n].shape and p.dtype == ref[n].dtype, n
    assert {n: b.shape for n, b in ours.named_buffers()} == {n: b.shape for n, b in theirs.named_buffers()}
    # every parameter's storage lies in an hf2q buffer
    spans = [(b.address, b.address + b.byte_len) for _, b in dict(ours.hf2q_model.named_buffers()).items()]
    for n, p in mine.items():
        ptr = p.data_ptr()
        assert any(lo <= ptr and ptr + p.numel() * p.element_size() <= hi for lo, hi in spans), n
    # tied weights share one buffer, as in transformers
    if getattr(ours.config.get_text_config(), "tie_word_embeddings", False):
        assert ours.get_output_embeddings().weight.data_ptr() == ours.get_input_embeddings().weight.data_ptr()
    # every tensor filled from the checkpoint is flagged as transformers' loader flags it
    flagged = {n for n, t in [*ours.named_parameters(remove_duplicate=False),
                              *ours.named_buffers(remove_duplicate=False)] if getattr(t, "_is_hf_initialized", False)}
    assert set(ours.hf2q_model) <= flagged
    theirs_flagged = {n for n, t in [*theirs.named_parameters(remove_duplicate=False),
                                     *theirs.named_buffers(remove_duplicate=False)]
                      if getattr(t, "_is_hf_initialized", False)}
    assert set(ours.hf2q_model) <= theirs_flagged


def test_experts_stacked_in_one_buffer(models) -> None:
    ours, theirs = models("qwen3_moe_per_expert", "f32")
    plan = ours.hf2q_model  # the loaded buffers under transformers' names
    name = "model.layers.0.mlp.experts.gate_up_proj"
    assert name in plan and "model.layers.0.mlp.experts.0.gate_proj.weight" not in plan
    assert torch.equal(dict(ours.named_parameters())[name], dict(theirs.named_parameters())[name])


def test_model_runs_on_hf2q_memory(models) -> None:
    """A write to an hf2q buffer is seen by the model: its parameters are
    those buffers, not copies."""
    ours, _ = models("qwen3_moe_per_expert", "bf16")
    with torch.no_grad():
        before = ours(IDS).logits.clone()
    buf = ours.hf2q_model["model.embed_tokens.weight"]
    view = buf.numpy()
    saved = view.copy()
    try:
        view[IDS[0, -1].item()] *= 3  # the last token's embedding row, through numpy
        with torch.no_grad():
            after = ours(IDS).logits
        assert not torch.equal(after[0, -1], before[0, -1])
        assert torch.equal(after[0, :-1], before[0, :-1])
    finally:
        view[...] = saved


def test_generate_matches(models) -> None:
    ours, theirs = models("llama_tied", "f32")
    a = ours.generate(IDS[:, :4], max_new_tokens=6, do_sample=False)
    b = theirs.generate(IDS[:, :4], max_new_tokens=6, do_sample=False)
    assert torch.equal(a, b)


def test_keep_is_the_checkpoint_dtype(tmp_path: Path) -> None:
    m = htf.from_pretrained(CHECKPOINTS["llama_tied"], "host")
    assert m.model.embed_tokens.weight.dtype == torch.bfloat16  # config.json's dtype, as dtype="auto"


def test_unsupported_architecture_is_refused(tmp_path: Path) -> None:
    src = CHECKPOINTS["llama_tied"]
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "model.safetensors").symlink_to(src / "model.safetensors")
    cfg = json.loads((src / "config.json").read_text())
    cfg["architectures"] = ["NoSuchModelForCausalLM"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(htf.HandoffError, match="NoSuchModelForCausalLM") as e:
        htf.from_pretrained(d, "host")
    assert e.value.missing == ["NoSuchModelForCausalLM"]
    assert isinstance(e.value, hf2q.Hf2qError)
    cfg["model_type"] = "no_such_model_type"
    del cfg["architectures"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(htf.HandoffError, match="no_such_model_type"):
        htf.from_pretrained(d, "host")


def test_missing_tensor_is_refused(tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    src = CHECKPOINTS["llama_tied"]
    d = tmp_path / "ckpt"
    d.mkdir()
    tensors = load_file(src / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, d / "model.safetensors")
    (d / "config.json").write_text((src / "config.json").read_text())
    with pytest.raises(htf.HandoffError, match="model.layers.1.mlp.up_proj.weight") as e:
        htf.from_pretrained(d, "host")
    assert e.value.missing == ["model.layers.1.mlp.up_proj.weight"]


def test_device_opens_beside_the_model_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """The device is opened on a helper thread while transformers builds the
    model (a fresh CUDA device takes 0.1 s the main thread would wait for)."""
    import threading

    opened_on = []
    real = htf._hf2q_device

    def opening(device):
        opened_on.append(threading.current_thread() is threading.main_thread())
        return real(device)

    monkeypatch.setattr(htf, "_hf2q_device", opening)
    m = htf.from_pretrained(CHECKPOINTS["llama_tied"], "cpu")
    assert opened_on == [False] and m.hf2q_model.device.kind == "host"
    host = Device("host")  # a Device given is used as it is, no thread
    assert htf.from_pretrained(CHECKPOINTS["llama_tied"], host).hf2q_model.device is host
    assert opened_on == [False]


def test_device_errors_reach_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad device string is refused before the model is built; an opening
    that fails raises its own error; a build that fails leaves no opening
    thread behind."""
    import threading
    import time

    def no_build(*a, **k):
        raise AssertionError("built the model for a bad device")

    with monkeypatch.context() as mp:
        mp.setattr(htf, "_build", no_build)
        with pytest.raises(ValueError, match="bad device"):
            htf.from_pretrained(CHECKPOINTS["llama_tied"], "cuda:x")

    def failing(device):
        raise hf2q.DeviceError("no such GPU here")

    with monkeypatch.context() as mp:
        mp.setattr(htf, "_hf2q_device", failing)
        with pytest.raises(hf2q.DeviceError, match="no such GPU here"):
            htf.from_pretrained(CHECKPOINTS["llama_tied"], "host")

    def slow(device):
        time.sleep(0.3)
        return Device("host")

    def broken_build(*a, **k):
        raise htf.HandoffError("build failed", missing=["x"])

    with monkeypatch.context() as mp:
        mp.setattr(htf, "_hf2q_device", slow)
        mp.setattr(htf, "_build", broken_build)
        with pytest.raises(htf.HandoffError, match="build failed"):
            htf.from_pretrained(CHECKPOINTS["llama_tied"], "host")
    assert not [t for t in threading.enumerate() if t.name == "hf2q-device-open"]

    def no_threads(self):
        raise RuntimeError("can't start new thread")

    with monkeypatch.context() as mp:  # no thread to be had: the device is opened in line
        mp.setattr(threading.Thread, "start", no_threads)
        assert htf.from_pretrained(CHECKPOINTS["llama_tied"], "host").hf2q_model.device.kind == "host"


@pytest.fixture
def overlapped(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The GPU's batch overlap forced on the host with small batches (CI has
    no GPU): the hand-off assembles transformers' model while the last batch
    is in flight. Yields the order of events: "assemble" (the model built
    from the buffers), "landed" (a batch's bytes written and joined)."""
    from hf2q import loader

    monkeypatch.setattr(loader, "_OVERLAP", True)
    monkeypatch.setattr(loader, "GPU_BATCH_BYTES", 16 << 10)
    monkeypatch.setattr(loader, "BATCH_BYTES", 16 << 10)
    events: list[str] = []
    real_join = loader._InFlight.join
    real_finalize = transformers.PreTrainedModel._finalize_model_loading

    def join(self):
        out = real_join(self)
        events.append("landed")
        return out

    def finalize(*a, **k):
        events.append("assemble")
        return real_finalize(*a, **k)

    real_sync = Device.synchronize

    def synchronize(self):
        events.append("synchronized")
        return real_sync(self)

    real_unwaited = htorch._Unwaited.__dlpack__

    def unwaited(self, **kw):
        if "unwaited views" not in events:
            events.append("unwaited views")
        return real_unwaited(self, **kw)

    monkeypatch.setattr(htorch._Unwaited, "__dlpack__", unwaited)

    monkeypatch.setattr(loader._InFlight, "join", join)
    monkeypatch.setattr(transformers.PreTrainedModel, "_finalize_model_loading", staticmethod(finalize))
    monkeypatch.setattr(Device, "synchronize", synchronize)
    return events


def _slow_batch_with(monkeypatch: pytest.MonkeyPatch, name: str, seconds: float = 0.3) -> None:
    """The batch holding ``name`` starts writing only after ``seconds`` (a
    GPU's copy engine still busy): its buffers are zeros meanwhile."""
    from hf2q import loader

    from _helpers import QueueSpy

    QueueSpy.install(monkeypatch, seconds)
    real_start = loader._start_batch

    def start(device, batch, queue=None, check_finite=False):
        if queue is not None:
            queue.hold = any(e.name == name for e in batch.entries)
        return real_start(device, batch, queue, check_finite)

    monkeypatch.setattr(loader, "_start_batch", start)


@pytest.mark.parametrize("name", ["qwen3_moe_per_expert", "qwen35moe_conditional_generation_fused"])
def test_model_assembled_while_the_last_batch_lands(models, overlapped: list[str], name: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU the model is assembled (state dict, load_state_dict,
    transformers' finish) while the last batch is still being written, and
    the device synchronized once it has landed; the logits are still
    transformers' own, bit for bit."""
    _slow_batch_with(monkeypatch, "lm_head.weight")
    ours = htf.from_pretrained(CHECKPOINTS[name], Device._isolated("host"), dtype="bf16")
    assert overlapped.count("landed") > 3, overlapped
    assert overlapped[-4:] == ["unwaited views", "assemble", "landed", "synchronized"], overlapped
    _, theirs = models(name, "bf16")
    with torch.no_grad():
        assert torch.equal(ours(IDS).logits, theirs(IDS).logits)


def test_landed_seconds_leave_out_the_assembly(overlapped: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The summary's landed_seconds (the benchmark's "own load") end when the
    last byte is written, not when an assembly that outlasts it ends."""
    import time

    real = transformers.PreTrainedModel._finalize_model_loading  # the fixture's, which records "assemble"

    def slow(*a, **k):
        time.sleep(0.3)
        return real(*a, **k)

    monkeypatch.setattr(transformers.PreTrainedModel, "_finalize_model_loading", staticmethod(slow))
    from hf2q import loader

    marks: dict[str, float] = {}
    real_execute, real_join = loader.execute, loader._InFlight.join

    def execute(*a, **k):
        marks["start"] = time.perf_counter()
        return real_execute(*a, **k)

    def join(self):
        out = real_join(self)
        marks["batch written"] = self.finished  # when its reads ended; the last one's stays
        return out

    monkeypatch.setattr(loader, "execute", execute)
    monkeypatch.setattr(loader._InFlight, "join", join)
    s = htf.from_pretrained(CHECKPOINTS["qwen3_moe_per_expert"], Device._isolated("host")).hf2q_model.summary
    assert overlapped[-3:] == ["assemble", "landed", "synchronized"]
    assert s.landed_seconds is not None and s.landed_seconds + 0.25 < s.seconds
    assert s.landed_seconds >= marks["batch written"] - marks["start"] - 0.01  # not before the last byte
    plain = hf2q.load(CHECKPOINTS["qwen3_moe_per_expert"], Device._isolated("host"), progress=False).summary
    assert plain.landed_seconds is not None and 0 < plain.landed_seconds <= plain.seconds


def test_a_failing_synchronize_after_the_load_leaves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The device's last synchronize (a copy that failed on the GPU) raises
    its DeviceError with every buffer freed, while the caller holds it."""
    import gc

    dev = Device._isolated("host")
    htf.from_pretrained(CHECKPOINTS["qwen3_moe_per_expert"], dev)
    gc.collect()
    before = dev.residency.stats()["count"]

    def failing(self):
        raise hf2q.DeviceError("injected: a copy failed on the device")

    monkeypatch.setattr(Device, "synchronize", failing)
    with pytest.raises(hf2q.DeviceError, match="injected") as ei:
        htf.from_pretrained(CHECKPOINTS["qwen3_moe_per_expert"], dev)
    gc.collect()
    assert dev.residency.stats()["count"] == before
    assert ei.value.__traceback__ is not None


def test_tied_model_assembled_once_landed(tmp_path: Path, overlapped: list[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Tying reads weights (both ends of a tied pair in the checkpoint are
    compared, and tied only if equal): a model that ties is assembled after
    its last batch, and ties exactly as transformers' own loader does, here
    with both ends stored (as merged checkpoints often are) and the batch
    holding the output layer slow."""
    from safetensors.torch import load_file, save_file

    src = CHECKPOINTS["llama_tied"]
    d = tmp_path / "both_ends"
    d.mkdir()
    tensors = load_file(src / "model.safetensors")
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, d / "model.safetensors")
    (d / "config.json").write_text((src / "config.json").read_text())
    _slow_batch_with(monkeypatch, "lm_head.weight")
    ours = htf.from_pretrained(d, Device._isolated("host"), dtype="f32")
    assert overlapped.count("landed") > 2, overlapped
    # after the last batch, from views that wait for the copies (tying reads the weights)
    assert overlapped[-3:] == ["landed", "assemble", "synchronized"], overlapped
    assert "unwaited views" not in overlapped
    theirs = _reference(d, torch.float32)
    assert dict(ours.all_tied_weights_keys) == dict(theirs.all_tied_weights_keys) == {
        "lm_head.weight": "model.embed_tokens.weight"}
    assert ours.lm_head.weight.data_ptr() == ours.model.embed_tokens.weight.data_ptr()
    with torch.no_grad():
        assert torch.equal(ours(IDS).logits, theirs(IDS).logits)


@pytest.mark.parametrize("fail", ["last batch", "assembly"])
def test_failure_after_early_assembly_leaves_nothing(overlapped: list[str], monkeypatch: pytest.MonkeyPatch,
                                                     fail: str) -> None:
    """The last batch failing after the model was assembled from its buffers,
    or the assembly failing while the batch runs: the error reaches the
    caller with every buffer freed, while the caller still holds the error
    (its traceback keeps from_pretrained's frame, not the model made early)."""
    import gc

    from hf2q import loader

    dev = Device._isolated("host")
    htf.from_pretrained(CHECKPOINTS["qwen3_moe_per_expert"], dev)  # one-time costs paid
    gc.collect()
    before = dev.residency.stats()["count"]
    if fail == "last batch":
        real_finish, real_execute = loader._finish_batch, loader.execute
        last: list[str] = []

        def execute(plan, *a, **k):
            last.append([e.name for e in plan if e.streamed][-1])
            return real_execute(plan, *a, **k)

        def finish(device, ckpt, batch, check_finite=False):
            is_last = bool(batch.entries) and batch.entries[-1].name == last[-1]
            out = real_finish(device, ckpt, batch, check_finite)  # (drops the batch's lists)
            if is_last:  # joined once the model was assembled from its buffers
                assert "assemble" in overlapped
                del out
                raise hf2q.DeviceError("injected: the last batch fails")
            return out

        monkeypatch.setattr(loader, "execute", execute)
        monkeypatch.setattr(loader, "_finish_batch", finish)
    else:
        def broken(*a, **k):
            raise htf.HandoffError("injected: assembly fails", missing=["x"])

        monkeypatch.setattr(transformers.PreTrainedModel, "_finalize_model_loading", staticmethod(broken))
    overlapped.clear()
    with pytest.raises(hf2q.Hf2qError, match="injected") as ei:
        htf.from_pretrained(CHECKPOINTS["qwen3_moe_per_expert"], dev)
    gc.collect()
    assert dev.residency.stats()["count"] == before  # while the error, its traceback included, is held
    assert ei.value.__traceback__ is not None
    if fail == "assembly" and sys.version_info >= (3, 11):  # where it came from, though its frames are gone
        assert any("_finalize_model_loading" in n or "broken" in n for n in ei.value.__notes__), ei.value.__notes__


def test_old_transformers_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transformers, "__version__", "4.57.6")
    with pytest.raises(htf.HandoffError, match="transformers >= 5.0") as e:
        htf.from_pretrained(CHECKPOINTS["llama_tied"], "host")
    assert e.value.missing == ["transformers>=5.0"]


def test_moved_internals_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers.core_model_loading as cml

    monkeypatch.delattr(cml, "MergeModulelist")
    with pytest.raises(htf.HandoffError, match="MergeModulelist"):
        htf.from_pretrained(CHECKPOINTS["llama_tied"], "host")


def test_unsupported_conversion_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers.conversion_mapping as cm
    from transformers.core_model_loading import Transpose, WeightConverter

    real = cm.get_model_conversion_mapping

    def with_transpose(model, *args, **kwargs):
        extra = WeightConverter("mlp.up_proj.weight", "mlp.up_proj.weight", operations=[Transpose(0, 1)])
        return [*real(model, *args, **kwargs), extra]

    monkeypatch.setattr(cm, "get_model_conversion_mapping", with_transpose)
    with pytest.raises(htf.HandoffError, match="Transpose") as e:
        htf.from_pretrained(CHECKPOINTS["llama_tied"], "host")
    assert e.value.missing == ["Transpose"]


def test_placement_rules() -> None:
    from hf2q._handoff import HandoffError, placements

    groups = {"g": [("g0", (3, 4)), ("g1", (3, 4))], "u": [("u0", (3, 4)), ("u1", (3, 4))]}
    shape, where = placements(groups, ["g", "u"], [("merge", 0), ("concat", 1)], "x")
    assert shape == (2, 6, 4)
    assert dict(where) == {"g0": 0, "u0": 12, "g1": 24, "u1": 36}
    with pytest.raises(HandoffError, match="contiguous"):  # concatenated along the last axis: interleaved rows
        placements(groups, ["g", "u"], [("merge", 0), ("concat", 2)], "x")


# ---------------------------------------------------------------- memory

_RSS_SCRIPT = textwrap.dedent("""
    import gc, json, sys
    import hf2q.transformers as htf
    from hf2q.device import Device
    def status(key):
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key))
    dev = Device("host")
    htf.from_pretrained(sys.argv[2], dev)  # first use: transformers' model modules imported (~140 MB)
    out = []
    for dtype in ("keep", "f32"):
        gc.collect()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # peak RSS := current RSS (Linux >= 4.0)
        before = status("VmHWM:")
        m = htf.from_pretrained(sys.argv[1], dev, dtype=dtype)
        out.append({"dtype": dtype, "before": before, "peak": status("VmHWM:"),
                    "param_bytes": sum(p.numel() * p.element_size() for p in m.parameters()),
                    "resident": m.hf2q_model.gpu_resident_bytes()})
        del m
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def big_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Llama with 114 MiB of bf16 weights (random bits of small values,
    written with safetensors in the layout transformers' save_pretrained
    writes)."""
    from safetensors.numpy import save_file

    d = tmp_path_factory.mktemp("big_llama")
    cfg = transformers.LlamaConfig(vocab_size=4096, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                                   num_attention_heads=8, num_key_value_heads=8, tie_word_embeddings=False)
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.dtype = "bfloat16"
    cfg.save_pretrained(d)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    rng = np.random.default_rng(0)
    # bf16 bit patterns with exponents of small numbers (|x| < 2^-3), any mantissa
    tensors = {n: ((rng.integers(0, 1 << 16, p.numel(), dtype=np.uint32) & 0x83FF) | 0x3C00).astype(np.uint16)
               .view(ml_dtypes.bfloat16).reshape(p.shape) for n, p in model.state_dict().items()}
    save_file(tensors, d / "model.safetensors")
    return d


@pytest.mark.skipif(os.environ.get("HF2Q_UNDER_SANITIZER") == "1",
                    reason="scripts/run_sanitizers.sh: ASan's allocator and quarantine change RSS; the main suite "
                           "measures it")
@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="peak RSS reset needs Linux /proc")
def test_no_copy_peak_rss(big_llama: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF2Q_")}
    p = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, str(big_llama), str(CHECKPOINTS["llama_tied"])],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    keep, f32 = json.loads(p.stdout.strip().splitlines()[-1])
    assert f32["param_bytes"] == 2 * keep["param_bytes"] >= 114 << 20
    for r in (keep, f32):
        assert r["param_bytes"] == r["resident"]
        grown = r["peak"] - r["before"]
        # One copy of the weights plus transformers' model skeleton (measured:
        # +0.3 MiB); a second copy of any large tensor would add >= 5.5 MiB
        # (one MLP projection in bf16), of all of them param_bytes.
        assert grown <= r["param_bytes"] + (4 << 20), r
        assert grown >= r["param_bytes"] * 0.9, r  # the weights are resident: the measure measures something


# ---------------------------------------------------------------- CUDA

def _cuda_ok() -> bool:
    try:
        return torch.cuda.is_available() and Device("cuda") is not None
    except Exception:
        return False


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["llama_tied", "qwen3_moe_per_expert", "qwen35moe_conditional_generation",
                                  "gemma4_moe_causal_lm"])
def test_cuda_logits_bit_identical(name: str) -> None:
    if not _cuda_ok():
        pytest.skip("needs a CUDA GPU, torch built with CUDA and hf2q's CUDA backend")
    path = CHECKPOINTS[name]
    ours = htf.from_pretrained(path, "cuda", dtype="bf16")
    cfg = transformers.AutoConfig.from_pretrained(path)
    theirs = getattr(transformers, cfg.architectures[0]).from_pretrained(path, dtype=torch.bfloat16,
                                                                        device_map="cuda").eval()
    for n, p in ours.named_parameters():
        assert p.device.type == "cuda", n
    ids = IDS.to("cuda")
    with torch.no_grad():
        assert torch.equal(ours(ids).logits, theirs(ids).logits)


@pytest.mark.cuda
def test_cuda_state_dict_and_dequantize() -> None:
    if not _cuda_ok():
        pytest.skip("needs a CUDA GPU, torch built with CUDA and hf2q's CUDA backend")
    from hf2q.model import LoadedModel

    dev = Device("cuda")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((16, 128)).astype(np.float32)
    bufs = {"bf16": dev.upload(x.astype(ml_dtypes.bfloat16)), "q": dev.upload(x, to="q8_0")}
    sd = LoadedModel(dev, None, bufs).state_dict()
    assert sd["bf16"].device.type == "cuda" and sd["bf16"].data_ptr() == bufs["bf16"].address
    ref = ops.dequantize_q8_0(ops.quantize_q8_0(x))
    got = htorch.dequantize(sd["q"]).cpu().numpy()
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))


def test_hf2q_does_not_import_torch() -> None:
    """torch and transformers are imported by hf2q.torch / hf2q.transformers
    only: a load without them leaves both out of the process."""
    code = ("import sys, hf2q\n"
            f"m = hf2q.load({str(CHECKPOINTS['llama_tied'])!r}, hf2q.Device('host'), progress=False)\n"
            "print(sorted(k for k in ('torch', 'transformers') if k in sys.modules))\n"
            "sd = m.state_dict()\n"
            "print(sorted(k for k in ('torch', 'transformers') if k in sys.modules), type(hf2q.torch).__name__)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["[]", "['torch'] module"]
