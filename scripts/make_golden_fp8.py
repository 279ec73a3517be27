#!/usr/bin/env python3
"""Regenerate the FP8 golden fixtures under tests/data/fp8/ (docs/FP8.md).

Not run in CI. CI reads only what this script committed.

Per variant (``tests/data/fp8/<variant>/``):

- ``hf/``: a tiny FP8 checkpoint made the way the Hub's quantizers make them
  (:mod:`hf2q.testing.fp8_checkpoint`: per block / row / tensor scale
  ``amax / 448`` in float32, the weight ``x / scale`` saturated and rounded
  by the float8 cast, the scale stored in the dtype the real repos use;
  embeddings, ``lm_head``, norms, routers, shared-expert gates and linear
  attention's ``conv1d`` / ``in_proj_a`` / ``in_proj_b`` left in BF16) from a
  BF16 checkpoint written by transformers' ``save_pretrained``;
- ``converted.json`` + ``converted.npz``: what llama.cpp's
  ``convert_hf_to_gguf.py`` (llama-cpp-python 0.3.36's sdist, as
  scripts/make_golden.py) makes of it with ``--outtype`` q8_0, f32 and bf16:
  every tensor with its GGUF name, type, shape, the checkpoint name the
  converter's own tensor map gives it, and its bytes.

Variants:

- ``qwen35moe_fp8_block128``: tests/data/golden/qwen35moe_causal_lm/hf (the
  transformers-written Qwen3.5-MoE) as Qwen's ``-FP8`` repos store it:
  ``quant_method: fp8``, ``weight_block_size [128, 128]``, BF16
  ``weight_scale_inv``, experts one per expert (rows of 320 and 64 make
  partial edge blocks);
- ``qwen35moe_fp8_fused``: the fused-experts Qwen3.5-MoE golden checkpoint
  (``gate_up_proj`` ``[E, 2I, H]``) in the same form: the gate and up halves
  are cut after decoding;
- ``qwen3_fp8_e5m2_tensor``: the Qwen3 model below with E5M2 weights and
  one F32 ``weight_scale_inv`` per tensor (``quant_method: fp8`` without
  ``weight_block_size``);
- ``gemma4_moe_fp8_ct_channel``: tests/data/gemma4/gemma4_moe_causal_lm/hf
  (transformers-written Gemma 4 MoE) as compressed-tensors per-channel FP8
  (its fused experts, which carry no ``.weight``, stay BF16);
- ``qwen3_fp8_deepseek``: a tiny transformers ``Qwen3ForCausalLM`` (an
  architecture hf2q has no family for: the generic family loads it) as
  DeepSeek-V3 stores FP8: F32 ``weight_scale_inv``, here with blocks of
  [32, 48] (several blocks per matrix, partial at both edges);
- ``qwen3_fp8_ct_channel``: the same model as llm-compressor's
  compressed-tensors FP8 (``float-quantized``, strategy ``channel``, BF16
  ``weight_scale`` [rows, 1]);
- ``qwen3_fp8_ct_block``: the same as llm-compressor's ``FP8_BLOCK``
  (strategy ``block``, here blocks of [32, 48], BF16 ``weight_scale``);
- ``qwen35moe_cond_fp8_block128``: tests/data/golden/qwen35moe_conditional_generation
  (transformers' Qwen3.5-MoE ConditionalGeneration, the layout of the real
  ``-FP8`` repos: ``model.language_model.*`` and a vision tower) as Qwen
  stores FP8;
- ``gptoss_mxfp4``: a tiny transformers ``GptOssForCausalLM`` with its
  experts as OpenAI publishes them (``*_blocks`` uint8 + ``*_scales`` E8M0,
  ``quant_method: mxfp4``; :func:`hf2q.testing.fp8_checkpoint.mxfp4_checkpoint`),
  which the converter repacks into ggml MXFP4.

The vocabulary step is stubbed as in scripts/make_golden.py (no tokenizer
files; no tensor depends on them).

``--files``: for the generic family's variants (``qwen3_*``), the
converter's whole file instead, from the committed ``hf/`` (not remade):
``converted_file.json``, every key/value and tensor info and each tensor's
SHA-256 for each outtype (scripts/make_golden_gguf.py's ``describe``), read
by tests/test_convert_generic_fp8.py to compare ``hf2q convert``'s whole
file.

Usage (an environment with hf2q, torch 2.13.0+cpu and transformers 5.24.0)::

    python scripts/make_golden_fp8.py [--converter DIR] [--only VARIANT ...] [--files]
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "data" / "fp8"
OUTTYPES = ("q8_0", "f32", "bf16")

QWEN3_TEXT = dict(vocab_size=128, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=512,
                  tie_word_embeddings=False)

# name -> (base, fp8_checkpoint arguments, converter arguments, note)
VARIANTS: dict[str, tuple[str, dict[str, Any], list[str], str]] = {
    "qwen35moe_fp8_block128": (
        "qwen35moe_causal_lm", dict(method="fp8", strategy="block", block=(128, 128), scale_dtype="bf16"),
        ["--no-mtp"], "Qwen3.5-MoE as Qwen's -FP8 repos: fp8 block 128x128, BF16 scale_inv, per-expert experts"),
    "qwen35moe_fp8_fused": (
        "qwen35moe_causal_lm_fused_mrope", dict(method="fp8", strategy="block", block=(128, 128), scale_dtype="bf16"),
        ["--no-mtp"], "Qwen3.5-MoE with fused gate_up_proj experts in FP8 (scale [E, 2I/128, H/128]), block 128x128"),
    "qwen3_fp8_e5m2_tensor": (
        "qwen3", dict(method="fp8", strategy="tensor", fmt="f8_e5m2", scale_dtype="f32"),
        [], "Qwen3 dense, E5M2 weights with one F32 scale_inv per tensor (fp8 without weight_block_size)"),
    "gemma4_moe_fp8_ct_channel": (
        "gemma4/gemma4_moe_causal_lm", dict(method="compressed-tensors", strategy="channel", scale_dtype="bf16"),
        [], "Gemma 4 MoE as compressed-tensors FP8 (per-channel BF16 weight_scale; fused experts stay BF16)"),
    "qwen3_fp8_deepseek": (
        "qwen3", dict(method="fp8", strategy="block", block=(32, 48), scale_dtype="f32"),
        [], "Qwen3 dense (generic family) as DeepSeek-V3 stores FP8: F32 scale_inv, blocks 32x48"),
    "gptoss_mxfp4": (
        "gptoss", dict(), [], "gpt-oss experts in MXFP4 (*_blocks + *_scales), the rest BF16"),
    "qwen3_fp8_ct_channel": (
        "qwen3", dict(method="compressed-tensors", strategy="channel", scale_dtype="bf16"),
        [], "Qwen3 dense (generic family) as compressed-tensors FP8: per-channel BF16 weight_scale"),
    "qwen3_fp8_ct_block": (
        "qwen3", dict(method="compressed-tensors", strategy="block", block=(32, 48), scale_dtype="bf16"),
        [], "Qwen3 dense (generic family) as llm-compressor's FP8_BLOCK: BF16 weight_scale per 32x48 block"),
    "qwen35moe_cond_fp8_block128": (
        "qwen35moe_conditional_generation", dict(method="fp8", strategy="block", block=(128, 128),
                                                 scale_dtype="bf16"),
        ["--no-mtp"], "Qwen3.5-MoE in the ConditionalGeneration layout the real Qwen3.5/3.6 -FP8 repos have "
                      "(model.language_model.*, the vision tower BF16), fp8 block 128x128, BF16 scale_inv"),
}


def _golden_module() -> Any:
    spec = importlib.util.spec_from_file_location("make_golden", REPO / "scripts" / "make_golden.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def make_qwen3(out: Path) -> None:
    import torch
    import transformers as tf

    torch.manual_seed(3)
    model = tf.Qwen3ForCausalLM(tf.Qwen3Config(**QWEN3_TEXT))
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(torch.rand_like(p) * 1.5 + 0.25)
    model = model.to(torch.bfloat16)
    model.save_pretrained(out)


GPTOSS_TEXT = dict(vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=1, head_dim=32, num_local_experts=4, num_experts_per_tok=2, sliding_window=16,
                   max_position_embeddings=512)


def make_gptoss(out: Path) -> None:
    import torch
    import transformers as tf

    torch.manual_seed(5)
    model = tf.GptOssForCausalLM(tf.GptOssConfig(**GPTOSS_TEXT))
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(torch.rand_like(p) * 1.5 + 0.25)
            else:
                p.copy_(torch.randn_like(p) * 0.05)
    model.to(torch.bfloat16).save_pretrained(out)


def convert(conv_dir: Path, model_dir: Path, outtype: str, outfile: Path, extra: list[str]) -> None:
    for p in (str(conv_dir / "gguf-py"), str(conv_dir)):
        if p not in sys.path:
            sys.path.insert(0, p)
    import conversion.gemma as gemma  # noqa: PLC0415
    import conversion.gpt_oss as gpt_oss  # noqa: PLC0415
    import conversion.qwen as qwen  # noqa: PLC0415  (the extracted converter)

    def no_vocab(self: Any) -> None:
        return None

    for cls in (qwen.Qwen2Model, qwen.Qwen3Model, gpt_oss.GptOssModel, gemma.Gemma4Model):
        if "set_vocab" in cls.__dict__:
            cls.set_vocab = no_vocab  # type: ignore[method-assign]
    _golden_module().convert(conv_dir, model_dir, outtype, outfile, extra)


def record(conv_dir: Path, gguf_path: Path, blobs: dict[str, bytes]) -> dict[str, Any]:
    """Every tensor of the converter's file (scripts/make_golden.py's record,
    for any architecture name) and the architecture's key/values."""
    import hashlib

    import gguf
    import numpy as np

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
        h = hashlib.sha256(data).hexdigest()[:24]
        blobs.setdefault(h, data)
        tensors.append({"name": t.name, "type": t.tensor_type.name,
                        "shape": [int(x) for x in reversed(t.shape.tolist())], "nbytes": int(t.n_bytes), "blob": h})
    return {"architecture": arch, "metadata": meta, "tensors": tensors}


def hf_names(conv_dir: Path, hf: Path, arch: str, n_blocks: int) -> dict[str, str]:
    """GGUF name -> checkpoint name, by the converter's own tensor map."""
    import gguf
    from safetensors import safe_open

    by_name = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}
    tmap = gguf.get_tensor_name_map(by_name[arch], n_blocks)
    out: dict[str, str] = {}
    for f in sorted(hf.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as sf:
            for k in sf.keys():
                g = tmap.get_name(k, try_suffixes=(".weight", ".bias"))
                if g is not None:
                    out[g] = k
    return out


def whole_files(conv_dir: Path, mg: Any, only: list[str] | None) -> None:
    """``converted_file.json`` of each generic variant (module doc, ``--files``)."""
    sys.path.insert(0, str(REPO / "scripts"))
    from make_golden_gguf import describe  # noqa: PLC0415

    for name, (base, _, extra, _) in VARIANTS.items():
        if base != "qwen3" or (only and name not in only):
            continue
        hf = OUT / name / "hf"
        out: dict[str, Any] = {"variant": name, "checkpoint": str(hf.relative_to(REPO)),
                               "converter": f"llama.cpp convert_hf_to_gguf.py from llama-cpp-python "
                                            f"{mg.LLAMA_CPP_PYTHON} (vocabulary step stubbed: no tokenizer)",
                               "outtypes": {}}
        with tempfile.TemporaryDirectory() as tmp:
            for ot in OUTTYPES:
                g = Path(tmp) / f"{ot}.gguf"
                convert(conv_dir, hf, ot, g, extra)
                mg._reset_converter_state()
                out["outtypes"][ot] = describe(g)
        (OUT / name / "converted_file.json").write_text(json.dumps(out, indent=1) + "\n")
        print(f"{name}: whole files for {', '.join(OUTTYPES)}", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--converter", type=Path, default=None,
                    help="directory holding convert_hf_to_gguf.py (default: fetched as scripts/make_golden.py does)")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "hf2q-golden")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--files", action="store_true",
                    help="the converter's whole file of the committed generic variants (converted_file.json)")
    args = ap.parse_args()
    mg = _golden_module()
    conv_dir = args.converter or mg.fetch_converter(args.cache)
    if args.files:
        whole_files(conv_dir, mg, args.only)
        return
    from hf2q.testing.fp8_checkpoint import fp8_checkpoint, mxfp4_checkpoint

    import numpy as np

    for name, (base, kw, extra, note) in VARIANTS.items():
        if args.only and name not in args.only:
            continue
        vdir = OUT / name
        hf = vdir / "hf"
        if hf.exists():
            shutil.rmtree(hf)
        vdir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            if base in ("qwen3", "gptoss"):
                src = Path(tmp) / "bf16"
                (make_qwen3 if base == "qwen3" else make_gptoss)(src)
            else:
                src = REPO / "tests" / "data" / (base if "/" in base else "golden/" + base) / "hf"
            if base == "gptoss":
                mxfp4_checkpoint(src, hf)
            else:
                fp8_checkpoint(src, hf, **kw)
            blobs: dict[str, bytes] = {}
            out: dict[str, Any] = {"variant": name, "note": note, "base": base, "quantizer": kw,
                                   "converter": f"llama.cpp convert_hf_to_gguf.py from llama-cpp-python "
                                                f"{mg.LLAMA_CPP_PYTHON}", "outtypes": {}}
            for ot in OUTTYPES:
                g = Path(tmp) / f"{ot}.gguf"
                convert(conv_dir, hf, ot, g, extra)
                mg._reset_converter_state()
                rec = record(conv_dir, g, blobs)
                names = hf_names(conv_dir, hf, rec["architecture"], rec["metadata"][f"{rec['architecture']}.block_count"])
                for t in rec["tensors"]:
                    if t["name"] in names:
                        t["hf_name"] = names[t["name"]]
                out["outtypes"][ot] = rec
        buf = io.BytesIO()
        np.savez_compressed(buf, **{k: np.frombuffer(v, dtype=np.uint8) for k, v in sorted(blobs.items())})
        (vdir / "converted.npz").write_bytes(buf.getvalue())
        (vdir / "converted.json").write_text(json.dumps(out, indent=1) + "\n")
        print(f"{name}: {sum(len(o['tensors']) for o in out['outtypes'].values())} tensors, {len(blobs)} blobs, "
              f"npz {len(buf.getvalue()):,} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
