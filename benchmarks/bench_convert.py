"""hf2q convert (q8_0) against copying the output's bytes and against
llama.cpp's converter, on the Qwen3.6-35B-A3B two-layer bench checkpoint
(256 experts x 512 x 2048, ~3.4 GB of BF16; benchmarks/bench_qwen35.py).

    python benchmarks/bench_convert.py [--dir DIR] [--out-dir DIR] [--converter DIR] [--json]

Cases (each output written to --out-dir, default the checkpoint's folder; the
checkpoint is read once first so that every case reads from the page cache):

  1. hf2q: ``hf2q convert CKPT OUT.gguf --outtype q8_0`` in a fresh process
     (its peak RSS, VmHWM, is reported), best of 2.
  2. cp: ``cp`` of a file of the output's size (made once, from the page
     cache) to the same folder, fsynced: the disk's copy speed for those
     bytes. hf2q also fsyncs before its rename.
  3. converter: llama.cpp's ``convert_hf_to_gguf.py --outtype q8_0`` from the
     pinned llama-cpp-python sdist (scripts/make_golden.py fetches it; pass
     its ``vendor/llama.cpp`` folder as --converter), vocabulary step stubbed
     (the bench checkpoint has no tokenizer), once, in a fresh process with
     torch; its peak RSS too. Skipped without --converter.

Targets (issue 25): hf2q >= 0.8x cp's speed; >= 20x the converter's; peak
RSS <= 256 MiB + the largest tensor + the interpreter's baseline. The
machine may be shared: numbers are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import CHILD_HWM, dump_json, print_table, subprocess_json, warm_page_cache  # noqa: E402

from bench_qwen35 import DEFAULT_DIR, ensure_checkpoint  # noqa: E402

_HF2Q = CHILD_HWM + """
import json, sys, time
import hf2q
base = hwm()
t0 = time.perf_counter()
s = hf2q.convert(sys.argv[1], sys.argv[2], "q8_0", force=True)
t = time.perf_counter() - t0
print(json.dumps({"seconds": t, "bytes": s.bytes, "tensors": s.tensors, "vmhwm": hwm(), "baseline": base}))
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--out-dir", type=Path)
    ap.add_argument("--converter", type=Path, help="llama.cpp's folder with convert_hf_to_gguf.py, gguf-py/")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    ckpt, made = ensure_checkpoint(args.dir)
    out_dir = args.out_dir or ckpt
    warm_page_cache(ckpt / "model.safetensors")
    ours_out = out_dir / "bench-hf2q.gguf"
    runs = [subprocess_json(_HF2Q, str(ckpt), str(ours_out)) for _ in range(args.repeat)]
    best = min(runs, key=lambda r: r["seconds"])
    size = best["bytes"]
    t_cp = min(cp_time(size, out_dir) for _ in range(args.repeat))
    rows = [
        {"case": "hf2q convert q8_0", "seconds": best["seconds"], "GB/s": size / best["seconds"] / 1e9,
         "peak_rss_MB": best["vmhwm"] / 1e6, "baseline_MB": best["baseline"] / 1e6},
        {"case": "cp (same bytes)", "seconds": t_cp, "GB/s": size / t_cp / 1e9},
    ]
    result = {"output_bytes": size, "tensors": best["tensors"], "checkpoint_made_s": made,
              "hf2q_runs_s": [r["seconds"] for r in runs], "cp_s": t_cp,
              "hf2q_vs_cp": t_cp / best["seconds"]}
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
    result["rows"] = rows
    if args.json:
        dump_json(result)
    else:
        print_table(f"q8_0 GGUF of {ckpt} ({size:,} bytes, {best['tensors']} tensors)", rows,
                    ["case", "seconds", "GB/s", "peak_rss_MB", "baseline_MB"])
        print(f"\nhf2q / cp speed: {result['hf2q_vs_cp']:.2f}x"
              + (f"; hf2q vs converter: {result['speedup_vs_converter']:.1f}x faster" if args.converter else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
