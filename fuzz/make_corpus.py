"""Write the fuzzers' seed corpora (generated at run time; nothing binary is
committed).

    python fuzz/make_corpus.py OUT_DIR

OUT_DIR/safetensors/  small hand-made safetensors files (every dtype, rank 0,
                      empty tensors, metadata, padding, shards of the tiny
                      DFlash drafter) and a few near-misses
OUT_DIR/checkpoint/   tiny DFlash and Qwen3.5-MoE checkpoints (single,
                      sharded, fused experts, multimodal) in the compact
                      encoding of fuzz/_ckpt_codec.py, plus broken variants
OUT_DIR/ops/, OUT_DIR/device/
                      deterministic byte strings of assorted lengths (these
                      targets read their actions from a FuzzedDataProvider)
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _ckpt_codec import DEV_ZERO, DIRECTORY, FIFO, REWRITE, SPARSE, encode_dir, encode_file, encode_special  # noqa: E402

DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
               "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}


def st_file(tensors: dict[str, tuple[str, list[int], bytes]], metadata: dict[str, str] | None = None,
            pad_to: int = 8) -> bytes:
    """A safetensors file: tensors in name order, header padded with spaces."""
    header: dict[str, object] = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    data = b""
    for name in sorted(tensors):
        dtype, shape, body = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(body)]}
        data += body
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % pad_to)
    return struct.pack("<Q", len(text)) + text + data


def safetensors_seeds(tmp: Path) -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    seeds: dict[str, bytes] = {}
    for dtype, size in DTYPE_BYTES.items():
        shape = [2, 3]
        seeds[f"dtype_{dtype}"] = st_file({"t": (dtype, shape, rng.bytes(6 * size))})
    seeds["empty_header"] = st_file({})
    seeds["metadata_only"] = st_file({}, {"format": "pt", "k": "v"})
    seeds["scalar"] = st_file({"s": ("F32", [], b"\x00\x00\x80\x3f")})
    seeds["empty_tensor"] = st_file({"e": ("F16", [0, 4], b""), "x": ("U8", [3], b"abc")})
    # zero elements with huge other dimensions (issue 26): legal; numpy holds some of them
    seeds["empty_huge"] = st_file({"a": ("F32", [0, (1 << 64) - 1], b""), "b": ("F32", [0, 1 << 62], b""),
                                   "c": ("U8", [1 << 62, 0], b""), "x": ("U8", [2], b"ab")})
    seeds["many"] = st_file({f"layers.{i}.w": ("BF16", [4, 2], rng.bytes(16)) for i in range(6)},
                            {"format": "pt"})
    seeds["f4"] = st_file({"q": ("F4", [2, 4], rng.bytes(4))})
    seeds["f6"] = st_file({"q": ("F6_E2M3", [4], rng.bytes(3))})
    seeds["unpadded"] = st_file({"t": ("I32", [2], rng.bytes(8))}, pad_to=1)
    seeds["null_metadata"] = struct.pack("<Q", 22) + b'{"__metadata__":null} '
    # near misses: each breaks one rule
    good = st_file({"a": ("F32", [2], rng.bytes(8)), "b": ("U8", [3], b"xyz")})
    seeds["bad_truncated"] = good[:-1]
    seeds["bad_extra_byte"] = good + b"\x00"
    seeds["bad_header_len"] = struct.pack("<Q", 1 << 40) + good[8:]
    seeds["bad_duplicate"] = (struct.pack("<Q", 86) + b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                              b'"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}' + b"\x01")
    seeds["bad_gap"] = (struct.pack("<Q", 56) + b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}   ' + b"xx")
    seeds["bad_overflow"] = st_file({"a": ("F64", [1 << 62, 1 << 62], b"")})
    seeds["short"] = b"\x02\x00\x00\x00\x00\x00\x00"
    # real shards of the tiny DFlash drafter
    from hf2q.testing import make_dflash_checkpoint

    d = make_dflash_checkpoint(tmp / "dflash_sharded", "tiny", sharded=True, num_shards=3)
    for p in sorted(d.glob("*.safetensors")):
        seeds[f"dflash_{p.stem}"] = p.read_bytes()
    return seeds


def checkpoint_seeds(tmp: Path) -> dict[str, bytes]:
    from hf2q.testing import make_dflash_checkpoint, make_qwen35_moe_checkpoint

    seeds: dict[str, bytes] = {}
    dirs = {
        "dflash_single": make_dflash_checkpoint(tmp / "d1", "tiny"),
        "dflash_sharded": make_dflash_checkpoint(tmp / "d2", "tiny", sharded=True, num_shards=3),
        "qwen35_single": make_qwen35_moe_checkpoint(tmp / "q1", "tiny"),
        "qwen35_sharded": make_qwen35_moe_checkpoint(tmp / "q2", "tiny", sharded=True),
        "qwen35_fused": make_qwen35_moe_checkpoint(tmp / "q3", "tiny", fused_gate_up=True),
        "qwen35_multimodal": make_qwen35_moe_checkpoint(tmp / "q4", "tiny", multimodal=True, mtp=False),
    }
    for key, d in dirs.items():
        seeds[key] = encode_dir(d)
    # variants: a shard missing, a bad shard name, an index with a tensor in the wrong shard, truncation
    d2 = dirs["dflash_sharded"]
    index = json.loads((d2 / "model.safetensors.index.json").read_text())
    files = {p.name: p.read_bytes() for p in d2.iterdir()}
    no_shard = {k: v for k, v in files.items() if k != "model-00002-of-00003.safetensors"}
    seeds["dflash_missing_shard"] = b"".join(encode_file(k, v) for k, v in sorted(no_shard.items()))
    bad = json.loads(json.dumps(index))
    first = next(iter(bad["weight_map"]))
    bad["weight_map"][first] = "../model-00001-of-00003.safetensors"
    files_bad = dict(files, **{"model.safetensors.index.json": json.dumps(bad).encode()})
    seeds["dflash_bad_shard_name"] = b"".join(encode_file(k, v) for k, v in sorted(files_bad.items()))
    moved = json.loads(json.dumps(index))
    moved["weight_map"][first] = "model-00003-of-00003.safetensors"
    files_moved = dict(files, **{"model.safetensors.index.json": json.dumps(moved).encode()})
    seeds["dflash_wrong_shard"] = b"".join(encode_file(k, v) for k, v in sorted(files_moved.items()))
    # single file truncated by 100 bytes after its header (kind 3 entry)
    single = dirs["dflash_single"] / "model.safetensors"
    size = single.stat().st_size
    seeds["dflash_truncated"] = seeds["dflash_single"] + bytes([2 | (3 << 3)]) + struct.pack("<I", size - 100)
    # issue 11: special files, oversized configs, in-place rewrites after validation
    for what, tag in ((FIFO, "fifo"), (DIRECTORY, "dir"), (DEV_ZERO, "devzero")):
        seeds[f"dflash_config_{tag}"] = seeds["dflash_single"] + encode_special("config.json", what)
        seeds[f"dflash_index_{tag}"] = seeds["dflash_sharded"] + encode_special("model.safetensors.index.json", what)
        seeds[f"dflash_shard_{tag}"] = seeds["dflash_sharded"] + encode_special("model-00002-of-00003.safetensors", what)
    seeds["dflash_config_sparse_5mib"] = seeds["dflash_single"] + encode_special("config.json", SPARSE, 5)
    seeds["qwen35_rewrite_in_place"] = seeds["qwen35_single"] + encode_special("model.safetensors", REWRITE)
    seeds["dflash_rewrite_shard"] = seeds["dflash_sharded"] + encode_special("model-00001-of-00003.safetensors", REWRITE)
    cfg = json.loads((dirs["dflash_single"] / "config.json").read_text())
    for key, value in (("num_hidden_layers", 10**9), ("num_hidden_layers", 1024), ("hidden_size", 10**30)):
        seeds[f"dflash_config_{key}_{len(str(value))}"] = seeds["dflash_single"] + encode_file(
            "config.json", json.dumps(dict(cfg, **{key: value})).encode())
    seeds["dflash_config_deep"] = seeds["dflash_single"] + encode_file("config.json", b"[" * 5000 + b"]" * 5000)
    return seeds


def byte_seeds(tag: str) -> dict[str, bytes]:
    out = {}
    for i, n in enumerate([16, 64, 256, 1024, 4096]):
        out[f"{tag}_{n}"] = hashlib.shake_256(f"{tag}{i}".encode()).digest(n)
    out[f"{tag}_zeros"] = bytes(512)
    out[f"{tag}_ones"] = b"\xff" * 512
    return out


def write_all(out: Path) -> dict[str, int]:
    counts = {}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        groups = {
            "safetensors": safetensors_seeds(tmp),
            "checkpoint": checkpoint_seeds(tmp),
            "ops": byte_seeds("ops"),
            "device": byte_seeds("device"),
            "hub": byte_seeds("hub"),
        }
    for target, seeds in groups.items():
        d = out / target
        d.mkdir(parents=True, exist_ok=True)
        for name, body in seeds.items():
            (d / name).write_bytes(body)
        counts[target] = len(seeds)
    return counts


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    counts = write_all(Path(argv[1]))
    print("seed corpus:", ", ".join(f"{k} {v}" for k, v in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
