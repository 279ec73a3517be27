"""The CUDA encoders and read-back of Q4_0 / Q4_K / Q5_K / Q6_K / Q5_0 / Q5_1
(shaders/cuda_kernels.cu) against the CPU kernels.

Two layers: ``test_cuda_kernels_emulated_on_the_cpu`` compiles the kernel
source as C++ with a minimal emulation of the CUDA built-ins it uses
(tests/native/cuda_kquants_emu.cpp: one CTA as threads, __syncwarp as a
barrier), so CI without a GPU checks their bytes and read-back values; the
tests marked ``cuda`` run them on a GPU (``pytest -m cuda
tests/test_kquants_cuda.py``) and skip cleanly without one."""

from __future__ import annotations

import subprocess
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import hf2q
from hf2q import formats, ops, reference
from _helpers import build_cuda_emulator, why_no_cuda

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "kquants"
FMTS = ("q4_0", "q4_k", "q5_k", "q6_k", "q5_0", "q5_1")
SRC = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}


def _rows() -> np.ndarray:
    with np.load(DATA / "ggml_ref.npz") as z:
        return np.ascontiguousarray(z["rows"], dtype=np.float32)


def _quiet(x: np.ndarray, fmt: str) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hf2q.ScaleOverflowWarning)
        return ops.quantize(x, fmt)


@pytest.fixture(scope="module")
def emulator(tmp_path_factory) -> Path:
    out = build_cuda_emulator(tmp_path_factory.mktemp("cuda_emu"))
    if out is None:
        pytest.skip("no C++ compiler")
    return out


@pytest.mark.host_tools
def test_cuda_kernels_emulated_on_the_cpu(emulator: Path, tmp_path: Path) -> None:
    rows = _rows()
    # A: every committed row (huge values included: scale overflow paths), f32 only;
    # B: rows that stay finite in f16, from all three sources. 256 rows each (whole CTAs).
    cases = {"A": (np.resize(rows, (256, 256)), ["f32"]),
             "B": (np.resize(rows[np.abs(rows).max(axis=1) < 60000], (256, 256)), ["f32", "f16", "bf16"])}
    bad = []
    for tag, (x, srcs) in cases.items():
        x.astype(np.float32).tofile(tmp_path / f"{tag}.f32")
        subprocess.run([str(emulator), str(tmp_path / f"{tag}.f32"), str(tmp_path / tag)], check=True,
                       capture_output=True)
        for src in srcs:
            xin = np.fromfile(tmp_path / f"{tag}.{src}.in", dtype=SRC[src]).reshape(x.shape)
            for fmt in FMTS:
                got = np.fromfile(tmp_path / f"{tag}.{fmt}.{src}", dtype=np.uint8)
                want = _quiet(xin, fmt).reshape(-1)
                if not np.array_equal(got, want):
                    bad.append(f"{tag} {fmt} from {src}")
        for fmt in FMTS:  # read-back values of the f32 source's bytes, as the CPU's decode gives them
            q = np.fromfile(tmp_path / f"{tag}.{fmt}.f32", dtype=np.uint8)
            got = np.fromfile(tmp_path / f"{tag}.{fmt}.bits", dtype=np.uint32)
            with np.errstate(all="ignore"):
                want = reference.readback_bits(fmt, q)
            if not np.array_equal(got, want.reshape(-1)):
                bad.append(f"{tag} {fmt} read-back")
    assert bad == []


# ------------------------------------------------------------------ on a GPU (marked cuda)



@pytest.fixture(scope="module")
def gpu() -> hf2q.Device:
    why = why_no_cuda()
    if why:
        pytest.skip(f"no CUDA device: {why}")
    return hf2q.Device._isolated("cuda")


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("src", ["f32", "f16", "bf16"])
def test_gpu_quantize_equals_cpu(gpu, fmt: str, src: str) -> None:
    rows = _rows()
    if src != "f32":
        with np.errstate(over="ignore"):
            cast = rows.astype(SRC[src])
        rows = rows[np.all(np.isfinite(cast.astype(np.float32)), axis=1)]
    x = np.ascontiguousarray(np.tile(rows, (9, 1)).astype(SRC[src]))  # several CTAs and a partial last one
    host = hf2q.Device._isolated("host")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hf2q.ScaleOverflowWarning)
        want = host.upload(x, to=fmt, name="w")
        got = gpu.upload(x, to=fmt, name="w")
    assert got.dtype == fmt and got.shape == x.shape
    assert np.array_equal(np.asarray(got.to_host()).view(np.uint8).reshape(-1),
                          np.asarray(want.to_host()).view(np.uint8).reshape(-1))
    assert gpu.verify(got).ok


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", FMTS)
def test_gpu_nonfinite_and_scale_overflow(gpu, fmt: str) -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 512)).astype(np.float32)
    x[40, 300] = np.nan
    x[50, 7] = np.inf
    with pytest.raises(hf2q.NonFiniteError) as e:
        gpu.upload(x, to=fmt, name="blk.0.w")
    assert e.value.index == 40 * 512 + 300
    big = np.zeros((1, 256), dtype=np.float32)
    big[0, ::2], big[0, 1::2] = 1e9, -1e9
    with pytest.warns(hf2q.ScaleOverflowWarning):
        gpu.upload(big, to=fmt, name="t")


@pytest.mark.cuda
def test_gpu_recipe_load_equals_host(gpu, tmp_path: Path) -> None:
    from _recipe_variants import materialize

    path = materialize("qwen35moe_wide", tmp_path / "wide")
    a = hf2q.load(path, gpu, recipe="q4_k_m", progress=False)
    b = hf2q.load(path, hf2q.Device("host"), recipe="q4_k_m", progress=False)
    for name, buf in b.named_buffers():
        assert a[name].dtype == buf.dtype
        assert bytes(a[name]._storage_bytes(0, a[name].byte_len)) == bytes(buf._storage_bytes(0, buf.byte_len)), name
