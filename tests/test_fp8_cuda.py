"""FP8 and MXFP4 on CUDA (docs/FP8.md): the golden checkpoints load on the
GPU with the host's bytes (the converter's, test_fp8_golden.py); FP8 and
MXFP4 buffers kept on the GPU read back (verify) through their CUDA
checksum kernels; unscaled FP8 decodes to f32 on the GPU bit for bit.
Marked ``cuda``; skipped without a CUDA device."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import hf2q
from hf2q import qwen35
from hf2q.device import Device
from _helpers import why_no_cuda

DATA = Path(__file__).parent / "data" / "fp8"




_NO_CUDA = why_no_cuda()
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(bool(_NO_CUDA), reason=f"no CUDA device: {_NO_CUDA}")]


def _same_model(a: hf2q.LoadedModel, b: hf2q.LoadedModel) -> None:
    assert sorted(a.names()) == sorted(b.names())
    for n in a.names():
        assert a[n].dtype == b[n].dtype and a[n].shape == b[n].shape, n
        assert a[n].to_host().view(np.uint8).tobytes() == b[n].to_host().view(np.uint8).tobytes(), n


@pytest.mark.parametrize("outtype", ["q8_0", "f32", "bf16"])
def test_fp8_golden_on_gpu_equals_host(outtype) -> None:
    from hf2q import gemma4

    gpu, host = Device._isolated("cuda"), Device._isolated("host")
    for v in ("qwen35moe_fp8_block128", "qwen35moe_fp8_fused", "qwen35moe_cond_fp8_block128"):
        d = DATA / v / "hf"
        _same_model(qwen35.load(d, device=gpu, dense_dtype=outtype, expert_dtype=outtype, progress=False),
                    qwen35.load(d, device=host, dense_dtype=outtype, expert_dtype=outtype, progress=False))
    d = DATA / "gemma4_moe_fp8_ct_channel" / "hf"
    _same_model(gemma4.load(d, device=gpu, dense_dtype=outtype, expert_dtype=outtype, progress=False),
                gemma4.load(d, device=host, dense_dtype=outtype, expert_dtype=outtype, progress=False))
    for v in ("qwen3_fp8_deepseek", "qwen3_fp8_ct_channel", "qwen3_fp8_ct_block", "qwen3_fp8_e5m2_tensor",
              "gptoss_mxfp4"):
        d = DATA / v / "hf"
        _same_model(hf2q.load(d, device=gpu, dtype=outtype, progress=False),
                    hf2q.load(d, device=host, dtype=outtype, progress=False))


def test_fp8_and_mxfp4_kept_on_gpu_read_back() -> None:
    gpu, host = Device._isolated("cuda"), Device._isolated("host")
    for v in ("qwen3_fp8_deepseek", "qwen3_fp8_e5m2_tensor", "gptoss_mxfp4"):
        d = DATA / v / "hf"
        g = hf2q.load(d, device=gpu, dtype="keep", progress=False)
        _same_model(g, hf2q.load(d, device=host, dtype="keep", progress=False))
        kinds = {g[n].dtype for n in g.names()}
        assert kinds & {"f8_e4m3", "f8_e5m2", "mxfp4"}
        for n in g.names():
            assert gpu.verify(g[n]).ok, n


# (lead, rows, cols), block: scale blocks a multiple of 32 wide (one scale per
# Q8_0 block), narrower and not dividing 32, partial edge blocks, per channel.
_GEOMETRIES = [((2, 40, 64), (32, 24)), ((3, 130, 256), (128, 128)), ((1, 7, 96), (1, 96)), ((2, 33, 160), (5, 48)),
               ((1, 64, 320), (16, 16)), ((1, 8, 160), (4, 64)),
               ((2, 9, 70), (4, 6)), ((1, 5, 13), (2, 13))]  # cols not a multiple of 4 (nor 32: no Q8_0)


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("fmt", ["f8_e4m3", "f8_e5m2"])
@pytest.mark.parametrize("geometry", _GEOMETRIES)
def test_scaled_fp8_kernels_equal_the_cpu_decoder(fmt: str, geometry, wide: bool, monkeypatch) -> None:
    """The GPU's scaled FP8 decoders (Device.scaled_fp8: what the loader runs
    on an expert stack) against the CPU decoder, byte for byte, into every
    output format, at an element offset into the destination; a NaN
    encoding is reported at its flat index."""
    import ml_dtypes

    from hf2q import formats, ops

    shape, block = geometry
    if wide:  # the kernels' 64-bit index arithmetic, which they take where an index passes 32 bits
        monkeypatch.setenv("HF2Q_CUDA_WIDE_INDEX", "1")
    gpu = Device._isolated("cuda")
    outs = ("f32", "bf16", "f16", "q8_0") if shape[2] % 32 == 0 else ("f32", "bf16", "f16")
    rng = np.random.default_rng(sum(shape) + block[1])
    w = rng.integers(0, 256, shape, dtype=np.uint8)
    w[(w & 0x7F) >= 0x7C] = 3  # no NaN / Inf encodings here (0x7F is a NaN in both formats)
    grid = (shape[0], -(-shape[1] // block[0]), -(-shape[2] // block[1]))
    s = (rng.random(grid, dtype=np.float32) * 1e-2 + 1e-4).astype(np.float32)
    wf = w.view(ml_dtypes.float8_e4m3fn if fmt == "f8_e4m3" else ml_dtypes.float8_e5m2)
    per = formats.numel(shape[1:])
    for to in outs:
        want, _ = ops.dequantize_fp8(wf, s, block, to=to)
        buf = gpu.alloc((shape[0] + 1, *shape[1:]), to)
        first, _ = gpu._native.scaled_fp8(buf._native, per, gpu.upload(wf)._native, gpu.upload(s)._native, shape, block)
        assert first == -1, (to, first)
        got = buf.to_host().reshape(-1).view(np.uint8)
        off = formats.nbytes(shape[1:], to)
        assert got[off:off + formats.nbytes(shape, to)].tobytes() == want.view(np.uint8).tobytes(), to
    bad = w.copy()
    at = (shape[0] - 1, shape[1] // 2, shape[2] - 5)
    bad.reshape(shape)[at] = 0x7F
    bad.reshape(shape)[at[0], at[1], shape[2] - 2] = 0x7F  # a second NaN later in the same Q8_0 block
    flat = int(np.ravel_multi_index(at, shape))
    for to in outs[::3]:  # f32, and q8_0 where the rows are whole blocks
        buf = gpu.alloc(shape, to)
        first, _ = gpu._native.scaled_fp8(buf._native, 0, gpu.upload(bad.view(wf.dtype))._native,
                                          gpu.upload(s)._native, shape, block)
        assert first == flat, (to, first, flat)


@pytest.mark.parametrize("fmt", ["f8_e4m3", "f8_e5m2"])
def test_unscaled_fp8_decodes_on_gpu(fmt) -> None:
    from hf2q import reference

    gpu = Device._isolated("cuda")
    raw = np.arange(256, dtype=np.uint8)
    buf = gpu.alloc((256,), "f32")
    gpu.write(buf, raw, src_dtype=fmt)
    assert np.array_equal(buf.to_host().view(np.uint32), reference.f8_to_f32_bits(raw, fmt))


def test_torch_state_dict_float8_on_gpu() -> None:
    torch = pytest.importorskip("torch")
    from hf2q import torch as ht

    g = hf2q.load(DATA / "qwen3_fp8_deepseek" / "hf", device=Device._isolated("cuda"), dtype="keep", progress=False)
    t = ht.state_dict(g.named_buffers())["model.layers.0.mlp.up_proj.weight"]
    assert t.dtype == torch.float8_e4m3fn and t.is_cuda
