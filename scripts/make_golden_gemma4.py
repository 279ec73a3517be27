#!/usr/bin/env python3
"""Regenerate the Gemma 4 golden fixtures under tests/data/gemma4/.

Not run in CI. CI reads only what this script committed (safetensors, JSON
and ``.npz`` files), so the golden tests need neither torch nor transformers.

Per variant (``tests/data/gemma4/<variant>/``):

- ``hf/``: a tiny checkpoint written by transformers' ``save_pretrained``
  (weights and ``config.json`` exactly as written), plus a ``tokenizer.json``
  written here that holds only what the converter reads of it: the token
  count (``model.vocab`` + ``added_tokens``), which decides how many embedding
  rows it keeps;
- ``converted.json`` + ``converted.npz``: what llama.cpp's
  ``convert_hf_to_gguf.py`` makes of ``hf/`` with ``--outtype`` q8_0, f32 and
  bf16: every tensor (GGUF name, GGML type, numpy shape, bytes; a SHA-256
  prefix names each distinct content, stored once in the ``.npz``) and the
  ``gemma4.*`` metadata.

The ``*_published`` variant has the same weights as its base and the base's
``config.json`` rewritten into the form Google publishes (root
``global_head_dim`` / ``num_global_key_value_heads`` instead of the
``per_layer_config`` that transformers 5.24 writes); it is marked "edited".
``config_variants.json``: fixtures' configs with keys removed or changed (also
"edited"), and the metadata the converter writes for each (what it assumes
for the keys a file leaves out).

Pinned: torch 2.13.0+cpu, transformers 5.24.0, llama-cpp-python 0.3.36 (its
sdist ships ``convert_hf_to_gguf.py``, ``conversion/`` and ``gguf-py`` under
``vendor/llama.cpp``). The sdist is fetched with ``pip download`` into a cache
(default ``~/.cache/hf2q-golden``) and only those parts are extracted there;
nothing of llama.cpp or transformers is copied into this repository.

The converter runs in this process with ``Gemma4Model.set_vocab`` replaced
(at run time only) by a function that writes nothing: the tokenizer's
metadata is not compared, and the tiny tokenizer.json is not a loadable
tokenizer.

Usage::

    python3 -m venv .venv-golden
    .venv-golden/bin/pip install "torch==2.13.0+cpu" "transformers==5.24.0" safetensors numpy scikit-build-core
    .venv-golden/bin/python scripts/make_golden_gemma4.py
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import io
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The same pins and the same converter fetch as the Qwen / DFlash golden data.
from make_golden import LLAMA_CPP_PYTHON, OUTTYPES, PINNED, fetch_converter  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "data" / "gemma4"

# Tiny Gemma 4 text models. Every quantized row is a multiple of 32; the full
# layers' head dim differs from the sliding one (else transformers drops the
# override and the converter finds no full-layer head dim); the full layers'
# RoPE is "proportional" (the converter requires it).
MOE_TEXT = dict(
    vocab_size=96, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=2, head_dim=32, global_head_dim=64, num_global_key_value_heads=1, attention_k_eq_v=True,
    enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32,
    hidden_size_per_layer_input=0, sliding_window=64, final_logit_softcapping=30.0, max_position_embeddings=4096,
    layer_types=["sliding_attention", "full_attention"],
)
# E2B-shaped dense: per-layer embeddings, KV sharing, double-wide MLP on the
# shared layers, V projections on every layer, its own LM head.
DENSE_TEXT = dict(
    vocab_size=96, hidden_size=32, intermediate_size=32, num_hidden_layers=4, num_attention_heads=2,
    num_key_value_heads=1, head_dim=32, global_head_dim=64, attention_k_eq_v=False, hidden_size_per_layer_input=32,
    vocab_size_per_layer_input=96, num_kv_shared_layers=2, use_double_wide_mlp=True, sliding_window=64,
    max_position_embeddings=4096, tie_word_embeddings=False,
    layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
)
# 31B-like dense (no MoE, no per-layer embeddings), k_eq_v full layer, saved
# in F32: the converter then keeps F32 sources as they are and rounds them to
# BF16 / quantizes them itself.
DENSE_F32_TEXT = dict(
    vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=2, head_dim=32, global_head_dim=64, num_global_key_value_heads=1, attention_k_eq_v=True,
    hidden_size_per_layer_input=0, sliding_window=64, max_position_embeddings=4096,
    layer_types=["sliding_attention", "full_attention"],
)
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
              head_dim=16, patch_size=4, position_embedding_size=64, pooling_kernel_size=2)

# name -> (class, text config, save_pretrained kwargs, tokens in tokenizer.json, note)
VARIANTS: dict[str, tuple[str, dict[str, Any], dict[str, Any], int | None, str]] = {
    "gemma4_moe_causal_lm": (
        "Gemma4ForCausalLM", MOE_TEXT, {}, 96,
        "26B-A4B layout (MoE + dense MLP, k_eq_v full layers, tied), text-only, single file"),
    "gemma4_moe_conditional_generation": (
        "Gemma4ForConditionalGeneration", MOE_TEXT, {"max_shard_size": "40KB"}, 96,
        "multimodal wrapper with a vision tower (skipped), sharded with an index"),
    "gemma4_dense_ple": (
        "Gemma4ForCausalLM", DENSE_TEXT, {}, 90,
        "E2B-shaped dense: PLE, KV-shared layers, double-wide MLP, untied lm_head; "
        "tokenizer has 90 of 96 tokens (the converter trims the embedding)"),
    "gemma4_dense_f32_source": (
        "Gemma4ForCausalLM", DENSE_F32_TEXT, {}, 60,
        "31B-like dense (no MoE, no PLE), k_eq_v full layer, checkpoint saved in F32; tokenizer has 60 of 64 "
        "tokens"),
}
#: checkpoint dtype by variant (default bfloat16, as Google's checkpoints)
DTYPES = {"gemma4_dense_f32_source": "float32"}
# Edited-config variants: base variant's weights, config rewritten.
PUBLISHED = {"gemma4_moe_published": "gemma4_moe_causal_lm"}


# Config-only variants: a fixture's config.json with keys taken out or changed
# (edited here on purpose), converted (--outtype f32) only to record the
# metadata the converter writes, i.e. the values it takes for what the file
# does not say. name -> (base variant, edits of the text config)
def _drop(*keys: str):
    return lambda t: [t.pop(k) for k in keys]


def _put(**kv: Any):
    return lambda t: t.update(kv)


def _rope_full_theta(t: dict[str, Any]) -> None:
    t["rope_parameters"]["full_attention"]["rope_theta"] = 500000.0


CONFIG_VARIANTS: dict[str, tuple[str, Any]] = {
    "no_layer_types": ("gemma4_dense_ple", _drop("layer_types")),
    "last_layer_sliding": ("gemma4_dense_ple", _put(layer_types=["sliding_attention", "full_attention",
                                                                 "sliding_attention", "sliding_attention"])),
    "no_rope_parameters": ("gemma4_moe_causal_lm", _drop("rope_parameters")),
    "full_rope_theta": ("gemma4_moe_causal_lm", _rope_full_theta),
    "no_sliding_window": ("gemma4_moe_causal_lm", _drop("sliding_window")),
    "no_max_position_embeddings": ("gemma4_moe_causal_lm", _drop("max_position_embeddings")),
    "no_rms_norm_eps": ("gemma4_moe_causal_lm", _drop("rms_norm_eps")),
    "no_final_logit_softcapping": ("gemma4_moe_causal_lm", _drop("final_logit_softcapping")),
    "no_hidden_size_per_layer_input": ("gemma4_moe_causal_lm", _drop("hidden_size_per_layer_input")),
    "null_hidden_size_per_layer_input": ("gemma4_moe_causal_lm", _put(hidden_size_per_layer_input=None)),
    "no_num_kv_shared_layers": ("gemma4_moe_causal_lm", _drop("num_kv_shared_layers")),
    "no_attention_k_eq_v": ("gemma4_moe_causal_lm", _drop("attention_k_eq_v")),
    "wrapper_no_sliding_window": ("gemma4_moe_conditional_generation", _drop("sliding_window")),
}


def config_variants(conv_dir: Path) -> list[dict[str, Any]]:
    out = []
    for name, (base, edit) in CONFIG_VARIANTS.items():
        src = GOLDEN / base / "hf"
        cfg = json.loads((src / "config.json").read_text())
        edit(cfg.get("text_config", cfg))
        entry: dict[str, Any] = {"name": name, "base": base, "edited": True, "config": cfg}
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp) / "ck"
            d.mkdir()
            for f in src.iterdir():
                if f.name != "config.json":
                    (d / f.name).symlink_to(f)
            (d / "config.json").write_text(json.dumps(cfg, indent=2))
            try:
                convert(conv_dir, d, "f32", Path(tmp) / "out.gguf")
                entry["metadata"] = record(Path(tmp) / "out.gguf", {})["metadata"]
            except BaseException as e:  # the converter refuses the config: record why
                entry["converter_error"] = f"{type(e).__name__}: {e}"
        out.append(entry)
    return out


def check_versions(any_version: bool) -> dict[str, str]:
    found = {}
    for pkg, want in PINNED.items():
        have = md.version(pkg)
        found[pkg] = have
        if have != want and not any_version:
            sys.exit(f"{pkg} {have} installed, {want} pinned (use --any-version to override)")
    found["llama-cpp-python"] = LLAMA_CPP_PYTHON
    return found



def write_tokenizer(out: Path, n_tokens: int) -> None:
    """A tokenizer.json with ``n_tokens`` tokens (5 of them added tokens)."""
    added = 5
    vocab = {f"t{i}": i for i in range(n_tokens - added)}
    tok = {"version": "1.0", "model": {"type": "BPE", "vocab": vocab, "merges": [], "byte_fallback": True},
           "added_tokens": [{"id": n_tokens - added + i, "content": f"<a{i}>", "special": True}
                            for i in range(added)]}
    (out / "tokenizer.json").write_text(json.dumps(tok) + "\n")


def make_checkpoint(name: str, out: Path) -> None:
    import torch
    import transformers as tf

    cls_name, text, save_kw, n_tokens, _ = VARIANTS[name]
    torch.manual_seed(sum(name.encode()))
    if cls_name == "Gemma4ForCausalLM":
        model = tf.Gemma4ForCausalLM(tf.Gemma4TextConfig(**text))
    else:
        tie = text.get("tie_word_embeddings", True)
        config = tf.Gemma4Config(text_config=dict(text), vision_config=dict(VISION), audio_config=None,
                                 tie_word_embeddings=tie)
        model = tf.Gemma4ForConditionalGeneration(config)
    with torch.no_grad():
        # transformers initialises norms, layer_scalar and the router scales
        # to constants; random values make every copy visible.
        for _, p in model.named_parameters():
            if p.ndim <= 1:
                p.copy_(torch.rand_like(p) * 1.5 + 0.25)
        for n, b in model.named_buffers():
            if n.endswith("layer_scalar"):
                b.copy_(torch.rand_like(b) * 1.5 + 0.25)
    model = model.to(getattr(torch, DTYPES.get(name, "bfloat16")))
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(out, **save_kw)
    write_tokenizer(out, n_tokens or text["vocab_size"])


def make_published(name: str, out: Path) -> dict[str, Any]:
    """The base's weights with its per_layer_config turned back into the
    published global_head_dim / num_global_key_value_heads keys."""
    src = GOLDEN / PUBLISHED[name] / "hf"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for f in src.iterdir():  # the base's files, linked (only config.json is committed)
        if f.name != "config.json":
            (out / f.name).symlink_to(f)
    cfg = json.loads((src / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    plc = text.pop("per_layer_config")
    full = [v for k, v in sorted(plc.items()) if text["layer_types"][int(k)] == "full_attention"]
    text["global_head_dim"] = full[0]["head_dim"]
    if "num_key_value_heads" in full[0]:
        text["num_global_key_value_heads"] = full[0]["num_key_value_heads"]
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return cfg


def convert(conv_dir: Path, model_dir: Path, outtype: str, outfile: Path) -> None:
    """Run convert_hf_to_gguf.main() in this process, vocabulary step stubbed."""
    for p in (str(conv_dir / "gguf-py"), str(conv_dir)):
        if p not in sys.path:
            sys.path.insert(0, p)
    import conversion.gemma as gemma  # noqa: PLC0415  (the extracted converter)
    import convert_hf_to_gguf  # noqa: PLC0415

    gemma.Gemma4Model.set_vocab = lambda self: None
    argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", str(model_dir), "--outtype", outtype, "--outfile", str(outfile)]
    try:
        convert_hf_to_gguf.main()
    finally:
        sys.argv = argv


def record(gguf_path: Path, blobs: dict[str, bytes]) -> dict[str, Any]:
    import numpy as np
    import gguf  # the extracted gguf-py (put on sys.path by convert())

    reader = gguf.GGUFReader(gguf_path)
    arch = str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")
    meta: dict[str, Any] = {}
    for key, f in reader.fields.items():
        if key.startswith(arch + ".") or key in ("general.architecture", "general.file_type"):
            v = f.contents()
            meta[key] = v.tolist() if isinstance(v, np.ndarray) else v
    tensors = []
    for t in reader.tensors:
        data = bytes(np.asarray(t.data).view(np.uint8).reshape(-1))
        assert len(data) == int(t.n_bytes), t.name
        h = hashlib.sha256(data).hexdigest()[:24]
        blobs.setdefault(h, data)
        tensors.append({"name": t.name, "type": t.tensor_type.name,
                        "shape": [int(x) for x in reversed(t.shape.tolist())],  # numpy order
                        "nbytes": int(t.n_bytes), "blob": h})
    return {"architecture": arch, "metadata": meta, "tensors": tensors}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "hf2q-golden")
    ap.add_argument("--converter", type=Path, help="an extracted vendor/llama.cpp (instead of --cache)")
    ap.add_argument("--any-version", action="store_true")
    ap.add_argument("--only", nargs="*", help="variant names (default: all)")
    args = ap.parse_args()
    versions = check_versions(args.any_version)
    conv_dir = args.converter or fetch_converter(args.cache)
    names = list(VARIANTS) + list(PUBLISHED)
    if args.only is None or "config_variants" in args.only:
        variants = config_variants(conv_dir)
        (GOLDEN / "config_variants.json").write_text(json.dumps(
            {"converter": f"llama.cpp convert_hf_to_gguf.py from llama-cpp-python {LLAMA_CPP_PYTHON}",
             "versions": versions, "variants": variants}, indent=1) + "\n")
        print(f"config variants: {len(variants)}", file=sys.stderr)
    for name in (names if args.only is None else [n for n in names if n in args.only]):
        vdir = GOLDEN / name
        hf = vdir / "hf"
        vdir.mkdir(parents=True, exist_ok=True)
        out: dict[str, Any] = {"variant": name,
                               "converter": f"llama.cpp convert_hf_to_gguf.py from llama-cpp-python {LLAMA_CPP_PYTHON}",
                               "versions": versions, "outtypes": {}}
        if name in VARIANTS:
            make_checkpoint(name, hf)
            out["note"] = VARIANTS[name][4]
            out["checkpoint_writer"] = f"transformers {versions['transformers']} save_pretrained ({VARIANTS[name][0]})"
        else:
            make_published(name, hf)
            out["note"] = f"{PUBLISHED[name]}'s weights; config.json edited into the published form"
            out["edited"] = True
            out["checkpoint_writer"] = f"as {PUBLISHED[name]}, config.json edited by this script"
        blobs: dict[str, bytes] = {}
        with tempfile.TemporaryDirectory() as tmp:
            for ot in OUTTYPES:
                g = Path(tmp) / f"{ot}.gguf"
                convert(conv_dir, hf, ot, g)
                out["outtypes"][ot] = record(g, blobs)
        import numpy as np

        if name in PUBLISHED:  # same tensors as the base: refer to its blobs
            base = np.load(GOLDEN / PUBLISHED[name] / "converted.npz")
            missing = [b for b in blobs if b not in base.files]
            assert not missing, f"{name}: converter output differs from {PUBLISHED[name]}'s: {missing[:3]}"
            for f in hf.iterdir():
                if f.is_symlink():
                    f.unlink()
            out["blobs_in"] = PUBLISHED[name]
            (vdir / "converted.json").write_text(json.dumps(out, indent=1) + "\n")
            print(f"{name}: {sum(len(o['tensors']) for o in out['outtypes'].values())} tensors, blobs of "
                  f"{PUBLISHED[name]}", file=sys.stderr)
            continue
        buf = io.BytesIO()
        np.savez_compressed(buf, **{k: np.frombuffer(v, dtype=np.uint8) for k, v in sorted(blobs.items())})
        (vdir / "converted.npz").write_bytes(buf.getvalue())
        (vdir / "converted.json").write_text(json.dumps(out, indent=1) + "\n")
        print(f"{name}: {sum(len(o['tensors']) for o in out['outtypes'].values())} tensors, {len(blobs)} blobs, "
              f"npz {len(buf.getvalue()):,} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
