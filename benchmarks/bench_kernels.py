"""Kernel throughput beside the peers, in one run.

    python benchmarks/bench_kernels.py [--elements N] [--json]

GB/s counts bytes read + written. "x memcpy" divides by the GB/s (also bytes
read + written) of a plain memory copy: numpy copyto of a source of the case's
output size into a pre-faulted destination of that size (float32-sized for the
decodes and dequantize, Q8_0-sized for the quantizers). "x gguf-py" divides by
gguf-py's quantizer, run on a smaller slice (--gguf-elements, GB/s is per byte
so sizes compare) whose bytes are checked equal to ours. One warm-up run, then
the best of 3, for every case.
Targets (2-core x86): BF16->F32 into out >= 0.85x memcpy; Q8_0 >= 0.5x memcpy
and >= 15x gguf-py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import best_of, dump_json, print_table  # noqa: E402

import hf2q  # noqa: E402
from hf2q import formats, ops  # noqa: E402

Q8 = formats.get("q8_0")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--elements", type=int, default=64 << 20)
    ap.add_argument("--gguf-elements", type=int, default=2 << 20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    n = args.elements - args.elements % Q8.block_elems
    rng = np.random.default_rng(0)
    f32 = (rng.standard_normal(n, dtype=np.float32) * 0.02)
    bf16 = f32.astype(ml_dtypes.bfloat16)
    f16 = f32.astype(np.float16)
    u16 = bf16.view(np.uint16)
    rows: list[dict] = []

    def add(case: str, seconds: float, moved: int, kind: str) -> None:
        rows.append({"case": case, "seconds": seconds, "GB/s": moved / seconds / 1e9, "kind": kind})

    def memcpy_gbs(nbytes: int) -> float:
        src = np.ones(nbytes, np.uint8)
        dst = np.empty(nbytes, np.uint8)
        dst[:] = 0
        return 2 * nbytes / best_of(lambda: np.copyto(dst, src)) / 1e9

    copy_f32 = memcpy_gbs(4 * n)
    copy_q8 = memcpy_gbs(Q8.storage_bytes(n))
    add("memcpy, f32-sized (numpy copyto)", 2 * 4 * n / copy_f32 / 1e9, 8 * n, "baseline")
    add("memcpy, q8_0-sized (numpy copyto)", 2 * Q8.storage_bytes(n) / copy_q8 / 1e9, 2 * Q8.storage_bytes(n), "baseline")
    out = np.empty(n, np.float32)
    out[:] = 0
    add("hf2q bf16->f32 into out", best_of(lambda: ops.bf16_to_f32(bf16, out=out)), 6 * n, "ours")
    add("hf2q bf16->f32 fresh array", best_of(lambda: ops.bf16_to_f32(bf16)), 6 * n, "ours")
    add("hf2q f16->f32 into out", best_of(lambda: ops.f16_to_f32(f16, out=out)), 6 * n, "ours")
    add("numpy shift (u16->u32 << 16)", best_of(lambda: (u16.astype(np.uint32) << 16).view(np.float32)), 6 * n, "peer")
    add("ml_dtypes astype(float32)", best_of(lambda: bf16.astype(np.float32)), 6 * n, "peer")
    try:
        import torch

        t = torch.from_numpy(u16.view(np.int16)).view(torch.bfloat16)
        add("torch .float()", best_of(lambda: t.float()), 6 * n, "peer")
    except ImportError:
        rows.append({"case": "torch .float()", "kind": "not installed"})

    q = np.empty(Q8.storage_bytes(n), np.uint8)
    q[:] = 0
    qbytes = Q8.storage_bytes(n)
    for name, src, es in (("f32", f32, 4), ("bf16", bf16, 2), ("f16", f16, 2)):
        add(f"hf2q q8_0 from {name} into out", best_of(lambda src=src: ops.quantize_q8_0(src, out=q)), es * n + qbytes, "ours")
    add("hf2q dequantize q8_0", best_of(lambda: ops.dequantize_q8_0(q, out=out)), qbytes + 4 * n, "ours")

    import gguf

    m = min(n, args.gguf_elements - args.gguf_elements % Q8.block_elems)
    sl = f32[:m].reshape(-1, 4096) if m % 4096 == 0 else f32[:m].reshape(-1, 32)
    t_g = best_of(lambda: gguf.quants.quantize(sl, gguf.GGMLQuantizationType.Q8_0))
    equal = bool(np.array_equal(gguf.quants.quantize(sl, gguf.GGMLQuantizationType.Q8_0).reshape(-1),
                                ops.quantize_q8_0(sl).reshape(-1)))
    add(f"gguf-py q8_0 from f32 ({m:,} elements)", t_g, 4 * m + Q8.storage_bytes(m), "peer")

    for r in rows:
        if "GB/s" in r:
            # The baseline copies as many bytes as the case writes: Q8_0 bytes
            # for the quantizers, float32 for every decode (dequantize included).
            base = copy_q8 if "q8_0 from" in r["case"] or "q8_0-sized" in r["case"] else copy_f32
            r["x memcpy"] = r["GB/s"] / base
    g = rows[-1]["GB/s"]
    for r in rows:
        if "q8_0 from" in r["case"] and r["kind"] == "ours":
            r["x gguf-py"] = r["GB/s"] / g
    by_case = {r["case"]: r for r in rows}
    targets = [("bf16->f32 into out >= 0.85x memcpy", by_case["hf2q bf16->f32 into out"]["x memcpy"] >= 0.85)]
    for name in ("f32", "bf16", "f16"):
        r = by_case[f"hf2q q8_0 from {name} into out"]
        targets.append((f"q8_0 from {name} >= 0.5x memcpy", r["x memcpy"] >= 0.5))
        targets.append((f"q8_0 from {name} >= 15x gguf-py", r["x gguf-py"] >= 15))
    targets.append(("gguf-py slice byte-equal to ours", equal))
    result = {"elements": n, "threads": hf2q.get_num_threads(), "isa": ops.simd_isa(), "gguf_bytes_equal": equal,
              "memcpy_f32_gbs": copy_f32, "memcpy_q8_gbs": copy_q8, "rows": rows,
              "targets": {name: bool(ok) for name, ok in targets}}
    if args.json:
        dump_json(result)
        return 0
    print(f"{n:,} elements, {hf2q.get_num_threads()} threads, ISA {ops.simd_isa()}; gguf-py bytes equal: {equal}")
    print(f"memcpy baselines (numpy copyto, bytes read + written): {copy_f32:.2f} GB/s (f32-sized), "
          f"{copy_q8:.2f} GB/s (q8_0-sized)")
    print("best of 3 after one warm-up run each; a busy machine makes every number noisy")
    print_table("kernels", rows, ["case", "seconds", "GB/s", "x memcpy", "x gguf-py", "kind"])
    print("\ntargets")
    for name, ok in targets:
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
