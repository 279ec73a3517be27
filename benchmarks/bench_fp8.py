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
repos; ``--layers`` of the real 40, ``--vocab`` rows, ``--experts`` of 256)
is written into DIR (kept for later runs: config.json is written last), and
loaded with qwen35.load (experts -> Q8_0, dense -> BF16) on ``--device``:
FP8 checkpoint bytes read per second, best of 3 after a warm-up, and the
best of 3 of opening and planning alone (part of each load), beside pinned
host-to-device copies (torch) of the same byte count on a GPU: into device
memory written just before (the line rate: "x pinned H2D") and into memory
freed and allocated again, as each warm load writes ("x recycled",
benchmarks/bench_fullscale.py's limit). Issue target (GPU): >= 0.8x the
pinned H2D line rate of the FP8 bytes read.

The checkpoint's layout (names, shapes, which tensors are FP8, the
quantization_config) is hf2q.testing's (checkpoint_tensor_specs and
keeps_bf16, as make_qwen35_moe_checkpoint(fp8_block=(128, 128)) writes
it); its values are tiled from three random pools, one per kind of tensor,
written by ``--threads`` threads with pwrite in 64 MiB pieces (as
benchmarks/bench_fullscale.py does): FP8 weights from E4M3 bytes of
normal values (no NaN encoding), their BF16 scales from [1e-4, 3e-4), other
tensors from BF16 bits of normal(0, 0.02) (read as F32: two BF16 words,
finite). The 40-layer checkpoint is 35.7 GB: 2 layers (1.7 GB) took 1.9 s on 2
cores here, so about a minute is expected on 16 (not measured); hf2q.testing's
generator, one value at a time from each tensor's own
seed, takes minutes per layer.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import best_of, dump_json, print_table  # noqa: E402

from hf2q import formats, ops  # noqa: E402


MiB = 1 << 20
POOL_BYTES = 16 * MiB  # each pool: a multiple of every element size
BLOCK = (128, 128)


def fp8_specs(text: dict[str, Any]) -> dict[str, tuple[str, tuple[int, ...], str]]:
    """name -> (dtype, shape, pool) of the FP8 checkpoint, as
    make_qwen35_moe_checkpoint(fp8_block=BLOCK, mtp=False) lays it out."""
    from hf2q.testing.fp8_checkpoint import keeps_bf16
    from hf2q.testing.qwen35_checkpoint import checkpoint_tensor_specs

    out: dict[str, tuple[str, tuple[int, ...], str]] = {}
    for name, (dt, shape) in checkpoint_tensor_specs(text, fused_gate_up=False, multimodal=False, mtp=False).items():
        if dt != "BF16" or keeps_bf16(name, shape):
            out[name] = (dt, shape, "bf16")
            continue
        rows, cols = shape
        out[name] = ("F8_E4M3", shape, "fp8")
        out[name + "_scale_inv"] = ("BF16", (-(-rows // BLOCK[0]), -(-cols // BLOCK[1])), "scale")
    return out


def _pools() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(21)
    x = np.clip(rng.standard_normal(POOL_BYTES, dtype=np.float32) * np.float32(120), -448, 448)
    fp8 = x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)  # never 0x7F / 0xFF (NaN)
    s = (rng.random(MiB // 2, dtype=np.float32) * np.float32(2e-4) + np.float32(1e-4)).astype(ml_dtypes.bfloat16)
    f = rng.standard_normal(POOL_BYTES // 2, dtype=np.float32) * np.float32(0.02)
    bf16 = (f.view(np.uint32) >> 16).astype(np.uint16)  # truncation: finite, small
    return {"fp8": fp8, "scale": s.view(np.uint8), "bf16": bf16.view(np.uint8)}


def write_fp8_checkpoint(d: Path, text: dict[str, Any], threads: int) -> float:
    """Write the FP8 checkpoint into ``d`` with bench_fullscale's tiled
    writer (shards, index, config.json last); returns seconds."""
    import bench_fullscale
    from hf2q.testing.qwen35_checkpoint import qwen35_config_dict

    cfg = qwen35_config_dict(text)
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": list(BLOCK)}
    return bench_fullscale.write_checkpoint(d, cfg, fp8_specs(text), threads, pools=_pools(), always_index=True)


def load_case(args: argparse.Namespace) -> int:
    import hf2q
    from hf2q import qwen35
    from hf2q.testing.qwen35_checkpoint import QWEN36_35B_A3B_TEXT_CONFIG

    d = Path(args.load)
    text = dict(QWEN36_35B_A3B_TEXT_CONFIG, mtp_num_hidden_layers=0)
    if args.layers:
        text["num_hidden_layers"] = args.layers
        text.pop("layer_types", None)
    if args.vocab:
        text["vocab_size"] = args.vocab
    if args.experts:
        text["num_experts"] = args.experts
        text["num_experts_per_tok"] = min(text["num_experts_per_tok"], args.experts)
    if not (d / "config.json").is_file():
        secs = write_fp8_checkpoint(d, text, args.threads)
        print(f"wrote {d} in {secs:.1f} s", file=sys.stderr)
    dev = hf2q.Device(args.device) if args.device else hf2q.Device.default()
    from hf2q.models.qwen35 import plan_checkpoint
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

    def planned() -> float:
        t = time.perf_counter()
        with open_checkpoint(d) as c:
            plan_checkpoint(c, config=None, expert_dtype="q8_0", dense_dtype="bf16")
        return time.perf_counter() - t

    once()
    secs = min(once() for _ in range(args.repeat))
    plan_secs = min(planned() for _ in range(args.repeat))
    row = {"case": f"qwen35 FP8 load ({text['num_hidden_layers']} layers) on {dev.kind}", "seconds": secs,
           "open+plan s": plan_secs, "checkpoint bytes": nbytes, "fp8 bytes": fp8_bytes,
           "GB/s read": nbytes / secs / 1e9}
    if dev.kind == "cuda":
        try:
            bus, limit = pinned_h2d_rates(nbytes, dev.index)
            row["pinned H2D GB/s"] = bus
            row["x pinned H2D"] = row["GB/s read"] / bus
            row["recycled H2D GB/s"] = limit
            row["x recycled"] = row["GB/s read"] / limit
        except Exception as e:  # noqa: BLE001 - no torch / no CUDA build of torch: report without the line rate
            row["pinned H2D GB/s"] = f"unavailable: {type(e).__name__}"
    if args.json:
        dump_json({"load": row})
    else:
        print_table("scaled FP8 checkpoint load", [row], list(row))
    return 0


def pinned_h2d_rates(nbytes: int, index: int) -> tuple[float, float]:
    """GB/s of a pinned host-to-device copy of ``nbytes`` (torch, a 1 GiB
    pinned buffer copied over the range), best of 3 each: into device memory
    the copy wrote just before (the bus: the issue's line rate), and into
    memory the process freed and allocated again, as every warm load writes
    (benchmarks/bench_fullscale.py's limit; about 10% slower on the H200
    machines, docs/CUDA.md)."""
    import torch

    chunk = 1 << 30
    pinned = torch.empty(chunk, dtype=torch.uint8, pin_memory=True)
    where = f"cuda:{index}"

    def copy(dst: Any) -> float:
        torch.cuda.synchronize(where)
        t = time.perf_counter()
        for o in range(0, nbytes, chunk):
            n = min(chunk, nbytes - o)
            dst[o:o + n].copy_(pinned[:n], non_blocking=True)
        torch.cuda.synchronize(where)
        return time.perf_counter() - t

    bus, recycled = [], []
    for _ in range(3):
        dst = torch.empty(nbytes, dtype=torch.uint8, device=where)
        recycled.append(copy(dst))
        bus.append(copy(dst))
        del dst
        torch.cuda.empty_cache()
    return nbytes / min(bus) / 1e9, nbytes / min(recycled) / 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--load", type=Path, help="write (once) and load a Qwen3.6-shaped FP8 checkpoint in this folder")
    ap.add_argument("--device", default=None, help="host, cuda, cuda:N (default: Device.default())")
    ap.add_argument("--layers", type=int, default=2, help="--load: layers (the real model has 40)")
    ap.add_argument("--vocab", type=int, default=4096, help="--load: vocabulary rows (real: 248320)")
    ap.add_argument("--experts", type=int, default=None, help="--load: experts per layer (real: 256)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="--load: writer threads")
    ap.add_argument("--repeat", type=int, default=3, help="--load: timed loads after the warm-up (best kept)")
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
