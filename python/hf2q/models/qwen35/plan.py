"""Qwen3.5 / Qwen3.6 MoE tensor plan: checkpoint names -> GGUF names, shapes,
transforms and device dtypes (docs/QWEN35MOE.md).

The plan is built from tensor *metadata* only (name -> dtype, shape); no byte
is read. It validates the checkpoint against the manifest the config implies
and fails with every offending name at once:

- :class:`UnknownTensorError` — names that map to nothing (listed, with why);
- :class:`DuplicateTensorError` — two checkpoint tensors for one destination
  (a duplicate expert, ``dt_bias`` and ``dt_proj.bias``, a name present with
  and without ``language_model.``, ...);
- :class:`MixedExpertFormsError` — fused and per-expert experts in one layer;
- :class:`hf2q.MissingTensorError`, :class:`hf2q.DtypeMismatchError`,
  :class:`hf2q.ShapeMismatchError` — as named;
- :class:`hf2q.ConfigError` — a Q8_0 tensor whose last dimension is not a
  multiple of 32.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import numpy as np
else:  # numpy on first use (hf2q._lazy)
    from ..._lazy import numpy as np

from ... import formats
from ..._frozen import constructor
from ...plan import LoadPlan, Piece, TensorPlan, UnitTranspose
from ...safetensors import Checkpoint, SafetensorsFile
from ...errors import (
    ConfigError,
    DtypeMismatchError,
    DuplicateTensorError,
    ManifestError,
    MissingTensorError,
    ShapeMismatchError,
    _lead,
    _listing,
    in_file,
    tensor_file,
)
from .._quant import scaled_tensors, unconfigured_error, unconfigured_scales
from .config import Qwen35Config
from .transforms import transform_tensor
from .names import (  # noqa: F401  (the public names are re-exported in __all__)
    DEVICE_DTYPES,
    SOURCE_DTYPES,
    _EXPERT_SPEC,
    _GLOBAL_BY_HF,
    _LAYER_RE,
    _LAYER_SPECS,
    _MTP_GLOBALS,
    _MTP_LAYER_RE,
    _Spec,
    _Target,
    _gguf_name,
    _rename_mtp,
    _strip_lm,
    TensorKind,
    Transform,
    UnknownTensorError,
    _HUB_EXPERT_NAME_RE,
    _canon_int,
    _classify,
    checkpoint_targets,
    hf_name_to_gguf,
    is_multimodal_tensor,
)

__all__ = [
    "TensorKind",
    "DeviceDtype",
    "Transform",
    "SourcePiece",
    "PlannedTensor",
    "Qwen35Plan",
    "UnknownTensorError",
    "DuplicateTensorError",
    "MixedExpertFormsError",
    "plan_qwen35_moe",
    "hf_name_to_gguf",
    "checkpoint_targets",
    "is_multimodal_tensor",
    "select_device_dtype",
    "SOURCE_DTYPES",
    "DEVICE_DTYPES",
]

DeviceDtype = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k"]
_Q8_BLOCK = formats.get("q8_0").block_elems
#: Transforms the loader does while streaming: pieces land at their
#: offsets, a squeeze keeps the bytes, and a V-head reorder is a unit
#: transpose done where the tensor lies (:func:`_unit_transpose`).
_STREAMABLE = frozenset((Transform.FUSED_SPLIT, Transform.STACK_EXPERTS, Transform.SQUEEZE_CONV1D,
                         *Transform.REORDERS))


# --------------------------------------------------------------------------- errors
class MixedExpertFormsError(ManifestError):
    """A layer holds both fused (``experts.gate_up_proj``/``experts.down_proj``) and
    per-expert (``experts.{e}.*_proj.weight``) expert tensors. ``layers`` maps
    the block index to (fused names, per-expert names)."""

    def __init__(self, layers: Mapping[int, tuple[list[str], list[str]]]) -> None:
        self.layers = dict(sorted(layers.items()))
        lines = [
            f"block {b}: fused {sorted(f)} and {len(p)} per-expert tensor(s), e.g. {sorted(p)[0]}"
            for b, (f, p) in self.layers.items()
        ]
        super().__init__(f"fused and per-expert expert tensors mixed in {len(lines)} layer(s):{_listing(lines)}")


# Each led by the checkpoint's directory where it is known (``where``); a
# line about a tensor present names the file that holds it.
def _missing_error(names: list[str], where: Any = None) -> MissingTensorError:
    err = MissingTensorError(f"{_lead(where)}{len(names)} tensor(s) the config requires are missing:{_listing(names)}")
    err.names = names  # type: ignore[attr-defined]
    return err


def _dtype_error(lines: list[str], where: Any = None) -> DtypeMismatchError:
    err = DtypeMismatchError(
        f"{_lead(where)}{len(lines)} tensor(s) with an unsupported dtype (qwen35moe reads BF16, F16, F32):"
        f"{_listing(lines)}"
    )
    err.lines = lines  # type: ignore[attr-defined]
    return err


def _shape_error(lines: list[str], where: Any = None) -> ShapeMismatchError:
    err = ShapeMismatchError(f"{_lead(where)}{len(lines)} tensor(s) do not have the shape the config implies:"
                             f"{_listing(lines)}")
    err.lines = lines  # type: ignore[attr-defined]
    return err


# --------------------------------------------------------------------------- plan data
@dataclass(frozen=True)
class SourcePiece(Piece):
    """One checkpoint tensor (or part of one) feeding a planned tensor: a
    :class:`hf2q.plan.Piece` (``dtype`` the safetensors code, as on disk)
    that also says what it is in the model.

    ``name`` (the piece's ``tensor``)/``dtype``/``shape`` are as on disk. For
    a per-expert piece ``expert`` is the index on axis 0 of the stack it fills
    (``dest[expert] = source``; it lands at element ``expert * numel``). For a
    fused ``experts.gate_up_proj`` piece ``half`` says which half of axis 1 is
    used: ``"gate"`` = ``[:, :I, :]``, ``"up"`` = ``[:, I:, :]`` (``dest[:] =
    source[:, :I]`` or ``source[:, I:]``; ``rows`` is that half). Otherwise
    both are None and the whole tensor is used.
    """

    expert: int | None = None
    half: Literal["gate", "up"] | None = None

    @property
    def name(self) -> str:
        return self.tensor

    def selection(self) -> tuple[slice, ...]:
        """Index into the source array that gives this piece's contribution."""
        if self.half is None:
            return ()
        n = self.shape[1] // 2
        return (slice(None), slice(0, n) if self.half == "gate" else slice(n, 2 * n))


# One per expert of a per-expert checkpoint (30,720 in a full-size Qwen3.6):
# the fields in order (tensor, dtype, shape, dest_offset, rows, select,
# scale, expert, half), without the dataclass __init__'s cost (hf2q._frozen).
new_piece = constructor(SourcePiece)


def _half(name: str, dtype: str, shape: tuple[int, ...], half: Literal["gate", "up"]) -> SourcePiece:
    i = shape[1] // 2 if len(shape) > 1 else 0
    return SourcePiece(name, dtype, shape, 0, (0, i) if half == "gate" else (i, 2 * i), half=half)


@dataclass(frozen=True)
class PlannedTensor(TensorPlan):
    """One device tensor of the model: a :class:`hf2q.plan.TensorPlan` with
    the family's own names for its fields and what the plan decided.

    - ``gguf_name`` (the entry's ``name``): GGUF tensor name (``blk.3.ffn_up_exps.weight``).
    - ``hf_name``: the name after the renames of docs/QWEN35MOE.md (e.g.
      ``model.layers.3.mlp.experts.up_proj.weight``; MTP blocks as ``model.layers.{L+i}``).
    - ``shape``: logical numpy shape after every transform (Q8_0 keeps the logical shape).
    - ``kind``: ``"dense"`` | ``"f32"`` | ``"expert"`` (the dtype classes of docs/QWEN35MOE.md).
    - ``dtype``: device dtype, one of :data:`hf2q.plan.CONVERT_DTYPES`.
    - ``sources``: the checkpoint pieces (:class:`SourcePiece`), in the order
      :func:`~hf2q.models.qwen35.transforms.transform_tensor` takes them.
    - ``transforms``: :class:`Transform` tags, in application order.
    - ``layer`` (the entry's ``group``): block index (``None`` for token_embd / output_norm / output).
    - ``source_dtype``: the (common) checkpoint dtype of the sources.
    - ``transform``: the loader's numpy step (None when the pieces stream
      straight to their offsets: expert stacks, fused halves, and the V-head
      reorders, which are then the entry's ``unit_transpose``).
    """

    hf_name: str = ""
    transforms: tuple[str, ...] = ()
    source_dtype: str = ""

    @property
    def gguf_name(self) -> str:
        return self.name

    @property
    def layer(self) -> int | None:
        return self.group

    @property
    def numel(self) -> int:
        return formats.numel(self.shape)


class _Transform:
    """The loader's numpy step of a planned tensor: its transforms, on the
    arrays the loader read for it and drops after the call (handed over:
    reorders in place, no second copy)."""

    __slots__ = ("cfg", "pt")
    #: BF16 sources may come as raw uint16 bits (the loader then reads no
    #: bfloat16 arrays, and imports no ml_dtypes); a uint16 result is BF16 bits.
    raw_bf16 = True

    def __init__(self, cfg: Qwen35Config) -> None:
        self.cfg = cfg
        self.pt: PlannedTensor | None = None

    def __call__(self, arrays: list[np.ndarray]) -> np.ndarray:
        assert self.pt is not None
        return transform_tensor(self.pt, arrays, self.cfg, consume=True, raw_bf16=True)


@dataclass
class Qwen35Plan(LoadPlan):
    """The ordered tensor plan of one checkpoint: a :class:`hf2q.plan.LoadPlan`
    of :class:`PlannedTensor` entries, plus what the family decided.

    ``tensors``: token_embd, then blocks 0..n_blocks-1 (each: attn_norm,
    attention, post_attention_norm, router, experts, shared expert, and for MTP
    blocks the 4 nextn tensors), then output_norm and output.
    ``skipped``: vision/multimodal tensors, known and not loaded (checkpoint names).
    ``dropped``: ``mtp.*`` tensors left out because MTP was turned off.
    ``mtp_layers``: MTP blocks in the plan (``blk.L`` .. ``blk.L+mtp_layers-1``).
    ``tied_output``: no ``output.weight`` is planned (tied embeddings, no
    ``lm_head.weight`` in the checkpoint): the consumer uses ``token_embd``.
    """

    dropped: tuple[str, ...] = ()
    mtp_layers: int = 0
    dense_dtype: str = "f32"
    expert_dtype: str = "q8_0"
    tied_output: bool = False

    @property
    def tensors(self) -> tuple[PlannedTensor, ...]:
        return tuple(self.entries)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[PlannedTensor]:  # type: ignore[override]
        return iter(self.entries)  # type: ignore[arg-type]

    @property
    def n_blocks(self) -> int:
        """``L`` plus the MTP blocks in the plan."""
        return self.config.num_hidden_layers + self.mtp_layers

    def nbytes_by_kind(self) -> dict[str, int]:
        out = {"dense": 0, "f32": 0, "expert": 0}
        for t in self.entries:
            out[t.kind] += t.nbytes
        return out

    def source_names(self) -> set[str]:
        """Every checkpoint tensor the plan reads."""
        return {p.tensor for t in self.entries for p in t.sources}


# --------------------------------------------------------------------------- dtypes
def select_device_dtype(kind: TensorKind, dense_dtype: str = "f32", expert_dtype: str = "q8_0",
                        shape: tuple[int, ...] | None = None, name: str | None = None) -> DeviceDtype:
    """docs/QWEN35MOE.md: expert -> ``expert_dtype``; F32 class -> ``"f32"``; dense -> ``dense_dtype``.

    With ``dense_dtype="q8_0"`` this is exactly the set that llama.cpp's
    ``convert_hf_to_gguf.py --outtype q8_0`` quantizes. Given the tensor's
    ``shape``, a block format whose block does not divide the rows gets
    llama.cpp's fallback (:func:`hf2q.formats.for_row`).
    """
    for what, v in (("dense_dtype", dense_dtype), ("expert_dtype", expert_dtype)):
        if v not in DEVICE_DTYPES:
            raise ValueError(f"{what} must be one of {', '.join(DEVICE_DTYPES)}, got {v!r}")
    if kind == "expert":
        want = expert_dtype
    elif kind == "f32":
        return "f32"
    elif kind == "dense":
        want = dense_dtype
    else:
        raise ValueError(f"unknown tensor kind {kind!r}")
    if shape and want != "q8_0":  # q8_0 rows that are not whole blocks: the ConfigError of plan_qwen35
        want = formats.for_row(want, shape[-1], name)
    return want  # type: ignore[return-value]


_DTYPE_ALIASES = {"BFLOAT16": "BF16", "FLOAT16": "F16", "HALF": "F16", "FLOAT32": "F32", "FLOAT": "F32"}


class _Headers:
    """(name, dtype code, shape) triples as the scale pairing reads a
    checkpoint: ``keys()`` and ``[name].dtype`` / ``.shape``."""

    class _Info:
        __slots__ = ("dtype", "shape")

        def __init__(self, dtype: str, shape: tuple[int, ...]) -> None:
            self.dtype, self.shape = dtype, shape

    def __init__(self, entries: list[tuple[str, str, tuple[int, ...]]], directory: Any = None) -> None:
        self._d = {n: self._Info(dt, sh) for n, dt, sh in entries}
        self.directory = directory  # named in the pairing's errors

    def keys(self) -> list[str]:
        return list(self._d)

    def __getitem__(self, name: str) -> _Headers._Info:
        return self._d[name]


def _dtype_str(d: Any) -> str:
    if isinstance(d, str):
        s = d
    elif isinstance(d, np.dtype) or (isinstance(d, type) and issubclass(d, np.generic)):
        s = np.dtype(d).name
    else:
        s = getattr(d, "name", None) or getattr(d, "value", None) or str(d)
        s = str(s)
    s = s.upper().removeprefix("TORCH.")
    return _DTYPE_ALIASES.get(s, s)


def _info(name: str, info: Any) -> tuple[str, str, tuple[int, ...]]:
    if isinstance(info, (tuple, list)) and len(info) == 2 and not hasattr(info, "shape"):
        dtype, shape = info
    else:
        dtype, shape = getattr(info, "dtype"), getattr(info, "shape")
    return name, _dtype_str(dtype), tuple(int(x) for x in shape)


def _entries(tensors: Any) -> list[tuple[str, str, tuple[int, ...]]]:
    """Normalise the plan's input to (name, dtype code, shape) triples.

    Accepted: a mapping name -> (dtype, shape) or -> object with ``.dtype`` and
    ``.shape`` (e.g. ``hf2q.safetensors.TensorInfo``); an object whose
    ``tensors`` is such a mapping or a method/attribute giving TensorInfo-like
    objects (``hf2q.safetensors.Checkpoint`` / ``SafetensorsFile``); a
    mapping-like object with ``keys()`` and ``[name]``; an iterable of
    TensorInfo-like objects or (name, info) pairs (duplicates are kept, so
    they can be reported).
    """
    if type(tensors) in (Checkpoint, SafetensorsFile):
        # Validated headers: names are str, dtypes safetensors codes (upper
        # case, so _dtype_str keeps them) and shapes tuples of int, already
        # normalised; one tuple per tensor, with no per-field conversion.
        return [(t.name, t.dtype, t.shape) for t in tensors.tensors()]
    if not isinstance(tensors, Mapping):
        inner = getattr(tensors, "tensors", None)
        if callable(inner):
            inner = inner()
        if inner is not None:
            tensors = inner
        elif callable(getattr(tensors, "keys", None)) and hasattr(tensors, "__getitem__"):
            tensors = {k: tensors[k] for k in tensors.keys()}
    if isinstance(tensors, Mapping):
        return [_info(str(k), v) for k, v in tensors.items()]
    out = []
    for item in tensors:
        if hasattr(item, "name") and hasattr(item, "shape"):
            out.append(_info(item.name, item))
        else:
            n, info = item
            out.append(_info(str(n), info))
    return out


# --------------------------------------------------------------------------- the plan
def _unit_transpose(pt: PlannedTensor, cfg: Qwen35Config) -> UnitTranspose | None:
    """A V-head reorder of ``pt`` (its one reorder tag) as the unit transpose
    the loader does where the tensor lies: grouped by key head ``[nk, r]``
    -> tiled ``[r, nk]``, a unit being a head's rows (or, for ``out_proj``,
    a head's columns of each row). The same result as the numpy reorders of
    :mod:`.transforms`, which the tests compare it with."""
    tags = [t for t in pt.transforms if t in Transform.REORDERS]
    if not tags:
        return None
    nk, nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    if len(tags) != 1 or nv % nk:
        raise ValueError(f"{pt.name}: reorders {tags} of {nv} value heads over {nk} key heads")
    r, dv = nv // nk, cfg.linear_value_head_dim
    n = formats.numel(pt.shape)
    cols = formats.numel(pt.shape[1:])  # elements of a row (1 for a vector)
    tag = tags[0]
    if tag == Transform.REORDER_V_COLS:  # out_proj [H, nv*dv]: each row's columns, dv per head
        return UnitTranspose(pt.shape[0], cols, 0, nk, r, dv)
    if tag in (Transform.REORDER_V_QKV, Transform.REORDER_V_CONV1D):  # V rows after Q and K, dv per head
        return UnitTranspose(1, n, 2 * nk * cfg.linear_key_head_dim * cols, nk, r, dv * cols)
    if tag == Transform.REORDER_V_ROWS:  # in_proj_z: rows, dv per head
        return UnitTranspose(1, n, 0, nk, r, dv * cols)
    return UnitTranspose(1, n, 0, nk, r, cols)  # in_proj_a/_b rows, dt_bias elements: one per head


def _transforms(spec: _Spec, cfg: Qwen35Config) -> tuple[str, ...]:
    """Transform tags of a non-expert tensor, in the order of docs/QWEN35MOE.md."""
    tags: list[str] = []
    full = spec.hf
    if full.endswith("norm.weight") and not full.endswith("linear_attn.norm.weight"):
        tags.append(Transform.NORM_PLUS_ONE)
    if spec.hf == "linear_attn.conv1d.weight":
        tags.append(Transform.SQUEEZE_CONV1D)
    if spec.reorder is not None and cfg.linear_num_key_heads != cfg.linear_num_value_heads:
        tags.append(spec.reorder)
    if spec.hf == "linear_attn.A_log":
        tags.append(Transform.NEG_EXP)
    return tuple(tags)


def _mtp_name(canonical: str, cfg: Qwen35Config) -> str:
    """Checkpoint-side spelling of a canonical name (for missing-tensor messages)."""
    m = _LAYER_RE.match(canonical)
    L = cfg.num_hidden_layers
    if m and int(m.group(1)) >= L:
        rest = m.group(2)
        for g, local in _MTP_GLOBALS.items():
            if rest == local:
                return g
        return f"mtp.layers.{int(m.group(1)) - L}.{rest}"
    return canonical


_PROJS = ("gate", "up", "down")


def _claim_hub_experts(entries: list[tuple[str, str, tuple[int, ...]]], layers: int, n_experts: int
                       ) -> tuple[dict[tuple[int, str], dict[int, list[tuple[str, str, tuple[int, ...]]]]],
                                  dict[int, tuple[set[str], set[str]]], list[tuple[str, str, tuple[int, ...]]]]:
    """The per-expert tensors of the text layers named exactly as the Hub
    names them (30,000 of the layout's 32,000 tensors, all under one of
    ``model.layers.`` / ``model.language_model.layers.``): per (layer,
    projection), expert -> [(name, dtype, shape)] as the plan's loop files
    them, each layer's (fused, per-expert) name sets, and the entries left
    for that loop. Each (layer, projection)'s names are made and looked up
    in C loops (map, zip), with no regex match or Python call per tensor.
    Everything else goes through the loop, which files or refuses it as
    before: another spelling of an index (``01``), a block past ``layers``
    (MTP), an expert past ``n_experts``; and every name, when one name is
    listed twice or expert tensors sit under both prefixes (duplicates the
    loop reports in the checkpoint's order)."""
    per_expert: dict[tuple[int, str], dict[int, list[tuple[str, str, tuple[int, ...]]]]] = {}
    forms: dict[int, tuple[set[str], set[str]]] = {}
    names = list(map(_FIRST, entries))
    rec_of = dict(zip(names, entries))
    prefixes = ("model.layers.", "model.language_model.layers.")
    used = [p for p in prefixes if f"{p}0.mlp.experts.0.gate_proj.weight" in rec_of]
    if len(used) != 1 or len(rec_of) != len(names):
        return per_expert, forms, entries
    prefix = used[0]
    other = prefixes[1 - prefixes.index(prefix)]
    if ("\n" + "\n".join(names)).find("\n" + other) >= 0:  # (one C search, not a call per name)
        return per_expert, forms, entries
    experts = range(n_experts)
    claimed: set[str] = set()
    for b in range(layers):
        for proj in _PROJS:
            want = [f"{prefix}{b}.mlp.experts.{e}.{proj}_proj.weight" for e in experts]
            recs = list(map(rec_of.get, want))
            if None in recs:  # some absent (the plan names them): the present ones only
                kept = [(e, n, t) for e, n, t in zip(experts, want, recs) if t is not None]
                if not kept:
                    continue
                per_expert[(b, proj)] = {e: [t] for e, _, t in kept}
                want = [n for _, n, _ in kept]
            else:
                per_expert[(b, proj)] = dict(zip(experts, [[t] for t in recs]))
            layer_forms = forms.get(b)
            if layer_forms is None:
                layer_forms = forms[b] = (set(), set())
            layer_forms[1].update(want)
            claimed.update(want)
    if not claimed:
        return per_expert, forms, entries
    return per_expert, forms, [t for t in entries if t[0] not in claimed]


_FIRST = operator.itemgetter(0)


def plan_qwen35_moe(
    tensors: Any,
    config: Qwen35Config,
    *,
    dense_dtype: str = "f32",
    expert_dtype: str = "q8_0",
    mtp: bool | None = None,
) -> Qwen35Plan:
    """Plan the device tensors of a Qwen3.5/3.6 MoE checkpoint from its metadata.

    ``tensors``: an ``hf2q.safetensors`` checkpoint/file, name -> (dtype string
    such as ``"BF16"``, shape), name -> object with ``.dtype``/``.shape`` (a
    ``TensorInfo``), or an iterable of TensorInfo-like objects. No tensor byte
    is read.

    ``mtp``: ``None`` (default) keeps the MTP block when the checkpoint has
    ``mtp.*`` tensors, ``True`` requires it, ``False`` drops every ``mtp.*``.
    ``dense_dtype``/``expert_dtype``: device dtypes of the dense and expert
    classes (one of :data:`hf2q.plan.CONVERT_DTYPES`); the F32 class is always F32.
    """
    select_device_dtype("dense", dense_dtype, expert_dtype)  # validates both options
    cfg = config
    L = cfg.num_hidden_layers
    directory = getattr(tensors, "directory", None)  # what the manifest errors are led by, where known
    entries = _entries(tensors)
    # FP8 checkpoints (docs/FP8.md): each FP8 weight decodes with its scale,
    # as the converter's dequant step does before any transform; the scale
    # and activation-scale tensors are not tensors of the model.
    # (a validated checkpoint is its own header view: no second table of 60,000 entries)
    headers = tensors if type(tensors) is Checkpoint else _Headers(entries, getattr(tensors, "directory", None))
    scaled = scaled_tensors(headers, cfg.quantization)
    if scaled.scheme is not None:
        entries = [e for e in entries if e[0] not in scaled.consumed and e[0] not in scaled.dropped]

    # The multimodal filter and the language_model. strip, once per tensor.
    # A per-expert name as the Hub writes it (30,000 of 32,000 names in that
    # layout) is neither multimodal nor an MTP name: it is kept with its
    # match (index and projection), which the loop below takes as is.
    per_expert, forms, entries = _claim_hub_experts(entries, L, cfg.num_experts)
    skipped: list[str] = []
    # (raw name, dtype, shape, stripped name or the per-expert name's match)
    text: list[tuple[str, str, tuple[int, ...], Any]] = []
    expert_match = _HUB_EXPERT_NAME_RE.match
    has_mtp = False
    for n, dt, sh in entries:
        em = expert_match(n)
        if em is not None:
            text.append((n, dt, sh, em))
        elif is_multimodal_tensor(n):
            skipped.append(n)
        else:
            c = _strip_lm(n)
            text.append((n, dt, sh, c))
            if not has_mtp and c.startswith("mtp."):
                has_mtp = True
    if has_mtp and not cfg.mtp_num_hidden_layers_stated:
        # config.json does not say: llama.cpp's converter counts mtp.layers.{i}
        # (a default, so it is taken from the names rather than refused).
        idx = [int(m.group(1)) for n, _, _ in entries if (m := _MTP_LAYER_RE.match(_strip_lm(n)))]
        if idx:
            cfg = dataclasses.replace(cfg, mtp_num_hidden_layers=max(idx) + 1)
    if mtp is None:
        use_mtp = has_mtp
    elif mtp:
        if cfg.mtp_num_hidden_layers == 0:
            raise ConfigError("MTP requested, but the config has mtp_num_hidden_layers = 0")
        use_mtp = True
    else:
        use_mtp = False
    n_mtp = cfg.mtp_num_hidden_layers if use_mtp else 0
    n_blocks = L + n_mtp

    dropped: list[str] = []
    unknown: dict[str, str] = {}
    # destination key -> [(raw name, dtype, shape)]
    simple: dict[str, list[tuple[str, str, tuple[int, ...], _Target]]] = {}
    fused: dict[tuple[int, str], list[tuple[str, str, tuple[int, ...]]]] = {}

    def add_expert(layer: int, proj: str, expert: int, rec: tuple[str, str, tuple[int, ...]]) -> None:
        # (get-or-insert by hand: setdefault would build its default, a dict
        # or two sets, for every one of the 30,000 expert tensors)
        layer_forms = forms.get(layer)
        if layer_forms is None:
            layer_forms = forms[layer] = (set(), set())
        by_e = per_expert.get((layer, proj))
        if by_e is None:
            by_e = per_expert[(layer, proj)] = {}
        recs = by_e.get(expert)
        if recs is None:
            by_e[expert] = [rec]
        else:
            recs.append(rec)
        layer_forms[1].add(rec[0])

    # The per-expert names matched above, as _classify would take them; an
    # index it would refuse goes through _classify (which words the refusal).
    n_experts = cfg.num_experts
    for name, dtype, shape, cname in text:
        if type(cname) is not str:
            b_text, e_text, proj = cname.groups()
            b = _canon_int(b_text)
            e = _canon_int(e_text)
            if b is not None and b < n_blocks and e is not None and e < n_experts:
                add_expert(b, proj, e, (name, dtype, shape))
                continue
            cname = _strip_lm(name)
        if cname.startswith("mtp."):
            if not use_mtp:
                dropped.append(name)
                continue
            renamed = _rename_mtp(cname, cfg)
            if isinstance(renamed, str):
                unknown[name] = renamed
                continue
            targets = renamed
        else:
            targets = [cname]
        for tname in targets:
            t = _classify(tname, cfg, n_blocks)
            if isinstance(t, str):
                unknown[name] = t
                break
            rec = (name, dtype, shape)
            if t.form == "simple":
                assert t.spec is not None
                simple.setdefault(_gguf_name(t.spec, t.layer), []).append((*rec, t))
                continue
            assert t.layer is not None
            if t.form == "expert":
                assert t.proj is not None and t.expert is not None
                add_expert(t.layer, t.proj, t.expert, rec)
            else:
                layer_forms = forms.get(t.layer)
                if layer_forms is None:
                    layer_forms = forms[t.layer] = (set(), set())
                projs = ("gate", "up") if t.form == "fused_gate_up" else ("down",)
                for p in projs:
                    fused.setdefault((t.layer, p), []).append(rec)
                layer_forms[0].add(name)

    if unknown:
        if scaled.scheme is None:
            # FP8 weights with their scales but no quantization_config: say
            # that (docs/FP8.md), rather than that the scales are unknown names.
            unconf = unconfigured_scales(headers)
            if unconf:
                raise unconfigured_error(headers, unconf, None, "the qwen35moe loader")
        raise UnknownTensorError(unknown, {n: tensor_file(headers, n) for n in unknown}, str(directory or ""))

    # duplicates
    dups: dict[str, list[str]] = {}
    for g, recs in simple.items():
        if len(recs) > 1:
            dups[g] = [r[0] for r in recs]
    for (b, p), by_e in per_expert.items():
        for e, recs in by_e.items():
            if len(recs) > 1:
                dups[f"{_gguf_name(_EXPERT_SPEC[p], b)} [expert {e}]"] = [r[0] for r in recs]
    for (b, p), recs in fused.items():
        if len(recs) > 1:
            dups[_gguf_name(_EXPERT_SPEC[p], b)] = [r[0] for r in recs]
    if dups:
        raise DuplicateTensorError(dups, str(directory or ""))

    mixed = {b: (sorted(f), sorted(pe)) for b, (f, pe) in forms.items() if f and pe}
    if mixed:
        raise MixedExpertFormsError(mixed)

    # Expected manifest, in plan order; collect missing / dtype / shape problems.
    missing: list[str] = []
    bad_dtype: list[str] = []
    bad_shape: list[str] = []
    planned: list[PlannedTensor] = []

    def check_piece(raw: str, dtype: str, shape: tuple[int, ...], want: tuple[int, ...]) -> None:
        if dtype not in SOURCE_DTYPES and raw not in scaled.scales:
            bad_dtype.append(f"{raw}{in_file(tensor_file(headers, raw))}: {dtype}")
        if shape != want:
            bad_shape.append(f"{raw}{in_file(tensor_file(headers, raw))}: shape {list(shape)}, expected {list(want)}")

    def plan_simple(spec: _Spec, layer: int | None) -> None:
        g = _gguf_name(spec, layer)
        canonical = spec.hf if layer is None else f"model.layers.{layer}.{spec.hf}"
        recs = simple.get(g)
        if not recs:
            if spec.hf == "lm_head.weight" and cfg.tie_word_embeddings:
                return
            missing.append(_mtp_name(canonical, cfg) + ("" if not spec.aliases else
                                                        f" (or {', '.join(spec.aliases)})"))
            return
        raw, dtype, shape, _ = recs[0]
        want_src = (spec.src_shape or spec.shape)(cfg)
        check_piece(raw, dtype, shape, want_src)
        planned.append(PlannedTensor(
            g, spec.shape(cfg), select_device_dtype(spec.kind, dense_dtype, expert_dtype, spec.shape(cfg), g),
            (SourcePiece(raw, dtype, shape, scale=scaled.scales.get(raw)),), group=layer, kind=spec.kind,
            hf_name=canonical, transforms=_transforms(spec, cfg), source_dtype=dtype,
        ))

    def plan_experts(spec: _Spec, b: int, proj: str) -> None:
        g = _gguf_name(spec, b)
        canonical = f"model.layers.{b}.{spec.hf}"
        logical = spec.shape(cfg)
        E = cfg.num_experts
        if (b, proj) in fused:
            raw, dtype, shape = fused[(b, proj)][0]
            if proj == "down":
                want = logical
                pieces = (SourcePiece(raw, dtype, shape, scale=scaled.scales.get(raw)),)
                tags: tuple[str, ...] = ()
            else:
                want = (E, 2 * cfg.moe_intermediate_size, cfg.hidden_size)
                pieces = (dataclasses.replace(_half(raw, dtype, shape, proj),  # type: ignore[arg-type]
                                              scale=scaled.scales.get(raw)),)
                tags = (Transform.FUSED_SPLIT,)
            # gate and up share one fused tensor: report its problems once
            if proj != "up":
                check_piece(raw, dtype, shape, want)
            src_dtype = dtype
        elif (b, proj) in per_expert:
            by_e = per_expert[(b, proj)]
            if len(by_e) < E:
                # Name the first few absent experts and count the rest: the work
                # follows the checkpoint's tensors, not num_experts.
                shown: list[int] = []
                e = 0
                while len(shown) < 8 and e < E:
                    if e not in by_e:
                        shown.append(e)
                    e += 1
                missing.extend(_mtp_name(f"model.layers.{b}.mlp.experts.{x}.{proj}_proj.weight", cfg) for x in shown)
                if E - len(by_e) > len(shown):
                    missing.append(f"... and {E - len(by_e) - len(shown)} more experts of "
                                   + _mtp_name(f"model.layers.{b}.mlp.experts", cfg) + f".*.{proj}_proj.weight")
                return
            want = (spec.src_shape or spec.shape)(cfg)
            # Expert e lands at element e * numel of the stack (one shape
            # for all of them, unless the shape check below refuses one).
            # The pieces made by C loops (map), a Python call per expert only
            # for the constructor: 30,000-60,000 of them in a full-size checkpoint.
            recs = [by_e[e][0] for e in range(E)]
            names, dtypes, shapes = zip(*recs)
            if shapes.count(shapes[0]) == E:
                numel = formats.numel(shapes[0])
                offsets: Any = range(0, E * numel, numel) if numel else itertools.repeat(0, E)
            else:
                offsets = [e * formats.numel(sh) for e, sh in enumerate(shapes)]
            scales_of = scaled.scales
            pieces = tuple(map(new_piece, names, dtypes, shapes, offsets, itertools.repeat(None),
                               itertools.repeat(None), map(scales_of.get, names), range(E),
                               itertools.repeat(None)))
            kinds = set(dtypes)
            if shapes.count(want) != E or not kinds.issubset(SOURCE_DTYPES):  # check_piece's tests: a call per problem only
                for n, d, sh in recs:
                    if sh != want or (d not in SOURCE_DTYPES and n not in scales_of):
                        check_piece(n, d, sh, want)
            if len(kinds) > 1:
                counts = {d: dtypes.count(d) for d in sorted(kinds)}
                bad_dtype.append(f"{g}: experts mix dtypes {counts}")
            src_dtype = pieces[0].dtype
            tags = (Transform.STACK_EXPERTS,)
        else:
            form = "gate_up_proj" if proj != "down" else "down_proj"
            missing.append(_mtp_name(canonical, cfg)
                           + f" (fused experts.{form} or per-expert experts.{{0..{E - 1}}}.{proj}_proj.weight)")
            return
        planned.append(PlannedTensor(
            g, logical, select_device_dtype("expert", dense_dtype, expert_dtype, logical, g), pieces, group=b,
            kind="expert",
            hf_name=canonical, transforms=tags, source_dtype=src_dtype,
        ))

    plan_simple(_GLOBAL_BY_HF["model.embed_tokens.weight"], None)
    for b in range(n_blocks):
        kind = "full" if b >= L else cfg.layer_kinds[b]
        for spec in _LAYER_SPECS:
            if spec.where == "mtp" and b < L:
                continue
            if spec.where in ("full", "linear") and spec.where != kind:
                continue
            if spec.kind == "expert":
                plan_experts(spec, b, spec.hf.split(".")[2].removesuffix("_proj"))
            else:
                plan_simple(spec, b)
    plan_simple(_GLOBAL_BY_HF["model.norm.weight"], None)
    plan_simple(_GLOBAL_BY_HF["lm_head.weight"], None)

    if missing:
        raise _missing_error(missing, directory)
    if bad_dtype:
        raise _dtype_error(bad_dtype, directory)
    if bad_shape:
        raise _shape_error(bad_shape, directory)

    not_q8 = [f"{t.gguf_name} {list(t.shape)}" for t in planned if t.dtype == "q8_0" and t.shape[-1] % _Q8_BLOCK]
    if not_q8:
        raise ConfigError(
            f"{len(not_q8)} tensor(s) to be stored as Q8_0 have a last dimension that is not a multiple of 32 "
            f"(Q8_0 quantizes rows in blocks of 32; llama.cpp would silently fall back to F16):{_listing(not_q8)}"
        )

    # What the loader does with each: the pieces stream to their offsets
    # when no numpy step is needed and the device converts their format
    # natively, else the tensor's transforms run on its sources.
    convertible: dict[tuple[str, str], bool] = {}
    for i, pt in enumerate(planned):
        streamed = set(pt.transforms) <= _STREAMABLE
        if streamed and any(p.scale is not None for p in pt.sources):
            pass  # scaled FP8 pieces: the loader decodes each into place (any destination format)
        elif streamed:
            for code in {p.dtype for p in pt.sources}:
                ok = convertible.get((code, pt.dtype))
                if ok is None:
                    ok = convertible[(code, pt.dtype)] = formats.can_convert(code, pt.dtype)
                streamed = streamed and ok
        if not streamed:
            step = _Transform(cfg)
            planned[i] = step.pt = dataclasses.replace(pt, transform=step)
        elif pt.transforms:
            t = _unit_transpose(pt, cfg)
            if t is not None:
                planned[i] = dataclasses.replace(pt, unit_transpose=t)

    return Qwen35Plan(
        "qwen35moe", planned, cfg, tuple(skipped),
        extra={"blocks": n_blocks, "experts": cfg.num_experts, "expert_dtype": expert_dtype,
               "dense_dtype": dense_dtype, "skipped_tensors": len(skipped),
               **({"quantization": scaled.scheme.describe()} if scaled.scheme is not None else {})},
        dropped=tuple(dropped), mtp_layers=n_mtp, dense_dtype=dense_dtype, expert_dtype=expert_dtype,
        tied_output="output.weight" not in simple,
    )
