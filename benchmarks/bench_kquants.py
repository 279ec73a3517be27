"""Q4_0 / Q4_K / Q5_K / Q6_K quantizers beside ggml's reference C code; with
``--recipe``, a Q4_K_M file in one pass beside the two passes of llama.cpp.

    python benchmarks/bench_kquants.py [--elements N] [--cache DIR | --no-ggml] [--json]
    python benchmarks/bench_kquants.py --recipe q4_k_m --llama-quantize PATH [--experts E] [--device D] [--json]

MB/s counts float32 input bytes (4 per value), as the issue's ggml figures do.
ggml: ``quantize_row_<type>_ref`` from ``ggml-quants.c`` of the pinned
llama-cpp-python sdist, built by scripts/make_kquant_golden.py's recipe
(-O2 -DNDEBUG -ffp-contract=off) and called through ctypes (which releases the
GIL); "all cores" runs it on as many Python threads as hf2q uses, each on a
contiguous range of rows. hf2q: ``hf2q.ops.quantize`` with 1 thread and with
``hf2q.get_num_threads()``. Bytes are checked equal to ggml's. One warm-up,
best of 3. Input: normal values * 0.02 rounded to BF16 (a checkpoint's
weights), widened to float32.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ml_dtypes
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "scripts"))
from _common import best_of, dump_json, print_table  # noqa: E402

import hf2q  # noqa: E402
from hf2q import formats, ops  # noqa: E402

FMTS = {"q4_0": "q4_0", "q4_k": "q4_K", "q5_k": "q5_K", "q6_k": "q6_K"}


def ggml_quantizer(lib: ctypes.CDLL, fmt: str):
    fn = getattr(lib, f"quantize_row_{FMTS[fmt]}_ref")
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return fn


def _tensor_hashes(path: Path) -> dict[str, tuple[int, str]]:
    import hashlib

    import gguf

    return {t.name: (int(t.tensor_type), hashlib.sha256(bytes(t.data.tobytes())).hexdigest())
            for t in gguf.GGUFReader(str(path)).tensors}


def bench_recipe(args: argparse.Namespace) -> int:
    """Recipe mode: a Qwen3.6-35B-A3B-shaped checkpoint (the real per-layer
    shapes of hf2q.testing's "bench" config, two layers, ``--experts``
    experts) to a Q4_K_M GGUF file: ``hf2q convert --recipe`` (one pass from
    the safetensors) beside ``hf2q convert --outtype bf16`` (the converter's
    BF16 file; hf2q writes it faster than convert_hf_to_gguf.py) followed by
    ``llama-quantize ... Q4_K_M`` with as many threads; and ``hf2q.load`` with
    the recipe on ``--device`` (resident, no file). Page cache warm (one warm-up
    of each), one timed run each; bytes of every tensor compared."""
    import subprocess
    import time

    from hf2q.testing import make_qwen35_moe_checkpoint
    from hf2q.testing.qwen35_checkpoint import BENCH_TEXT_CONFIG

    threads = hf2q.get_num_threads()
    work = Path(tempfile.mkdtemp(prefix="hf2q-bench-recipe-"))
    try:
        cfg = {**BENCH_TEXT_CONFIG, "num_experts": args.experts, "num_experts_per_tok": min(8, args.experts)}
        ckpt = make_qwen35_moe_checkpoint(work / "ckpt", cfg, seed=0)
        src_bytes = sum(f.stat().st_size for f in ckpt.glob("*.safetensors"))
        ftype = args.recipe.upper()

        def ours() -> None:
            hf2q.convert(ckpt, work / "ours.gguf", recipe=args.recipe, force=True)

        import shutil

        quantizer = shutil.which(args.llama_quantize)

        def two_pass() -> tuple[float, float]:
            t0 = time.perf_counter()
            hf2q.convert(ckpt, work / "bf16.gguf", "bf16", force=True)
            t1 = time.perf_counter()
            if quantizer is None:  # no llama.cpp here: hf2q's rows only
                return t1 - t0, float("nan")
            subprocess.run([quantizer, str(work / "bf16.gguf"), str(work / "theirs.gguf"), ftype,
                            str(threads)], check=True, capture_output=True)
            return t1 - t0, time.perf_counter() - t1

        device = hf2q.Device(args.device)

        def load() -> None:
            m = hf2q.load(ckpt, device, recipe=args.recipe, progress=False)
            del m

        ours(), two_pass(), load()  # warm-up (page cache, kernels)
        t = time.perf_counter()
        ours()
        t_ours = time.perf_counter() - t
        t_bf16, t_quant = two_pass()
        t = time.perf_counter()
        load()
        t_load = time.perf_counter() - t
        equal = None if quantizer is None else _tensor_hashes(work / "ours.gguf") == _tensor_hashes(work / "theirs.gguf")
        out_bytes = (work / "ours.gguf").stat().st_size
    finally:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    rows = [
        {"case": f"hf2q convert --recipe {args.recipe}", "seconds": t_ours},
        {"case": "hf2q convert --outtype bf16", "seconds": t_bf16},
        {"case": f"llama-quantize {ftype} ({threads} threads)", "seconds": t_quant},
        {"case": "two passes (bf16 file + llama-quantize)", "seconds": t_bf16 + t_quant},
        {"case": f"hf2q.load(recipe={args.recipe!r}) on {args.device}", "seconds": t_load},
    ]
    for r in rows:
        r["MB/s"] = src_bytes / r["seconds"] / 1e6
        r["x two passes"] = (t_bf16 + t_quant) / r["seconds"]
    result = {"recipe": args.recipe, "experts": args.experts, "threads": threads, "source_bytes": src_bytes,
              "output_bytes": out_bytes, "tensors_equal_llama_quantize": equal, "rows": rows}
    if args.json:
        dump_json(result)
    else:
        print_table(f"{args.recipe}: {src_bytes / 1e6:.0f} MB of BF16 safetensors -> {out_bytes / 1e6:.0f} MB "
                    f"GGUF, {threads} threads (MB/s of source)", rows, ["case", "seconds", "MB/s", "x two passes"])
        print(f"\nevery tensor equal to llama-quantize's (type and bytes): {equal}")
    return 0 if equal is not False else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--elements", type=int, default=4 << 20)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "hf2q-golden")
    ap.add_argument("--no-ggml", action="store_true", help="time hf2q only")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--recipe", help="recipe mode: time a whole checkpoint to this file type (q4_k_m, ...)")
    ap.add_argument("--llama-quantize", default="llama-quantize",
                    help="recipe mode: the llama-quantize binary (not found: hf2q's rows only)")
    ap.add_argument("--experts", type=int, default=32, help="recipe mode: experts per layer (real model: 256)")
    ap.add_argument("--device", default="host", help="recipe mode: the device hf2q.load fills (host, cuda, ...)")
    args = ap.parse_args()
    if args.recipe:
        return bench_recipe(args)
    row = 4096
    n = max(row, args.elements - args.elements % row)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(n, dtype=np.float32) * 0.02).astype(ml_dtypes.bfloat16).astype(np.float32)
    x = x.reshape(-1, row)
    threads = hf2q.get_num_threads()
    rows: list[dict] = []
    equal: dict[str, bool] = {}

    lib = None
    tmp = None
    if not args.no_ggml:
        from make_kquant_golden import build, fetch_ggml

        tmp = tempfile.TemporaryDirectory()
        lib, _ = build(fetch_ggml(args.cache), Path(tmp.name), "cc")

    def add(case: str, fmt: str, seconds: float, kind: str) -> None:
        rows.append({"case": case, "format": fmt, "seconds": seconds, "MB/s": 4 * n / seconds / 1e6, "kind": kind})

    for fmt in FMTS:
        out = np.empty(formats.storage_shape(x.shape, fmt), dtype=np.uint8)
        try:
            hf2q.set_num_threads(1)
            add("hf2q, 1 thread", fmt, best_of(lambda: ops.quantize(x, fmt, out=out)), "ours")
            hf2q.set_num_threads(threads)
            add(f"hf2q, {threads} threads", fmt, best_of(lambda: ops.quantize(x, fmt, out=out)), "ours")
        finally:
            hf2q.set_num_threads(threads)
        if lib is None:
            continue
        fn = ggml_quantizer(lib, fmt)
        ref = np.empty_like(out)

        def ggml_range(a: int, b: int) -> None:
            fn(x[a:b].ctypes.data, ref[a:b].ctypes.data, (b - a) * row)

        add("ggml ref, 1 thread", fmt, best_of(lambda: ggml_range(0, x.shape[0])), "ggml")
        bounds = np.linspace(0, x.shape[0], threads + 1).astype(int)
        with ThreadPoolExecutor(threads) as pool:
            def all_cores() -> None:
                list(pool.map(ggml_range, bounds[:-1], bounds[1:]))

            add(f"ggml ref, {threads} threads", fmt, best_of(all_cores), "ggml")
        equal[fmt] = bool(np.array_equal(ref, out))

    for r in rows:
        base = [g for g in rows if g["kind"] == "ggml" and g["format"] == r["format"]
                and g["case"].split(",")[1] == r["case"].split(",")[1]]
        r["x ggml"] = base[0]["seconds"] / r["seconds"] if base and r["kind"] == "ours" else None
    if tmp is not None:
        tmp.cleanup()
    result = {"elements": n, "threads": threads, "isa": ops.simd_isa(), "bytes_equal_ggml": equal, "rows": rows}
    if args.json:
        dump_json(result)
    else:
        print_table(f"Quantizers, {n} float32 values (MB/s of input), {threads} threads max, {ops.simd_isa()}",
                    rows, ["format", "case", "seconds", "MB/s", "x ggml"])
        print(f"\nbytes equal to ggml: {equal}")
    return 0 if all(equal.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
