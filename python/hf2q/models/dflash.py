"""DFlash drafter: config, tensor manifest, weight validation and byte
accounting (spec: dflash.md).

A DFlash drafter is a small stack of dense Qwen3-style decoder layers fed by an
``fc`` projection of hidden states tapped from the target model. hf2q validates
its ``config.json`` (:class:`DFlashConfig`) and ``model.safetensors``
(:meth:`DFlashWeights.load`) against the ``2 + 11*L + 1`` tensor manifest
(:func:`expected_manifest`). All tensors are BF16 on disk; the six RMSNorm
kinds become F32 on the device, everything else stays a raw BF16 copy.

The device upload is a separate step: :class:`DFlashWeights` exposes, in
manifest order, ``(entry, info, path)`` for each tensor so that it can ``pread``
each tensor straight into its destination.
"""

from __future__ import annotations

import copy
import json
import math
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Union

import numpy as np

from ..errors import read_config_text
from ..errors import (
    ConfigError,
    Hf2qError,
    DtypeMismatchError,
    ExtraTensorError,
    ManifestError,
    ManifestProblem,
    MissingTensorError,
    ShapeMismatchError,
)
from ..device import Buffer, Device, FileReadError
from ..safetensors import Checkpoint, SafetensorsFile, TensorInfo, open_checkpoint
from ._loading import LoadSummary, detached, file_read_error, progress_bar, residency_state

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_MASK_TOKEN_ID",
    "DEFAULT_ROPE_THETA",
    "DRAFTER_CONFIGS",
    "FULL_ATTENTION",
    "GEMMA4_26B_A4B_DRAFTER_CONFIG",
    "LAYER_TENSOR_NAMES",
    "NORM_SUFFIXES",
    "QWEN36_27B_DRAFTER_CONFIG",
    "QWEN36_35B_A3B_DRAFTER_CONFIG",
    "QWEN36_35B_A3B_NEW_DRAFTER_CONFIG",
    "SLIDING_ATTENTION",
    "TINY_DRAFTER_CONFIG",
    "DFlashConfig",
    "DFlashWeights",
    "DFlashLayerTensors",
    "DFlashModelTensors",
    "DTypeInvariantError",
    "LoadedTensor",
    "load",
    "ManifestEntry",
    "check_manifest",
    "expected_manifest",
    "expected_resident_bytes",
    "expected_total_data_bytes",
    "manifest_error",
    "n_norm_elements",
]

PathLike = Union[str, "os.PathLike[str]"]

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
_LAYER_KINDS = (FULL_ATTENTION, SLIDING_ATTENTION)
U32_MAX = (1 << 32) - 1
#: Values used when config.json leaves the field out: those of llama.cpp's
#: converter (block size 16; rope_theta through transformers' Qwen3Config,
#: 10000), mask token 0, all layers full attention.
DEFAULT_BLOCK_SIZE = 16
DEFAULT_ROPE_THETA = 10000.0
DEFAULT_MASK_TOKEN_ID = 0

#: Per-layer tensor names (after ``layers.{i}.``), in manifest (alphabetical) order.
LAYER_TENSOR_NAMES: tuple[str, ...] = (
    "input_layernorm.weight",
    "mlp.down_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "post_attention_layernorm.weight",
    "self_attn.k_norm.weight",
    "self_attn.k_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.q_proj.weight",
    "self_attn.v_proj.weight",
)

#: The six RMSNorm kinds (decoded to F32 on the device).
NORM_SUFFIXES: tuple[str, ...] = (
    "hidden_norm.weight",
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "self_attn.k_norm.weight",
    "self_attn.q_norm.weight",
    "norm.weight",
)


# ============================================================================ config


def _type_name(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, (list, tuple)):
        return "array"
    if isinstance(v, Mapping):
        return "object"
    return type(v).__name__


def _type_error(key: str, want: str, v: Any) -> ConfigError:
    return ConfigError(f"config key '{key}' must be {want}, got {_type_name(v)} {v!r}", key=key)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool))


def _as_int(v: Any, key: str, *, minimum: int | None = None) -> int:
    if not _is_int(v):
        raise _type_error(key, "an integer", v)
    if minimum is not None and v < minimum:
        raise ConfigError(f"config key '{key}' must be >= {minimum}, got {v}", key=key)
    return int(v)


def _as_float(v: Any, key: str, *, positive: bool = False) -> float:
    if not _is_number(v):
        raise _type_error(key, "a number", v)
    f = float(v)
    if not math.isfinite(f):
        raise ConfigError(f"config key '{key}' must be finite, got {v!r}", key=key)
    if positive and f <= 0:
        raise ConfigError(f"config key '{key}' must be > 0, got {v!r}", key=key)
    return f


def _as_object(v: Any, key: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise _type_error(key, "an object", v)
    return v


@dataclass(frozen=True)
class DFlashConfig:
    """A validated DFlash drafter config (spec §2-§4).

    Build with :meth:`from_file`, :meth:`from_json_str` or :meth:`from_dict`,
    which accept both config revisions (root ``rope_theta``/``block_size`` or
    ``rope_parameters`` + ``dflash_config.block_size``), check JSON types
    (naming the key) and then the eight validation rules, in order. Direct
    construction also runs the eight rules.
    """

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    num_target_layers: int
    target_layer_ids: tuple[int, ...]
    rope_theta: float
    block_size: int
    mask_token_id: int = 0
    #: ``rope_scaling`` when it is an object, else ``rope_parameters`` when its
    #: ``rope_type`` is present and not ``"default"``, else None.
    rope_scaling: dict[str, Any] | None = field(default=None, compare=True, hash=False)
    #: One entry per layer; None (the default) means all ``"full_attention"``.
    layer_types: tuple[str, ...] | None = None
    sliding_window: int | None = None
    final_logit_softcapping: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_layer_ids", tuple(self.target_layer_ids))
        if self.layer_types is None:
            object.__setattr__(self, "layer_types", (FULL_ATTENTION,) * self.num_hidden_layers)
        else:
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
        self.validate()

    # ------------------------------------------------------------------ rules
    def validate(self) -> None:
        """The eight rules of spec §4, in order; the first broken raises
        :class:`~hf2q.ConfigError` with ``rule`` set."""
        L = self.num_hidden_layers
        lt = self.layer_types or ()
        if len(lt) != L:
            raise ConfigError(
                f"config rule 1: layer_types has {len(lt)} entries but num_hidden_layers is {L} "
                "(one attention kind per layer)",
                key="layer_types",
                rule=1,
            )
        if SLIDING_ATTENTION in lt and self.sliding_window is None:
            raise ConfigError(
                "config rule 2: layer_types has sliding_attention layers but sliding_window is not set",
                key="sliding_window",
                rule=2,
            )
        if self.block_size < 2:
            raise ConfigError(
                f"config rule 3: block_size must be >= 2 (at least one mask token per block), got {self.block_size}",
                key="block_size",
                rule=3,
            )
        if self.num_target_layers <= 0:
            raise ConfigError(
                f"config rule 4: num_target_layers must be > 0, got {self.num_target_layers}",
                key="num_target_layers",
                rule=4,
            )
        ids = self.target_layer_ids
        if not ids:
            raise ConfigError(
                "config rule 5: dflash_config.target_layer_ids is empty (fc needs at least one tapped layer)",
                key="dflash_config.target_layer_ids",
                rule=5,
            )
        for a, b in zip(ids, ids[1:]):
            if b <= a:
                raise ConfigError(
                    f"config rule 6: dflash_config.target_layer_ids must be strictly increasing, got {list(ids)} "
                    f"({a} then {b})",
                    key="dflash_config.target_layer_ids",
                    rule=6,
                )
        if ids[0] < 0 or ids[-1] >= self.num_target_layers:
            raise ConfigError(
                f"config rule 7: dflash_config.target_layer_ids {list(ids)} must lie in "
                f"[0, num_target_layers = {self.num_target_layers})",
                key="dflash_config.target_layer_ids",
                rule=7,
            )
        if not 0 <= self.mask_token_id <= U32_MAX:
            raise ConfigError(
                f"config rule 8: dflash_config.mask_token_id must be in [0, 2^32 - 1], got {self.mask_token_id}",
                key="dflash_config.mask_token_id",
                rule=8,
            )

    # ------------------------------------------------------------------ derived
    @property
    def num_taps(self) -> int:
        """T, the number of tapped target layers."""
        return len(self.target_layer_ids)

    @property
    def fc_input_dim(self) -> int:
        """``T * H`` (not ``num_target_layers * H``)."""
        return self.num_taps * self.hidden_size

    @property
    def q_width(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def n_norm_elements(self) -> int:
        """``L * (2*Dh + 2*H) + 2*H``: elements of the six norm kinds."""
        return n_norm_elements(self)

    @property
    def num_tensors(self) -> int:
        """``2 + 11*L + 1``."""
        return 3 + len(LAYER_TENSOR_NAMES) * self.num_hidden_layers

    def is_sliding(self, layer: int) -> bool:
        return (self.layer_types or ())[layer] == SLIDING_ATTENTION

    # ------------------------------------------------------------------ parsing
    @classmethod
    def from_file(cls, path: PathLike) -> DFlashConfig:
        """Read ``config.json`` (``path`` may be the file or its directory)."""
        p, text = read_config_text(path)
        try:
            return cls.from_json_str(text)
        except ConfigError as e:
            raise ConfigError(f"{p}: {e}", key=e.key, rule=e.rule) from None

    @classmethod
    def from_json_str(cls, text: str | bytes) -> DFlashConfig:
        try:
            d = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise ConfigError(f"config is not valid JSON: {e}") from None
        if not isinstance(d, dict):
            raise ConfigError(f"config must be a JSON object, got {_type_name(d)}")
        return cls.from_dict(d)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DFlashConfig:
        """Parse a config mapping: required keys and JSON types first (naming
        the key), then the two revisions' resolution, then rules 1-8."""
        if not isinstance(d, Mapping):
            raise ConfigError(f"config must be a JSON object, got {_type_name(d)}")

        archs = d.get("architectures")
        if "dflash_config" not in d and not (isinstance(archs, list) and "DFlashDraftModel" in archs):
            # another model's config: say so, not which key it lacks
            raise ConfigError(
                f"not a DFlash drafter config (architectures {archs!r}, model_type {d.get('model_type')!r}): "
                "it has no 'dflash_config'; hf2q.dflash loads DFlash drafters only (`hf2q load` picks the "
                "loader from config.json)", key="dflash_config")

        def req(key: str) -> Any:
            if key not in d:
                raise ConfigError(f"config is missing required key '{key}'", key=key)
            return d[key]

        H = _as_int(req("hidden_size"), "hidden_size", minimum=1)
        L = _as_int(req("num_hidden_layers"), "num_hidden_layers", minimum=1)
        Qh = _as_int(req("num_attention_heads"), "num_attention_heads", minimum=1)
        Kh = _as_int(req("num_key_value_heads"), "num_key_value_heads", minimum=1)
        Dh = _as_int(req("head_dim"), "head_dim", minimum=1)
        I = _as_int(req("intermediate_size"), "intermediate_size", minimum=1)
        vocab = _as_int(req("vocab_size"), "vocab_size", minimum=1)
        eps = _as_float(req("rms_norm_eps"), "rms_norm_eps", positive=True)
        max_pos = _as_int(req("max_position_embeddings"), "max_position_embeddings", minimum=1)
        n_target = _as_int(req("num_target_layers"), "num_target_layers")

        dcfg = _as_object(req("dflash_config"), "dflash_config")
        if "target_layer_ids" not in dcfg:
            raise ConfigError(
                "config is missing required key 'dflash_config.target_layer_ids'", key="dflash_config.target_layer_ids"
            )
        raw_ids = dcfg["target_layer_ids"]
        if not isinstance(raw_ids, (list, tuple)):
            raise _type_error("dflash_config.target_layer_ids", "an array of integers", raw_ids)
        ids = tuple(_as_int(v, f"dflash_config.target_layer_ids[{i}]") for i, v in enumerate(raw_ids))
        mask = dcfg.get("mask_token_id")
        mask_id = DEFAULT_MASK_TOKEN_ID if mask is None else _as_int(mask, "dflash_config.mask_token_id")

        # Optional keys.
        raw_scaling = d.get("rope_scaling")
        rope_scaling = dict(copy.deepcopy(raw_scaling)) if isinstance(raw_scaling, Mapping) else None
        rope_params: Mapping[str, Any] | None = None
        if d.get("rope_parameters") is not None:
            rope_params = _as_object(d["rope_parameters"], "rope_parameters")
        layer_types: tuple[str, ...] | None = None
        if d.get("layer_types") is not None:
            raw_lt = d["layer_types"]
            if not isinstance(raw_lt, (list, tuple)):
                raise _type_error("layer_types", "an array of strings", raw_lt)
            kinds = []
            for i, v in enumerate(raw_lt):
                if not isinstance(v, str):
                    raise _type_error(f"layer_types[{i}]", "a string", v)
                if v not in _LAYER_KINDS:
                    raise ConfigError(
                        f"config key 'layer_types[{i}]' must be 'full_attention' or 'sliding_attention', got {v!r}",
                        key=f"layer_types[{i}]",
                    )
                kinds.append(v)
            layer_types = tuple(kinds)
        sliding_window = None
        if d.get("sliding_window") is not None:
            sliding_window = _as_int(d["sliding_window"], "sliding_window", minimum=1)
        softcap = None
        if d.get("final_logit_softcapping") is not None:
            softcap = _as_float(d["final_logit_softcapping"], "final_logit_softcapping")

        # rope_theta: root, else rope_parameters.rope_theta, else rope_scaling.rope_theta.
        if d.get("rope_theta") is not None:
            rope_theta = _as_float(d["rope_theta"], "rope_theta", positive=True)
        elif rope_params is not None and rope_params.get("rope_theta") is not None:
            rope_theta = _as_float(rope_params["rope_theta"], "rope_parameters.rope_theta", positive=True)
        elif rope_scaling is not None and rope_scaling.get("rope_theta") is not None:
            rope_theta = _as_float(rope_scaling["rope_theta"], "rope_scaling.rope_theta", positive=True)
        else:
            # transformers' Qwen3Config default, which llama.cpp's converter
            # reads through AutoConfig when no location states it.
            rope_theta = DEFAULT_ROPE_THETA

        # block_size: root, else dflash_config.block_size; both and different -> error.
        root_bs = None if d.get("block_size") is None else _as_int(d["block_size"], "block_size")
        nested_bs = None if dcfg.get("block_size") is None else _as_int(dcfg["block_size"], "dflash_config.block_size")
        if root_bs is not None and nested_bs is not None and root_bs != nested_bs:
            raise ConfigError(
                f"config has conflicting block sizes: block_size = {root_bs} but dflash_config.block_size = {nested_bs}",
                key="block_size",
            )
        block_size = root_bs if root_bs is not None else nested_bs
        if block_size is None:
            # Neither location states it: llama.cpp's converter (and z-lab's
            # DFlashDraftModel) use 16. A default is not checked against anything.
            block_size = DEFAULT_BLOCK_SIZE

        # Scaling: rope_scaling object, else rope_parameters with a non-default rope_type.
        if rope_scaling is None and rope_params is not None and "rope_type" in rope_params:
            rt = rope_params["rope_type"]
            if not isinstance(rt, str):
                raise _type_error("rope_parameters.rope_type", "a string", rt)
            if rt != "default":
                rope_scaling = dict(copy.deepcopy(rope_params))

        return cls(
            hidden_size=H,
            num_hidden_layers=L,
            num_attention_heads=Qh,
            num_key_value_heads=Kh,
            head_dim=Dh,
            intermediate_size=I,
            vocab_size=vocab,
            rms_norm_eps=eps,
            max_position_embeddings=max_pos,
            num_target_layers=n_target,
            target_layer_ids=ids,
            rope_theta=rope_theta,
            block_size=block_size,
            mask_token_id=mask_id,
            rope_scaling=rope_scaling,
            layer_types=layer_types,
            sliding_window=sliding_window,
            final_logit_softcapping=softcap,
        )


# ============================================================================ manifest


@dataclass(frozen=True)
class ManifestEntry:
    """One expected drafter tensor: on disk BF16; on the device ``"bf16"``
    (raw byte copy, no transpose) or ``"f32"`` (norms, ``bits << 16``)."""

    name: str
    shape: tuple[int, ...]
    disk_dtype: str = "BF16"
    device_dtype: str = "bf16"

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def disk_nbytes(self) -> int:
        return 2 * self.numel

    @property
    def device_nbytes(self) -> int:
        """Logical device buffer length (2 bytes/element for bf16, 4 for f32)."""
        return (4 if self.device_dtype == "f32" else 2) * self.numel

    @property
    def is_norm(self) -> bool:
        return self.device_dtype == "f32"


def expected_manifest(cfg: DFlashConfig) -> list[ManifestEntry]:
    """The ``2 + 11*L + 1`` tensors in spec order: ``fc.weight``,
    ``hidden_norm.weight``, per layer the 11 names alphabetically, ``norm.weight``."""
    H, Dh, I = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.q_width, cfg.kv_width
    per_layer: dict[str, tuple[tuple[int, ...], str]] = {
        "input_layernorm.weight": ((H,), "f32"),
        "mlp.down_proj.weight": ((H, I), "bf16"),
        "mlp.gate_proj.weight": ((I, H), "bf16"),
        "mlp.up_proj.weight": ((I, H), "bf16"),
        "post_attention_layernorm.weight": ((H,), "f32"),
        "self_attn.k_norm.weight": ((Dh,), "f32"),
        "self_attn.k_proj.weight": ((kv, H), "bf16"),
        "self_attn.o_proj.weight": ((H, q), "bf16"),
        "self_attn.q_norm.weight": ((Dh,), "f32"),
        "self_attn.q_proj.weight": ((q, H), "bf16"),
        "self_attn.v_proj.weight": ((kv, H), "bf16"),
    }
    out = [
        ManifestEntry("fc.weight", (H, cfg.fc_input_dim), "BF16", "bf16"),
        ManifestEntry("hidden_norm.weight", (H,), "BF16", "f32"),
    ]
    for i in range(cfg.num_hidden_layers):
        for suffix in LAYER_TENSOR_NAMES:
            shape, dev = per_layer[suffix]
            out.append(ManifestEntry(f"layers.{i}.{suffix}", shape, "BF16", dev))
    out.append(ManifestEntry("norm.weight", (H,), "BF16", "f32"))
    return out


def n_norm_elements(cfg: DFlashConfig) -> int:
    """``L * (2*Dh + 2*H) + 2*H``."""
    H, L, Dh = cfg.hidden_size, cfg.num_hidden_layers, cfg.head_dim
    return L * (2 * Dh + 2 * H) + 2 * H


def expected_total_data_bytes(cfg: DFlashConfig) -> int:
    """On-disk tensor bytes of a conforming checkpoint (2 x parameters)."""
    return sum(e.disk_nbytes for e in expected_manifest(cfg))


def expected_resident_bytes(cfg: DFlashConfig) -> int:
    """``gpu_resident_bytes = total_data_bytes + 2 * n_norm`` (norms widen from
    2 to 4 bytes): the sum of logical device buffer lengths, before any page
    rounding. Needs no file."""
    return expected_total_data_bytes(cfg) + 2 * n_norm_elements(cfg)


# ============================================================================ weights

_KIND_ORDER = {"extra": 0, "missing": 1, "dtype": 2, "shape": 3}
_KIND_CLASS: dict[str, type[ManifestError]] = {
    "extra": ExtraTensorError,
    "missing": MissingTensorError,
    "dtype": DtypeMismatchError,
    "shape": ShapeMismatchError,
}


def _fmt_shape(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def check_manifest(
    tensors: Mapping[str, TensorInfo] | Checkpoint | SafetensorsFile,
    manifest: Sequence[ManifestEntry],
) -> list[ManifestProblem]:
    """Every mismatch between the checkpoint's tensors and ``manifest``,
    sorted by kind (extra, missing, dtype, shape) then tensor name."""
    names = list(tensors.keys())
    wanted = {e.name: e for e in manifest}
    problems: list[ManifestProblem] = []
    for name in names:
        if name not in wanted:
            info = tensors[name]
            problems.append(
                ManifestProblem("extra", name, "absent (not in the DFlash manifest)", f"{info.dtype} {_fmt_shape(info.shape)}")
            )
    present = set(names)
    for e in manifest:
        if e.name not in present:
            problems.append(ManifestProblem("missing", e.name, f"{e.disk_dtype} {_fmt_shape(e.shape)}", "absent"))
            continue
        info = tensors[e.name]
        if info.dtype != e.disk_dtype:
            problems.append(
                ManifestProblem("dtype", e.name, f"{e.disk_dtype} (DFlash drafters are BF16-only)", info.dtype)
            )
        if tuple(info.shape) != tuple(e.shape):
            problems.append(ManifestProblem("shape", e.name, _fmt_shape(e.shape), _fmt_shape(info.shape)))
    problems.sort(key=lambda p: (_KIND_ORDER[p.kind], p.tensor))
    return problems


def manifest_error(problems: Sequence[ManifestProblem], where: str) -> ManifestError:
    """The error for a non-empty problem list: class of the first kind present."""
    cls = _KIND_CLASS[problems[0].kind]
    lines = "\n".join(f"  {p}" for p in problems)
    return cls(
        f"{where}: checkpoint does not match the DFlash drafter manifest ({len(problems)} problem(s)):\n{lines}",
        problems,
    )


class LoadedTensor(NamedTuple):
    """A manifest entry bound to the checkpoint tensor that satisfies it."""

    entry: ManifestEntry
    info: TensorInfo
    path: Path


class DFlashWeights:
    """A drafter checkpoint validated against its manifest.

    ``tensors`` holds one :class:`LoadedTensor` ``(entry, info, path)`` per
    manifest entry, in manifest order; ``info.offset``/``info.nbytes`` locate
    the BF16 bytes in ``path`` for a ``pread`` straight into a device buffer.
    """

    def __init__(
        self,
        config: DFlashConfig,
        checkpoint: Checkpoint,
        tensors: list[LoadedTensor],
        owns_checkpoint: bool,
    ) -> None:
        self.config = config
        self.checkpoint = checkpoint
        self.tensors = tensors
        self._by_name = {t.entry.name: t for t in tensors}
        self._owns = owns_checkpoint

    @classmethod
    def load(
        cls,
        source: Checkpoint | SafetensorsFile | PathLike,
        cfg: DFlashConfig | None = None,
    ) -> DFlashWeights:
        """Validate ``source`` (an open :class:`Checkpoint`/:class:`SafetensorsFile`,
        or a path to a file, index or directory) against ``expected_manifest(cfg)``.

        ``cfg`` defaults to the ``config.json`` next to the checkpoint. All
        problems are collected; the raised :class:`~hf2q.ManifestError` subclass
        is that of the first kind present (extra, missing, dtype, shape) and its
        message and ``problems`` list all of them. A checkpoint opened here is
        owned (closed by :meth:`close`); one passed in is not.
        """
        owns = False
        if isinstance(source, Checkpoint):
            ckpt = source
        elif isinstance(source, SafetensorsFile):
            ckpt = Checkpoint([source], source.path.parent)
        else:
            ckpt = open_checkpoint(source)
            owns = True
        try:
            if cfg is None:
                cfg = DFlashConfig.from_file(ckpt.directory / "config.json")
            manifest = expected_manifest(cfg)
            problems = check_manifest(ckpt, manifest)
            if problems:
                where = str(ckpt.index_path or (ckpt.files[0] if len(ckpt.files) == 1 else ckpt.directory))
                raise manifest_error(problems, where)
            tensors = []
            for e in manifest:
                info = ckpt[e.name]
                path = info.path if info.path is not None else ckpt.file_for(e.name).path
                tensors.append(LoadedTensor(e, info, path))
        except BaseException:
            if owns:
                ckpt.close()
            raise
        return cls(cfg, ckpt, tensors, owns)

    # ------------------------------------------------------------------ access
    def __iter__(self) -> Iterator[LoadedTensor]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def __getitem__(self, name: str) -> LoadedTensor:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"{name!r} is not in the DFlash manifest") from None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def names(self) -> list[str]:
        return [t.entry.name for t in self.tensors]

    @property
    def manifest(self) -> list[ManifestEntry]:
        return [t.entry for t in self.tensors]

    def total_data_bytes(self) -> int:
        """Sum of on-disk tensor bytes (headers excluded) = 2 x parameters."""
        return sum(t.info.nbytes for t in self.tensors)

    def gpu_resident_bytes(self) -> int:
        """Sum of logical device buffer lengths: ``total_data_bytes + 2 * n_norm``."""
        return sum(t.entry.device_nbytes for t in self.tensors)

    def read_raw(self, name: str, out: Any = None) -> Any:
        """The tensor's on-disk BF16 bytes, into ``out`` (any writable buffer of
        ``nbytes`` bytes, returned) or a new bytearray."""
        t = self[name]
        return self.checkpoint.file_for(name).read_bytes(t.info.name, out)

    def read_host(self, name: str) -> np.ndarray:
        """The tensor as its device layout on the host: ``ml_dtypes.bfloat16``
        for raw tensors, float32 (``bits << 16``, exact) for the norms."""
        import ml_dtypes

        from .. import ops

        t = self[name]
        raw = np.empty(t.entry.shape, dtype=ml_dtypes.bfloat16)
        self.checkpoint.read_into(name, raw)
        if t.entry.device_dtype == "f32":
            return ops.bf16_to_f32(raw)
        return raw

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Close the checkpoint if it was opened by :meth:`load`."""
        if self._owns:
            self.checkpoint.close()

    def __enter__(self) -> DFlashWeights:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"<hf2q.dflash.DFlashWeights {len(self)} tensors, {self.total_data_bytes():,} data bytes, "
            f"{self.gpu_resident_bytes():,} resident bytes>"
        )


# ============================================================================ known drafters

#: z-lab gemma-4-26B-A4B-it-DFlash ``config.json`` (spec §7), verbatim.
GEMMA4_26B_A4B_DRAFTER_CONFIG: dict[str, Any] = {
    "architectures": ["DFlashDraftModel"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "block_size": 16,
    "bos_token_id": 2,
    "dflash_config": {"mask_token_id": 4, "target_layer_ids": [1, 6, 11, 17, 22, 27]},
    "dtype": "bfloat16",
    "eos_token_id": 1,
    "final_logit_softcapping": 30.0,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2816,
    "intermediate_size": 5632,
    "layer_types": [
        "sliding_attention",
        "sliding_attention",
        "sliding_attention",
        "sliding_attention",
        "full_attention",
    ],
    "max_position_embeddings": 262144,
    "max_window_layers": 5,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_hidden_layers": 5,
    "num_key_value_heads": 8,
    "num_target_layers": 30,
    "pad_token_id": 0,
    "rms_norm_eps": 1e-06,
    "sliding_window": 2048,
    "tie_word_embeddings": False,
    "use_cache": True,
    "use_sliding_window": True,
    "vocab_size": 262144,
    "rope_theta": 1000000,
    "rope_scaling": None,
}

#: Qwen3.6-27B drafter (spec §8): original revision, root block_size.
QWEN36_27B_DRAFTER_CONFIG: dict[str, Any] = {
    "architectures": ["DFlashDraftModel"],
    "block_size": 16,
    "dflash_config": {"mask_token_id": 248070, "target_layer_ids": [1, 16, 31, 46, 61]},
    "dtype": "bfloat16",
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 5120,
    "intermediate_size": 17408,
    "layer_types": ["sliding_attention"] * 4 + ["full_attention"],
    "max_position_embeddings": 262144,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_hidden_layers": 5,
    "num_key_value_heads": 8,
    "num_target_layers": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 10000000,
    "sliding_window": 2048,
    "tie_word_embeddings": False,
    "use_sliding_window": True,
    "vocab_size": 248320,
}

#: Qwen3.6-35B-A3B drafter, original revision (spec §8): 8 full-attention layers.
QWEN36_35B_A3B_DRAFTER_CONFIG: dict[str, Any] = {
    "architectures": ["DFlashDraftModel"],
    "block_size": 16,
    "dflash_config": {"mask_token_id": 248070, "target_layer_ids": [1, 10, 19, 28, 37]},
    "dtype": "bfloat16",
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "max_position_embeddings": 262144,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_hidden_layers": 8,
    "num_key_value_heads": 4,
    "num_target_layers": 40,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 10000000,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "vocab_size": 248320,
}

#: Qwen3.6-35B-A3B drafter, newer revision (spec §8): rope_parameters and
#: dflash_config.block_size, 5 sliding (4096) + 1 full layers.
QWEN36_35B_A3B_NEW_DRAFTER_CONFIG: dict[str, Any] = {
    "architectures": ["DFlashDraftModel"],
    "dflash_config": {
        "block_size": 16,
        "mask_token_id": 248077,
        "target_layer_ids": [1, 6, 11, 16, 22, 27, 32, 37],
    },
    "dtype": "bfloat16",
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
    "max_position_embeddings": 262144,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_hidden_layers": 6,
    "num_key_value_heads": 8,
    "num_target_layers": 40,
    "rms_norm_eps": 1e-06,
    "rope_parameters": {"rope_theta": 10000000, "rope_type": "default"},
    "sliding_window": 4096,
    "tie_word_embeddings": False,
    "use_sliding_window": True,
    "vocab_size": 248320,
}

#: A small valid drafter for tests (H=64, L=2, Qh/Kh=4/2, Dh=16, I=128, taps [1, 3]).
TINY_DRAFTER_CONFIG: dict[str, Any] = {
    "architectures": ["DFlashDraftModel"],
    "block_size": 4,
    "dflash_config": {"mask_token_id": 5, "target_layer_ids": [1, 3]},
    "dtype": "bfloat16",
    "head_dim": 16,
    "hidden_size": 64,
    "intermediate_size": 128,
    "layer_types": ["sliding_attention", "full_attention"],
    "max_position_embeddings": 512,
    "model_type": "qwen3",
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "num_target_layers": 6,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 10000,
    "sliding_window": 32,
    "vocab_size": 256,
}

#: Named configs (deep-copy before mutating).
DRAFTER_CONFIGS: dict[str, dict[str, Any]] = {
    "gemma-4-26B-A4B-it": GEMMA4_26B_A4B_DRAFTER_CONFIG,
    "Qwen3.6-27B": QWEN36_27B_DRAFTER_CONFIG,
    "Qwen3.6-35B-A3B": QWEN36_35B_A3B_DRAFTER_CONFIG,
    "Qwen3.6-35B-A3B-new": QWEN36_35B_A3B_NEW_DRAFTER_CONFIG,
    "tiny": TINY_DRAFTER_CONFIG,
}


# ============================================================================ device upload


class DTypeInvariantError(Hf2qError):
    """A drafter buffer does not hold the dtype its kernels read (the bug of
    spec dflash.md section 9: BF16 norms read as F32)."""


#: Python field -> per-layer checkpoint name (after ``layers.{i}.``).
_LAYER_FIELDS: dict[str, str] = {
    "q_proj": "self_attn.q_proj.weight",
    "k_proj": "self_attn.k_proj.weight",
    "v_proj": "self_attn.v_proj.weight",
    "o_proj": "self_attn.o_proj.weight",
    "q_norm": "self_attn.q_norm.weight",
    "k_norm": "self_attn.k_norm.weight",
    "input_layernorm": "input_layernorm.weight",
    "post_attention_layernorm": "post_attention_layernorm.weight",
    "mlp_gate": "mlp.gate_proj.weight",
    "mlp_up": "mlp.up_proj.weight",
    "mlp_down": "mlp.down_proj.weight",
}


@dataclass
class DFlashLayerTensors:
    """One decoder layer's device buffers: projections BF16, norms F32."""

    q_proj: Buffer
    k_proj: Buffer
    v_proj: Buffer
    o_proj: Buffer
    q_norm: Buffer
    k_norm: Buffer
    input_layernorm: Buffer
    post_attention_layernorm: Buffer
    mlp_gate: Buffer
    mlp_up: Buffer
    mlp_down: Buffer

    def buffers(self) -> dict[str, Buffer]:
        return {f: getattr(self, f) for f in _LAYER_FIELDS}


class DFlashModelTensors:
    """A DFlash drafter resident on a device: ``fc`` and the projections are
    raw BF16 copies of the file's bytes, the six RMSNorm kinds are F32."""

    def __init__(self, device: Device, config: DFlashConfig, fc: Buffer, hidden_norm: Buffer,
                 final_norm: Buffer, layers: list[DFlashLayerTensors]) -> None:
        self.device = device
        self.config = config
        self.fc = fc
        self.hidden_norm = hidden_norm
        self.final_norm = final_norm
        self.layers = layers
        self.summary: LoadSummary | None = None
        self.check_dtypes()

    # ------------------------------------------------------------------ build
    @classmethod
    def upload(cls, device: Device, cfg: DFlashConfig, weights: DFlashWeights, *,
               progress: bool = False) -> "DFlashModelTensors":
        """Make ``weights`` resident on ``device``: one buffer per tensor,
        ``pread`` straight into it (BF16) or decoded into it (norms -> F32).
        On any failure (including KeyboardInterrupt) every buffer allocated so
        far is freed before the exception propagates."""
        if weights.config != cfg:
            raise ConfigError("weights were validated against a different config")
        bufs: dict[str, Buffer] = {}
        bar = progress_bar(weights.total_data_bytes(), "hf2q load", progress)
        t0 = time.perf_counter()
        try:
            for t in weights:
                name, entry, info = t.entry.name, t.entry, t.info
                shard = weights.checkpoint.file_for(name)
                try:
                    bufs[name] = device.upload_from_file(
                        shard.fileno(), info.offset, info.nbytes, "bf16", entry.device_dtype, entry.shape, name=name
                    )
                except FileReadError as e:
                    raise file_read_error(e, t.path, name) from None
                bar.update(info.nbytes)
                if name.endswith("self_attn.v_proj.weight"):  # last of a layer in manifest order: one commit per layer
                    device.residency.commit()
            device.residency.commit()
            layers = [
                DFlashLayerTensors(**{f: bufs[f"layers.{i}.{n}"] for f, n in _LAYER_FIELDS.items()})
                for i in range(cfg.num_hidden_layers)
            ]
            model = cls(device, cfg, bufs["fc.weight"], bufs["hidden_norm.weight"], bufs["norm.weight"], layers)
        except BaseException as e:
            bufs.clear()
            layers = []
            bar.close()
            raise detached(e)
        bar.close()
        seconds = time.perf_counter() - t0
        model.summary = LoadSummary(
            model="dflash", device=device.kind, tensors=len(bufs),
            resident_bytes=model.gpu_resident_bytes(), data_bytes=weights.total_data_bytes(),
            seconds=seconds, residency=residency_state(device, bufs.values()),
            extra={"layers": cfg.num_hidden_layers, "hidden_size": cfg.hidden_size},
        )
        return model

    # ------------------------------------------------------------------ access
    def named_buffers(self) -> dict[str, Buffer]:
        """Every buffer under its checkpoint name, in manifest order."""
        out: dict[str, Buffer] = {"fc.weight": self.fc, "hidden_norm.weight": self.hidden_norm}
        for i, layer in enumerate(self.layers):
            for f, n in sorted(_LAYER_FIELDS.items(), key=lambda kv: kv[1]):
                out[f"layers.{i}.{n}"] = getattr(layer, f)
        out["norm.weight"] = self.final_norm
        return out

    def __getitem__(self, name: str) -> Buffer:
        return self.named_buffers()[name]

    def names(self) -> list[str]:
        return list(self.named_buffers())

    def gpu_resident_bytes(self) -> int:
        """Sum of logical buffer lengths (= total_data_bytes + 2 * n_norm)."""
        return sum(b.byte_len for b in self.named_buffers().values())

    def allocated_bytes(self) -> int:
        """Sum of page-rounded allocation sizes."""
        return sum(b.alloc_len for b in self.named_buffers().values())

    def check_dtypes(self) -> None:
        """Always-on invariant: BF16 for fc and the seven projections, F32 for
        the six norm kinds. Raises :class:`DTypeInvariantError`."""
        bad: list[str] = []

        def want(name: str, buf: Buffer, dtype: str, shape: tuple[int, ...]) -> None:
            if buf.dtype != dtype or buf.shape != shape:
                bad.append(f"{name}: expected {dtype} {shape}, found {buf.dtype} {buf.shape}")

        manifest = {e.name: e for e in expected_manifest(self.config)}
        for name, buf in self.named_buffers().items():
            e = manifest[name]
            want(name, buf, e.device_dtype, e.shape)
        if bad:
            raise DTypeInvariantError("DFlash device buffers break the dtype invariant:\n  " + "\n  ".join(bad))

    def verify(self) -> dict[str, Any]:
        """Read every buffer back through the device and compare with a CPU
        decode (see :meth:`hf2q.Device.verify`); raises DeviceError on a mismatch."""
        t0 = time.perf_counter()
        groups = 0
        for buf in self.named_buffers().values():
            groups += self.device.verify(buf).groups
        return {"buffers": len(self.named_buffers()), "groups": groups, "seconds": time.perf_counter() - t0}

    def __repr__(self) -> str:
        return (f"<hf2q.dflash.DFlashModelTensors L={self.config.num_hidden_layers} H={self.config.hidden_size} "
                f"{self.gpu_resident_bytes():,} resident bytes on {self.device.kind}>")


def load(path: PathLike, device: Device | None = None, progress: bool = True,
         config: DFlashConfig | None = None, *, revision: str | None = None,
         download: bool = False) -> DFlashModelTensors:
    """Validate a DFlash drafter checkpoint (file or directory with
    ``config.json``, or a Hugging Face repo id in the local cache: see
    :func:`hf2q.hub.resolve` for ``revision`` and ``download``) and make it
    resident on ``device`` (default: :meth:`hf2q.Device.default`).
    ``model.summary`` holds the load summary; ``progress`` draws a bar on a
    terminal only."""
    from ..hub import resolve

    path = resolve(path, revision, download=download)
    dev = device if device is not None else Device.default()
    with DFlashWeights.load(path, config) as weights:
        return DFlashModelTensors.upload(dev, weights.config, weights, progress=progress)
