"""Scaled FP8 decode throughput (docs/FP8.md), beside a memory copy.

    python benchmarks/bench_fp8.py [--rows R] [--cols C] [--json]
    python benchmarks/bench_fp8.py --load DIR [--device cuda] [--layers N] [--vocab V] [--json]

An E4M3 weight of R x C with 128x128 block scales (F32, as DeepSeek-V3) is
decoded by hf2q.ops.dequantize_fp8 into a pre-faulted ``out`` of each
format. "x memcpy" divides the case's rate by that of numpy copyto of a
source of the output's size into a pre-faulted destination of that size
(both as bytes written per second). Issue target (2-core x86): FP8 -> Q8_0
and FP8 -> BF16 >= 0.5x memcpy of the bytes written. One warm-up run, then
the best of 3.

``--load DIR``: a Qwen3.6-35B-A3B-shaped FP8 checkpoint (the published
per-layer shapes, per-expert experts, 128x128 BF16 scales, as Qwen's -FP8
repos; ``--layers`` of the real 40, ``--vocab`` rows) is written into DIR
(kept for later runs) by hf2q.testing, and loaded with qwen35.load (experts
-> Q8_0, dense -> BF16) on ``--device``: FP8 checkpoint bytes read per second,
best of 3 after a warm-up, beside pinned host-to-device copies (torch) on a
GPU. Issue target (GPU): >= 0.8x the pinned H2D line rate of the FP8 bytes
read.
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


def load_case(args: argparse.Namespace) -> int:
    import time

    import hf2q
    from hf2q import qwen35
    from hf2q.testing.qwen35_checkpoint import QWEN36_35B_A3B_TEXT_CONFIG, make_qwen35_moe_checkpoint

    d = Path(args.load)
    text = dict(QWEN36_35B_A3B_TEXT_CONFIG, mtp_num_hidden_layers=0)
    if args.layers:
        text["num_hidden_layers"] = args.layers
        text.pop("layer_types", None)
    if args.vocab:
        text["vocab_size"] = args.vocab
    if not (d / "config.json").is_file():
        t0 = time.perf_counter()
        make_qwen35_moe_checkpoint(d, text, seed=1, mtp=False, sharded=True, num_shards=max(1, text["num_hidden_layers"]),
                                   fp8_block=(128, 128))
        print(f"wrote {d} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    dev = hf2q.Device(args.device) if args.device else hf2q.Device.default()
    from hf2q.safetensors import open_checkpoint

    with open_checkpoint(d) as ckpt:
        nbytes = ckpt.total_data_bytes()
        fp8_bytes = sum(ckpt[n].nbytes for n in ckpt.keys() if ckpt[n].dtype == "F8_E4M3")

    def once() -> float:
        t = time.perf_counter()
        m = qwen35.load(d, device=dev, expert_dtype="q8_0", dense_dtype="bf16", progress=False)
        dev.synchronize()
        dt = time.perf_counter() - t
        del m
        return dt

    once()
    secs = min(once() for _ in range(3))
    row = {"case": f"qwen35 FP8 load ({text['num_hidden_layers']} layers) on {dev.kind}", "seconds": secs,
           "checkpoint bytes": nbytes, "fp8 bytes": fp8_bytes, "GB/s read": nbytes / secs / 1e9}
    if dev.kind == "cuda":
        try:
            import torch

            n = 1 << 30
            pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
            dst = torch.empty(n, dtype=torch.uint8, device=f"cuda:{dev.index}")
            dst.copy_(pinned, non_blocking=True)
            torch.cuda.synchronize()
            t = time.perf_counter()
            dst.copy_(pinned, non_blocking=True)
            torch.cuda.synchronize()
            h2d = n / (time.perf_counter() - t) / 1e9
            row["pinned H2D GB/s"] = h2d
            row["x pinned H2D"] = row["GB/s read"] / h2d
        except Exception as e:  # noqa: BLE001 - no torch / no CUDA build of torch: report without the line rate
            row["pinned H2D GB/s"] = f"unavailable: {type(e).__name__}"
    if args.json:
        dump_json({"load": row})
    else:
        print_table("scaled FP8 checkpoint load", [row], list(row))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--load", type=Path, help="write (once) and load a Qwen3.6-shaped FP8 checkpoint in this folder")
    ap.add_argument("--device", default=None, help="host, cuda, cuda:N (default: Device.default())")
    ap.add_argument("--layers", type=int, default=2, help="--load: layers (the real model has 40)")
    ap.add_argument("--vocab", type=int, default=4096, help="--load: vocabulary rows (real: 248320)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.load is not None:
        return load_case(args)
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
