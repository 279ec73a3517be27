"""The CUDA kernel source compiles where nvcc is installed (no GPU needed):
shaders/cuda_kernels.cu with the options the CUDA backend gives NVRTC at run
time (csrc/device/cuda/cuda_backend.cpp, load_kernels), once for every
format's kernels. The GPU tests (-m cuda) run them; the k-quant encoders also
run on the CPU through tests/test_kquants_cuda.py's emulation."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hf2q import formats

ROOT = Path(__file__).resolve().parents[1]
KQUANTS = ("q4_0", "q4_k", "q5_k", "q6_k", "q5_0", "q5_1")
HALF_AND_F32 = ("f32", "f16", "bf16")


@pytest.mark.host_tools
def test_kernel_source_compiles_with_nvcc(tmp_path: Path) -> None:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not installed (the kernels compile at run time with NVRTC)")
    # Under scripts/run_sanitizers.sh the ASan runtime is preloaded into every
    # child: nvcc's own binaries are not built for it (they crash).
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    out = tmp_path / "k.ptx"
    r = subprocess.run([nvcc, "--ptx", "-arch=sm_80", "--fmad=false", "--ftz=false", "--prec-div=true",
                        "--prec-sqrt=true", "-std=c++17", "-x", "cu", str(ROOT / "shaders" / "cuda_kernels.cu"),
                        "-o", str(out)], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    ptx = out.read_text()
    for fmt in formats.DEVICE_FORMATS:  # every device format has a read-back kernel (32-bit ones share one)
        kernel = "b32" if fmt in ("f32", "i32") else fmt
        assert f".entry hf2q_checksums_{kernel}(" in ptx, fmt
    for fmt in KQUANTS:
        for src in HALF_AND_F32:
            assert f".entry hf2q_quantize_{fmt}_{src}(" in ptx
    for weight in ("f8_e4m3", "f8_e5m2"):
        assert f".entry hf2q_{weight}_to_f32(" in ptx
        for to in ("f32", "bf16", "f16", "q8_0"):
            assert f".entry hf2q_scaled_{weight}_{to}(" in ptx
    for word in ("u32", "u8"):  # unit transposes (csrc/kernels/unit_grid.h)
        assert f".entry hf2q_transpose_units_{word}(" in ptx
