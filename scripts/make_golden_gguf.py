#!/usr/bin/env python3
"""Record llama.cpp's converter's whole GGUF file for the committed tiny
checkpoints: tests/data/gguf/<variant>.json (read by tests/test_convert_golden.py).

Not run in CI. For every checkpoint already committed under
``tests/data/golden/`` (Qwen3.5 MoE) and ``tests/data/gemma4/`` (Gemma 4),
and every ``--outtype`` of ``make_golden.OUTTYPES``, the converter from the
pinned llama-cpp-python sdist (``make_golden.fetch_converter``) writes a
GGUF file, run in this process exactly as ``make_golden.py`` /
``make_golden_gemma4.py`` run it (vocabulary step stubbed: these checkpoints
carry no real tokenizer; Qwen3.5 variants written by transformers with
``--no-mtp``). What is kept of each file, read back with the converter's own
gguf-py:

- every key/value: key, value type, element type for arrays, value;
- every tensor info in file order: name, GGML type, numpy-order shape,
  offset in the data section, byte length, SHA-256 of its bytes;
- the alignment, the data section's offset and the file's size.

The tensor bytes themselves are already committed (``converted.npz``); the
hashes tie this file to them. Keys that depend on the tool or the path
(``general.name``, ``general.size_label``, ...) are recorded as written; the
test knows which of them may differ (docs/CONVERT.md).

Usage: the environment of make_golden.py (torch, transformers pinned)::

    python scripts/make_golden_gguf.py [--only VARIANT ...]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_golden as mg  # noqa: E402
import make_golden_gemma4 as mg4  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "data" / "gguf"


def variants() -> dict[str, tuple[str, Path]]:
    """name -> (family, checkpoint directory)"""
    out: dict[str, tuple[str, Path]] = {}
    for d in sorted((REPO / "tests" / "data" / "golden").glob("qwen35moe_*")):
        if (d / "hf" / "config.json").is_file():
            out[d.name] = ("qwen35moe", d / "hf")
    for d in sorted((REPO / "tests" / "data" / "gemma4").glob("gemma4_*")):
        if (d / "hf" / "config.json").is_file() and any((d / "hf").glob("*.safetensors")):
            out[d.name] = ("gemma4", d / "hf")
    return out


def describe(path: Path) -> dict[str, Any]:
    import gguf  # the converter's gguf-py, on sys.path once a conversion ran
    import numpy as np

    r = gguf.GGUFReader(path)
    kvs = []
    for key, f in r.fields.items():
        if key.startswith("GGUF."):
            continue  # the reader's view of the header, not key/values
        t = f.types[0]
        sub = f.types[1] if t == gguf.GGUFValueType.ARRAY else None
        v = f.contents()
        if isinstance(v, np.ndarray):
            v = v.tolist()
        kvs.append({"key": key, "type": t.name, **({"sub_type": sub.name} if sub is not None else {}), "value": v})
    tensors = []
    for t in r.tensors:
        data = np.asarray(t.data).view(np.uint8).reshape(-1).tobytes()
        tensors.append({"name": t.name, "type": t.tensor_type.name,
                        "shape": [int(x) for x in reversed(t.shape.tolist())],
                        "offset": int(t.data_offset) - int(r.data_offset), "nbytes": int(t.n_bytes),
                        "sha256": hashlib.sha256(data).hexdigest()})
    return {"alignment": int(r.alignment), "data_offset": int(r.data_offset), "file_size": path.stat().st_size,
            "kv": kvs, "tensors": tensors}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "hf2q-golden")
    ap.add_argument("--any-version", action="store_true")
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    versions = mg.check_versions(args.any_version)
    conv = mg.fetch_converter(args.cache)
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (fam, hf) in variants().items():
        if args.only and name not in args.only:
            continue
        rec: dict[str, Any] = {"variant": name, "family": fam, "checkpoint": str(hf.relative_to(REPO)),
                               "converter": f"llama.cpp convert_hf_to_gguf.py from llama-cpp-python "
                                            f"{mg.LLAMA_CPP_PYTHON}", "versions": versions, "outtypes": {}}
        for ot in mg.OUTTYPES:
            with tempfile.TemporaryDirectory() as tmp:
                g = Path(tmp) / f"{ot}.gguf"
                if fam == "qwen35moe":
                    mg.convert(conv, hf, ot, g, ["--no-mtp"] if name in mg.QWEN_VARIANTS else [])
                    mg._reset_converter_state()
                else:
                    mg4.convert(conv, hf, ot, g)
                rec["outtypes"][ot] = describe(g)
        (OUT / f"{name}.json").write_text(json.dumps(rec, indent=1) + "\n")
        print(f"{name}: {sum(len(o['tensors']) for o in rec['outtypes'].values())} tensors", file=sys.stderr)


if __name__ == "__main__":
    main()
