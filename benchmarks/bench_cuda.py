"""CUDA loads: hf2q against the loaders people use to put safetensors weights
on an NVIDIA GPU, and against the copy bandwidths that bound them.

    python benchmarks/bench_cuda.py [--dir DIR] [--repeat N] [--json FILE] [--markdown FILE]

Checkpoints (written once into --dir, then read from the page cache):
  drafter: the full-size DFlash drafter (859 MB of BF16; hf2q keeps the
           projections BF16 and widens the norms to F32 on the GPU).
  qwen:    two layers at the real Qwen3.6-35B-A3B shapes (~3.3 GB of BF16,
           almost all experts; hf2q quantizes the experts to Q8_0 on the GPU
           and widens the dense tensors to F32).

Cases, each the best of --repeat runs after one warm-up, the GPU memory of
the previous run freed first:
  hf2q            hf2q.dflash.load / hf2q.qwen35.load(device=Device("cuda"))
  st.load_file    safetensors.torch.load_file(f, device="cuda") per file
  st.safe_open    safe_open(f, framework="pt", device="cuda").get_tensor(k) per tensor
  fastsafetensors fastsafe_open(files, device="cuda:0", nogds=True) + get_tensor (where it imports)
The peers only copy the BF16 bytes; hf2q also converts, so the ratios are
conservative.

Limits, measured with CUDA events through torch (cudaMemcpyAsync is
cuMemcpyHtoDAsync / cuMemcpyDtoDAsync underneath):
  pinned H2D      1 GiB from pinned host memory to the GPU
  D2D copy        4 GiB device to device, bytes read + written
and the two hf2q rates they bound:
  raw upload      the Qwen file's tensor bytes, page cache -> GPU, no conversion
  GPU Q8_0        bf16 buffer -> q8_0 buffer on the GPU (the conversion Device.convert
                  runs, into a preallocated buffer), bytes read + written; also the
                  whole Device.convert, its zero-filled allocation included
  GPU FP8 decode  block-scaled f8_e4m3 (128 x 128 blocks, f32 scales) -> q8_0 and -> bf16
                  on the GPU (the kernels the staging pipeline runs on each chunk of a
                  scaled FP8 load, docs/FP8.md), bytes read + written, beside the
                  Q8_0 quantizer (both are bound by the D2D copy)

Whole processes (--processes N, default 3; 0 skips): what a user who runs one
load per process waits for, page cache warm, the median of N fresh
interpreters: hf2q (import, Device("cuda"), load, synchronize) against
safetensors load_file (import torch and safetensors, CUDA init, load,
synchronize), each split into set-up and load.

Targets (issue 14): raw upload >= 0.8x pinned H2D; GPU Q8_0 >= 0.5x D2D;
drafter and Qwen loads >= 3x faster than st.load_file and faster than
fastsafetensors. The GPU is named in the output.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, subprocess_json  # noqa: E402

import numpy as np  # noqa: E402

import hf2q  # noqa: E402
from hf2q import dflash, qwen35  # noqa: E402

GB = 1e9


def _files(d: Path) -> list[Path]:
    return sorted(d.glob("*.safetensors"))


def _data_bytes(files: list[Path]) -> int:
    total = 0
    for f in files:
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
        total += f.stat().st_size - 8 - n
    return total


def _warm(files: list[Path]) -> None:
    """Read every file once so that all cases start from the page cache."""
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while fh.read(64 << 20):
                pass


def ensure_checkpoints(root: Path) -> dict[str, Path]:
    from hf2q.testing import make_dflash_checkpoint, make_qwen35_moe_checkpoint

    out = {}
    for name, make in (("drafter", lambda d: make_dflash_checkpoint(d)),
                       ("qwen", lambda d: make_qwen35_moe_checkpoint(d, config="bench"))):
        d = root / name
        if not (d / ".complete").exists():
            t0 = time.perf_counter()
            d.mkdir(parents=True, exist_ok=True)
            make(d)
            (d / ".complete").write_text("")
            print(f"wrote {name} checkpoint in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        out[name] = d
    return out


# One whole process each: set-up (imports and the device) and the load, the
# checkpoint directory as argv[1]. The peer loads every shard, as bench's st.load_file.
PROC_HF2Q = """
import json, sys, time
t0 = time.perf_counter()
import hf2q
from hf2q import {family}
dev = hf2q.Device("cuda")
t1 = time.perf_counter()
model = {family}.load(sys.argv[1], device=dev, progress=False)
dev.synchronize()
t2 = time.perf_counter()
print(json.dumps({{"setup": t1 - t0, "load": t2 - t1, "total": t2 - t0}}))
"""
PROC_ST = """
import json, sys, time
from pathlib import Path
t0 = time.perf_counter()
import torch
from safetensors.torch import load_file
torch.cuda.init()
torch.empty(1, device="cuda")
t1 = time.perf_counter()
out = [load_file(str(p), device="cuda") for p in sorted(Path(sys.argv[1]).glob("*.safetensors"))]
torch.cuda.synchronize()
t2 = time.perf_counter()
print(json.dumps({"setup": t1 - t0, "load": t2 - t1, "total": t2 - t0}))
"""


def best(fn: Callable[[], Any], repeat: int, cleanup: Callable[[], None]) -> float:
    times = []
    for i in range(repeat + 1):
        cleanup()
        t0 = time.perf_counter()
        keep = fn()
        dt = time.perf_counter() - t0
        del keep
        if i:
            times.append(dt)
    cleanup()
    return min(times)


def _ratio(v: Any) -> str:
    return v if isinstance(v, str) else f"{v:.2f}x"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", type=Path, default=Path(os.environ.get("HF2Q_BENCH_DIR", Path.home() / ".cache/hf2q/bench-cuda")))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--profile", action="store_true", help="cProfile one hf2q load of each checkpoint (stderr)")
    ap.add_argument("--processes", type=int, default=3, help="fresh processes per whole-process case (0: skip)")
    args = ap.parse_args()

    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file

    dev = hf2q.Device("cuda")
    gpu = f"{dev.name} (cuda:{dev.index})"
    torch.cuda.init()

    def cleanup() -> None:
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()

    def events_ms(fn: Callable[[], None], reps: int = 5) -> float:
        fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
        return statistics.median(ts)

    # ---------------------------------------------------------------- limits
    n = 1 << 30
    pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    pinned.random_(0, 255)
    dst = torch.empty(n, dtype=torch.uint8, device="cuda")
    h2d = n / (events_ms(lambda: dst.copy_(pinned, non_blocking=True)) / 1e3) / GB
    del pinned, dst
    m = 4 << 30
    s = torch.empty(m, dtype=torch.uint8, device="cuda").random_(0, 255)
    t = torch.empty_like(s)
    d2d = 2 * m / (events_ms(lambda: t.copy_(s)) / 1e3) / GB
    del s, t
    cleanup()

    # GPU Q8_0: 512 Mi bf16 elements (1 GiB) -> q8_0, on the GPU only.
    elems = 512 << 20
    src = dev.alloc((elems // 4096, 4096), "bf16")
    torch.from_dlpack(src).copy_(torch.randn(elems // 4096, 4096, device="cuda", dtype=torch.bfloat16))
    torch.cuda.synchronize()
    # The kernel with its status round trip, into a preallocated buffer (the
    # native call Device.convert makes after allocating).
    dst_q = dev.alloc(src.shape, "q8_0")
    q_times = []
    for i in range(11):
        t0 = time.perf_counter()
        dev._native.convert(dst_q._native, src._native)
        dt = time.perf_counter() - t0
        if i:
            q_times.append(dt)
    q8_bytes = elems * 2 + elems // 32 * 34
    q8_rate = q8_bytes / statistics.median(q_times) / GB
    del dst_q
    # Scaled FP8 decodes of the same element count (the weights' values do not
    # change the kernels' work; the scales are 1e-3, every product finite).
    lead, r, c = elems // (512 * 2048), 512, 2048
    w8 = dev.alloc((elems,), "f8_e4m3")
    dev.write(w8, np.random.default_rng(0).integers(0, 0x70, elems, dtype=np.uint8), src_dtype="f8_e4m3")
    grid = dev.alloc((lead * (r // 128) * (c // 128),), "f32")
    dev.write(grid, np.full(grid.shape, 1e-3, np.float32))
    dev.synchronize()
    fp8_rates = {}
    for to, out_bytes in (("q8_0", elems // 32 * 34), ("bf16", elems * 2)):
        out = dev.alloc((lead, r, c), to)
        ts = []
        for i in range(11):
            t0 = time.perf_counter()
            dev._native.scaled_fp8(out._native, 0, w8._native, grid._native, (lead, r, c), (128, 128))
            if i:
                ts.append(time.perf_counter() - t0)
        fp8_rates[to] = (elems + out_bytes) / statistics.median(ts) / GB
        del out
    del w8, grid
    t0 = time.perf_counter()
    q = dev.convert(src, "q8_0")
    q8_alloc_rate = q8_bytes / (time.perf_counter() - t0) / GB
    del q
    del src
    cleanup()

    ck = ensure_checkpoints(args.dir)
    rows: list[dict[str, Any]] = []
    results: dict[str, Any] = {"gpu": gpu, "pinned_h2d_GBps": h2d, "d2d_GBps_rw": d2d, "q8_0_GBps_rw": q8_rate,
                               "fp8_q8_0_GBps_rw": fp8_rates["q8_0"], "fp8_bf16_GBps_rw": fp8_rates["bf16"]}

    # raw upload of the Qwen file's tensor bytes, page cache -> GPU
    qfiles = _files(ck["qwen"])
    _warm(qfiles)
    f = qfiles[0]
    with open(f, "rb") as fh:
        hdr = int.from_bytes(fh.read(8), "little")
    nbytes = f.stat().st_size - 8 - hdr
    def raw_upload() -> Any:
        buf = dev.upload_from_file(f, 8 + hdr, nbytes, "u8", "u8", (nbytes,))
        dev.synchronize()
        return buf

    raw_s = best(raw_upload, args.repeat, cleanup)
    raw_rate = nbytes / raw_s / GB
    results["raw_upload_GBps"] = raw_rate

    def peers(files: list[Path]) -> dict[str, Callable[[], Any]]:
        def st_load():
            out = [load_file(str(p), device="cuda") for p in files]
            torch.cuda.synchronize()
            return out

        def st_open():
            out = []
            for p in files:
                with safe_open(str(p), framework="pt", device="cuda") as sf:
                    out.append({k: sf.get_tensor(k) for k in sf.keys()})
            torch.cuda.synchronize()
            return out

        cases = {"st.load_file": st_load, "st.safe_open": st_open}
        try:
            from fastsafetensors import fastsafe_open

            def fst():
                with fastsafe_open([str(p) for p in files], framework="pt", device=f"cuda:{dev.index}",
                                   nogds=True) as fo:
                    out = {k: fo.get_tensor(k) for k in fo.keys()}
                torch.cuda.synchronize()
                return out

            cases["fastsafetensors"] = fst
        except Exception as e:  # noqa: BLE001 - not installed, or no wheel for this platform
            print(f"fastsafetensors not run: {e}", file=sys.stderr)
        return cases

    def synced(model: Any) -> Any:
        dev.synchronize()  # every copy landed, as the peers' torch.cuda.synchronize()
        return model

    for name, loader in (("drafter", lambda d: synced(dflash.load(d, device=dev, progress=False))),
                         ("qwen", lambda d: synced(qwen35.load(d, device=dev, progress=False)))):
        files = _files(ck[name])
        _warm(files)
        size = _data_bytes(files)
        ours = best(lambda: loader(ck[name]), args.repeat, cleanup)
        rows.append({"checkpoint": name, "loader": "hf2q", "s": ours, "GB/s": size / ours / GB, "hf2q speed-up": 1.0})
        results[f"{name}_bytes"] = size
        results[f"{name}_hf2q_s"] = ours
        if args.profile:
            import cProfile
            import pstats

            model = loader(ck[name])
            shapes = [(model[n].shape, model[n].dtype) for n in model.names()]
            del model
            cleanup()
            t0 = time.perf_counter()
            bufs = [dev.alloc(sh, dt) for sh, dt in shapes]
            print(f"{name}: {len(shapes)} buffers, alloc only {time.perf_counter() - t0:.4f} s", file=sys.stderr)
            del bufs
            cleanup()
            prof = cProfile.Profile()
            prof.enable()
            model = loader(ck[name])
            prof.disable()
            del model
            cleanup()
            pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(12)
        for peer, fn in peers(files).items():
            try:
                secs = best(fn, args.repeat, cleanup)
            except Exception as e:  # noqa: BLE001
                print(f"{peer} on {name} failed: {type(e).__name__}: {e}", file=sys.stderr)
                continue
            rows.append({"checkpoint": name, "loader": peer, "s": secs, "GB/s": size / secs / GB,
                         "hf2q speed-up": secs / ours})
            results[f"{name}_{peer}_s"] = secs

    procs: list[dict[str, Any]] = []
    if args.processes > 0:
        for name, family in (("drafter", "dflash"), ("qwen", "qwen35")):
            files = _files(ck[name])
            _warm(files)
            cases = {"hf2q": PROC_HF2Q.format(family=family), "st.load_file": PROC_ST}
            med = {}
            for case, code in cases.items():
                runs = [subprocess_json(code, str(ck[name])) for _ in range(args.processes)]
                med[case] = {k: statistics.median(r[k] for r in runs) for k in ("setup", "load", "total")}
            for case, m in med.items():
                procs.append({"checkpoint": name, "loader": case, "set-up s": m["setup"], "load s": m["load"],
                              "total s": m["total"], "hf2q speed-up": m["total"] / med["hf2q"]["total"]})
        results["processes"] = procs

    limits = [
        {"rate": "pinned H2D (torch, cudaMemcpyAsync)", "GB/s": h2d, "hf2q": "-", "ratio": "-"},
        {"rate": "raw upload, page cache -> GPU", "GB/s": raw_rate, "hf2q": "vs pinned H2D", "ratio": raw_rate / h2d},
        {"rate": "D2D copy (read + write)", "GB/s": d2d, "hf2q": "-", "ratio": "-"},
        {"rate": "GPU Q8_0 from BF16 (read + write)", "GB/s": q8_rate, "hf2q": "vs D2D", "ratio": q8_rate / d2d},
        {"rate": "  the same with Device.convert's allocation", "GB/s": q8_alloc_rate, "hf2q": "vs D2D",
         "ratio": q8_alloc_rate / d2d},
        {"rate": "GPU block-scaled FP8 -> Q8_0 (read + write)", "GB/s": fp8_rates["q8_0"], "hf2q": "vs D2D",
         "ratio": fp8_rates["q8_0"] / d2d},
        {"rate": "GPU block-scaled FP8 -> BF16 (read + write)", "GB/s": fp8_rates["bf16"], "hf2q": "vs D2D",
         "ratio": fp8_rates["bf16"] / d2d},
    ]
    print(f"\nGPU: {gpu}; host threads: {hf2q._core.get_num_threads()}")
    print_table("Bandwidth limits and hf2q's rates", limits, ["rate", "GB/s", "hf2q", "ratio"])
    print_table("Loads from the page cache to the GPU (best of %d)" % args.repeat, rows,
                ["checkpoint", "loader", "s", "GB/s", "hf2q speed-up"])
    if procs:
        print_table(f"Whole processes, median of {args.processes} (page cache warm)", procs,
                    ["checkpoint", "loader", "set-up s", "load s", "total s", "hf2q speed-up"])
    results["rows"] = rows
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    if args.markdown:
        lines = [f"GPU: {gpu}", "", "| checkpoint | loader | seconds | GB/s | hf2q speed-up |", "|---|---|---|---|---|"]
        lines += [f"| {r['checkpoint']} | {r['loader']} | {r['s']:.3f} | {r['GB/s']:.1f} | {r['hf2q speed-up']:.2f}x |"
                  for r in rows]
        lines += ["", "| rate | GB/s | ratio |", "|---|---|---|"]
        lines += [f"| {r['rate']} | {r['GB/s']:.1f} | {_ratio(r['ratio'])} |" for r in limits]
        if procs:
            lines += ["", f"Whole processes, median of {args.processes}:", "",
                      "| checkpoint | loader | set-up s | load s | total s | hf2q speed-up |", "|---|---|---|---|---|---|"]
            lines += [f"| {r['checkpoint']} | {r['loader']} | {r['set-up s']:.3f} | {r['load s']:.3f} | "
                      f"{r['total s']:.3f} | {r['hf2q speed-up']:.2f}x |" for r in procs]
        args.markdown.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
