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

With ``--files``: tests/data/kquants/recipes_files.json, llama-quantize's
whole output file (its SHA-256, its key order, every tensor's name, numpy
shape, type and SHA-256 prefix in file order) for each recipe, from ``hf2q
convert --outtype bf16`` of each variant above and of the generic family's
llama-like checkpoints (tests/_recipe_variants.py ``GENERIC_CONVERT``): what
``hf2q convert --recipe`` must write byte for byte
(tests/test_convert_recipe_files.py).

With ``--full-size``: tests/data/kquants/recipes_full_size.json, the types
(only: no bytes) llama-quantize --dry-run gives every tensor of the
published Qwen3.6-35B-A3B and gemma-4-26B-A4B configs (40 + 1 MTP / 30
blocks, 256 / 128 experts, Gemma's 704-value expert rows), from a
header-only BF16 file (the data section a sparse hole) written as hf2q
convert writes it, and of two llama-like shapes for the generic family (a
LLaMA-70B: 80 blocks, grouped-query attention; a Mixtral-8x7B: 8 experts),
written with gguf-py's writer under llama.cpp's names.

Usage (any environment with hf2q installed, gguf-py and a llama.cpp build)::

    python scripts/make_recipe_golden.py --llama-quantize /path/to/llama-quantize [--full-size | --files]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "data" / "kquants" / "recipes.json"
HASH_DIGITS = 16
sys.path.insert(0, str(REPO / "tests"))
from _recipe_variants import (FULL_SIZE, GENERIC_CONVERT, GENERIC_FULL, RECIPES_FTYPE, VARIANTS,  # noqa: E402
                              full_size_plan, generic_full_size_plan, materialize, materialize_generic)

OUT_FULL = REPO / "tests" / "data" / "kquants" / "recipes_full_size.json"
OUT_FILES = REPO / "tests" / "data" / "kquants" / "recipes_files.json"
_LINE = re.compile(r"^\[\s*\d+/\s*\d+\]\s+(\S+)\s+- \[[^\]]*\], type =\s+(\S+), size =.*?(?:\((\S+)\))?\s*$")


def header_only_bf16(name: str, path: Path, scratch: Path) -> None:
    """The converter's BF16 GGUF of a published config, header only: the
    data section is a hole (a sparse file of the right size). llama-quantize
    --dry-run reads the header and the key/values alone."""
    from hf2q import formats
    from hf2q.export import metadata as md
    from hf2q.export.gguf import ALIGNMENT, TensorInfo, encode_header, padded
    from hf2q.export.order import converter_order

    plan, config, fam = full_size_plan(name, None, scratch)
    arch = {"qwen35moe": "qwen35moe", "gemma4": "gemma4"}[fam.name]
    entries = converter_order(list(plan), [p.tensor for e in plan for p in e.sources])
    kv = md.KVList(arch)
    kv.string("general.architecture", arch)
    md.general(kv, name)
    getattr(md, arch)(kv, config, plan.config, "bf16")
    kv.u32("general.quantization_version", md.QUANTIZATION_VERSION)
    infos = [TensorInfo(e.name, tuple(e.shape), formats.get(e.dtype).gguf_type, formats.nbytes(e.shape, e.dtype))
             for e in entries]
    head, _ = encode_header(kv.items(), infos, ALIGNMENT)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + sum(padded(t.nbytes, ALIGNMENT) for t in infos))


def llama_tensors(name: str, scratch: Path) -> list[tuple[str, tuple[int, ...], str]]:
    """(GGUF name, numpy shape, hf2q format) of the converter's file of a
    llama-like checkpoint: the generic family's BF16 plan under llama.cpp's
    names, per-expert tensors stacked as the converter stacks them."""
    import re as _re

    from hf2q.models.generic.names import llama_gguf_name

    plan = generic_full_size_plan(name, None, scratch)
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    for e in plan:
        g = llama_gguf_name(e.name)
        m = _re.fullmatch(r"(blk\.\d+\.ffn_\w+_exps)\.\d+\.weight", g)
        if m:
            g = m.group(1) + ".weight"
            n = out[g][0][0] + 1 if g in out else 1
            out[g] = ((n, *e.shape), e.dtype)
        else:
            out[g] = (tuple(e.shape), e.dtype)
    return [(g, shape, fmt) for g, (shape, fmt) in out.items()]


def header_only_llama(name: str, path: Path, scratch: Path) -> None:
    """A header-only llama GGUF (gguf-py's writer; the data section a hole)."""
    import gguf
    import numpy as np

    from hf2q import formats

    c = GENERIC_FULL[name]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(c["layers"])
    w.add_context_length(4096)
    w.add_embedding_length(c["hidden"])
    w.add_feed_forward_length(c["ffn"])
    w.add_head_count(c["heads"])
    w.add_head_count_kv(c["kv_heads"])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(c["hidden"] // c["heads"])
    w.add_vocab_size(c["vocab"])
    if c["experts"]:
        w.add_expert_count(c["experts"])
        w.add_expert_used_count(2)
    total = 0
    for g, shape, fmt in llama_tensors(name, scratch):
        nbytes = formats.nbytes(shape, fmt)
        raw = gguf.GGMLQuantizationType(formats.get(fmt).gguf_type)
        w.add_tensor_info(g, shape, np.dtype(np.float32 if fmt == "f32" else np.uint16), nbytes, raw_dtype=raw)
        total += -(-nbytes // 32) * 32
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(-(-size // 32) * 32 + total)


def dry_run_types(llama_quantize: str, path: Path, ftype: str) -> dict[str, str]:
    """name -> the type llama-quantize --dry-run gives each tensor (its log)."""
    p = subprocess.run([llama_quantize, "--dry-run", str(path), ftype, "1"], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{path} {ftype}: llama-quantize --dry-run failed:\n{p.stderr[-3000:]}")
    out = {}
    for line in (p.stdout + p.stderr).splitlines():
        m = _LINE.match(line.strip())
        if m:
            out[m.group(1)] = (m.group(3) or m.group(2)).lower()
    return out


def full_size(llama_quantize: str) -> None:
    doc: dict[str, Any] = {"tool": "llama-quantize --dry-run (as for recipes.json) on a header-only BF16 file "
                                   "of each published config (hf2q.testing's text configs)", "variants": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in (*FULL_SIZE, *GENERIC_FULL):
            path = Path(tmp) / f"{name}.bf16.gguf"
            if name in GENERIC_FULL:
                header_only_llama(name, path, Path(tmp) / name)
            else:
                header_only_bf16(name, path, Path(tmp) / name)
            names: list[str] = []
            results: dict[str, str] = {}
            for recipe, ftype in RECIPES_FTYPE.items():
                types = dry_run_types(llama_quantize, path, ftype)
                if not names:
                    names = list(types)
                if list(types) != names:
                    raise SystemExit(f"{name} {recipe}: the tensor list differs between recipes")
                results[recipe] = " ".join(types[n] for n in names)
            doc["variants"][name] = {"tensors": names, "types": results}
            print(f"{name}: {len(names)} tensors")
    lines = ["{", f' "tool": {json.dumps(doc["tool"])},', ' "variants": {']
    for i, (name, v) in enumerate(doc["variants"].items()):
        lines.append(f"  {json.dumps(name)}: {{")
        lines.append(f"   \"tensors\": {json.dumps(v['tensors'])},")
        lines.append("   \"types\": {")
        for j, (recipe, t) in enumerate(v["types"].items()):
            lines.append(f"    {json.dumps(recipe)}: {json.dumps(t)}" + ("," if j + 1 < len(v["types"]) else ""))
        lines.append("   }")
        lines.append("  }" + ("," if i + 1 < len(doc["variants"]) else ""))
    lines += [" }", "}"]
    OUT_FULL.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT_FULL}")


def quantized_tensors(path: Path) -> list[tuple[str, list[int], int, str]]:
    """(name, numpy shape, GGML type, SHA-256 prefix of the bytes) of every tensor, in file order."""
    import gguf

    r = gguf.GGUFReader(str(path))
    return [(t.name, [int(d) for d in reversed(t.shape.tolist())], int(t.tensor_type),
             hashlib.sha256(bytes(t.data.tobytes())).hexdigest()[:HASH_DIGITS]) for t in r.tensors]


def whole_files(llama_quantize: str) -> None:
    """recipes_files.json (module doc, ``--files``)."""
    import gguf

    import hf2q

    doc: dict[str, Any] = {"tool": "llama-quantize (llama-cpp-python 0.3.36 sdist, vendor/llama.cpp), Release, "
                                   "-ffp-contract=off, GGML_NATIVE=OFF, 1 thread; input: hf2q convert --outtype bf16 "
                                   "(general.name: the checkpoint folder's name)",
                           "recipes": RECIPES_FTYPE, "variants": {}}
    names = [*VARIANTS, *GENERIC_CONVERT]
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            ckpt = (materialize(name, Path(tmp) / name) if name in VARIANTS
                    else materialize_generic(name, Path(tmp) / "generic"))
            bf16 = Path(tmp) / f"{name}.bf16.gguf"
            hf2q.convert(ckpt, bf16, "bf16", force=True)
            rec: dict[str, Any] = {"family": "generic" if name in GENERIC_CONVERT else VARIANTS[name]["family"],
                                   "results": {}}
            for recipe, ftype in RECIPES_FTYPE.items():
                out = Path(tmp) / f"{name}.{recipe}.gguf"
                p = subprocess.run([llama_quantize, str(bf16), str(out), ftype, "1"], capture_output=True, text=True)
                if p.returncode != 0:
                    raise SystemExit(f"{name} {recipe}: llama-quantize failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
                got = quantized_tensors(out)
                listing = [[n, shape] for n, shape, _, _ in got]
                keys = [k for k in gguf.GGUFReader(str(out)).fields if not k.startswith("GGUF.")]
                for field, value in (("tensors", listing), ("kv", keys)):
                    if rec.setdefault(field, value) != value:
                        raise SystemExit(f"{name} {recipe}: the {field} differ between recipes")
                rec["results"][recipe] = {"sha256": hashlib.sha256(out.read_bytes()).hexdigest(),
                                          "bytes": out.stat().st_size, "tensors": [[ty, h] for _, _, ty, h in got]}
            doc["variants"][name] = rec
            print(f"{name}: {len(rec['tensors'])} tensors, {len(rec['kv'])} keys")
    lines = ["{", f' "tool": {json.dumps(doc["tool"])},', f' "recipes": {json.dumps(doc["recipes"])},',
             ' "variants": {']
    for i, (name, v) in enumerate(doc["variants"].items()):
        lines.append(f"  {json.dumps(name)}: {{")
        lines.append(f"   \"family\": {json.dumps(v['family'])},")
        lines.append(f"   \"kv\": {json.dumps(v['kv'])},")
        lines.append(f"   \"tensors\": {json.dumps(v['tensors'])},")
        lines.append("   \"results\": {")
        for j, (recipe, r) in enumerate(v["results"].items()):
            comma = "," if j + 1 < len(v["results"]) else ""
            lines.append(f"    {json.dumps(recipe)}: {json.dumps(r)}{comma}")
        lines.append("   }")
        lines.append("  }" + ("," if i + 1 < len(doc["variants"]) else ""))
    lines += [" }", "}"]
    OUT_FILES.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT_FILES}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-quantize", default="/work/llamacpp/build/bin/llama-quantize")
    ap.add_argument("--only", nargs="*", help="variants to redo (others kept from the existing file)")
    ap.add_argument("--full-size", action="store_true",
                    help="only the types of the published full-size configs (recipes_full_size.json)")
    ap.add_argument("--files", action="store_true",
                    help="only llama-quantize's whole output files, generic variants included (recipes_files.json)")
    args = ap.parse_args()
    if args.full_size:
        full_size(args.llama_quantize)
        return
    if args.files:
        whole_files(args.llama_quantize)
        return
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
