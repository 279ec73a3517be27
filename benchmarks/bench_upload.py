"""Upload throughput: 512 MiB of BF16 into device buffers, raw, to f32 and to
q8_0, from memory and from a file in the page cache, beside a plain memory
copy, a plain read into a preallocated buffer, and safetensors' own loaders.

    python benchmarks/bench_upload.py [--mib 512] [--json]

Target: raw upload from the page cache >= 0.8x a plain read of the same bytes
into a preallocated buffer.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import best_of, dump_json, print_table  # noqa: E402

import hf2q  # noqa: E402
from hf2q import formats  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=512, help="MiB of BF16 source data (default 512)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    n = args.mib * (1 << 20) // 2
    n -= n % formats.get("q8_0").block_elems
    rng = np.random.default_rng(0)
    src = (rng.standard_normal(n, dtype=np.float32) * 0.02).astype(ml_dtypes.bfloat16)
    nbytes = src.nbytes
    dev = hf2q.Device("host")
    rows: list[dict] = []

    def add(name: str, seconds: float, moved: int, note: str = "") -> None:
        rows.append({"case": name, "seconds": seconds, "GB/s": moved / seconds / 1e9, "note": note})

    # Baselines -----------------------------------------------------------
    dst = np.empty(nbytes, np.uint8)
    dst[:] = 1
    src_u8 = src.view(np.uint8)
    t_copy = best_of(lambda: np.copyto(dst, src_u8))
    add("memcpy (numpy copyto, prefaulted)", t_copy, 2 * nbytes, "baseline")

    with tempfile.TemporaryDirectory() as tmp:
        raw_path = Path(tmp) / "w.bin"
        raw_path.write_bytes(src.tobytes())
        st_path = Path(tmp) / "w.safetensors"
        from safetensors.numpy import load_file, save_file
        from safetensors import safe_open

        save_file({"w": src.view(np.uint16)}, str(st_path))  # same bytes, U16 tag
        header = 8 + int.from_bytes(st_path.read_bytes()[:8], "little")

        def plain_read() -> None:
            with open(raw_path, "rb", buffering=0) as f:
                f.readinto(memoryview(dst))

        t_read = best_of(plain_read)
        add("plain read into preallocated buffer", t_read, nbytes, "baseline")

        t_sf_load = best_of(lambda: load_file(str(st_path)), repeat=2)
        add("safetensors.numpy.load_file", t_sf_load, nbytes, "peer")

        def sf_open() -> None:
            with safe_open(str(st_path), framework="numpy") as f:
                f.get_tensor("w")

        t_sf_open = best_of(sf_open, repeat=2)
        add("safetensors safe_open().get_tensor", t_sf_open, nbytes, "peer")

        # Ours: from memory -------------------------------------------------
        for to in ("bf16", "f32", "q8_0"):
            out_bytes = formats.nbytes((n,), to)
            t = best_of(lambda to=to: dev.upload(src, to=to), repeat=2)
            add(f"hf2q upload from memory -> {to} (alloc incl.)", t, nbytes + out_bytes)

        # Ours: from the page cache ------------------------------------------
        buf_raw = dev.alloc((n,), "bf16")
        t_into = best_of(lambda: dev.write_from_file(buf_raw, st_path, header, nbytes, "bf16"))
        add("hf2q file -> existing bf16 buffer (raw pread)", t_into, nbytes)
        del buf_raw
        for to in ("bf16", "f32", "q8_0"):
            t = best_of(lambda to=to: dev.upload_from_file(st_path, header, nbytes, "bf16", to, (n,)), repeat=2)
            add(f"hf2q upload_from_file -> {to} (alloc incl.)", t, nbytes)

    for r in rows:
        r["x read"] = t_read / r["seconds"] if "file" in r["case"] or "safetensors" in r["case"] else None
        r["x memcpy"] = r["GB/s"] / rows[0]["GB/s"]
    if args.json:
        dump_json({"bytes": nbytes, "threads": hf2q.get_num_threads(), "rows": rows})
    else:
        print(f"{nbytes / 2**20:.0f} MiB BF16, {hf2q.get_num_threads()} threads, ISA {hf2q.ops.simd_isa()}")
        print("GB/s counts bytes read + written for memory cases, bytes read for file cases;")
        print("'x read' = time of a plain read of the same bytes / time of the case (higher is better).")
        print_table("upload", rows, ["case", "seconds", "GB/s", "x memcpy", "x read", "note"])
        into = next(r for r in rows if r["case"].startswith("hf2q file -> existing"))
        full = next(r for r in rows if r["case"] == "hf2q upload_from_file -> bf16 (alloc incl.)")
        print(f"\nraw upload from page cache vs plain read: {into['x read']:.2f}x into an existing buffer, "
              f"{full['x read']:.2f}x with allocation + residency (target >= 0.8x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
