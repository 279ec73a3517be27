#!/usr/bin/env python3
"""Regenerate tests/data/kquants/: ggml's own bytes for Q4_0, Q4_K, Q5_K, Q6_K
(and Q5_0 / Q5_1, llama-quantize's fallbacks for rows of whole 32-blocks).

Not run in CI; CI reads the committed ``ggml_ref.npz`` and ``ggml_ref.json``.

How ggml's code is obtained: the llama-cpp-python sdist pinned in
``scripts/make_golden.py`` (it vendors llama.cpp and ggml) is downloaded with
``pip download --no-deps --no-binary :all: --no-build-isolation`` into a cache
directory (default ``~/.cache/hf2q-golden``), and only ``ggml/`` is extracted
there. ``ggml/src/ggml-quants.c`` is compiled, as it is, into a small shared
library together with a C file written by this script that defines the four
ggml functions ``ggml-quants.c`` calls but does not define (none of them is
reached by the routines used here). Flags: ``-O2 -DNDEBUG -ffp-contract=off``
(a release build: ``nearest_int``'s assert is compiled out, as in shipped
llama.cpp; no FMA contraction, which x86 gcc does not do anyway but arm64 gcc
and Apple clang do by default). Nothing of ggml is copied into this
repository; only the outputs below are.

What is written (``tests/data/kquants/ggml_ref.npz``):

- ``rows``: float32 [R, 256], the inputs: adversarial rows (named in
  ``ggml_ref.json``) and random rows of several distributions;
- ``<fmt>``: uint8 [R, bytes per 256 values]: ``quantize_row_<fmt>_ref`` of
  each row (fmt in q4_0, q4_k, q5_k, q6_k, q5_0, q5_1);
- ``<fmt>_rand`` / ``<fmt>_rand_deq``: random bytes (every bit pattern, with
  finite scales) and ggml's dequantization of them;
- ``nonfinite_rows`` and ``<fmt>_nonfinite``: rows holding NaN / Inf and what
  a release ggml writes for them (documentation of ggml's behaviour: hf2q
  raises NonFiniteError instead, docs/KQUANTS.md).

Usage: ``python scripts/make_kquant_golden.py`` (needs numpy, a C compiler,
and scikit-build-core for pip to read the sdist's metadata).
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import platform
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_golden import LLAMA_CPP_PYTHON  # noqa: E402  (one pin for both scripts)

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "data" / "kquants"
FORMATS = {"q4_0": ("q4_0", 18 * 8), "q4_k": ("q4_K", 144), "q5_k": ("q5_K", 176), "q6_k": ("q6_K", 210),
           "q5_0": ("q5_0", 22 * 8), "q5_1": ("q5_1", 24 * 8)}
CFLAGS = ["-O2", "-DNDEBUG", "-ffp-contract=off", "-fPIC", "-shared", "-std=gnu11"]

# The four symbols ggml-quants.c references outside itself. They are only
# reached by the imatrix quantizers and validation, which are not called.
STUBS = r"""
#include <stddef.h>
#include <stdlib.h>
void ggml_abort(const char * file, int line, const char * fmt, ...) { (void)file; (void)line; (void)fmt; abort(); }
size_t ggml_row_size(int type, long long ne) { (void)type; (void)ne; abort(); }
const char * ggml_type_name(int type) { (void)type; return "?"; }
size_t ggml_type_size(int type) { (void)type; abort(); }
"""


def fetch_ggml(cache: Path) -> Path:
    root = cache / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp" / "ggml"
    sdist = cache / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
    if not (root / "src" / "ggml-quants.c").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        if not sdist.is_file():
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                            "--no-build-isolation", f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(cache)],
                           check=True)
        prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp/ggml/"
        with tarfile.open(sdist) as tf:
            members = [m for m in tf.getmembers() if m.name.startswith(prefix) and (m.isfile() or m.isdir())]
            tf.extractall(cache, members=members, filter="data")
    return root


def build(ggml: Path, work: Path, cc: str) -> tuple[ctypes.CDLL, str]:
    stubs = work / "stubs.c"
    stubs.write_text(STUBS)
    lib = work / "libggmlquants.so"
    cmd = [cc, *CFLAGS, f"-I{ggml / 'include'}", f"-I{ggml / 'src'}", str(ggml / "src" / "ggml-quants.c"),
           str(stubs), "-o", str(lib), "-lm"]
    subprocess.run(cmd, check=True)
    version = subprocess.run([cc, "--version"], check=True, capture_output=True, text=True).stdout.splitlines()[0]
    return ctypes.CDLL(str(lib)), version


def f32(v: float) -> np.float32:
    return np.float32(v)


def adversarial_rows() -> list[tuple[str, np.ndarray]]:
    """Named 256-value rows aimed at the branches of the four quantizers."""
    n = 256
    rows: list[tuple[str, np.ndarray]] = []

    def add(name: str, values) -> None:
        a = np.asarray(values, dtype=np.float64).astype(np.float32).reshape(-1)
        assert a.size == n, (name, a.size)
        rows.append((name, a))

    rng = np.random.default_rng(20240624)
    ramp = np.linspace(-1, 1, n)
    add("zeros", np.zeros(n))
    add("neg_zeros", np.full(n, -0.0))
    add("const_pos", np.full(n, 0.75))
    add("const_neg", np.full(n, -0.75))
    add("const_one", np.ones(n))
    add("ramp", ramp)
    add("ramp_pos", np.linspace(0, 3, n))
    add("ramp_neg", np.linspace(-3, -0.001, n))
    add("positive_offset", rng.random(n) + 5.0)  # min > 0: the min is clamped to 0
    add("negative_offset", -rng.random(n) - 5.0)
    # A different constant per 32-group and per 16-group.
    add("const_groups32", np.repeat(np.arange(8) - 3.5, 32))
    add("const_groups16", np.repeat((np.arange(16) - 7.0) * 0.125, 16))
    # Whole sub-blocks of zeros among ordinary values.
    z = rng.standard_normal(n)
    z[32:64] = 0
    z[160:176] = 0
    add("zero_subblocks", z)
    z = np.zeros(n)
    z[200] = 1.0
    add("one_nonzero", z)
    z = np.zeros(n)
    z[5] = -1e-3
    add("one_negative_tiny", z)
    # Outliers.
    z = rng.standard_normal(n) * 0.01
    z[17] = 50.0
    add("outlier_pos", z)
    z = rng.standard_normal(n) * 0.01
    z[100] = -50.0
    z[230] = 40.0
    add("outlier_neg", z)
    # max and -max in one block: the first one wins in Q4_0 and Q6_K.
    z = rng.standard_normal(n) * 0.1
    z[0::32] = 1.0
    z[1::32] = -1.0
    add("plus_minus_max", z)
    z = rng.standard_normal(n) * 0.1
    z[0::32] = -1.0
    z[1::32] = 1.0
    add("minus_plus_max", z)
    # Ties: values on half steps of the level grids.
    add("half_steps", (np.arange(n) % 33 - 16) * 0.5)
    add("quarter_steps", (np.arange(n) % 17 - 8) * 0.25)
    add("integers_0_15", np.arange(n) % 16)
    add("integers_0_31", np.arange(n) % 32)
    add("integers_m32_31", np.arange(n) % 64 - 32)
    add("integers_m8_7", np.arange(n) % 16 - 8)
    # Small magnitudes: float16 subnormal scales, float32 subnormals, the
    # GROUP_MAX_EPS threshold (1e-15) and values around it.
    for mag in (1e-3, 1e-5, 6e-8, 1e-9, 1e-14, 1e-15, 2e-15, 1e-16, 1e-30, 1e-37, 1e-38, 2e-39, 1e-40, 1e-44):
        add(f"normal_x{mag:g}", rng.standard_normal(n) * mag)
    add("subnormal_mix", np.where(np.arange(n) % 2 == 0, rng.standard_normal(n) * 1e-40, rng.standard_normal(n)))
    add("min_subnormal", np.where(np.arange(n) % 3 == 0, 1.401298464324817e-45, 0.0))
    # Large magnitudes: super-block scales that overflow float16 (d or dmin
    # >= 65520), x*x overflowing float32 in the weights (|x| > 1.8e19), and
    # nearest_int fed values beyond 2^22.
    for mag in (1e3, 1e5, 4e6, 1e7, 6e7, 1e8, 1e10, 1e15, 1e19, 2e19, 1e25, 1e37, 3e38):
        # (uniform, not normal, where a normal sample could overflow float32)
        add(f"normal_x{mag:g}", (rng.uniform(-1, 1, n) if mag > 1e36 else rng.standard_normal(n)) * mag)
    add("huge_pos", np.full(n, 3.0e38))
    add("huge_ramp", np.linspace(-3.4e38, 3.4e38, n))
    add("max_float", np.where(np.arange(n) % 2 == 0, 3.4028234663852886e38, -3.4028234663852886e38))
    z = rng.standard_normal(n)
    z[77] = 1e20
    add("one_huge_among_normal", z)
    z = rng.standard_normal(n) * 1e-3
    z[3] = 1e9
    add("q6k_scale_spread", z)
    # Mixed: huge sub-block next to tiny ones (some group scales round to 0).
    z = rng.standard_normal(n) * 1e-6
    z[0:32] = rng.standard_normal(32) * 1e4
    add("huge_and_tiny_groups", z)
    z = rng.standard_normal(n) * 1e-6
    z[0:16] = rng.standard_normal(16) * 1e4
    add("huge_and_tiny_groups16", z)
    return rows


def random_rows(count: int) -> np.ndarray:
    rng = np.random.default_rng(24)
    out = []
    kinds = ("normal", "bf16", "t3", "uniform", "laplace", "sparse", "positive")
    for i in range(count):
        kind = kinds[i % len(kinds)]
        sigma = 10.0 ** rng.uniform(-4, 2)
        if kind == "normal":
            r = rng.standard_normal(256) * sigma
        elif kind == "bf16":  # BF16 checkpoints: few mantissa bits, many exact ties
            r = rng.standard_normal(256).astype(np.float32) * np.float32(sigma)
            r = (r.view(np.uint32) & 0xFFFF0000).view(np.float32)
        elif kind == "t3":
            r = rng.standard_t(3, 256) * sigma
        elif kind == "uniform":
            r = rng.uniform(-sigma, sigma, 256)
        elif kind == "laplace":
            r = rng.laplace(0, sigma, 256)
        elif kind == "sparse":
            r = rng.standard_normal(256) * sigma * (rng.random(256) < 0.1)
        else:
            r = np.abs(rng.standard_normal(256)) * sigma + sigma * 0.5
        out.append(np.asarray(r, dtype=np.float32))
    return np.stack(out)


def nonfinite_rows() -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    rows = []
    for name, pos, val in (("nan_first", 0, np.nan), ("nan_mid", 100, np.nan), ("pinf_mid", 100, np.inf),
                           ("ninf_mid", 200, -np.inf), ("nan_last", 255, np.nan)):
        r = rng.standard_normal(256).astype(np.float32)
        r[pos] = val
        rows.append((name, r))
    rows.append(("all_nan", np.full(256, np.nan, dtype=np.float32)))
    rows.append(("all_pinf", np.full(256, np.inf, dtype=np.float32)))
    return rows


def quantize(lib: ctypes.CDLL, fmt: str, rows: np.ndarray) -> np.ndarray:
    cname, nbytes = FORMATS[fmt]
    fn = getattr(lib, f"quantize_row_{cname}_ref")
    fn.restype = None
    out = np.zeros((rows.shape[0], nbytes), dtype=np.uint8)
    for i, r in enumerate(rows):  # one call per row, as llama-quantize's rows
        r = np.ascontiguousarray(r, dtype=np.float32)
        fn(r.ctypes.data_as(ctypes.c_void_p), out[i].ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(256))
    return out


def dequantize(lib: ctypes.CDLL, fmt: str, blocks: np.ndarray) -> np.ndarray:
    cname, _ = FORMATS[fmt]
    fn = getattr(lib, f"dequantize_row_{cname}")
    fn.restype = None
    out = np.zeros((blocks.shape[0], 256), dtype=np.float32)
    for i, b in enumerate(blocks):
        b = np.ascontiguousarray(b)
        fn(b.ctypes.data_as(ctypes.c_void_p), out[i].ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(256))
    return out


def random_blocks(fmt: str, count: int) -> np.ndarray:
    """Random bytes with finite float16 scales (random exponents 1..30)."""
    rng = np.random.default_rng(sum(fmt.encode()))
    _, nbytes = FORMATS[fmt]
    b = rng.integers(0, 256, size=(count, nbytes), dtype=np.uint8)

    def fix(offsets: list[int]) -> None:
        for off in offsets:
            h = rng.integers(0, 2**16, size=count, dtype=np.uint32)
            exp = rng.integers(1, 31, size=count, dtype=np.uint32)
            h = (h & 0x83FF) | (exp << 10)
            b[:, off] = h & 0xFF
            b[:, off + 1] = h >> 8

    if fmt == "q4_0":
        fix([18 * k for k in range(8)])
    elif fmt == "q5_0":
        fix([22 * k for k in range(8)])
    elif fmt == "q5_1":
        fix([24 * k for k in range(8)] + [24 * k + 2 for k in range(8)])
    elif fmt in ("q4_k", "q5_k"):
        fix([0, 2])
    else:
        fix([208])
    return b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "hf2q-golden")
    ap.add_argument("--cc", default="cc")
    ap.add_argument("--random-rows", type=int, default=168)
    args = ap.parse_args()

    ggml = fetch_ggml(args.cache)
    sdist = args.cache / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
    with tempfile.TemporaryDirectory() as tmp:
        lib, compiler = build(ggml, Path(tmp), args.cc)

        adv = adversarial_rows()
        rows = np.concatenate([np.stack([r for _, r in adv]), random_rows(args.random_rows)])
        nf = nonfinite_rows()
        nf_rows = np.stack([r for _, r in nf])
        arrays: dict[str, np.ndarray] = {"rows": rows, "nonfinite_rows": nf_rows}
        for fmt in FORMATS:
            q = quantize(lib, fmt, rows)
            arrays[fmt] = q
            rb = random_blocks(fmt, 96)
            arrays[f"{fmt}_rand"] = rb
            arrays[f"{fmt}_rand_deq"] = dequantize(lib, fmt, rb)
            arrays[f"{fmt}_nonfinite"] = quantize(lib, fmt, nf_rows)

    OUT.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT / "ggml_ref.npz", **arrays)
    meta = {
        "source": f"llama-cpp-python {LLAMA_CPP_PYTHON} sdist, vendor/llama.cpp/ggml/src/ggml-quants.c",
        "sdist_sha256": hashlib.sha256(sdist.read_bytes()).hexdigest(),
        "ggml_quants_c_sha256": hashlib.sha256((ggml / "src" / "ggml-quants.c").read_bytes()).hexdigest(),
        "compiler": compiler,
        "cflags": CFLAGS,
        "machine": platform.machine(),
        "adversarial_rows": [name for name, _ in adv],
        "random_rows": args.random_rows,
        "nonfinite_rows": [name for name, _ in nf],
    }
    (OUT / "ggml_ref.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {OUT}: {rows.shape[0]} rows")


if __name__ == "__main__":
    main()
