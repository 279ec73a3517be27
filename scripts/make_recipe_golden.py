#!/usr/bin/env python3
"""Record what ``llama-quantize`` writes for each recipe: tests/data/kquants/recipes.json
(read by tests/test_recipes.py).

Not run in CI. For each variant (the tiny Qwen3.5 MoE and Gemma 4
checkpoints committed under ``tests/data/``, whose rows of 32 or 64 values
make llama-quantize fall back to Q5_0 / Q8_0 / F16, and two synthetic
checkpoints written by ``hf2q.testing`` from a fixed config and seed whose
rows are multiples of 256, so that Q4_K / Q5_K / Q6_K are really chosen):

1. ``hf2q convert --outtype bf16`` writes the converter's BF16 GGUF file
   (byte-identical to llama.cpp's ``convert_hf_to_gguf.py`` for these
   families: tests/test_convert_golden.py);
2. ``llama-quantize <bf16.gguf> <out.gguf> <TYPE> 1`` (no importance matrix)
   from the pinned llama.cpp (the llama-cpp-python sdist of
   ``make_golden.py``), built in Release with ``-ffp-contract=off`` and
   ``GGML_NATIVE=OFF`` (x86-64 baseline: no FMA; the reference quantizers
   live in ggml-base, which runs no SIMD path for these types);
3. every tensor of the output, read with gguf-py: per variant the names and
   numpy shapes in file order, and per recipe each tensor's GGML type and the
   first 16 hex digits of the SHA-256 of its bytes (the bytes themselves
   would be too large to commit; the hashes pin them).

Usage (any environment with hf2q installed, gguf-py and a llama.cpp build)::

    python scripts/make_recipe_golden.py --llama-quantize /path/to/llama-quantize
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "data" / "kquants" / "recipes.json"
HASH_DIGITS = 16
sys.path.insert(0, str(REPO / "tests"))
from _recipe_variants import RECIPES_FTYPE, VARIANTS, materialize  # noqa: E402


def quantized_tensors(path: Path) -> list[tuple[str, list[int], int, str]]:
    """(name, numpy shape, GGML type, SHA-256 prefix of the bytes) of every tensor, in file order."""
    import gguf

    r = gguf.GGUFReader(str(path))
    return [(t.name, [int(d) for d in reversed(t.shape.tolist())], int(t.tensor_type),
             hashlib.sha256(bytes(t.data.tobytes())).hexdigest()[:HASH_DIGITS]) for t in r.tensors]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-quantize", default="/work/llamacpp/build/bin/llama-quantize")
    ap.add_argument("--only", nargs="*", help="variants to redo (others kept from the existing file)")
    args = ap.parse_args()
    import hf2q

    old = json.loads(OUT.read_text()) if OUT.is_file() else {"variants": {}}
    doc: dict[str, Any] = {
        "tool": "llama-quantize (llama-cpp-python 0.3.36 sdist, vendor/llama.cpp), Release, "
                "-ffp-contract=off, GGML_NATIVE=OFF; input: hf2q convert --outtype bf16",
        "recipes": RECIPES_FTYPE,
        "variants": {n: {**v.get("about", {}), "tensors": v["tensors"], "results": v["results"]}
                     for n, v in old.get("variants", {}).items()},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name in VARIANTS:
            if args.only and name not in args.only:
                continue
            ckpt = materialize(name, Path(tmp) / name)
            bf16 = Path(tmp) / f"{name}.bf16.gguf"
            hf2q.convert(ckpt, bf16, "bf16", force=True)
            results: dict[str, list[list[Any]]] = {}
            tensors: list[list[Any]] = []
            for recipe, ftype in RECIPES_FTYPE.items():
                out = Path(tmp) / f"{name}.{recipe}.gguf"
                p = subprocess.run([args.llama_quantize, str(bf16), str(out), ftype, "1"], capture_output=True,
                                   text=True)
                if p.returncode != 0:
                    raise SystemExit(f"{name} {recipe}: llama-quantize failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
                got = quantized_tensors(out)
                listing = [[n, shape] for n, shape, _, _ in got]
                if tensors and listing != tensors:
                    raise SystemExit(f"{name} {recipe}: the tensor list differs between recipes")
                tensors = listing
                results[recipe] = [[ty, h] for _, _, ty, h in got]
            doc["variants"][name] = {**{k: v for k, v in VARIANTS[name].items() if k != "config"},
                                     "tensors": tensors, "results": results}
            print(f"{name}: {len(tensors)} tensors")
    # One line per list: small, and diffs stay readable.
    lines = ["{", f' "tool": {json.dumps(doc["tool"])},', f' "recipes": {json.dumps(doc["recipes"])},',
             ' "variants": {']
    for i, (name, v) in enumerate(doc["variants"].items()):
        lines.append(f"  {json.dumps(name)}: {{")
        head = {k: v[k] for k in v if k not in ("tensors", "results")}
        lines.append(f"   \"about\": {json.dumps(head)},")
        lines.append(f"   \"tensors\": {json.dumps(v['tensors'])},")
        lines.append("   \"results\": {")
        for j, (recipe, rows) in enumerate(v["results"].items()):
            comma = "," if j + 1 < len(v["results"]) else ""
            lines.append(f"    {json.dumps(recipe)}: {json.dumps(rows)}{comma}")
        lines.append("   }")
        lines.append("  }" + ("," if i + 1 < len(doc["variants"]) else ""))
    lines += [" }", "}"]
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
