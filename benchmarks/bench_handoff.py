"""Hand-off to transformers: time to a ready transformers model with
hf2q.transformers.from_pretrained against transformers' own from_pretrained,
and the peak memory of each (docs/HANDOFF.md).

    python benchmarks/bench_handoff.py [--dir DIR] [--full] [--repeat N] [--cuda] [--json]

Checkpoint: two layers at the real Qwen3.6-35B-A3B shapes (256 experts x 512
x 2048, ~3.4 GB of BF16, per-expert tensors as transformers' save_pretrained
writes them: transformers stacks them on load), the generator of
bench_qwen35.py; ``--full`` writes the full-size synthetic Qwen3.6-35B-A3B
(40 layers, ~67 GB, text-only layout, experts fused: bench_fullscale.py's
"qwen-text" case, into DIR/qwen-text; put --dir on /dev/shm or a fast disk)
instead.

Cases, each in a fresh interpreter (imports of torch, transformers, hf2q,
transformers' loading modules and the model's class done before the clock
starts, page cache warmed once), interleaved, ``--repeat`` rounds:
  CPU:  hf2q.transformers.from_pretrained(dir, "host", dtype="bf16")
        transformers AutoModelForCausalLM.from_pretrained(dir, dtype=torch.bfloat16)
  GPU (--cuda, needs torch with CUDA):
        hf2q.transformers.from_pretrained(dir, "cuda", dtype="bf16")
        AutoModelForCausalLM.from_pretrained(dir, dtype=torch.bfloat16, device_map="cuda")
  Both: hf2q.load(dir, Device(...), expert_dtype="bf16", dense_dtype="bf16")
        (hf2q's own load of the checkpoint, bytes kept; "hf2q load"; its
        param_MiB is the resident bytes of its buffers)
Reported: seconds to a ready model (median and best; for hf2q also the part
spent executing the load plan until its last byte was written, without the
model's assembly, and the ready model over it, x_own_load; the ready model
over hf2q's own load in the same run, x_hf2q_load), the CPU seconds the
process spent over the same span (user and kernel, all threads, median: on a
shared machine these move less than the wall time does), peak RSS growth over
the process's RSS before the load (VmHWM), and on the GPU the device memory
in use after the load (cudaMemGetInfo: hf2q's buffers are not torch's
allocator's) and torch's peak allocation.

Targets (issue 22): CPU >= 2x faster than from_pretrained with peak RSS <=
model bytes + 256 MiB; GPU >= 5x faster with peak GPU memory <= 1.05x the
model's bytes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import CHILD_HWM, dump_json, print_table, subprocess_json, warm_page_cache  # noqa: E402

DEFAULT_DIR = Path.home() / ".cache" / "hf2q" / "bench-qwen35"

_CHILD = CHILD_HWM + """
import json, sys, time
import torch, transformers
import hf2q, hf2q.transformers
which, path, device = sys.argv[1], sys.argv[2], sys.argv[3]
cuda = device == "cuda"
# Imports before the clock, for both cases: transformers' loading machinery
# and the model's class (importing them takes longer than a small load here).
import transformers.modeling_utils, transformers.core_model_loading, transformers.conversion_mapping
cls = getattr(transformers, transformers.AutoConfig.from_pretrained(path).architectures[0])
hf2q.transformers._internals()
if cuda:
    torch.cuda.init()
    free0, total = torch.cuda.mem_get_info()
import os
before = hwm()
c0 = os.times()
t0 = time.perf_counter()
if which == "hf2q":
    m = hf2q.transformers.from_pretrained(path, device, dtype="bf16")
    resident = m.hf2q_model.gpu_resident_bytes()
    load_s = m.hf2q_model.summary.landed_seconds  # the plan's execution: file bytes into the buffers
elif which == "hf2q load":
    # hf2q's own load of the same checkpoint, its bytes kept (BF16), the device opened on the clock
    dev = hf2q.Device(device)
    m = hf2q.load(path, dev, progress=False, expert_dtype="bf16", dense_dtype="bf16")
    dev.synchronize()
    resident = load_s = None
else:
    kw = {"device_map": "cuda"} if cuda else {}
    m = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, **kw)
    resident = load_s = None
if cuda:
    torch.cuda.synchronize()
t = time.perf_counter() - t0
c1 = os.times()
if which == "hf2q load":
    nbytes = m.summary.resident_bytes
else:
    nbytes = sum(p.numel() * p.element_size() for p in m.parameters())
out = {"seconds": t, "rss_before": before, "rss_peak": hwm(), "param_bytes": nbytes, "resident": resident,
       "load_s": load_s, "user_s": c1.user - c0.user, "sys_s": c1.system - c0.system}
if cuda:
    free1, _ = torch.cuda.mem_get_info()
    out["gpu_used"] = free0 - free1
    out["torch_peak"] = torch.cuda.max_memory_allocated()
print(json.dumps(out))
"""


def ensure(d: Path, full: bool) -> Path:
    from bench_qwen35 import _checkpoint_ok

    if full:
        # bench_fullscale's parallel writer (a minute on 16 cores), in the text-only
        # layout: the fused multimodal layout has no vision tensors, which
        # transformers would initialise at random and hf2q refuses as missing.
        import os

        import bench_fullscale

        opts = argparse.Namespace(layers=None, vocab=None, experts=None, dense_shrink=1, threads=os.cpu_count() or 4)
        ckpt, _ = bench_fullscale.ensure_checkpoint(d, "qwen-text", opts)
        return ckpt
    if not _checkpoint_ok(d):
        from hf2q.testing.qwen35_checkpoint import make_qwen35_moe_checkpoint

        make_qwen35_moe_checkpoint(d, config="bench")
    return d


def run(d: Path, device: str, repeat: int) -> list[dict]:
    results: dict[str, list[dict]] = {"hf2q": [], "transformers": [], "hf2q load": []}
    for _ in range(repeat):
        for which in results:  # interleaved: drift on a shared machine hits both
            results[which].append(subprocess_json(_CHILD, which, str(d), device))
    rows = []
    for which, runs in results.items():
        secs = [r["seconds"] for r in runs]
        last = runs[-1]
        row = {"device": device, "case": which, "median_s": statistics.median(secs), "best_s": min(secs),
               "param_MiB": last["param_bytes"] / 2**20,
               "rss_growth_MiB": max(r["rss_peak"] - r["rss_before"] for r in runs) / 2**20,
               "of_which_read_s": statistics.median(r["load_s"] for r in runs) if which == "hf2q" else None,
               # issue 22's "within 1.1x of hf2q's own load": the whole hand-off over its load plan's execution
               "x_own_load": statistics.median(r["seconds"] / r["load_s"] for r in runs) if which == "hf2q" else None,
               "user_s": statistics.median(r["user_s"] for r in runs),
               "sys_s": statistics.median(r["sys_s"] for r in runs)}
        if device == "cuda":
            row["gpu_used_MiB"] = max(r["gpu_used"] for r in runs) / 2**20
            row["torch_peak_MiB"] = max(r["torch_peak"] for r in runs) / 2**20
        rows.append(row)
    ours, theirs, load = rows
    ours["speedup_median"] = theirs["median_s"] / ours["median_s"]
    # issue 22's "within 1.1x of hf2q's own load time", as a user sees it: the
    # ready model against hf2q.load of the same checkpoint (open, plan, bytes kept), same run
    ours["x_hf2q_load"] = ours["median_s"] / load["median_s"]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--full", action="store_true", help="the full-size synthetic Qwen3.6-35B-A3B (~71 GB)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cuda", action="store_true", help="also the GPU cases")
    ap.add_argument("--no-cpu", action="store_true", help="only the GPU cases")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    d = ensure(a.dir, a.full)
    for f in sorted(d.glob("*.safetensors")):
        warm_page_cache(f)
    rows: list[dict] = []
    if not a.no_cpu:
        rows += run(d, "host", a.repeat)
    if a.cuda:
        rows += run(d, "cuda", a.repeat)
    if a.json:
        dump_json(rows)
    else:
        cols = ["device", "case", "median_s", "best_s", "of_which_read_s", "x_own_load", "x_hf2q_load",
                "speedup_median", "user_s", "sys_s", "param_MiB", "rss_growth_MiB"]
        if a.cuda:
            cols += ["gpu_used_MiB", "torch_peak_MiB"]
        print_table(f"hand-off, {d}", rows, cols)


if __name__ == "__main__":
    main()
