"""Unit transposes (hf2q.plan.UnitTranspose, kernels/unit_grid.h): the
V-head reorders of Qwen3.5/3.6 done where a tensor lies after its bytes are
streamed, instead of in numpy. Checked against the numpy reorders of
models/qwen35/transforms.py (themselves checked against loops and
llama.cpp's converter), on the host backend (both of its paths) and, with
``-m cuda``, the GPU kernel; the loader's numpy fallback (units that are not
whole blocks of the format) against the streamed path."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

from hf2q import ops, qwen35
from hf2q.device import Device
from hf2q.models.qwen35.names import Transform as T  # noqa: N817
from hf2q.models.qwen35.plan import _unit_transpose
from hf2q.models.qwen35 import transforms as tr
from hf2q.plan import TensorPlan, UnitTranspose
from hf2q.testing import make_qwen35_moe_checkpoint
from hf2q.testing.qwen35_checkpoint import TINY_TEXT_CONFIG
from _helpers import why_no_cuda

RNG = np.random.default_rng(11)


def _cfg(nk: int, nv: int, dk: int, dv: int) -> SimpleNamespace:
    return SimpleNamespace(linear_num_key_heads=nk, linear_num_value_heads=nv, linear_key_head_dim=dk,
                           linear_value_head_dim=dv)


def _pt(tag: str, shape: tuple[int, ...]) -> SimpleNamespace:
    return SimpleNamespace(name="t", transforms=(tag,), shape=shape)


@pytest.mark.parametrize("nk,nv,dk,dv", [(2, 6, 4, 3), (16, 32, 128, 128), (3, 3, 2, 2), (1, 4, 8, 5)])
def test_each_qwen_reorder_is_its_unit_transpose(nk: int, nv: int, dk: int, dv: int) -> None:
    c = _cfg(nk, nv, dk, dv)
    h, k = 24, 4
    qk = 2 * nk * dk
    cases = [
        (T.REORDER_V_QKV, RNG.standard_normal((qk + nv * dv, h)), lambda x: tr.reorder_in_proj_qkv(x, nk, nv, dk, dv)),
        (T.REORDER_V_ROWS, RNG.standard_normal((nv * dv, h)), lambda x: tr.reorder_in_proj_z(x, nk, nv, dv)),
        (T.REORDER_V_HEADS, RNG.standard_normal((nv, h)), lambda x: tr.reorder_in_proj_ab(x, nk, nv)),
        (T.REORDER_V_HEADS, RNG.standard_normal(nv), lambda x: tr.reorder_per_head(x, nk, nv)),
        (T.REORDER_V_CONV1D, RNG.standard_normal((qk + nv * dv, k)), lambda x: tr.reorder_conv1d(x, nk, nv, dk, dv)),
        (T.REORDER_V_COLS, RNG.standard_normal((h, nv * dv)), lambda x: tr.reorder_out_proj(x, nk, nv, dv)),
    ]
    for tag, x, reference in cases:
        x = x.astype(np.float32)
        t = _unit_transpose(_pt(tag, x.shape), c)  # type: ignore[arg-type]
        assert t is not None
        assert np.array_equal(t.apply(x), reference(x)), tag


def test_no_reorder_tag_no_transpose_and_bad_head_counts() -> None:
    assert _unit_transpose(_pt(T.NORM_PLUS_ONE, (4,)), _cfg(2, 4, 2, 2)) is None  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="value heads"):
        _unit_transpose(_pt(T.REORDER_V_ROWS, (10, 4)), _cfg(2, 5, 2, 2))  # type: ignore[arg-type]


def test_fits_says_whole_blocks() -> None:
    t = UnitTranspose(outer=8, period=512, start=0, a=2, b=2, unit=128)
    assert t.fits("f32") and t.fits("bf16") and t.fits("q8_0") and t.fits("q4_0")
    assert not t.fits("q4_k")  # 128-element units inside 256-element super-blocks
    assert not UnitTranspose(1, 96, 32, 2, 2, 16).fits("q8_0")


def _device_case(dev: Device, x: np.ndarray, dtype: str, t: UnitTranspose) -> tuple[bytes, bytes]:
    """(the device's transpose of the converted x, the conversion of the numpy transpose of x)."""
    if dtype == "bf16":
        x = x.astype(ml_dtypes.bfloat16)
    buf = dev.upload(x, to=dtype)
    dev._native.transpose_units(buf._native, t.outer, t.period, t.start, t.a, t.b, t.unit)
    got = np.ascontiguousarray(buf.to_host()).view(np.uint8).tobytes()
    want = dev.upload(t.apply(x), to=dtype)
    return got, np.ascontiguousarray(want.to_host()).view(np.uint8).tobytes()


# (shape, transpose): out_proj-like columns (small grids: scratch per row), in_proj_qkv-like
# rows after a prefix, and grids past the scratch size (followed cycle by cycle).
GRIDS = [
    ((64, 512), UnitTranspose(64, 512, 0, 2, 2, 128)),
    ((64, 6 * 64), UnitTranspose(64, 384, 0, 2, 3, 64)),
    ((2 * 2 * 32 + 6 * 64, 64), UnitTranspose(1, (128 + 384) * 64, 128 * 64, 2, 3, 64 * 64)),
    ((32 * 128 + 2048, 256), UnitTranspose(1, (32 * 128 + 2048) * 256, 2048 * 256, 16, 2, 128 * 256)),
    ((3, 5, 64), UnitTranspose(3, 320, 64, 2, 2, 64)),
]


def _host_and_gpu() -> list:
    out = [pytest.param("host", id="host")]
    why = why_no_cuda()
    out.append(pytest.param("cuda", id="cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(bool(why), reason=f"no CUDA device: {why}")]))
    return out


@pytest.mark.parametrize("kind", _host_and_gpu())
@pytest.mark.parametrize("dtype", ["f32", "bf16", "q8_0"])
@pytest.mark.parametrize("shape,t", GRIDS)
def test_device_transpose_equals_numpy(kind: str, dtype: str, shape: tuple[int, ...], t: UnitTranspose) -> None:
    dev = Device._isolated(kind)
    x = RNG.standard_normal(shape).astype(np.float32)
    got, want = _device_case(dev, x, dtype, t)
    assert got == want


@pytest.mark.parametrize("kind", _host_and_gpu())
def test_device_transpose_odd_byte_sizes(kind: str) -> None:
    """Q8_0 blocks are 34 bytes: units of one block are not whole 4-byte words (the GPU's byte kernel)."""
    dev = Device._isolated(kind)
    x = RNG.standard_normal((5, 3 * 4 * 32)).astype(np.float32)
    t = UnitTranspose(5, 384, 0, 3, 4, 32)
    got, want = _device_case(dev, x, "q8_0", t)
    assert got == want


@pytest.mark.parametrize("kind", _host_and_gpu())
def test_device_transpose_refuses_bad_geometry(kind: str) -> None:
    dev = Device._isolated(kind)
    buf = dev.upload(np.zeros((4, 64), np.float32), to="q8_0")
    n = buf._native
    with pytest.raises(ValueError, match="whole blocks of 32"):
        dev._native.transpose_units(n, 4, 64, 0, 2, 2, 16)
    with pytest.raises(ValueError, match="does not fit its period"):
        dev._native.transpose_units(n, 4, 64, 32, 2, 2, 32)
    with pytest.raises(ValueError, match="grids end at byte"):
        dev._native.transpose_units(n, 5, 64, 0, 2, 1, 32)
    with pytest.raises(ValueError, match="overflow"):
        dev._native.transpose_units(n, 1, 64, 0, 1 << 40, 1 << 40, 32)
    other = Device._isolated(kind).upload(np.zeros(64, np.float32), to="f32")
    with pytest.raises(Exception, match="another device"):
        dev._native.transpose_units(other._native, 1, 64, 0, 2, 2, 16)


@pytest.mark.parametrize("kind", _host_and_gpu())
def test_device_transposes_many_at_once_equal_one_by_one(kind: str) -> None:
    """transpose_units_many (a loader's batch: one wait and one scratch on a
    GPU, sized by the largest region) equals each transpose done alone,
    formats and sizes mixed, a buffer listed twice done twice in order; every
    item is checked before any runs."""
    dev = Device._isolated(kind)
    cases = [(RNG.standard_normal(shape).astype(np.float32), dtype, t)
             for (shape, t), dtype in zip(GRIDS, ["f32", "bf16", "q8_0", "f32", "bf16"])]
    bufs, want = [], []
    for x, dtype, t in cases:
        xs = x.astype(ml_dtypes.bfloat16) if dtype == "bf16" else x
        bufs.append(dev.upload(xs, to=dtype))
        one = dev.upload(xs, to=dtype)
        dev._native.transpose_units(one._native, t.outer, t.period, t.start, t.a, t.b, t.unit)
        want.append(np.ascontiguousarray(one.to_host()).view(np.uint8).tobytes())
    twice = dev.upload(cases[0][0], to="f32")
    t0 = cases[0][2]
    items = [(b._native, t.outer, t.period, t.start, t.a, t.b, t.unit) for b, (_, _, t) in zip(bufs, cases)]
    items += [(twice._native, t0.outer, t0.period, t0.start, t0.a, t0.b, t0.unit)] * 2
    dev._native.transpose_units_many(items)
    for b, w in zip(bufs, want):
        assert np.ascontiguousarray(b.to_host()).view(np.uint8).tobytes() == w
    assert np.array_equal(twice.to_host(), cases[0][0])  # a transpose done twice is the identity here (2 x 2)
    before = [np.ascontiguousarray(b.to_host()).copy() for b in bufs]
    with pytest.raises(ValueError, match="whole blocks of 32"):  # bufs[2] is Q8_0
        dev._native.transpose_units_many(items[:2] + [(bufs[2]._native, 4, 64, 0, 2, 2, 16)])
    assert all(np.array_equal(b.to_host(), x) for b, x in zip(bufs, before))  # none ran
    dev._native.transpose_units_many([])


# --------------------------------------------------------------------------- through the loader
#: Tiny Qwen3.5 shapes where every dense format divides the rows (256) but a
#: V head's 128 columns of out_proj are half a K-quant super-block.
KQ_TEXT = {**TINY_TEXT_CONFIG, "hidden_size": 256, "head_dim": 128, "linear_key_head_dim": 32,
           "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_value_head_dim": 128,
           "moe_intermediate_size": 256, "shared_expert_intermediate_size": 256,
           "rope_parameters": {**TINY_TEXT_CONFIG["rope_parameters"], "mrope_section": [8, 4, 4]}}


@pytest.fixture(scope="module")
def kq_dir(tmp_path_factory):
    return make_qwen35_moe_checkpoint(tmp_path_factory.mktemp("kq"), KQ_TEXT, seed=3, mtp=False)


def _by_numpy(plan):
    return dataclasses.replace(plan, entries=[e.transposed_in_numpy() for e in plan])


def _bytes(model) -> dict[str, bytes]:
    return {n: np.ascontiguousarray(b.to_host()).view(np.uint8).tobytes() for n, b in model.named_buffers()}


@pytest.mark.parametrize("kind", _host_and_gpu())
@pytest.mark.parametrize("dense", ["f32", "bf16", "q8_0", "q4_0", "q4_k"])
def test_loader_transposes_equal_the_numpy_reorders(kind: str, dense: str, kq_dir) -> None:
    from hf2q.models.qwen35 import FAMILY
    from hf2q.safetensors import open_checkpoint

    dev = Device._isolated(kind)
    with open_checkpoint(kq_dir) as ck:
        plan = FAMILY.plan_checkpoint(ck, config=None, dense_dtype=dense, expert_dtype="q8_0")
        moved = [e for e in plan if e.unit_transpose is not None]
        # every V-head reorder of the three linear-attention layers: qkv, z, a, b, conv1d, out_proj, dt_bias
        assert len(moved) == 3 * 7 and not any(e.transform is not None and e.unit_transpose for e in plan)
        fits = {e.name: e.unit_transpose.fits(e.dtype) for e in moved}
        if dense == "q4_k":  # out_proj's 128-column units: the loader reorders it in numpy
            assert {n for n, ok in fits.items() if not ok} == {f"blk.{i}.ssm_out.weight" for i in range(3)}
        else:
            assert all(fits.values())
        got = _bytes(FAMILY.load_planned(plan, ck, dev, progress=False))
        want = _bytes(FAMILY.load_planned(_by_numpy(plan), ck, dev, progress=False))
        if kind == "host":  # check_finite reads and checks the same bytes (a host-only option)
            assert _bytes(FAMILY.load_planned(plan, ck, dev, progress=False, check_finite=True)) == got
    assert got.keys() == want.keys()
    assert [n for n in got if got[n] != want[n]] == []


def test_loader_transposes_match_the_reference_oracle(kq_dir) -> None:
    """The streamed + transposed load equals transform_tensor's numpy reference (q8_0 dense)."""
    from hf2q.models.qwen35.transforms import convert_reference
    from hf2q.safetensors import open_checkpoint

    model = qwen35.load(kq_dir, device=Device._isolated("host"), dense_dtype="q8_0", expert_dtype="q8_0")
    with open_checkpoint(kq_dir) as ck:
        from hf2q.models.qwen35 import FAMILY

        plan = FAMILY.plan_checkpoint(ck, config=None, dense_dtype="q8_0", expert_dtype="q8_0")
        for e in plan:
            if e.unit_transpose is None:
                continue
            arrays = [ck.read_array(p.tensor) for p in e.sources]
            want = convert_reference(e, arrays, plan.config)
            got = model[e.name].to_host()
            assert np.array_equal(np.asarray(got).view(np.uint8), np.asarray(want).view(np.uint8)), e.name


def test_numpy_fallback_needs_one_whole_source() -> None:
    from hf2q.plan import Piece

    e = TensorPlan("x", (4, 4), "f32", (Piece("a", "F32", (2, 4)), Piece("b", "F32", (2, 4), dest_offset=8)),
                   unit_transpose=UnitTranspose(1, 16, 0, 2, 2, 4))
    with pytest.raises(ValueError, match="one whole source"):
        e.transposed_in_numpy()
    assert TensorPlan("y", (4,), "f32", (Piece("a", "F32", (4,)),)).transposed_in_numpy().transform is None


def test_ops_quantize_commutes_with_block_transposes() -> None:
    """Why a transpose of Q8_0 blocks is the converter's result: Q8_0
    quantizes each 32-element block on its own, so moving whole blocks and
    quantizing commute (K-quants' 256-element super-blocks do not, for 128-element units)."""
    x = RNG.standard_normal((8, 512)).astype(np.float32)
    t = UnitTranspose(8, 512, 0, 2, 2, 128)
    q = ops.quantize(x, "q8_0").view(np.uint8).reshape(8, -1)
    tq = UnitTranspose(8, q.shape[1], 0, 2, 2, 128 // 32 * 34).apply(q)
    assert np.array_equal(tq, ops.quantize(t.apply(x), "q8_0").view(np.uint8).reshape(8, -1))


def test_kquant_out_proj_is_transposed_on_the_device_before_it_is_quantized(kq_dir, monkeypatch) -> None:
    """A unit transpose that does not fit the format (K-quant out_proj) runs
    on a transient of the source format, then the device converts it: no
    numpy pass (the loader's numpy reorder is not called)."""
    from hf2q import loader, plan as plan_mod

    calls: list[str] = []
    real = loader._transpose_then_convert
    monkeypatch.setattr(loader, "_transpose_then_convert",
                        lambda dev, ck, e, *a: (calls.append(e.name), real(dev, ck, e, *a))[1])
    monkeypatch.setattr(plan_mod.TensorPlan, "transposed_in_numpy",
                        lambda self: pytest.fail(f"{self.name} reordered in numpy"))
    qwen35.load(kq_dir, device=Device._isolated("host"), dense_dtype="q4_k", expert_dtype="q8_0")
    assert sorted(calls) == [f"blk.{i}.ssm_out.weight" for i in range(3)]


def test_kquant_out_proj_nan_is_refused_with_its_name(tmp_path) -> None:
    import json

    from hf2q.errors import NonFiniteError

    d = make_qwen35_moe_checkpoint(tmp_path / "nan", KQ_TEXT, seed=3, mtp=False)
    # one NaN into layer 1's out_proj (BF16 0x7FC0) in place in its file
    idx = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"] if (
        d / "model.safetensors.index.json").exists() else None
    name = "model.layers.1.linear_attn.out_proj.weight"
    fname = d / (idx[name] if idx else "model.safetensors")
    raw = fname.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    info = json.loads(raw[8:8 + n])[name]
    at = 8 + n + info["data_offsets"][0] + 2 * 777
    fname.write_bytes(raw[:at] + b"\xc0\x7f" + raw[at + 2:])
    with pytest.raises(NonFiniteError, match="ssm_out") as ei:
        qwen35.load(d, device=Device._isolated("host"), dense_dtype="q4_k", expert_dtype="q8_0")
    assert ei.value.value_class == "nan"
