"""Gemma 4 loader: hf2q.gemma4.load against the gguf-py quantize path (what
convert_hf_to_gguf.py does for the experts) and against numpy alone, on two
layers at the real gemma-4-26B-A4B shapes (a sliding and a full layer; 128
experts, fused gate_up [128, 1408, 2816] and down [128, 2816, 704]: ~3.3 GB of
BF16, almost all experts), read from the page cache.

    python benchmarks/bench_gemma4.py [--dir DIR] [--gguf-budget S] [--json]

The vocabulary is 4096 rows instead of 262144 (as in bench_qwen35.py: the
benchmark is about the experts; the real embedding would add 1.5 GB of
BF16 that every path reads the same way).

Cases:
  1. ours: hf2q.gemma4.load(path, device=Device("host"), progress=False)
     (experts -> Q8_0, dense -> F32), best of 2 in this process; plus one load
     in a fresh subprocess (cold allocation), which also gives the peak RSS.
  2. gguf-py: safe_open().get_tensor of each fused expert tensor,
     astype(float32), gguf.quants.quantize(..., Q8_0), for the 4 expert
     tensors; each result is checked byte-equal to ours. If the first tensor
     projects the 4 above --gguf-budget seconds, only those that fit are timed
     and the total is scaled linearly (said so).
  3. numpy alone: the read + astype(float32) phases of (2). Gemma 4 stores
     its experts fused, so there is nothing to stack (the converter does not
     stack either).

Targets: gguf-py time / ours >= 20x; extra memory of a load (peak RSS -
baseline RSS - resident bytes) <= one fused gate_up tensor in BF16
(128 * 1408 * 2816 * 2 = 1,015,021,568 bytes). The machine may be shared:
numbers are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    CHILD_BASELINE, CHILD_HWM, best_of, dump_json, peak_rss_bytes, print_table, subprocess_json, warm_page_cache)

import hf2q  # noqa: E402
import hf2q.gemma4  # noqa: E402
from hf2q.testing.gemma4_checkpoint import (  # noqa: E402
    GEMMA4_26B_A4B_TEXT_CONFIG,
    gemma4_tensor_shapes,
    make_gemma4_checkpoint,
)

BENCH_TEXT_CONFIG = {**GEMMA4_26B_A4B_TEXT_CONFIG, "num_hidden_layers": 2,
                     "layer_types": ["sliding_attention", "full_attention"],
                     "vocab_size": 4096}  # real: 262144 (kept small on purpose)
ONE_GATE_UP_BF16 = 128 * 1408 * 2816 * 2  # 1,015,021,568 bytes
EXPERTS = (("experts.gate_up_proj", "ffn_gate_up_exps"), ("experts.down_proj", "ffn_down_exps"))
DEFAULT_DIR = Path.home() / ".cache" / "hf2q" / "bench-gemma4"


def _checkpoint_ok(d: Path) -> bool:
    f = d / "model.safetensors"
    if not (d / "config.json").is_file() or not f.is_file():
        return False
    try:
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
        header.pop("__metadata__", None)
        got = {k: tuple(v["shape"]) for k, v in header.items()}
        end = max(v["data_offsets"][1] for v in header.values())
        return got == gemma4_tensor_shapes(BENCH_TEXT_CONFIG) and f.stat().st_size == 8 + n + end
    except (OSError, ValueError, KeyError):
        return False


def ensure_checkpoint(d: Path) -> tuple[Path, float | None]:
    if _checkpoint_ok(d):
        return d, None
    t0 = time.perf_counter()
    make_gemma4_checkpoint(d, BENCH_TEXT_CONFIG)
    return d, time.perf_counter() - t0


_LOAD = CHILD_HWM + """
import json, resource, sys, time
import numpy, hf2q, hf2q.gemma4
t0 = time.perf_counter()
m = hf2q.gemma4.load(sys.argv[1], device=hf2q.Device("host"), progress=False)
t = time.perf_counter() - t0
k = 1 if sys.platform == "darwin" else 1024
print(json.dumps({"maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * k, "vmhwm": hwm(),
                  "resident": m.gpu_resident_bytes(), "seconds": t}))
"""


def gguf_path(st_file: Path, model: hf2q.gemma4.Gemma4Model, n_layers: int, budget_s: float) -> dict:
    import gguf
    from safetensors import safe_open

    todo = [(b, hf, g) for b in range(n_layers) for hf, g in EXPERTS]
    per: list[dict] = []
    with safe_open(str(st_file), framework="numpy") as f:
        for i, (b, hf, g) in enumerate(todo):
            t0 = time.perf_counter()
            x = f.get_tensor(f"model.layers.{b}.{hf}")
            t1 = time.perf_counter()
            f32 = x.astype(np.float32)
            del x
            t2 = time.perf_counter()
            q = gguf.quants.quantize(f32, gguf.GGMLQuantizationType.Q8_0)
            t3 = time.perf_counter()
            ours = model[f"blk.{b}.{g}.weight"].numpy()
            equal = bool(q.size == ours.size and np.array_equal(q.reshape(-1), ours.reshape(-1)))
            per.append({"tensor": f"blk.{b}.{g}", "read": t1 - t0, "astype": t2 - t1, "quantize": t3 - t2,
                        "src_bytes": f32.size * 2, "equal": equal})
            del f32, q, ours
            spent = sum(s["read"] + s["astype"] + s["quantize"] for s in per)
            if i + 1 < len(todo) and spent / (i + 1) * len(todo) > budget_s:
                break
    scale = len(todo) / len(per)

    def total(*keys: str) -> float:
        return sum(s[k] for s in per for k in keys) * scale

    return {"tensors_total": len(todo), "tensors_measured": len(per), "scaled": len(per) < len(todo),
            "per_tensor": per, "numpy_seconds": total("read", "astype"), "quantize_seconds": total("quantize"),
            "gguf_seconds": total("read", "astype", "quantize"), "bytes": sum(s["src_bytes"] for s in per) * scale,
            "all_equal": all(s["equal"] for s in per)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                    help=f"bench checkpoint directory, written once and reused (default {DEFAULT_DIR})")
    ap.add_argument("--gguf-budget", type=float, default=120.0,
                    help="seconds the gguf-py path may take before it is timed on fewer tensors and scaled")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    t_start = time.perf_counter()
    path, t_write = ensure_checkpoint(args.dir)
    st_file = path / "model.safetensors"
    file_bytes = st_file.stat().st_size
    t_warm = warm_page_cache(st_file)
    t_warm2 = warm_page_cache(st_file)
    L = BENCH_TEXT_CONFIG["num_hidden_layers"]

    base = subprocess_json(CHILD_BASELINE)
    sub = subprocess_json(_LOAD, str(path))

    dev = hf2q.Device("host")
    holder: dict[str, object] = {}
    runs: list[float] = []

    def ours() -> None:
        holder.pop("m", None)  # one model at a time
        t0 = time.perf_counter()
        holder["m"] = hf2q.gemma4.load(path, device=dev, progress=False)
        runs.append(time.perf_counter() - t0)

    t_ours = best_of(ours, repeat=2, warmup=0)
    model = holder["m"]
    assert isinstance(model, hf2q.gemma4.Gemma4Model)
    data_bytes = model.summary.data_bytes
    g = gguf_path(st_file, model, L, args.gguf_budget)
    del model
    holder.clear()

    extra = sub["maxrss"] - base["maxrss"] - sub["resident"]
    note_g = (f"scaled from {g['tensors_measured']}/{g['tensors_total']} tensors" if g["scaled"]
              else f"all {g['tensors_total']} expert tensors")
    rows = [
        {"case": "page-cache read of the file (plain read)", "seconds": t_warm2, "GB/s": file_bytes / t_warm2 / 1e9,
         "x ours": None, "note": "baseline"},
        {"case": "ours: hf2q.gemma4.load (best of 2)", "seconds": t_ours, "GB/s": data_bytes / t_ours / 1e9,
         "x ours": 1.0, "note": "whole checkpoint: experts q8_0, dense f32; runs "
                                + ", ".join(f"{r:.2f}s" for r in runs)},
        {"case": "ours: fresh subprocess (cold allocation)", "seconds": sub["seconds"],
         "GB/s": data_bytes / sub["seconds"] / 1e9, "x ours": sub["seconds"] / t_ours, "note": "single run"},
        {"case": "gguf-py: read+astype f32+quantize Q8_0", "seconds": g["gguf_seconds"],
         "GB/s": g["bytes"] / g["gguf_seconds"] / 1e9, "x ours": g["gguf_seconds"] / t_ours,
         "note": f"experts only, {note_g}, bytes equal ours: {g['all_equal']}"},
        {"case": "  of which gguf.quants.quantize", "seconds": g["quantize_seconds"],
         "GB/s": g["bytes"] / g["quantize_seconds"] / 1e9, "x ours": g["quantize_seconds"] / t_ours, "note": note_g},
        {"case": "numpy alone: read+astype f32 (no quant)", "seconds": g["numpy_seconds"],
         "GB/s": g["bytes"] / g["numpy_seconds"] / 1e9, "x ours": g["numpy_seconds"] / t_ours,
         "note": f"experts only, {note_g}"},
    ]
    ratio = g["gguf_seconds"] / t_ours
    result = {"checkpoint": str(path), "file_bytes": file_bytes, "data_bytes": data_bytes,
              "checkpoint_written_s": t_write, "threads": hf2q.get_num_threads(), "cpus": os.cpu_count(),
              "ours_runs_s": runs, "rows": rows, "gguf": g,
              "memory": {"baseline_maxrss": base["maxrss"], "load_maxrss": sub["maxrss"],
                         "resident_bytes": sub["resident"], "extra_bytes": extra,
                         "target_extra_bytes": ONE_GATE_UP_BF16, "extra_ok": extra <= ONE_GATE_UP_BF16,
                         "this_process_maxrss": peak_rss_bytes()},
              "ratio_gguf_over_ours": ratio, "ratio_target": 20.0, "ratio_ok": ratio >= 20.0,
              "total_seconds": time.perf_counter() - t_start}
    if args.json:
        dump_json(result)
        return 0
    print(f"bench checkpoint {path}: {file_bytes:,} bytes "
          + ("(reused)" if t_write is None else f"(written in {t_write:.1f} s)")
          + f"; {L} layers x 128 experts; {hf2q.get_num_threads()} hf2q threads on {os.cpu_count()} CPUs"
          + f"; page cache warmed in {t_warm:.2f} s")
    print("GB/s counts source (BF16) bytes read: the whole checkpoint for ours, the expert tensors for the others;")
    print("'x ours' = seconds / ours best (higher = slower than ours). The machine may be shared: noisy numbers.")
    print_table("gemma4 load", rows, ["case", "seconds", "GB/s", "x ours", "note"])
    print_table("gguf-py path per tensor (seconds)", g["per_tensor"], ["tensor", "read", "astype", "quantize", "equal"])
    print(f"\npeak RSS: baseline {base['maxrss']:,}, load {sub['maxrss']:,}, resident {sub['resident']:,}; "
          f"extra {extra:,} bytes ({extra / ONE_GATE_UP_BF16:.3f} of one BF16 gate_up tensor) -> "
          f"{'OK' if extra <= ONE_GATE_UP_BF16 else 'OVER TARGET'}")
    print(f"gguf-py path / ours: {ratio:.1f}x (target >= 20x) -> {'OK' if ratio >= 20 else 'BELOW TARGET'}; "
          f"numpy alone / ours: {g['numpy_seconds'] / t_ours:.1f}x")
    print(f"total bench time {result['total_seconds']:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
