"""Quantized checkpoints as the Hub publishes them: ``config.json``'s
``quantization_config`` read once, each FP8 weight paired with its scale
(docs/FP8.md).

Supported (anything else is a :class:`~hf2q.ConfigError` naming the key):

- ``quant_method: "fp8"`` (DeepSeek-V3/R1, Qwen ``-FP8``, transformers'
  FineGrainedFP8): ``fmt`` ``e4m3`` (or ``float8_e4m3fn``) / ``e5m2``,
  ``weight_block_size: [rows, cols]``; each ``<w>_scale_inv`` (F32, BF16 or F16,
  shape ``[ceil(R / rows), ceil(C / cols)]``, leading dimensions as the
  weight's) multiplies its block of ``<w>``. Without ``weight_block_size`` the
  scale's shape says it: one value (per tensor) or one per row (per channel).
- ``quant_method: "compressed-tensors"``, ``format: "float-quantized"``
  (llm-compressor's FP8): one config group whose ``weights`` are
  ``type: float``, ``num_bits: 8`` with ``strategy`` ``channel``
  (``weight_scale`` ``[R, 1]``), ``tensor`` (one value) or ``block``
  (``block_structure``); ``input_scale`` / ``*_zero_point`` of symmetric
  schemes are dropped. Other formats (``pack-quantized`` int4,
  ``nvfp4-pack-quantized``, ``int-quantized``), ``group`` strategies, several
  differing groups, and other ``num_bits`` are refused.
- ``quant_method: "mxfp4"`` (gpt-oss): ``<w>_blocks`` (U8 ``[..., R, C/32,
  16]``) with ``<w>_scales`` (U8 / F8_E8M0 ``[..., R, C/32]``) are one MXFP4
  tensor ``<w>`` of shape ``[..., R, C]``, kept as ggml's MXFP4 or decoded.

Each weight with a scale must be F8_E4M3 / F8_E5M2 and each F8 weight must
have its scale: a missing scale is a :class:`~hf2q.MissingTensorError`, a
scale of the wrong dtype a :class:`~hf2q.DtypeMismatchError`, of the wrong
shape (a block that does not divide as stated) a
:class:`~hf2q.ShapeMismatchError`, all naming the tensors and the rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from .. import formats
from .._frozen import constructor
from ..errors import (ConfigError, DtypeMismatchError, ManifestProblem, MissingTensorError, ShapeMismatchError,
                      tensor_file)
from ..plan import Scale

__all__ = ["QuantScheme", "ScaledTensors", "quant_scheme", "scaled_tensors", "SUPPORTED_SCHEMES",
           "unconfigured_scales", "unconfigured_error", "scale_layouts", "mxfp4_logical"]

#: One line per supported scheme, as docs/FP8.md and ``hf2q inspect`` name them.
SUPPORTED_SCHEMES: tuple[str, ...] = (
    "fp8 block (weight_block_size, <w>_scale_inv F32/BF16/F16): DeepSeek-V3/R1, Qwen3/3.5/3.6 -FP8",
    "fp8 per-tensor / per-channel (<w>_scale_inv of one value / one per row / one per matrix of a stack)",
    "compressed-tensors float-quantized FP8, strategy channel / tensor / block (<w>.weight_scale)",
    "mxfp4 (gpt-oss: <w>_blocks U8 + <w>_scales E8M0, 32 values per block)",
)

_F8 = ("f8_e4m3", "f8_e5m2")
_SCALE_DTYPES = ("f32", "bf16", "f16")
_FMT = {"e4m3": "f8_e4m3", "float8_e4m3fn": "f8_e4m3", "e5m2": "f8_e5m2", "float8_e5m2": "f8_e5m2"}


@dataclass(frozen=True)
class QuantScheme:
    """What a ``quantization_config`` says: ``method`` (``"fp8"`` or
    ``"compressed-tensors"``), ``strategy`` (``"block"``, ``"channel"``,
    ``"tensor"``, or ``"auto"``: from each scale's shape), ``block`` (rows,
    cols) for blocks, the weight format ``fmt`` the config states (None:
    either FP8 kind), the scale tensors' ``suffix`` (appended to the weight's
    name) and the ``dropped`` suffixes (activation scales, unused when
    weights are loaded)."""

    method: str
    strategy: str
    block: tuple[int, int] | None
    fmt: str | None
    suffix: str
    dropped: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line: method, strategy, block."""
        b = f" {self.block[0]}x{self.block[1]}" if self.block else ""
        return f"{self.method} {self.strategy}{b} ({self.fmt or 'f8'}, scales '*{self.suffix}')"


def _block(v: Any, key: str) -> tuple[int, int]:
    if (not isinstance(v, (list, tuple)) or len(v) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= 1 << 31 for x in v)):
        raise ConfigError(f"quantization_config.{key} must be two positive block sizes [rows, cols], got {v!r}",
                          key=f"quantization_config.{key}")
    return int(v[0]), int(v[1])


def quant_scheme(config: Mapping[str, Any] | None, source: str | None = None) -> QuantScheme | None:
    """The scheme of ``config.json``'s ``quantization_config`` (at the root,
    else in ``text_config``); None when there is none. A config hf2q does not
    support is a ConfigError naming the key and the supported schemes, led
    by ``source`` (the config file) where given."""
    try:
        return _quant_scheme(config)
    except ConfigError as e:
        if source is None:
            raise
        raise ConfigError(f"{source}: {e}", key=e.key, rule=e.rule) from None


def _where(ckpt: Any) -> str:
    """How an error names the checkpoint: its location (a one-file
    checkpoint's file), else its directory."""
    return getattr(ckpt, "location", None) or getattr(ckpt, "directory", None) or "checkpoint"


def _quant_scheme(config: Mapping[str, Any] | None) -> QuantScheme | None:
    if config is None:
        return None
    q = config.get("quantization_config")
    if q is None and isinstance(config.get("text_config"), Mapping):
        q = config["text_config"].get("quantization_config")
    if q is None:
        return None
    supported = "; supported: " + "; ".join(SUPPORTED_SCHEMES) + " (docs/FP8.md)"
    if not isinstance(q, Mapping):
        raise ConfigError(f"quantization_config must be an object, got {type(q).__name__}",
                          key="quantization_config")
    method = q.get("quant_method")
    if not isinstance(method, str):
        raise ConfigError(f"quantization_config.quant_method must be a string, got {method!r}{supported}",
                          key="quantization_config.quant_method")
    if method == "fp8":
        # No "fmt": either FP8 kind, each weight by its header dtype (the converter reads no "fmt").
        fmt_name = q.get("fmt")
        if "fmt" in q and (not isinstance(fmt_name, str) or fmt_name not in _FMT):
            raise ConfigError(f"quantization_config.fmt {fmt_name!r} is not an FP8 format hf2q reads "
                              f"(e4m3, e5m2){supported}", key="quantization_config.fmt")
        bs = q.get("weight_block_size")
        block = None if bs is None else _block(bs, "weight_block_size")
        return QuantScheme("fp8", "block" if block else "auto", block, None if fmt_name is None else _FMT[fmt_name],
                           "_scale_inv", (".activation_scale", "_activation_scale"))
    if method == "mxfp4":
        return QuantScheme("mxfp4", "block", (1, 32), "mxfp4", "_scales")
    if method == "compressed-tensors":
        fmt = q.get("format")
        if not isinstance(fmt, str) or fmt != "float-quantized":
            raise ConfigError(f"compressed-tensors format {fmt!r} is not supported (FP8 'float-quantized' "
                              f"is){supported}", key="quantization_config.format")
        groups = q.get("config_groups")
        if not isinstance(groups, Mapping) or not groups:
            raise ConfigError("compressed-tensors: config_groups must be a non-empty object",
                              key="quantization_config.config_groups")
        weights = []
        for gname, g in groups.items():
            w = g.get("weights") if isinstance(g, Mapping) else None
            if not isinstance(w, Mapping):
                raise ConfigError(f"compressed-tensors: config_groups.{gname}.weights must be an object",
                                  key=f"quantization_config.config_groups.{gname}.weights")
            weights.append((gname, w))
        first = weights[0][1]
        for gname, w in weights[1:]:
            if dict(w) != dict(first):
                raise ConfigError("compressed-tensors: config groups with different weight schemes are not "
                                  f"supported ({weights[0][0]} vs {gname}){supported}",
                                  key="quantization_config.config_groups")
        gname = weights[0][0]
        key = f"quantization_config.config_groups.{gname}.weights"
        if first.get("type") != "float" or first.get("num_bits") != 8:
            raise ConfigError(f"compressed-tensors: weights of type {first.get('type')!r} with "
                              f"{first.get('num_bits')!r} bits are not supported (FP8: type 'float', "
                              f"num_bits 8){supported}", key=key)
        if first.get("group_size") is not None:
            raise ConfigError(f"compressed-tensors: group_size {first.get('group_size')!r} is not supported"
                              f"{supported}", key=f"{key}.group_size")
        strategy = first.get("strategy")
        if not isinstance(strategy, str) or strategy not in ("channel", "tensor", "block"):
            raise ConfigError(f"compressed-tensors: strategy {strategy!r} is not supported (channel, tensor, "
                              f"block){supported}", key=f"{key}.strategy")
        if first.get("symmetric", True) is not True:
            raise ConfigError("compressed-tensors: asymmetric (zero-point) FP8 weights are not supported",
                              key=f"{key}.symmetric")
        block = _block(first.get("block_structure"), "config_groups." + gname + ".weights.block_structure") \
            if strategy == "block" else None
        return QuantScheme("compressed-tensors", strategy, block, None, "_scale",
                           (".input_scale", ".weight_zero_point", ".input_zero_point", ".k_scale", ".v_scale"))
    raise ConfigError(f"quantization_config.quant_method {method!r} is not supported{supported}",
                      key="quantization_config.quant_method")


@dataclass(frozen=True)
class ScaledTensors:
    """A checkpoint's scaled FP8 weights: ``scales`` maps each weight's name
    to its :class:`~hf2q.plan.Scale`; ``consumed`` names the scale tensors,
    ``dropped`` the activation scales (neither is a tensor of the model
    once its weights are decoded)."""

    scheme: QuantScheme | None
    scales: dict[str, Scale]
    consumed: frozenset[str]
    dropped: frozenset[str]

    def layout(self, name: str) -> str:
        """How ``name``'s values are scaled, for ``inspect``."""
        s = self.scales.get(name)
        if s is None:
            return "-"
        return f"{s.scheme} {s.block[0]}x{s.block[1]} {s.dtype} '{s.tensor}'"


def _strip_dims(shape: tuple[int, ...]) -> tuple[tuple[int, ...], int, int]:
    if len(shape) == 1:
        return (), 1, shape[0]
    return shape[:-2], shape[-2], shape[-1]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _scale_geometry(scheme: QuantScheme, wshape: tuple[int, ...], sshape: tuple[int, ...]
                    ) -> tuple[bool, str, tuple[int, int], tuple[int, ...], str]:
    """(whether the scale shape fits, the shape wanted in words, block,
    grid, strategy) of a scale of ``sshape`` for a weight of ``wshape``."""
    lead, rows, cols = _strip_dims(wshape)
    snumel = formats.numel(sshape)
    strategy = scheme.strategy
    if strategy == "auto":  # fp8 without weight_block_size: the scale's shape says which
        # (the converter aligns the scale with the weight's leading dimensions:
        # [E] or [E, 1, 1] of a stack [E, R, C] is one scale per matrix)
        bare = sshape
        while bare and bare[-1] == 1:
            bare = bare[:-1]
        strategy = "tensor" if snumel == 1 else ("matrix" if lead and bare == lead else "channel")
    if strategy == "matrix":
        block = (rows, cols)
        grid = (*lead, 1, 1)
        ok = True
        want = f"{list(lead)}: one scale per matrix of {list(wshape)}"
    elif strategy == "block":
        assert scheme.block is not None
        block = scheme.block
        grid = (*lead, _cdiv(rows, block[0]), _cdiv(cols, block[1]))
        ok = sshape == grid
        want = f"{list(grid)}: ceil({rows} / {block[0]}) x ceil({cols} / {block[1]}) blocks of {list(wshape)}"
    elif strategy == "channel":
        block = (1, cols)
        grid = (*lead, rows, 1)
        ok = sshape in (grid, (*lead, rows))
        want = f"{list(grid)}: one scale per row of {list(wshape)}"
    else:
        block = (rows, cols)
        grid = (*lead, 1, 1)
        ok = snumel == 1
        want = "one value: a per-tensor scale"
    return ok, want, block, grid, strategy


# One per FP8 weight (31,000 in a full-size Qwen3.6 FP8 checkpoint; hf2q._frozen).
_new_scale = constructor(Scale)


def _lookup(ckpt: Any) -> Any:
    """``name -> info`` of ``ckpt``: an open checkpoint's own table (a dict
    lookup, no Python call per tensor), else its ``[name]``."""
    table = getattr(ckpt, "table", None)
    return table().__getitem__ if callable(table) else ckpt.__getitem__


_DTYPE = attrgetter("dtype")
_SHAPE = attrgetter("shape")


def _judge_pair(scheme: QuantScheme, rule: str, wdtype: str, sdtype: str, wshape: tuple[int, ...],
                sshape: tuple[int, ...]) -> tuple[tuple[str, str, str, str] | None, tuple[Any, ...]]:
    """(problem, scale fields) of a weight of ``wdtype`` / ``wshape`` scaled
    by a tensor of ``sdtype`` / ``sshape``: the problem as (kind, "weight" or
    "scale", what is wanted with {weight} / {scale} to fill in, what it has),
    or None and the :class:`Scale` fields after its tensor name."""
    wfmt = formats.from_safetensors(wdtype).name
    sfmt = formats.from_safetensors(sdtype).name
    if wfmt not in _F8 or (scheme.fmt is not None and wfmt != scheme.fmt):
        want = scheme.fmt or "F8_E4M3 or F8_E5M2"
        return ("dtype", "weight", f"{want.upper()} (it has a scale '{{scale}}'; {_braced(rule)})", wdtype), ()
    if sfmt not in _SCALE_DTYPES:
        return ("dtype", "scale", "F32, BF16 or F16 (the scale of '{weight}')", sdtype), ()
    if not wshape or 0 in wshape:
        return ("shape", "weight", "a non-empty matrix (a scaled FP8 weight)", str(list(wshape))), ()
    ok, want, block, grid, strategy = _scale_geometry(scheme, wshape, sshape)
    if not ok:
        return ("shape", "scale", f"{_braced(want)} ({_braced(rule)})", str(list(sshape))), ()
    return None, (sfmt, sshape, block, grid, strategy)


def _braced(text: str) -> str:
    """``text`` safe inside a str.format template."""
    return text.replace("{", "{{").replace("}", "}}")


def scaled_tensors(ckpt: Any, scheme: QuantScheme | None) -> ScaledTensors:
    """Pair every FP8 weight of ``ckpt`` (an open checkpoint: names,
    ``[name].dtype`` / ``.shape``) with its scale under ``scheme``; typed
    errors listing every problem at once (module doc)."""
    if scheme is None:
        return ScaledTensors(None, {}, frozenset(), frozenset())
    names = list(ckpt.keys())
    present = set(names)
    scales: dict[str, Scale] = {}
    consumed: set[str] = set()
    dropped: set[str] = set()
    paired: set[str] = set()  # weights with a scale tensor (problems with it are reported as such)
    missing: list[ManifestProblem] = []
    bad_dtype: list[ManifestProblem] = []
    bad_shape: list[ManifestProblem] = []
    rule = f"quantization_config: {scheme.describe()}"
    if scheme.method == "mxfp4":
        return _mxfp4_tensors(ckpt, scheme, names, rule)
    dropped_suffixes = tuple(scheme.dropped)
    suffix = scheme.suffix
    info = _lookup(ckpt)
    # One pass per rule over the names, each at C speed (a full-size FP8
    # checkpoint has 60,000): the activation scales dropped, then the
    # weight scales; the loop below visits only the latter.
    if dropped_suffixes:
        dropped.update(n for n in names if n.endswith(dropped_suffixes))
    candidates = [n for n in names if n.endswith(suffix) and n not in dropped]
    if scheme.method == "compressed-tensors":
        # e.g. a module's own "x_scale" parameter: not a weight's scale
        candidates = [n for n in candidates if n[:-len(suffix)].endswith(".weight")]
    # Per weight only lookups, made by C loops (map, zip); the rules are
    # judged once per distinct (dtypes, shapes) of a pair, of which an
    # expert stack's hundreds of pairs share one.
    cut = len(suffix)
    weights = [n[:-cut] for n in candidates]
    consumed.update(candidates)
    paired.update(weights)
    if not paired <= present:
        missing.extend(ManifestProblem("missing", w, f"the weight scaled by '{n}' ({rule})", "absent")
                       for w, n in zip(weights, candidates) if w not in present)
        kept = [(w, n) for w, n in zip(weights, candidates) if w in present]
        weights, candidates = [w for w, _ in kept], [n for _, n in kept]
    winfos, sinfos = list(map(info, weights)), list(map(info, candidates))
    wshapes, sshapes = list(map(_SHAPE, winfos)), list(map(_SHAPE, sinfos))
    if not set(map(type, wshapes)) | set(map(type, sshapes)) <= {tuple}:  # e.g. lists from a plain mapping
        wshapes = [tuple(int(d) for d in x) for x in wshapes]
        sshapes = [tuple(int(d) for d in x) for x in sshapes]
    keys = list(zip(map(_DTYPE, winfos), map(_DTYPE, sinfos), wshapes, sshapes))
    judged = {k: _judge_pair(scheme, rule, *k) for k in dict.fromkeys(keys)}  # first-seen order: the same error every run
    if all(v[0] is None for v in judged.values()):
        made = [judged[k][1] for k in keys]  # (scale format, shape, block, grid, strategy) per weight
        if made:
            scales.update(zip(weights, map(_new_scale, candidates, *zip(*made))))
    else:
        for w, n, k in zip(weights, candidates, keys):
            problem, made = judged[k]
            if problem is None:
                scales[w] = _new_scale(n, *made)
                continue
            kind, about, want, got = problem
            target = bad_shape if kind == "shape" else bad_dtype
            which = w if about == "weight" else n
            target.append(ManifestProblem(kind, which, want.format(weight=w, scale=n), got, tensor_file(ckpt, which)))
    # FP8 tensors with no scale: among the names no rule above took (set
    # arithmetic at C speed), in the checkpoint's order.
    rest = present.difference(paired, consumed, dropped)
    for name in names:
        if name not in rest:
            continue
        if formats.from_safetensors(info(name).dtype).name in _F8:
            sname = name + scheme.suffix
            # (present but not taken: compressed-tensors scales '.weight' tensors only)
            got = "absent" if sname not in present else f"present, but '{name}' is not a '.weight' tensor"
            missing.append(ManifestProblem("missing", sname, f"the scale of FP8 weight '{name}' ({rule})", got))
    for problems, cls in ((missing, MissingTensorError), (bad_dtype, DtypeMismatchError),
                          (bad_shape, ShapeMismatchError)):
        if problems:
            lines = "\n".join(f"  {p}" for p in problems)
            raise cls(f"{_where(ckpt)}: {len(problems)} FP8 weight/scale problem(s):\n{lines}", problems)
    return ScaledTensors(scheme, scales, frozenset(consumed), frozenset(dropped))


def _mxfp4_tensors(ckpt: Any, scheme: QuantScheme, names: list[str], rule: str) -> ScaledTensors:
    """gpt-oss MXFP4: each ``<w>_blocks`` with its ``<w>_scales`` (module doc).
    The Scale is keyed by the blocks tensor; its grid is the scales' shape."""
    present = set(names)
    scales: dict[str, Scale] = {}
    consumed: set[str] = set()
    missing: list[ManifestProblem] = []
    bad_dtype: list[ManifestProblem] = []
    bad_shape: list[ManifestProblem] = []
    for name in names:
        if name.endswith("_scales") and name[: -len("_scales")] + "_blocks" not in present:
            missing.append(ManifestProblem("missing", name[: -len("_scales")] + "_blocks",
                                           f"the MXFP4 codes scaled by '{name}' ({rule})", "absent"))
        if not name.endswith("_blocks"):
            continue
        sname = name[: -len("_blocks")] + "_scales"
        if sname not in present:
            missing.append(ManifestProblem("missing", sname, f"the E8M0 scales of MXFP4 '{name}' ({rule})", "absent"))
            continue
        consumed.add(sname)
        binfo, sinfo = ckpt[name], ckpt[sname]
        bfmt = formats.from_safetensors(binfo.dtype).name
        sfmt = formats.from_safetensors(sinfo.dtype).name
        if bfmt != "u8":
            bad_dtype.append(ManifestProblem("dtype", name, f"U8 (MXFP4 codes, two per byte; {rule})", binfo.dtype,
                                             tensor_file(ckpt, name)))
            continue
        if sfmt not in ("u8", "f8_e8m0"):
            bad_dtype.append(ManifestProblem("dtype", sname, f"U8 or F8_E8M0 (E8M0 exponents; {rule})", sinfo.dtype,
                                             tensor_file(ckpt, sname)))
            continue
        bshape = tuple(int(d) for d in binfo.shape)
        sshape = tuple(int(d) for d in sinfo.shape)
        if len(bshape) < 2 or bshape[-1] != 16:  # the codes' own layout: [..., blocks, 16]
            bad_shape.append(ManifestProblem(
                "shape", name, f"[..., blocks, 16]: MXFP4 codes of 32 values in 16 bytes per block, at least 2 "
                f"dimensions ({rule})", str(list(bshape)), tensor_file(ckpt, name)))
            continue
        if sshape != bshape[:-1]:
            bad_shape.append(ManifestProblem(
                "shape", sname, f"{list(bshape[:-1])}: one exponent per 16-byte block of '{name}' {list(bshape)} "
                f"({rule})", str(list(sshape)), tensor_file(ckpt, sname)))
            continue
        scales[name] = Scale(sname, sfmt, sshape, (1, 32), sshape, "mxfp4")
    for problems, cls in ((missing, MissingTensorError), (bad_dtype, DtypeMismatchError),
                          (bad_shape, ShapeMismatchError)):
        if problems:
            lines = "\n".join(f"  {p}" for p in problems)
            raise cls(f"{getattr(ckpt, 'directory', None) or 'checkpoint'}: {len(problems)} MXFP4 blocks/scales "
                      f"problem(s):\n{lines}",
                      problems)
    return ScaledTensors(scheme, scales, frozenset(consumed), frozenset())


def mxfp4_logical(name: str, blocks_shape: tuple[int, ...]) -> tuple[str, tuple[int, ...]]:
    """The MXFP4 tensor a ``<w>_blocks`` tensor holds: its name ``<w>`` and
    logical shape ``[..., R, C]`` (``C`` = blocks per row x 32)."""
    return name.removesuffix("_blocks"), (*blocks_shape[:-2], blocks_shape[-2] * 32)


def scale_layouts(scaled: ScaledTensors) -> dict[str, str]:
    """For ``hf2q inspect``: each scaled weight's layout (``"fp8 block
    128x128, bf16 scale 'w_scale_inv'"``), each scale tensor's role
    (``"scale of 'w'"``), each dropped activation scale's."""
    out: dict[str, str] = {}
    for w, s in scaled.scales.items():
        what = {"block": f"block {s.block[0]}x{s.block[1]}", "channel": "per-channel", "tensor": "per-tensor"}
        if s.scheme == "mxfp4":
            out[w] = f"mxfp4 codes of '{w.removesuffix('_blocks')}', E8M0 scales '{s.tensor}'"
        else:
            out[w] = f"fp8 {what.get(s.scheme, s.scheme)}, {s.dtype} scale '{s.tensor}'"
        out[s.tensor] = f"scale of '{w}'"
    for n in scaled.dropped:
        out[n] = "activation scale (not used for weights)"
    return out


def unconfigured_scales(ckpt: Any, scaled: ScaledTensors | None = None) -> list[str]:
    """FP8 weights that come with a ``*_scale_inv`` / ``*.weight_scale``
    tensor that no stated scheme applies: ``config.json`` has no
    ``quantization_config``, or (``scaled``: the pairing under the one it
    has) its scheme pairs them with nothing (an FP8 weight under MXFP4; fp8
    and compressed-tensors refuse an FP8 weight they leave unpaired
    themselves). How the scales apply is unknown, so converting them is
    refused (keeping the bytes is not)."""
    names = list(ckpt.keys())
    # The few scale-like names first (one C-level test per name: this runs
    # on converting generic loads without a scheme), then their weights by
    # set algebra.
    scale_like = [n for n in names if n.endswith(("_scale_inv", "_scale"))]
    if not scale_like:
        return []
    bases = {n[:-len("_scale_inv")] if n.endswith("_scale_inv") else n[:-len("_scale")] for n in scale_like}
    cands = (bases & set(names)).difference(scaled.scales if scaled is not None else ())
    return [n for n in names if n in cands and formats.from_safetensors(ckpt[n].dtype).name in _F8]


def unconfigured_error(ckpt: Any, names: list[str], scheme: QuantScheme | None, what: str,
                       hint: str = "") -> ConfigError:
    """The ConfigError for :func:`unconfigured_scales`'s ``names``; ``what``
    is the step that cannot decode them (``--dtype q8_0``, ``hf2q convert``),
    ``hint`` what would load them."""
    shown = ", ".join(repr(n) for n in names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    if scheme is None:
        why = "config.json has no quantization_config: how the scales apply is not stated"
    else:
        why = (f"config.json's quantization_config ({scheme.describe()}) pairs them with none: decoding them "
               "without their scales would be wrong")
    return ConfigError(f"{_where(ckpt)}: FP8 weight(s) {shown} come with scale tensors but {why}, so {what} "
                       f"cannot decode them{f' ({hint})' if hint else ''}", key="quantization_config")
