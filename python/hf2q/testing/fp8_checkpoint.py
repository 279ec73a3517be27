"""FP8 checkpoints made the way the Hub's quantizers make them (docs/FP8.md),
for tests, golden data (scripts/make_golden_fp8.py) and benchmarks.

:func:`quantize_fp8` is the quantizer: per block (or row, or tensor) the
scale is ``amax / 448`` (E4M3; ``/ 57344`` for E5M2) in float32, the weight
``x / scale`` (scale repeated over its block) saturated to the format's
range and rounded to nearest even by the float8 cast; the scale is then
stored in the checkpoint's scale dtype (DeepSeek-V3: F32, Qwen ``-FP8``:
BF16). :func:`fp8_checkpoint` rewrites a BF16 checkpoint as an FP8 one:
matrices ending in ``.weight`` are quantized, except what the real repos keep
in BF16 (embeddings, ``lm_head``, norms, MoE routers and shared-expert
gates, linear attention's ``conv1d`` / ``in_proj_a`` / ``in_proj_b``, vision
tensors); ``config.json`` gets the ``quantization_config`` those repos carry.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["quantize_fp8", "fp8_checkpoint", "keeps_bf16", "write_safetensors", "FP8_MAX", "quantize_mxfp4",
           "mxfp4_checkpoint"]

#: Largest finite value of each FP8 format.
FP8_MAX = {"f8_e4m3": 448.0, "f8_e5m2": 57344.0}

#: Name parts of the tensors the published FP8 repos leave in BF16.
_KEEP = ("embed_tokens", "lm_head", "norm", "mlp.gate.weight", "shared_expert_gate", "conv1d", "in_proj_a",
         "in_proj_b", "visual", "vision", "router")


def keeps_bf16(name: str, shape: tuple[int, ...]) -> bool:
    """Whether the quantizers leave tensor ``name`` unquantized (module doc)."""
    matrix = name.endswith((".weight", "experts.gate_up_proj", "experts.down_proj"))  # fused experts: no .weight
    return len(shape) < 2 or not matrix or any(k in name for k in _KEEP)


def quantize_fp8(x: np.ndarray, *, strategy: str = "block", block: tuple[int, int] = (128, 128),
                 fmt: str = "f8_e4m3", scale_dtype: str = "f32") -> tuple[np.ndarray, np.ndarray]:
    """``x`` (float array ``[..., R, C]``) as (FP8 weight, stored scale).

    ``strategy``: ``"block"`` (scale ``[..., ceil(R/br), ceil(C/bc)]``),
    ``"channel"`` (``[..., R, 1]``) or ``"tensor"`` (one value, shape ``[1]``)."""
    import ml_dtypes

    x = np.asarray(x, dtype=np.float32)
    rows, cols = x.shape[-2:]
    fmax = np.float32(FP8_MAX[fmt])
    if strategy == "block":
        br, bc = block
    elif strategy == "channel":
        br, bc = 1, cols
    elif strategy == "tensor":
        br, bc = rows, cols
    else:
        raise ValueError(f"unknown strategy {strategy!r}")
    gr, gc = -(-rows // br), -(-cols // bc)
    pad = np.zeros((*x.shape[:-2], gr * br, gc * bc), np.float32)
    pad[..., :rows, :cols] = np.abs(x)
    amax = pad.reshape(*x.shape[:-2], gr, br, gc, bc).max(axis=(-3, -1))
    amax = np.maximum(amax, np.float32(1e-12))
    scale = (amax / fmax).astype(np.float32)
    full = np.repeat(np.repeat(scale, br, -2), bc, -1)[..., :rows, :cols]
    q = np.clip(x / full, -fmax, fmax)
    w = q.astype(ml_dtypes.float8_e4m3fn if fmt == "f8_e4m3" else ml_dtypes.float8_e5m2)
    sdt = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16}[scale_dtype]
    stored = scale.astype(sdt)
    if strategy == "tensor":
        stored = stored.reshape(*x.shape[:-2], 1) if x.ndim > 2 else stored.reshape(1)
    return w, stored


_CODES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float8_e4m3fn": "F8_E4M3",
          "float8_e5m2": "F8_E5M2", "float8_e8m0fnu": "F8_E8M0", "uint8": "U8", "int32": "I32", "int64": "I64", "float64": "F64"}


def write_safetensors(path: str | os.PathLike[str], arrays: Mapping[str, np.ndarray]) -> None:
    """``arrays`` as one safetensors file (the reference writer's layout:
    by descending element size, then name; header padded to 8 bytes)."""
    order = sorted(arrays, key=lambda n: (-arrays[n].dtype.itemsize, n))
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    off = 0
    for n in order:
        a = arrays[n]
        header[n] = {"dtype": _CODES[a.dtype.name], "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(len(hb).to_bytes(8, "little"))
        f.write(hb)
        for n in order:
            f.write(np.ascontiguousarray(arrays[n]).reshape(-1).view(np.uint8).data)


def _read_all(d: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    from ..safetensors import open_checkpoint

    arrays: dict[str, np.ndarray] = {}
    where: dict[str, str] = {}
    with open_checkpoint(d) as ckpt:
        for k in ckpt.keys():
            arrays[k] = ckpt.read_array(k)
            where[k] = ckpt.file_for(k).path.name
    return arrays, where


def fp8_checkpoint(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, method: str = "fp8",
                   strategy: str = "block", block: tuple[int, int] = (128, 128), fmt: str = "f8_e4m3",
                   scale_dtype: str = "bf16", keep: Callable[[str, tuple[int, ...]], bool] = keeps_bf16) -> Path:
    """Rewrite the BF16/F32 checkpoint ``src`` as an FP8 one in ``dst``
    (created; its files replaced), sharded as ``src`` is.

    ``method="fp8"``: DeepSeek / Qwen ``-FP8`` form (``<w>_scale_inv``,
    ``quantization_config`` ``{"quant_method": "fp8", "fmt": ..., "weight_block_size": block}``);
    ``method="compressed-tensors"``: llm-compressor's float-quantized form
    (``<w>_scale``, ``strategy`` ``channel`` / ``tensor`` / ``block``).
    A tensor for which ``keep(name, shape)`` is true is copied unchanged."""
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    arrays, where = _read_all(src)
    suffix = "_scale_inv" if method == "fp8" else "_scale"
    out_files: dict[str, dict[str, np.ndarray]] = {}
    for name, a in arrays.items():
        files = out_files.setdefault(where[name], {})
        shape = tuple(a.shape)
        unpaired = method != "fp8" and not name.endswith(".weight")  # compressed-tensors scales '<m>.weight_scale'
        if keep(name, shape) or unpaired or a.dtype.kind not in "fV" or a.dtype.name.startswith("float8"):
            files[name] = a
            continue
        w, s = quantize_fp8(a.astype(np.float32), strategy=strategy, block=block, fmt=fmt, scale_dtype=scale_dtype)
        files[name] = w
        files[name + suffix] = s
    for fname, arrs in out_files.items():
        write_safetensors(dst / fname, arrs)
    idx = src / "model.safetensors.index.json"
    if idx.exists():
        index = json.loads(idx.read_text())
        wm = {n: f for f, arrs in out_files.items() for n in arrs}
        index["weight_map"] = dict(sorted(wm.items()))
        index.setdefault("metadata", {})["total_size"] = sum(a.nbytes for arrs in out_files.values()
                                                             for a in arrs.values())
        (dst / idx.name).write_text(json.dumps(index, indent=2) + "\n")
    cfg = json.loads((src / "config.json").read_text())
    ignored = sorted({n.rsplit(".weight", 1)[0] for n, a in arrays.items()
                      if n.endswith(".weight") and a.ndim >= 2 and keep(n, tuple(a.shape))})
    if method == "fp8":
        q: dict[str, Any] = {"quant_method": "fp8", "fmt": fmt.removeprefix("f8_"), "activation_scheme": "dynamic"}
        if strategy == "block":
            q["weight_block_size"] = list(block)
        q["modules_to_not_convert"] = ignored
    else:
        weights: dict[str, Any] = {"num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True,
                                   "dynamic": False, "group_size": None, "block_structure": None}
        if strategy == "block":
            weights["block_structure"] = list(block)
        q = {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
             "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None}},
             "ignore": ignored}
    cfg["quantization_config"] = q
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for extra in src.iterdir():  # tokenizer files and the like
        if extra.is_file() and extra.suffix not in (".safetensors",) and extra.name not in (
                "config.json", "model.safetensors.index.json") and not (dst / extra.name).exists():
            shutil.copyfile(extra, dst / extra.name)
    return dst


#: E2M1 magnitudes, in code order (codes 8-15 are the negatives).
_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)


def quantize_mxfp4(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``x`` (float ``[..., R, C]``, C a multiple of 32) as gpt-oss stores
    MXFP4: (codes uint8 ``[..., R, C/32, 16]``, element 2i of a block in the
    low nibble of byte i; E8M0 exponents uint8 ``[..., R, C/32]``). The OCP MX
    rule: shared exponent ``floor(log2(amax)) - 2`` (E2M1's largest exponent),
    each element divided by it and rounded to the nearest E2M1 value,
    saturating at 6."""
    x = np.asarray(x, dtype=np.float32)
    *lead, rows, cols = x.shape
    if cols % 32:
        raise ValueError("MXFP4 rows are whole blocks of 32")
    b = x.reshape(*lead, rows, cols // 32, 32)
    amax = np.abs(b).max(axis=-1)
    with np.errstate(divide="ignore"):
        e = np.where(amax > 0, np.floor(np.log2(np.maximum(amax, np.float32(1e-38)))) - 2, -127)
    e = np.clip(e, -127, 127).astype(np.int32)
    scaled = b / np.exp2(e.astype(np.float32))[..., None]
    mag = np.minimum(np.abs(scaled), np.float32(6.0))
    idx = np.abs(mag[..., None] - _E2M1).argmin(axis=-1).astype(np.uint8)
    codes = idx | np.where(scaled < 0, np.uint8(8), np.uint8(0))
    codes = np.where(idx == 0, np.uint8(0), codes).astype(np.uint8)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    return packed, (e + 127).astype(np.uint8)


def mxfp4_checkpoint(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> Path:
    """A transformers-written gpt-oss checkpoint (BF16 experts
    ``mlp.experts.gate_up_proj`` ``[E, H, 2I]`` and ``down_proj`` ``[E, I, H]``,
    inputs first) as OpenAI publishes it: each expert matrix transposed to
    ``[E, out, in]`` and stored as ``<name>_blocks`` / ``<name>_scales``
    (:func:`quantize_mxfp4`), the rest unchanged, ``quantization_config``
    ``{"quant_method": "mxfp4"}``."""
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    arrays, _ = _read_all(src)
    out: dict[str, np.ndarray] = {}
    for name, a in arrays.items():
        if name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")) and a.ndim == 3:
            packed, exps = quantize_mxfp4(np.swapaxes(a.astype(np.float32), -1, -2))
            out[name + "_blocks"] = packed
            out[name + "_scales"] = exps
        else:
            out[name] = a
    write_safetensors(dst / "model.safetensors", out)
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return dst
