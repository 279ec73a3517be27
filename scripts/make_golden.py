#!/usr/bin/env python3
"""Regenerate the ecosystem-made golden fixtures under tests/data/golden/.

Not run in CI. CI reads only what this script committed (safetensors, JSON and
``.npz`` files), so the golden tests need neither torch nor transformers.

What it makes, per variant (``tests/data/golden/<variant>/``):

- ``hf/``: a tiny checkpoint written by the ecosystem's own writer, its
  ``config.json`` exactly as written (no field added by hand):
  transformers' ``save_pretrained`` for the Qwen3.5-MoE variants,
  ``hf2q.testing.make_dflash_checkpoint`` for the DFlash drafters (written with
  the config fields z-lab's published drafters carry);
- ``converted.json`` + ``converted.npz``: what llama.cpp's
  ``convert_hf_to_gguf.py`` makes of that checkpoint with ``--outtype`` q8_0,
  f32 and bf16: every tensor (GGUF name, GGML type, numpy shape, the HF name
  the converter's own tensor map gives it, bytes) and the architecture's
  metadata key/values. Tensor bytes are stored once per distinct content
  (``blob`` = a SHA-256 prefix) in the ``.npz``.

Pinned versions (checked at start; ``--any-version`` to override):
torch 2.13.0+cpu, transformers 5.24.0, llama-cpp-python 0.3.36 (its sdist ships
llama.cpp's ``convert_hf_to_gguf.py``, ``conversion/`` and ``gguf-py`` under
``vendor/llama.cpp``).

How the converter is obtained: ``pip download --no-deps --no-binary :all:
--no-build-isolation llama-cpp-python==0.3.36`` into a cache directory
(default ``~/.cache/hf2q-golden``; ``--no-build-isolation`` keeps pip from
building cmake from source just to read the sdist's metadata, so
``scikit-build-core`` must be installed in this environment), then only
``convert_hf_to_gguf.py``, ``conversion/`` and ``gguf-py/`` are extracted
there. Nothing of llama.cpp or transformers is copied into this repository.

MTP: transformers saves no ``mtp.*`` tensors and no ``mtp_num_hidden_layers``,
and the converter asserts on such a Qwen3.5 checkpoint unless told ``--no-mtp``,
so the transformers-written variants are converted with ``--no-mtp``. The MTP
block is covered by ``qwen35moe_hf2q_mtp`` (written by
``hf2q.testing.make_qwen35_moe_checkpoint``), converted with MTP on.

What transformers 5.24 can and cannot write: it always writes ``layer_types``
(``full_attention_interval`` is consumed, not saved), never ``mrope_section``
unless given one, turns ``rope_scaling`` into ``rope_parameters``, and writes
fused experts only with ``save_pretrained(save_original_format=False)``.
The absent-field cases it cannot write are the edited ``config_variants``.

How the tokenizer step is skipped: the tiny checkpoints have no tokenizer
files, and no tensor depends on the vocabulary. The converter runs in this
process, with ``TextModel.set_vocab`` replaced (at run time only) by a function
that writes nothing, and ``DFlashModel.set_vocab`` by one that writes only the
``mask_token_id`` (the part of the original that does not need the target's
tokenizer).

Usage (a venv with the pinned packages, plus an environment with hf2q for the
DFlash checkpoints, e.g. the repo's ``.venv``)::

    python3 -m venv .venv-golden
    .venv-golden/bin/pip install "torch==2.13.0+cpu" "transformers==5.24.0" \\
        safetensors numpy sentencepiece scikit-build-core
    .venv-golden/bin/python scripts/make_golden.py --hf2q-python .venv/bin/python
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

PINNED = {"torch": "2.13.0+cpu", "transformers": "5.24.0"}
LLAMA_CPP_PYTHON = "0.3.36"
OUTTYPES = ("q8_0", "f32", "bf16")
REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "data" / "golden"

# The tiny Qwen3.5-MoE text model: H=32, 4 layers (3 linear + 1 full), E=4,
# I=32, nk=2 != nv=6 (the V-head reorder is exercised), every quantized row a
# multiple of 32. Only constructor arguments; what reaches config.json is
# transformers' choice.
QWEN_TEXT = dict(
    vocab_size=128, hidden_size=32, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
    head_dim=32, linear_conv_kernel_dim=4, linear_key_head_dim=32, linear_value_head_dim=32,
    linear_num_key_heads=2, linear_num_value_heads=6, moe_intermediate_size=32,
    shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2, max_position_embeddings=4096,
)
VISION = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, patch_size=4, temporal_patch_size=2,
              spatial_merge_size=2, out_hidden_size=32, num_position_embeddings=16)

# name -> (class, extra text-config arguments, save_pretrained arguments, note)
QWEN_VARIANTS: dict[str, tuple[str, dict[str, Any], dict[str, Any], str]] = {
    "qwen35moe_causal_lm": (
        "Qwen3_5MoeForCausalLM", {}, {},
        "text-only, single file, per-expert experts, no mrope_section, rope_theta default"),
    "qwen35moe_causal_lm_fused_mrope": (
        "Qwen3_5MoeForCausalLM",
        {"rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                             "mrope_section": [2, 1, 1], "mrope_interleaved": True},
         "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"]},
        {"save_original_format": False},
        "text-only, fused gate_up_proj experts (save_original_format=False), mrope_section stated"),
    "qwen35moe_conditional_generation": (
        "Qwen3_5MoeForConditionalGeneration", {}, {"max_shard_size": "150KB"},
        "vision tower, sharded with an index, per-expert experts, no mrope_section"),
    "qwen35moe_conditional_generation_fused": (
        "Qwen3_5MoeForConditionalGeneration",
        {"rope_scaling": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25}},
        {"max_shard_size": "150KB", "save_original_format": False},
        "vision tower, sharded, fused experts; rope given as rope_scaling (transformers writes rope_parameters)"),
}

# MTP: transformers saves no mtp.* tensors, so the MTP block is checked on a
# checkpoint written by hf2q.testing.make_qwen35_moe_checkpoint (real HF naming,
# real checkpoints' dtypes: A_log F32, the rest BF16; the multimodal wrapper,
# sharded), converted by the same converter with its MTP export on.
HF2Q_QWEN_VARIANTS: dict[str, dict[str, Any]] = {
    "qwen35moe_hf2q_mtp": {
        "config": {
            "model_type": "qwen3_5_moe_text", "attn_output_gate": True, "head_dim": 32, "hidden_act": "silu",
            "hidden_size": 32, "full_attention_interval": 4,
            "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
            "linear_conv_kernel_dim": 4, "linear_key_head_dim": 32, "linear_num_key_heads": 2,
            "linear_num_value_heads": 6, "linear_value_head_dim": 32, "max_position_embeddings": 4096,
            "moe_intermediate_size": 32, "mtp_num_hidden_layers": 1, "num_attention_heads": 2, "num_experts": 4,
            "num_experts_per_tok": 2, "num_hidden_layers": 4, "num_key_value_heads": 1, "rms_norm_eps": 1e-06,
            "shared_expert_intermediate_size": 32, "tie_word_embeddings": False, "vocab_size": 128,
            "rope_parameters": {"mrope_interleaved": True, "rope_type": "default", "rope_theta": 10000000,
                                "partial_rotary_factor": 0.25},
        },
        "kwargs": {"multimodal": True, "sharded": True, "fused_gate_up": True},
    },
}

# z-lab drafters' config fields (docs/DFLASH.md), tiny sizes.
DFLASH_VARIANTS: dict[str, dict[str, Any]] = {
    "dflash_original": {
        "architectures": ["DFlashDraftModel"], "attention_bias": False, "attention_dropout": 0.0,
        "block_size": 16, "bos_token_id": 2,
        "dflash_config": {"mask_token_id": 5, "target_layer_ids": [1, 3]},
        "dtype": "bfloat16", "eos_token_id": 1, "head_dim": 32, "hidden_act": "silu", "hidden_size": 64,
        "intermediate_size": 128, "layer_types": ["sliding_attention", "full_attention"],
        "max_position_embeddings": 4096, "max_window_layers": 2, "model_type": "qwen3",
        "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "num_target_layers": 6,
        "pad_token_id": 0, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 10000000,
        "sliding_window": 64, "tie_word_embeddings": False, "use_cache": True, "use_sliding_window": True,
        "vocab_size": 256,
    },
    "dflash_new": {
        "architectures": ["DFlashDraftModel"], "attention_bias": False, "attention_dropout": 0.0,
        "dflash_config": {"block_size": 8, "mask_token_id": 7, "target_layer_ids": [1, 2, 4]},
        "dtype": "bfloat16", "head_dim": 32, "hidden_act": "silu", "hidden_size": 64,
        "intermediate_size": 96, "max_position_embeddings": 4096, "model_type": "qwen3",
        "num_attention_heads": 2, "num_hidden_layers": 1, "num_key_value_heads": 1, "num_target_layers": 8,
        "rms_norm_eps": 1e-06, "rope_parameters": {"rope_theta": 10000000, "rope_type": "default"},
        "sliding_window": None, "tie_word_embeddings": False, "use_cache": True, "use_sliding_window": False,
        "vocab_size": 256,
    },
}


# Config-only variants: a golden checkpoint's config.json with fields taken out
# or moved, converted (--outtype f32) only to record the metadata the converter
# writes, i.e. the values it uses for what the file does not state. These
# configs are edited by this script on purpose (marked "edited" in the JSON);
# the checkpoints above stay exactly as their writer made them.
def _del(*path: str):
    def edit(c: dict[str, Any]) -> None:
        d = c
        for k in path[:-1]:
            d = d[k]
        del d[path[-1]]
    return edit


def _set(value: Any, *path: str):
    def edit(c: dict[str, Any]) -> None:
        d = c
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value
    return edit


def _rename(old: str, new: str):
    def edit(c: dict[str, Any]) -> None:
        c[new] = c.pop(old)
    return edit


CONFIG_VARIANTS: dict[str, tuple[str, list[Any]]] = {
    "qwen_no_mrope_prf_0.5": ("qwen35moe_causal_lm", [_set(0.5, "rope_parameters", "partial_rotary_factor")]),
    "qwen_no_partial_rotary_factor": ("qwen35moe_causal_lm", [_del("rope_parameters", "partial_rotary_factor")]),
    "qwen_no_rope_parameters": ("qwen35moe_causal_lm", [_del("rope_parameters")]),
    "qwen_rope_scaling": ("qwen35moe_causal_lm_fused_mrope", [_rename("rope_parameters", "rope_scaling")]),
    "qwen_root_rope_theta": ("qwen35moe_causal_lm", [_del("rope_parameters"), _set(1e6, "rope_theta"),
                                                     _set(0.25, "partial_rotary_factor")]),
    "qwen_no_layer_types": ("qwen35moe_causal_lm", [_del("layer_types")]),
    "qwen_no_layer_types_interval_2": ("qwen35moe_causal_lm_fused_mrope",
                                       [_del("layer_types"), _set(2, "full_attention_interval")]),
    "qwen_layer_types_and_interval": ("qwen35moe_causal_lm", [_set(4, "full_attention_interval")]),
    "qwen_mm_no_text_rope_parameters": ("qwen35moe_conditional_generation", [_del("text_config", "rope_parameters")]),
    "qwen_mtp_stated": ("qwen35moe_hf2q_mtp", []),
    "qwen_mtp_absent": ("qwen35moe_hf2q_mtp", [_del("text_config", "mtp_num_hidden_layers")]),
    "dflash_no_block_size": ("dflash_original", [_del("block_size")]),
    "dflash_no_mask_token_id": ("dflash_original", [_del("dflash_config", "mask_token_id")]),
    "dflash_no_layer_types": ("dflash_new", [_set(None, "sliding_window")]),
    "dflash_no_rope_theta": ("dflash_original", [_del("rope_theta")]),
    "dflash_new_no_rope_parameters": ("dflash_new", [_del("rope_parameters")]),
}


def check_versions(any_version: bool) -> dict[str, str]:
    found = {}
    for pkg, want in PINNED.items():
        have = md.version(pkg)
        found[pkg] = have
        if have != want and not any_version:
            sys.exit(f"{pkg} {have} installed, {want} pinned (use --any-version to override)")
    found["llama-cpp-python"] = LLAMA_CPP_PYTHON
    found["safetensors"] = md.version("safetensors")
    return found


def fetch_converter(cache: Path) -> Path:
    """llama.cpp's converter from the pinned llama-cpp-python sdist; returns
    the directory holding convert_hf_to_gguf.py."""
    root = cache / f"llama_cpp_python-{LLAMA_CPP_PYTHON}"
    conv = root / "vendor" / "llama.cpp"
    if (conv / "convert_hf_to_gguf.py").is_file():
        return conv
    cache.mkdir(parents=True, exist_ok=True)
    sdist = cache / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
    if not sdist.is_file():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        "--no-build-isolation", f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(cache)],
                       check=True)
    prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp/"
    wanted = (prefix + "convert_hf_to_gguf.py", prefix + "conversion/", prefix + "gguf-py/")
    with tarfile.open(sdist) as tf:
        members = [m for m in tf.getmembers() if m.name.startswith(wanted) and (m.isfile() or m.isdir())]
        tf.extractall(cache, members=members, filter="data")
    return conv


# ----------------------------------------------------------------------------- checkpoints
def make_qwen(name: str, out: Path) -> None:
    import torch
    import transformers as tf

    cls_name, extra, save_kw, _ = QWEN_VARIANTS[name]
    torch.manual_seed(sum(name.encode()))
    text = dict(QWEN_TEXT, **extra)
    if cls_name == "Qwen3_5MoeForCausalLM":
        model = tf.Qwen3_5MoeForCausalLM(tf.Qwen3_5MoeTextConfig(**text))
    else:
        config = tf.Qwen3_5MoeConfig(text_config=text, vision_config=dict(VISION))
        model = tf.Qwen3_5MoeForConditionalGeneration(config)
    with torch.no_grad():
        # transformers initializes the +1-offset norms and A_log/dt_bias to
        # constants; random values make every transform visible.
        for pname, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(torch.rand_like(p) * 1.5 + 0.25)
    model = model.to(torch.bfloat16)
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(out, **save_kw)


def make_hf2q_qwen(name: str, out: Path, hf2q_python: str) -> None:
    if out.exists():
        shutil.rmtree(out)
    v = HF2Q_QWEN_VARIANTS[name]
    code = ("import json, sys; from hf2q.testing import make_qwen35_moe_checkpoint; "
            "make_qwen35_moe_checkpoint(sys.argv[1], json.loads(sys.argv[2]), seed=7, **json.loads(sys.argv[3]))")
    subprocess.run([hf2q_python, "-c", code, str(out), json.dumps(v["config"]), json.dumps(v["kwargs"])],
                   check=True, cwd=REPO)


def make_dflash(name: str, out: Path, hf2q_python: str) -> None:
    if out.exists():
        shutil.rmtree(out)
    code = ("import json, sys; from hf2q.testing import make_dflash_checkpoint; "
            "make_dflash_checkpoint(sys.argv[1], json.loads(sys.argv[2]), seed=int(sys.argv[3]))")
    subprocess.run([hf2q_python, "-c", code, str(out), json.dumps(DFLASH_VARIANTS[name]), str(len(name))],
                   check=True, cwd=REPO)


# ----------------------------------------------------------------------------- conversion
def convert(conv_dir: Path, model_dir: Path, outtype: str, outfile: Path, extra: list[str]) -> None:
    """Run convert_hf_to_gguf.main() in this process, vocabulary step stubbed."""
    for p in (str(conv_dir / "gguf-py"), str(conv_dir)):
        if p not in sys.path:
            sys.path.insert(0, p)
    import conversion.base as base  # noqa: PLC0415  (the extracted converter)
    import conversion.qwen as qwen  # noqa: PLC0415
    import convert_hf_to_gguf  # noqa: PLC0415

    def no_vocab(self: Any) -> None:
        return None

    def dflash_vocab(self: Any) -> None:
        mask = self.hparams.get("dflash_config", {}).get("mask_token_id")
        if mask is not None:
            self.gguf_writer.add_mask_token_id(mask)

    base.TextModel.set_vocab = no_vocab
    qwen.DFlashModel.set_vocab = dflash_vocab
    argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", str(model_dir), "--outtype", outtype, "--outfile", str(outfile), *extra]
    try:
        convert_hf_to_gguf.main()
    finally:
        sys.argv = argv


def _reset_converter_state() -> None:
    """convert_hf_to_gguf sets class attributes (no_mtp) on the model class;
    undo them so that one conversion does not leak into the next."""
    import conversion.qwen as qwen  # noqa: PLC0415

    for cls in (qwen.Qwen3_5MoeTextModel,):
        for attr in ("no_mtp", "mtp_only"):
            if attr in cls.__dict__:
                delattr(cls, attr)


def record(conv_dir: Path, gguf_path: Path, blobs: dict[str, bytes], hf_dir: Path) -> dict[str, Any]:
    import numpy as np
    import gguf  # the extracted gguf-py (put on sys.path by convert())

    reader = gguf.GGUFReader(gguf_path)
    arch = str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")
    meta: dict[str, Any] = {}
    for key, f in reader.fields.items():
        if not (key.startswith(arch + ".") or key in ("general.architecture", "general.file_type",
                                                       "tokenizer.ggml.mask_token_id")):
            continue
        v = f.contents()
        meta[key] = v.tolist() if isinstance(v, np.ndarray) else v
    n_blocks = meta[f"{arch}.block_count"]
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], n_blocks)
    hf_names: dict[str, str] = {}  # GGUF name -> checkpoint name, by the converter's own tensor map
    if arch == "dflash":
        from safetensors import safe_open

        for f in sorted(hf_dir.glob("*.safetensors")):
            with safe_open(str(f), framework="np") as sf:
                for k in sf.keys():
                    g = tmap.get_name("model." + k, try_suffixes=(".weight", ".bias"))
                    if g is not None:
                        hf_names[g] = k
    tensors = []
    for t in reader.tensors:
        data = bytes(np.asarray(t.data).view(np.uint8).reshape(-1))
        assert len(data) == int(t.n_bytes), t.name
        h = hashlib.sha256(data).hexdigest()[:24]
        blobs.setdefault(h, data)
        tensors.append({
            "name": t.name,
            "type": t.tensor_type.name,
            "shape": [int(x) for x in reversed(t.shape.tolist())],  # numpy order (GGUF ne reversed)
            "nbytes": int(t.n_bytes),
            "blob": h,
            **({"hf_name": hf_names[t.name]} if t.name in hf_names else {}),
        })
    return {"architecture": arch, "metadata": meta, "tensors": tensors}


def config_variants(conv_dir: Path) -> list[dict[str, Any]]:
    out = []
    for name, (base, edits) in CONFIG_VARIANTS.items():
        src = GOLDEN / base / "hf"
        cfg = json.loads((src / "config.json").read_text())
        for e in edits:
            e(cfg)
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp) / "ck"
            d.mkdir()
            for f in src.iterdir():
                if f.name != "config.json":
                    (d / f.name).symlink_to(f)
            (d / "config.json").write_text(json.dumps(cfg, indent=2))
            entry: dict[str, Any] = {"name": name, "base": base, "edited": True, "config": cfg}
            try:
                no_mtp = base in QWEN_VARIANTS
                convert(conv_dir, d, "f32", Path(tmp) / "out.gguf", ["--no-mtp"] if no_mtp else [])
                _reset_converter_state()
                entry["converter"] = {k: v for k, v in record(conv_dir, Path(tmp) / "out.gguf", {}, d).items()
                                      if k != "tensors"}
            except BaseException as e:  # the converter refuses the config: record why
                entry["converter_error"] = f"{type(e).__name__}: {e}"
        out.append(entry)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "hf2q-golden")
    ap.add_argument("--hf2q-python", default=sys.executable, help="a python with hf2q installed (DFlash checkpoints)")
    ap.add_argument("--any-version", action="store_true")
    ap.add_argument("--only", nargs="*", help="variant names (default: all)")
    args = ap.parse_args()
    versions = check_versions(args.any_version)
    conv_dir = fetch_converter(args.cache)
    names = list(QWEN_VARIANTS) + list(HF2Q_QWEN_VARIANTS) + list(DFLASH_VARIANTS)
    for name in (names if args.only is None else [n for n in args.only if n in names]):
        vdir = GOLDEN / name
        hf = vdir / "hf"
        vdir.mkdir(parents=True, exist_ok=True)
        if name in QWEN_VARIANTS:
            make_qwen(name, hf)
            note = QWEN_VARIANTS[name][3]
            writer = f"transformers {versions['transformers']} save_pretrained ({QWEN_VARIANTS[name][0]})"
        elif name in HF2Q_QWEN_VARIANTS:
            make_hf2q_qwen(name, hf, args.hf2q_python)
            note = "MTP block (transformers saves none): multimodal, sharded, fused experts, A_log F32"
            writer = "hf2q.testing.make_qwen35_moe_checkpoint"
        else:
            make_dflash(name, hf, args.hf2q_python)
            note = "DFlash drafter with z-lab's config fields"
            writer = "hf2q.testing.make_dflash_checkpoint"
        blobs: dict[str, bytes] = {}
        out: dict[str, Any] = {"variant": name, "note": note, "checkpoint_writer": writer,
                               "converter": f"llama.cpp convert_hf_to_gguf.py from llama-cpp-python {LLAMA_CPP_PYTHON}",
                               "versions": versions, "outtypes": {}}
        with tempfile.TemporaryDirectory() as tmp:
            for ot in OUTTYPES:
                g = Path(tmp) / f"{ot}.gguf"
                # transformers saves no mtp.* tensors and no mtp_num_hidden_layers;
                # the converter then needs --no-mtp (it asserts otherwise).
                convert(conv_dir, hf, ot, g, ["--no-mtp"] if name in QWEN_VARIANTS else [])
                _reset_converter_state()
                out["outtypes"][ot] = record(conv_dir, g, blobs, hf)
        import numpy as np

        buf = io.BytesIO()
        np.savez_compressed(buf, **{k: np.frombuffer(v, dtype=np.uint8) for k, v in sorted(blobs.items())})
        (vdir / "converted.npz").write_bytes(buf.getvalue())
        (vdir / "converted.json").write_text(json.dumps(out, indent=1, sort_keys=False) + "\n")
        print(f"{name}: {sum(len(o['tensors']) for o in out['outtypes'].values())} tensors, "
              f"{len(blobs)} blobs, npz {len(buf.getvalue()):,} bytes", file=sys.stderr)
    if args.only is None or "config_variants" in args.only:
        variants = config_variants(conv_dir)
        (GOLDEN / "config_variants.json").write_text(
            json.dumps({"converter": f"llama.cpp convert_hf_to_gguf.py from llama-cpp-python {LLAMA_CPP_PYTHON}",
                        "versions": versions, "variants": variants}, indent=1) + "\n")
        print(f"config variants: {len(variants)}", file=sys.stderr)


if __name__ == "__main__":
    main()
