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
    gpu, host = Device._isolated("cuda"), Device._isolated("host")
    d = DATA / "qwen35moe_fp8_block128" / "hf"
    _same_model(qwen35.load(d, device=gpu, dense_dtype=outtype, expert_dtype=outtype, progress=False),
                qwen35.load(d, device=host, dense_dtype=outtype, expert_dtype=outtype, progress=False))
    for v in ("qwen3_fp8_deepseek", "qwen3_fp8_ct_channel", "gptoss_mxfp4"):
        d = DATA / v / "hf"
        _same_model(hf2q.load(d, device=gpu, dtype=outtype, progress=False),
                    hf2q.load(d, device=host, dtype=outtype, progress=False))


def test_fp8_and_mxfp4_kept_on_gpu_read_back() -> None:
    gpu, host = Device._isolated("cuda"), Device._isolated("host")
    for v in ("qwen3_fp8_deepseek", "gptoss_mxfp4"):
        d = DATA / v / "hf"
        g = hf2q.load(d, device=gpu, dtype="keep", progress=False)
        _same_model(g, hf2q.load(d, device=host, dtype="keep", progress=False))
        kinds = {g[n].dtype for n in g.names()}
        assert kinds & {"f8_e4m3", "mxfp4"}
        for n in g.names():
            assert gpu.verify(g[n]).ok, n


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
