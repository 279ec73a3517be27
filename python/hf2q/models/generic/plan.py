"""The generic family's plan: every checkpoint tensor under its own name,
kept in its dtype or converted by a simple policy.

``dtype="keep"``: each tensor in its file dtype (which a device buffer must be
able to hold: f32, f16, bf16, u8, i32; bool -> u8 and i8 / i16 / u16 -> i32 are
widened losslessly).

``"f32"`` / ``"bf16"`` / ``"f16"`` / ``"q8_0"`` (and the k-quants): floating-point tensors are converted as
llama.cpp's ``convert_hf_to_gguf.py --outtype <t>`` converts a model it has no
special rules for: a tensor that is 1-D once its size-1 dimensions are
dropped, whose name does not end in ``.weight``, or whose name ends in
``_norm.weight`` stays F32; every other tensor becomes ``<t>``; for q8_0 a
tensor whose rows (last dimension) are not a whole number of 32-element
blocks falls back to F16, as llama.cpp does. (llama.cpp also keeps a few
architecture-specific tensors in F32, e.g. MoE routers and conv1d; it knows
them by their GGUF names, which the generic family does not use.) Integer
tensors keep their dtype under every policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ... import formats
from ...errors import DtypeMismatchError, DuplicateTensorError, ManifestProblem, tensor_file
from ...plan import LoadPlan, Piece, TensorPlan
from ...safetensors import Checkpoint
from .._quant import ScaledTensors, mxfp4_logical, scaled_tensors, unconfigured_error, unconfigured_scales
from .config import DTYPE_POLICIES, GenericConfig

__all__ = ["plan_generic", "device_dtype", "FLOAT_FORMATS"]

#: Source formats treated as floating point (converted by the policies).
FLOAT_FORMATS = ("f32", "f16", "bf16", "f64", "f8_e4m3", "f8_e5m2", "f8_e8m0", "f8_e4m3fnuz", "f8_e5m2fnuz")
# Integer / bool formats a device cannot hold, and the lossless device format they widen to.
_WIDEN = {"bool": "u8", "i8": "i32", "i16": "i32", "u16": "i32"}


def _block_id(name: str) -> int | None:
    """The first all-digit part of a dotted name (``model.layers.7.mlp`` -> 7):
    the layer, used to group residency commits (as llama.cpp finds block ids)."""
    for part in name.split("."):
        if part.isdecimal() and len(part) < 19:  # a layer index, not a 5000-digit name part
            return int(part)
    return None


def _keeps_f32(name: str, shape: tuple[int, ...]) -> bool:
    squeezed = [d for d in shape if d != 1]
    return len(squeezed) <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight")


def device_dtype(name: str, src: str, shape: tuple[int, ...], policy: str) -> str | None:
    """The device format of tensor ``name`` (file format ``src``, an hf2q
    name) under ``policy``; None when no device format can hold it."""
    if src in FLOAT_FORMATS:
        if policy == "keep":
            return src if formats.get(src).is_device else None
        if policy == "f32" or _keeps_f32(name, shape):
            return "f32"
        if policy in ("bf16", "f16"):  # (the converter's rule is the same for both)
            return policy
        if shape and shape[-1] != 1:
            # q8_0: the converter's "falling back to F16"; the k-quants:
            # llama-quantize's fallbacks (formats.for_row).
            return formats.for_row(policy, shape[-1], name)
        return "f16"  # llama.cpp: "falling back to F16"
    if formats.get(src).is_device:
        return src
    return _WIDEN.get(src)


def plan_generic(ckpt: Checkpoint, config: GenericConfig | Mapping[str, Any] | None = None, *,
                 dtype: str = "keep") -> LoadPlan:
    """The :class:`~hf2q.plan.LoadPlan` of ``ckpt``: every tensor, in the
    checkpoint's order, under its own name. Raises ValueError for an unknown
    policy and :class:`~hf2q.DtypeMismatchError` listing every tensor no
    device format can hold."""
    if dtype not in DTYPE_POLICIES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_POLICIES)}, got {dtype!r}")
    cfg = config if isinstance(config, GenericConfig) else GenericConfig.from_dict(
        config, str(ckpt.directory / "config.json") if config is not None and hasattr(ckpt, "directory") else None)
    scaled = fp8_sources(ckpt, cfg, dtype)
    entries: list[TensorPlan] = []
    problems: list[ManifestProblem] = []
    skipped: list[str] = []
    dups: dict[str, list[str]] = {}  # an MXFP4 tensor's name -> the tensors that would make it
    for name in ckpt.keys():
        info = ckpt[name]
        src = formats.from_safetensors(info.dtype).name
        shape = tuple(int(d) for d in info.shape)
        mxscale = scaled.scheme is not None and scaled.scheme.method == "mxfp4" and name in scaled.consumed
        if mxscale or (dtype != "keep" and (name in scaled.consumed or name in scaled.dropped)):
            skipped.append(name)  # a scale: applied to its weight, not a tensor of its own
            continue
        mx = scaled.scales.get(name)
        if mx is not None and mx.scheme == "mxfp4":
            # gpt-oss MXFP4: <w>_blocks + <w>_scales are one tensor <w>, kept as ggml's
            # MXFP4 (keep) or decoded and converted as a matrix weight.
            lname, lshape = mxfp4_logical(name, shape)
            if lname in ckpt:  # the checkpoint's own tensor of that name: two sources for one buffer
                dups[lname] = [lname, name, mx.tensor]
                continue
            dst = "mxfp4" if dtype == "keep" else device_dtype(lname + ".weight", "f32", lshape, dtype)
            assert dst is not None
            entries.append(TensorPlan(lname, lshape, dst, (Piece(name, src, shape, scale=mx),),
                                      group=_block_id(name), kind="mxfp4"))
            continue
        if mx is not None and name in scaled.consumed:
            continue
        scale = scaled.scales.get(name) if dtype != "keep" else None
        if scale is not None:
            # A scaled FP8 weight converts as any float weight, decoded with its scale.
            dst = device_dtype(name, "f32", shape, dtype)
            assert dst is not None
            entries.append(TensorPlan(name, shape, dst, (Piece(name, src, shape, scale=scale),),
                                      group=_block_id(name), kind="fp8"))
            continue
        dst = device_dtype(name, src, shape, dtype)
        if dst is None:
            problems.append(ManifestProblem(
                "dtype", name, f"a dtype a device buffer holds ({', '.join(formats.DEVICE_FORMATS[:-1])})"
                + ("" if src not in FLOAT_FORMATS else " or a --dtype policy that converts it"), info.dtype,
                tensor_file(ckpt, name)))
            continue
        kind = "float" if src in FLOAT_FORMATS else "int"
        entries.append(TensorPlan(name, shape, dst, (Piece(name, src, shape),), group=_block_id(name), kind=kind))
    if dups:
        raise DuplicateTensorError(dups, str(ckpt.location))
    if problems:
        lines = "\n".join(f"  {p}" for p in problems)
        raise DtypeMismatchError(
            f"{ckpt.location}: {len(problems)} tensor(s) cannot be loaded with --dtype {dtype}:\n{lines}", problems
        )
    extra: dict[str, Any] = {"architecture": cfg.label, "dtype": dtype}
    if scaled.scheme is not None:
        extra["quantization"] = scaled.scheme.describe()
    return LoadPlan("generic", entries, cfg, skipped=tuple(skipped), extra=extra)


def fp8_sources(ckpt: Checkpoint, cfg: GenericConfig, dtype: str) -> ScaledTensors:
    """The checkpoint's FP8 weights paired with their scales (docs/FP8.md);
    typed errors for a scale missing, of the wrong dtype or shape. A
    converting policy on FP8 weights that have scale tensors which no
    ``quantization_config`` applies (none stated, or one that pairs them
    with nothing) is a ConfigError: decoding them without their scales
    would be wrong."""
    scaled = scaled_tensors(ckpt, cfg.quantization)
    # (fp8 and compressed-tensors refuse an FP8 weight they leave unpaired: scaled_tensors)
    if dtype != "keep" and (scaled.scheme is None or scaled.scheme.method == "mxfp4"):
        unconf = unconfigured_scales(ckpt, scaled)
        if unconf:
            raise unconfigured_error(ckpt, unconf, cfg.quantization, f"--dtype {dtype}",
                                     "--dtype keep loads the bytes as they are")
    return scaled
