"""Non-finite weights in tensors copied raw or decoded (issue 11, item 9).

Policy (docs/RELIABILITY.md, "Non-finite weights"): raw copies and decodes
keep the file's bytes by default, exactly (the loaders' contract, and no cost
on the load path); ``check_finite=True`` on the loaders (``dflash.load``,
``qwen35.load``, ``DFlashModelTensors.upload``) and on
``Device.upload_from_file``/``write_from_file`` refuses a NaN/Inf with
:class:`hf2q.NonFiniteError` naming the tensor and the first bad element,
found during the read (each piece scanned right after its pread).
Quantization refuses them always (Q8_0 has no encoding for them)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from hf2q import dflash, qwen35
from hf2q.device import Device
from hf2q.errors import NonFiniteError
from hf2q.testing import make_dflash_checkpoint, make_qwen35_moe_checkpoint

BITS = {"nan": 0x7FC0, "+inf": 0x7F80, "-inf": 0xFF80}


def _poison_f32(ck: Path, name: str, flat_index: int) -> None:
    f = ck / "model.safetensors"
    tensors = load_file(str(f))
    t = tensors[name].astype(np.float32)
    t.reshape(-1)[flat_index] = np.nan
    tensors[name] = t
    save_file(tensors, str(f))


def _poison(ck: Path, name: str, flat_index: int, value_bits: int) -> None:
    f = ck / "model.safetensors"
    tensors = load_file(str(f))
    t = tensors[name].copy()
    t.reshape(-1).view(np.uint16)[flat_index] = value_bits
    tensors[name] = t
    save_file(tensors, str(f))


@pytest.fixture(scope="module")
def dflash_ck(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dflash_checkpoint(tmp_path_factory.mktemp("finite") / "d", "tiny", seed=6)


@pytest.mark.parametrize("cls", list(BITS))
@pytest.mark.parametrize("name", ["layers.1.mlp.down_proj.weight", "layers.0.input_layernorm.weight"])
def test_dflash_load_refuses_non_finite_raw_and_decoded(cls: str, name: str, dflash_ck: Path,
                                                        tmp_path: Path) -> None:
    d = tmp_path / "ck"
    shutil.copytree(dflash_ck, d)
    _poison(d, name, 37, BITS[cls])
    dev = Device._isolated("host")
    with pytest.raises(NonFiniteError) as ei:
        dflash.load(d, dev, progress=False, check_finite=True)
    e = ei.value
    assert e.tensor == name and e.index == 37 and e.value_class == cls, str(e)
    assert name in str(e)
    assert dev.residency.count == 0
    m = dflash.load(d, dev, progress=False)  # default: the file's bytes, exactly
    bits = m[name].numpy().reshape(-1).view(np.uint16 if m[name].dtype == "bf16" else np.uint32)
    want = BITS[cls] if m[name].dtype == "bf16" else BITS[cls] << 16
    assert int(bits[37]) == want


def test_qwen35_load_refuses_non_finite_raw_copied_tensor(tmp_path: Path) -> None:
    ck = make_qwen35_moe_checkpoint(tmp_path / "q", "tiny", seed=6)
    name = "model.layers.0.mlp.experts.1.down_proj.weight"
    _poison(ck, name, 5, BITS["+inf"])
    with pytest.raises(NonFiniteError) as ei:  # bf16 experts: copied raw
        qwen35.load(ck, Device._isolated("host"), expert_dtype="bf16", progress=False, check_finite=True)
    assert ei.value.value_class == "+inf" and "blk.0.ffn_down_exps" in str(ei.value)
    with pytest.raises(NonFiniteError):  # q8_0 experts: quantization refuses, as always
        qwen35.load(ck, Device._isolated("host"), progress=False)
    m = qwen35.load(ck, Device._isolated("host"), expert_dtype="bf16", progress=False)  # default: bytes as they are
    assert int(m["blk.0.ffn_down_exps.weight"].numpy()[1].reshape(-1).view(np.uint16)[5]) == BITS["+inf"]


def test_qwen35_check_finite_on_materialized_tensors(tmp_path: Path) -> None:
    ck = make_qwen35_moe_checkpoint(tmp_path / "q", "tiny", seed=6)
    name = "model.layers.0.linear_attn.A_log"  # transformed in numpy (-exp), not streamed
    _poison_f32(ck, name, 1)
    with pytest.raises(NonFiniteError) as ei:
        qwen35.load(ck, Device._isolated("host"), progress=False, check_finite=True)
    assert ei.value.tensor == name and ei.value.index == 1


@pytest.mark.parametrize("src,to", [("bf16", "bf16"), ("f16", "f16"), ("f32", "f32"), ("bf16", "f32"),
                                    ("f16", "f32")])
def test_upload_from_file_check_finite(src: str, to: str, tmp_path: Path) -> None:
    dt = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "f32": np.float32}[src]
    n = 3 << 20  # several native chunks
    x = np.linspace(-1, 1, n).astype(dt)
    bad = 2_500_123
    x[bad] = -np.inf
    x[bad + 7] = np.nan
    p = tmp_path / "w.bin"
    p.write_bytes(x.tobytes())
    dev = Device._isolated("host")
    buf = dev.upload_from_file(p, 0, x.nbytes, src, to, (n,))  # default: bytes as they are
    assert np.isneginf(buf.numpy()[bad].astype(np.float32))
    del buf
    with pytest.raises(NonFiniteError) as ei:
        dev.upload_from_file(p, 0, x.nbytes, src, to, (n,), check_finite=True, name="w")
    assert ei.value.index == bad and ei.value.value_class == "-inf" and ei.value.tensor == "w"
    assert dev.residency.count == 0
    # integers have no NaN: nothing to report
    p.write_bytes(np.full(64, -1, np.int32).tobytes())
    dev.upload_from_file(p, 0, 256, "i32", "i32", (64,), check_finite=True)


@pytest.mark.parametrize("name", ["model.layers.0.input_layernorm.weight",
                                  "model.layers.0.linear_attn.in_proj_qkv.weight"])
def test_qwen35_check_finite_on_bf16_tensors_transformed_in_numpy(name: str, tmp_path: Path) -> None:
    # bfloat16 is numpy kind 'V': the scan must recognise it through the format table.
    ck = make_qwen35_moe_checkpoint(tmp_path / "q", "tiny", seed=6)
    _poison(ck, name, 3, BITS["nan"])
    with pytest.raises(NonFiniteError) as ei:
        qwen35.load(ck, Device._isolated("host"), progress=False, check_finite=True)
    assert ei.value.value_class == "nan"


# --------------------------------------------------------------------------- what the load makes (issue 26)


def _no_warnings() -> Any:
    import warnings

    w = warnings.catch_warnings()
    w.__enter__()
    warnings.simplefilter("error")  # a numpy RuntimeWarning (overflow in exp / cast) fails the test
    return w


def test_qwen35_transform_that_overflows(tmp_path: Path) -> None:
    """A_log = 100: finite in the file, -exp(100) = -inf in f32 after the transform (passed before, with a
    numpy RuntimeWarning on stderr)."""
    ck = make_qwen35_moe_checkpoint(tmp_path / "q", "tiny", seed=6)
    name = "model.layers.0.linear_attn.A_log"
    f = ck / "model.safetensors"
    tensors = load_file(str(f))
    t = tensors[name].copy()
    t.reshape(-1)[2] = 100
    tensors[name] = t
    save_file(tensors, str(f))
    w = _no_warnings()
    try:
        with pytest.raises(NonFiniteError) as ei:
            qwen35.load(ck, Device._isolated("host"), progress=False, check_finite=True)
        e = ei.value
        assert e.step == "transform" and e.value_class == "-inf" and e.tensor is not None
        assert "made by the transform of 'model.layers.0.linear_attn.A_log'" in str(e)
        m = qwen35.load(ck, Device._isolated("host"), progress=False)  # default: the values as the load makes them
        assert np.isneginf(m[e.tensor].numpy().reshape(-1)[e.index])
    finally:
        w.__exit__(None, None, None)


def _generic(tmp_path: Path, tensors: dict[str, np.ndarray]) -> Path:
    d = tmp_path / "g"
    d.mkdir()
    save_file(tensors, str(d / "model.safetensors"))
    (d / "config.json").write_text("{}")
    return d


@pytest.mark.parametrize(("src", "value", "policy", "dst"), [
    (np.float32, 3.4e38, "bf16", "bf16"),  # f32's largest values round up past bf16's
    (np.float32, 70000.0, "q8_0", "f16"),  # rows of 3: not q8_0, llama.cpp's f16 fallback
    (np.float64, 1e300, "f32", "f32"),
    (np.float64, -1e39, "bf16", "bf16"),
])
def test_narrowing_conversion_that_overflows(src: Any, value: float, policy: str, dst: str, tmp_path: Path) -> None:
    import hf2q

    x = np.ones((4, 3), dtype=src)
    x[2, 1] = value
    ck = _generic(tmp_path, {"blk.0.w.weight": x, "ok.weight": np.ones((2, 3), dtype=src)})
    w = _no_warnings()
    try:
        with pytest.raises(NonFiniteError) as ei:
            hf2q.load(ck, Device._isolated("host"), dtype=policy, progress=False, check_finite=True)
        e = ei.value
        assert e.tensor == "blk.0.w.weight" and e.index == 7 and e.multi_index == (2, 1)
        assert e.step is not None and e.step.startswith("conversion ") and e.step.endswith(f"->{dst}"), e.step
        assert e.value_class == ("+inf" if value > 0 else "-inf")
        m = hf2q.load(ck, Device._isolated("host"), dtype=policy, progress=False)  # default: converted as it is
        assert m["blk.0.w.weight"].dtype == dst
    finally:
        w.__exit__(None, None, None)


def test_values_in_the_file_say_step_file(dflash_ck: Path, tmp_path: Path) -> None:
    d = tmp_path / "d"
    shutil.copytree(dflash_ck, d)
    _poison(d, "fc.weight", 5, BITS["+inf"])
    with pytest.raises(NonFiniteError) as ei:
        dflash.load(d, Device._isolated("host"), progress=False, check_finite=True)
    assert ei.value.tensor == "fc.weight" and ei.value.step in ("file", None)


@pytest.mark.parametrize(("dtype", "value"), [
    ("q8_0", 3.4e38), ("q4_0", 3.4e38), ("q4_k", 3.4e38), ("q5_k", 3.4e38),
    ("q6_k", 1e9),  # Q6_K's scale overflows from about 3e8 (beyond 1.8e19 ggml's fit collapses to zeros)
    ("q8_0", 1e7),  # just past Q8_0's 8,321,040
])
def test_block_scale_that_overflows(dtype: str, value: float, tmp_path: Path) -> None:
    """A finite f32 value too large for the block format: ggml (and the
    default) store a float16 scale of +-Inf, so the buffer dequantizes to
    Inf/NaN; check_finite refuses it for every block format, naming the
    file, the tensor and the step."""
    import warnings

    import hf2q
    from hf2q import ops

    x = np.ones((2, 256), dtype=np.float32)
    x[1, 5] = value
    ck = _generic(tmp_path, {"w.weight": x})
    w = _no_warnings()
    try:
        with pytest.raises(NonFiniteError) as ei:
            hf2q.load(ck, Device._isolated("host"), dtype=dtype, progress=False, check_finite=True)
    finally:
        w.__exit__(None, None, None)
    e = ei.value
    assert e.tensor == "w.weight" and e.step == f"quantization f32->{dtype}"
    assert e.path == str(ck / "model.safetensors") and str(e).startswith(f"{e.path}: non-finite weight in 'w.weight'")
    assert "float16 scale" in str(e) and f"too large for {dtype}" in str(e)
    block = hf2q.formats.get(dtype).block_elems
    assert 256 <= e.index < 256 + block and e.multi_index == (1, e.index - 256)  # in the block holding x[1, 5]
    assert e.value_class in ("nan", "+inf", "-inf")
    with pytest.warns(hf2q.ScaleOverflowWarning, match=f"{dtype.upper()} block scale"):
        m = hf2q.load(ck, Device._isolated("host"), dtype=dtype, progress=False)  # default: ggml's bytes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert m["w.weight"].numpy().tobytes() == ops.quantize(x, dtype).tobytes()
        assert not np.isfinite(ops.dequantize(m["w.weight"].numpy(), dtype)).all()


def test_block_scale_overflow_after_a_staged_conversion(tmp_path: Path) -> None:
    """f64 1e38 fits f32 but not Q8_0: the staged write (Device.write) reports it as the quantization's."""
    import hf2q

    x = np.ones((2, 32), dtype=np.float64)
    x[1, 5] = 1e38
    ck = _generic(tmp_path, {"w.weight": x})
    with pytest.raises(NonFiniteError) as ei:
        hf2q.load(ck, Device._isolated("host"), dtype="q8_0", progress=False, check_finite=True)
    assert ei.value.step == "quantization f32->q8_0" and ei.value.tensor == "w.weight"
    assert ei.value.path == str(ck / "model.safetensors")


@pytest.mark.parametrize("check_finite", [False, True])
def test_finite_f64_that_does_not_fit_f32_before_q8_0(check_finite: bool, tmp_path: Path) -> None:
    """f64 1e300 is finite in the file: it does not fit f32 on its way to Q8_0 (was "non-finite input",
    step None)."""
    import hf2q

    x = np.ones((2, 32), dtype=np.float64)
    x[1, 5] = 1e300
    ck = _generic(tmp_path, {"w.weight": x})
    w = _no_warnings()
    try:
        with pytest.raises(NonFiniteError) as ei:
            hf2q.load(ck, Device._isolated("host"), dtype="q8_0", progress=False, check_finite=check_finite)
    finally:
        w.__exit__(None, None, None)
    e = ei.value
    assert e.step == "conversion f64->f32" and e.value_class == "+inf" and e.index == 37 and e.multi_index == (1, 5)
    assert "non-finite input" not in str(e) and "the file's value is finite but does not fit f32" in str(e)
    # a NaN in the file stays the file's
    x[1, 5] = np.nan
    (tmp_path / "nan").mkdir()
    ck2 = _generic(tmp_path / "nan", {"w.weight": x})
    with pytest.raises(NonFiniteError) as ei:
        hf2q.load(ck2, Device._isolated("host"), dtype="q8_0", progress=False, check_finite=check_finite)
    assert ei.value.step in (None, "file") and ei.value.value_class == "nan"
