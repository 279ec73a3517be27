"""hf2q convert (q8_0) against copying the output's bytes and against
llama.cpp's converter, on a Qwen3.6-35B-A3B-shaped checkpoint: the real
layer shapes (256 experts x 512 x 2048, hidden 2048, ...) for ``--layers``
layers (default 2, the bench checkpoint of benchmarks/bench_qwen35.py, ~3.4 GB
of BF16; ``--layers 8`` is ~13.5 GB: every layer adds ~1.7 GB of BF16, ~0.9 GB
of Q8_0 output; the real model has 40).

    python benchmarks/bench_convert.py [--layers N] [--dir DIR] [--out-dir DIR] [--converter DIR]
                                       [--repeat N] [--profile] [--json]

Cases (each output written to --out-dir, default the checkpoint's folder; the
checkpoint is read once first so that every case reads from the page cache):

  1. hf2q: ``hf2q.convert(CKPT, OUT.gguf, "q8_0")`` in a fresh process, --repeat
     times (best and median reported): wall time, the process's CPU time
     (os.times user / sys, all threads), peak RSS (VmHWM) and the RSS once
     hf2q, numpy and the loader are imported (the interpreter's baseline).
  2. cp: ``cp`` of a file of the output's size (made once, in the page cache)
     to the same folder, then ``sync`` of it: the disk's copy speed for those
     bytes (hf2q also fsyncs before its rename). --repeat times, best and median.
  3. converter: llama.cpp's ``convert_hf_to_gguf.py --outtype q8_0`` from the
     pinned llama-cpp-python sdist (pass its ``vendor/llama.cpp`` folder as
     --converter), vocabulary step stubbed (no tokenizer here), once, in a
     fresh process with torch; its peak RSS too. Skipped without --converter.

``--profile``: one more hf2q run in this process, timing its phases: the
loader's reads + BF16 -> Q8_0 conversion into the output windows
(``execute``), the I/O threads' ``pwrite`` calls (summed over the threads:
they overlap each other and the conversion), the time the main thread waits
for the writes (the memory budget), and the final fsync.

Each hf2q run starts with no output file, as each ``cp`` does (replacing the
previous run's 1.8 GB file cost hf2q about 0.3 s inside its rename).

Targets (issue 25): hf2q >= 0.8x cp's speed; >= 20x the converter's; peak
RSS - baseline <= 256 MiB + the largest tensor. The machine may be shared:
numbers are noisy (docs/CONVERT.md says what was measured where).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import CHILD_HWM, dump_json, print_table, subprocess_json, warm_page_cache  # noqa: E402

from bench_qwen35 import DEFAULT_DIR, ensure_checkpoint  # noqa: E402

import statistics  # noqa: E402

_HF2Q = CHILD_HWM + """
import json, os, sys, time
import numpy, hf2q, hf2q.export, hf2q.loader, hf2q.safetensors
base = hwm()
t0 = time.perf_counter()
c0 = os.times()
s = hf2q.convert(sys.argv[1], sys.argv[2], "q8_0", force=True)
t = time.perf_counter() - t0
c1 = os.times()
print(json.dumps({"seconds": t, "bytes": s.bytes, "tensors": s.tensors, "vmhwm": hwm(), "baseline": base,
                  "user": c1.user - c0.user, "sys": c1.system - c0.system, "output_io": s.extra["output_io"],
                  "load": open("/proc/loadavg").read().split()[0]}))
"""

_CONVERTER = CHILD_HWM + """
import json, sys, time
conv = sys.argv[3]
sys.path[:0] = [conv + "/gguf-py", conv]
import conversion.base as base, convert_hf_to_gguf
base.TextModel.set_vocab = lambda self: None
b0 = hwm()
sys.argv = ["convert_hf_to_gguf.py", sys.argv[1], "--outtype", "q8_0", "--outfile", sys.argv[2], "--no-mtp"]
t0 = time.perf_counter()
convert_hf_to_gguf.main()
print(json.dumps({"seconds": time.perf_counter() - t0, "vmhwm": hwm(), "baseline": b0}))
"""


def cp_time(src_size: int, out_dir: Path) -> float:
    """``cp`` + fsync of a ``src_size``-byte file already in the page cache."""
    a, b = out_dir / "bench-cp-src.bin", out_dir / "bench-cp-dst.bin"
    if not a.is_file() or a.stat().st_size != src_size:
        with open(a, "wb") as f:
            chunk = os.urandom(1 << 20) * 64
            left = src_size
            while left:
                n = f.write(memoryview(chunk)[:min(left, len(chunk))])
                left -= n
    warm_page_cache(a)
    b.unlink(missing_ok=True)
    t0 = time.perf_counter()
    subprocess.run(["cp", str(a), str(b)], check=True)
    subprocess.run(["sync", str(b)], check=True)
    t = time.perf_counter() - t0
    b.unlink()
    return t


def profile(ckpt: Path, out: Path) -> dict[str, float]:
    """One conversion in this process, its phases timed (see the module doc)."""
    import hf2q
    import hf2q.export as ex
    import hf2q.loader as ld

    acc = {"execute_s": 0.0, "pwrite_s": 0.0, "wait_for_writer_s": 0.0, "fsync_s": 0.0}
    real = (ld.execute, ex._Output._pwrite, ex._Writer.reserve, os.fsync)

    def timed(key: str, f: Any) -> Any:
        def g(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                acc[key] += time.perf_counter() - t
        return g

    ld.execute = timed("execute_s", real[0])
    ex._Output._pwrite = timed("pwrite_s", real[1])
    ex._Writer.reserve = timed("wait_for_writer_s", real[2])
    os.fsync = timed("fsync_s", real[3])
    try:
        t0 = time.perf_counter()
        c0 = os.times()
        hf2q.convert(ckpt, out, "q8_0", force=True)
        c1 = os.times()
        acc["wall_s"] = time.perf_counter() - t0
        acc["user_s"], acc["sys_s"] = c1.user - c0.user, c1.system - c0.system
    finally:
        ld.execute, ex._Output._pwrite, ex._Writer.reserve, os.fsync = real
        out.unlink(missing_ok=True)
    return acc


def layered_checkpoint(base_dir: Path, layers: int) -> tuple[Path, float | None]:
    """The bench checkpoint with ``layers`` layers (3 linear-attention + 1
    full-attention per 4, as the real model; 2 layers: bench_qwen35's)."""
    if layers == 2:
        return ensure_checkpoint(base_dir)
    from hf2q.testing.qwen35_checkpoint import BENCH_TEXT_CONFIG, make_qwen35_moe_checkpoint

    d = base_dir.parent / f"{base_dir.name}-L{layers}"
    types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
    if (d / "model.safetensors").is_file() and (d / "config.json").is_file():
        return d, None
    t0 = time.perf_counter()
    make_qwen35_moe_checkpoint(d, config={**BENCH_TEXT_CONFIG, "num_hidden_layers": layers, "layer_types": types,
                                          "full_attention_interval": 4})
    return d, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--out-dir", type=Path)
    ap.add_argument("--converter", type=Path, help="llama.cpp's folder with convert_hf_to_gguf.py, gguf-py/")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    ckpt, made = layered_checkpoint(args.dir, args.layers)
    out_dir = args.out_dir or ckpt
    warm_page_cache(ckpt / "model.safetensors")
    ours_out = out_dir / "bench-hf2q.gguf"
    runs, cps, cp_loads = [], [], []
    for _ in range(args.repeat):  # interleaved: both see the same machine load
        ours_out.unlink(missing_ok=True)  # as cp's destination: not replaced inside the timing
        runs.append(subprocess_json(_HF2Q, str(ckpt), str(ours_out)))
        cps.append(cp_time(runs[-1]["bytes"], out_dir))
        cp_loads.append(float(open("/proc/loadavg").read().split()[0]))
    best = min(runs, key=lambda r: r["seconds"])
    size = best["bytes"]
    t_cp, med_cp = min(cps), statistics.median(cps)
    med = statistics.median(r["seconds"] for r in runs)
    largest = 256 * 512 * 2048 * 34 // 32  # one expert stack in Q8_0
    rows = [
        {"case": "hf2q convert q8_0 (best)", "seconds": best["seconds"], "GB/s": size / best["seconds"] / 1e9,
         "user_s": best["user"], "sys_s": best["sys"], "peak_rss_MB": best["vmhwm"] / 1e6,
         "baseline_MB": best["baseline"] / 1e6},
        {"case": "hf2q convert q8_0 (median)", "seconds": med, "GB/s": size / med / 1e9},
        {"case": "cp + sync (best)", "seconds": t_cp, "GB/s": size / t_cp / 1e9},
        {"case": "cp + sync (median)", "seconds": med_cp, "GB/s": size / med_cp / 1e9},
    ]
    result = {"layers": args.layers, "output_bytes": size, "tensors": best["tensors"], "checkpoint_made_s": made,
              "hf2q_runs_s": [r["seconds"] for r in runs], "hf2q_cpu_s": [r["user"] + r["sys"] for r in runs],
              "hf2q_user_sys_s": [(r["user"], r["sys"]) for r in runs],
              "hf2q_loadavg": [float(r["load"]) for r in runs], "output_io": best["output_io"],
              "cp_runs_s": cps, "cp_loadavg": cp_loads, "cp_s": t_cp,
              "hf2q_vs_cp": t_cp / best["seconds"], "hf2q_vs_cp_median": med_cp / med,
              "peak_rss_over_baseline_MB": max(r["vmhwm"] - r["baseline"] for r in runs) / 1e6,
              "rss_bound_MB": ((256 << 20) + largest) / 1e6}
    if args.converter:
        conv_out = out_dir / "bench-converter.gguf"
        c = subprocess_json(_CONVERTER, str(ckpt), str(conv_out), str(args.converter))
        rows.append({"case": "convert_hf_to_gguf.py q8_0", "seconds": c["seconds"],
                     "GB/s": size / c["seconds"] / 1e9, "peak_rss_MB": c["vmhwm"] / 1e6,
                     "baseline_MB": c["baseline"] / 1e6})
        result["converter_s"] = c["seconds"]
        result["speedup_vs_converter"] = c["seconds"] / best["seconds"]
        result["converter_bytes"] = conv_out.stat().st_size
        conv_out.unlink()
    ours_out.unlink(missing_ok=True)
    if args.profile:
        result["profile"] = profile(ckpt, ours_out)
    result["rows"] = rows
    if args.json:
        dump_json(result)
    else:
        print_table(f"q8_0 GGUF of {ckpt} ({size:,} bytes, {best['tensors']} tensors)", rows,
                    ["case", "seconds", "GB/s", "user_s", "sys_s", "peak_rss_MB", "baseline_MB"])
        print("\nhf2q runs (s, user, sys, load average): " + ", ".join(
            f"{r['seconds']:.2f} {r['user']:.2f}/{r['sys']:.2f} @{r['load']}" for r in runs)
            + f"; output {best['output_io']}")
        print("cp + sync runs (s, load average): " + ", ".join(f"{t:.2f} @{l:.2f}" for t, l in zip(cps, cp_loads)))
        print(f"\npeak RSS over baseline {result['peak_rss_over_baseline_MB']:.0f} MB "
              f"(bound {result['rss_bound_MB']:.0f} MB)")
        if args.profile:
            print("profile: " + ", ".join(f"{k} {v:.2f}" for k, v in result["profile"].items()))
        print(f"\nhf2q / cp speed: {result['hf2q_vs_cp']:.2f}x best, {result['hf2q_vs_cp_median']:.2f}x median"
              + (f"; hf2q vs converter: {result['speedup_vs_converter']:.1f}x faster" if args.converter else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
