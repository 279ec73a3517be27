"""The Metal read-back kernels (shaders/verify.metal) run on the CPU.

The .metal file cannot be compiled off a Mac, so its text is compiled as C++
(tests/native/metal_verify_cpu.cpp, through the small MSL shim in
tests/native/metal_shim/) and every kernel is run thread by thread over the
dispatches the Metal backend encodes (csrc/device/metal/verify_dispatch.h,
shared with metal_backend.mm). The driver compares the kernels' checksums with
csrc/device/verify.cpp (what the host backend computes); this test also
compares them with the definition computed here with numpy and hf2q.reference.
Vectors: every f16 and bf16 bit pattern, q8_0 blocks under every half scale
(zeros, subnormals, Inf, NaN payloads, 0 * Inf), f32 specials, partial tail
groups, and dispatches cut small to exercise offsets and idle threads.
"""

from __future__ import annotations

import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from hf2q import formats, reference

# slow (compiles the Metal shaders as C++ and sweeps every f16/bf16 pattern); run in every suite, CI included
pytestmark = [pytest.mark.slow, pytest.mark.host_tools]

ROOT = Path(__file__).resolve().parents[1]
DTYPES = {name: formats.get(name).id for name in formats.DEVICE_FORMATS}  # native DType ids
# The portable kernels as CMakeLists.txt globs them (every csrc/kernels/*.cpp but the AVX2 files).
SOURCES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc/kernels").glob("*.cpp")
                 if not p.name.endswith("_avx2.cpp")) + [
    "csrc/device/dtype.cpp", "csrc/device/verify.cpp", "tests/native/metal_verify_cpu.cpp"]


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    out = tmp_path_factory.mktemp("metal_cpu")
    flags = ["-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", "-Wno-attributes", "-ffp-contract=off",
             "-fno-math-errno", "-pthread", f"-I{ROOT / 'csrc'}", f"-I{ROOT / 'tests/native/metal_shim'}",
             f"-I{ROOT / 'shaders'}"]
    if "clang" in Path(cxx).name:
        flags.append("-Wno-unknown-attributes")

    def compile_one(src: str) -> tuple[str, subprocess.CompletedProcess[str]]:
        obj = out / (Path(src).stem + ".o")
        return str(obj), subprocess.run([cxx, *flags, "-c", str(ROOT / src), "-o", str(obj)],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(compile_one, SOURCES))
    for src, (_, proc) in zip(SOURCES, results):
        assert proc.returncode == 0, f"compiling {src}:\n{proc.stdout}"
    exe = out / "metal_verify_cpu"
    proc = subprocess.run([cxx, "-pthread", *[o for o, _ in results], "-o", str(exe)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0, proc.stdout
    return exe


def _definition(dtype: str, raw: np.ndarray, numel: int) -> np.ndarray:
    """out[g] = sum_i bits(g*256 + i) * (2i + 1) mod 2^32 (csrc/device/verify.h)."""
    bits = reference.readback_bits(dtype, raw[: formats.nbytes((numel,), dtype)])
    ngroups = -(-numel // 256)
    padded = np.zeros(ngroups * 256, np.uint64)
    padded[:numel] = bits
    w = 2 * np.arange(256, dtype=np.uint64) + 1
    return ((padded.reshape(-1, 256) * w).sum(axis=1) % (1 << 32)).astype(np.uint32)


def _vectors() -> list[tuple[str, str, np.ndarray, int]]:
    rng = np.random.default_rng(15)
    every16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.4e38], np.float32).view(np.uint32)
    f32 = rng.integers(0, 1 << 32, 1000, dtype=np.uint64).astype(np.uint32)
    f32[:8] = specials
    f32[8:16] = 0x7F800001 + np.arange(8, dtype=np.uint32) * 0x10000  # NaN payloads
    # q8_0: one block per half scale pattern, quants random with 0, -128, 127 in place.
    nb = 1 << 16
    blocks = np.zeros((nb, 34), np.uint8)
    blocks[:, :2] = every16.view(np.uint8).reshape(-1, 2)
    q = rng.integers(-128, 128, (nb, 32)).astype(np.int8)
    q[:, 0], q[:, 1], q[:, 2] = 0, -128, 127
    blocks[:, 2:] = q.view(np.uint8)
    return [
        ("f32 specials, tail group", "f32", f32.view(np.uint8), 1000),
        ("i32", "i32", rng.integers(-(1 << 31), 1 << 31, 777).astype(np.int32).view(np.uint8), 777),
        ("f16 every pattern", "f16", every16.view(np.uint8), 1 << 16),
        ("f16 tail group", "f16", rng.integers(0, 1 << 16, 300).astype(np.uint16).view(np.uint8), 300),
        ("bf16 every pattern", "bf16", every16.view(np.uint8), 1 << 16),
        ("bf16 one element", "bf16", np.array([0x7FC1], np.uint16).view(np.uint8), 1),
        ("u8", "u8", rng.integers(0, 256, 1001).astype(np.uint8), 1001),
        ("q8_0 every scale", "q8_0", blocks.reshape(-1), nb * 32),
        ("q8_0 tail group", "q8_0", blocks[:11].reshape(-1), 11 * 32),
    ]


VECTORS = _vectors()
# (groups per dispatch, threads per threadgroup): the backend's (2^20, 64), and
# dispatches cut small so offsets, idle threads and odd threadgroups are used.
DISPATCHES = [(1 << 20, 64), (3, 64), (5, 7), (1, 1)]


@pytest.mark.parametrize("chunk,tg", DISPATCHES, ids=[f"chunk{c}-tg{t}" for c, t in DISPATCHES])
@pytest.mark.parametrize("name,dtype,raw,numel", VECTORS, ids=[v[0] for v in VECTORS])
def test_shader_matches_cpu_checksums(driver: Path, tmp_path: Path, name: str, dtype: str, raw: np.ndarray,
                                      numel: int, chunk: int, tg: int) -> None:
    src = tmp_path / "in.bin"
    dst = tmp_path / "out.bin"
    src.write_bytes(np.ascontiguousarray(raw).tobytes())
    proc = subprocess.run([str(driver), str(DTYPES[dtype]), str(numel), str(chunk), str(tg), str(src), str(dst)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert proc.returncode == 0, f"{name}: shader differs from verify.cpp: {proc.stdout}"
    got = np.fromfile(dst, dtype="<u4")
    assert np.array_equal(got, _definition(dtype, raw, numel)), f"{name}: shader differs from the definition"


def test_a_wrong_kernel_is_caught(driver: Path, tmp_path: Path) -> None:
    """The comparison can fail: f16 data read by the bf16 rule differs."""
    raw = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.uint8)
    src, dst = tmp_path / "in.bin", tmp_path / "out.bin"
    src.write_bytes(raw.tobytes())
    proc = subprocess.run([str(driver), str(DTYPES["f16"]), str(1 << 16), "64", "64", str(src), str(dst)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout
    assert not np.array_equal(np.fromfile(dst, dtype="<u4"), _definition("bf16", raw, 1 << 16))
