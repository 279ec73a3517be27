"""Scaled FP8 decode throughput (docs/FP8.md), beside a memory copy.

    python benchmarks/bench_fp8.py [--rows R] [--cols C] [--json]

An E4M3 weight of R x C with 128x128 block scales (F32, as DeepSeek-V3) is
decoded by hf2q.ops.dequantize_fp8 into a pre-faulted ``out`` of each
format. "x memcpy" divides the case's rate by that of numpy copyto of a
source of the output's size into a pre-faulted destination of that size
(both as bytes written per second). Issue target (2-core x86): FP8 -> Q8_0
and FP8 -> BF16 >= 0.5x memcpy of the bytes written. One warm-up run, then
the best of 3.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import best_of, dump_json, print_table  # noqa: E402

from hf2q import formats, ops  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows, cols = args.rows, args.cols - args.cols % 32
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    w = np.clip(x * 100, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    s = (rng.random((-(-rows // 128), -(-cols // 128)), dtype=np.float32) * 1e-3 + 1e-4).astype(np.float32)
    out_rows: list[dict] = []
    for to in ("q8_0", "bf16", "f16", "f32"):
        f = formats.get(to)
        shape = formats.storage_shape((rows, cols), f)
        out = np.zeros(shape, dtype=np.uint8 if f.is_block else f.numpy_dtype)
        written = out.nbytes
        src = np.ones(written, np.uint8)
        dst = np.zeros(written, np.uint8)
        t_copy = best_of(lambda: np.copyto(dst, src))
        t = best_of(lambda: ops.dequantize_fp8(w, s, (128, 128), to=to, out=out))
        out_rows.append({"case": f"fp8 e4m3 -> {to}", "seconds": t, "GB/s written": written / t / 1e9,
                         "memcpy GB/s": written / t_copy / 1e9, "x memcpy": t_copy / t,
                         "GB/s read": (w.nbytes + s.nbytes) / t / 1e9})
    if args.json:
        dump_json({"rows": rows, "cols": cols, "results": out_rows})
    else:
        print_table(f"scaled FP8 decode, {rows} x {cols}, 128x128 F32 scales, {ops.simd_isa()}", out_rows,
                    ["case", "seconds", "GB/s written", "memcpy GB/s", "x memcpy", "GB/s read"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
