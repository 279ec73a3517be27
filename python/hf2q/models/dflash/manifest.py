"""DFlash drafter manifest: the ``2 + 11*L + 1`` tensors, their device
dtypes, weight validation and byte accounting (docs/DFLASH.md).

:class:`DFlashWeights` is a checkpoint validated against the manifest; it
exposes, in manifest order, ``(entry, info, path)`` for each tensor so the
loader can ``pread`` each one straight into its destination."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Union

if TYPE_CHECKING:
    import numpy as np
else:  # numpy on first use (hf2q._lazy)
    from ..._lazy import numpy as np

from ... import formats
from ...errors import (
    DtypeMismatchError,
    ExtraTensorError,
    ManifestError,
    ManifestProblem,
    MissingTensorError,
    ShapeMismatchError,
    tensor_file,
)
from ...safetensors import Checkpoint, SafetensorsFile, TensorInfo, open_checkpoint
from .config import LAYER_TENSOR_NAMES, DFlashConfig

__all__ = [
    "DFlashWeights",
    "LoadedTensor",
    "ManifestEntry",
    "check_manifest",
    "expected_manifest",
    "expected_resident_bytes",
    "expected_total_data_bytes",
    "manifest_error",
    "n_norm_elements",
]

PathLike = Union[str, "os.PathLike[str]"]

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
        return formats.numel(self.shape)

    @property
    def disk_nbytes(self) -> int:
        return formats.nbytes(self.shape, self.disk_dtype)

    @property
    def device_nbytes(self) -> int:
        """Logical device buffer length (:func:`hf2q.formats.nbytes`)."""
        return formats.nbytes(self.shape, self.device_dtype)

    @property
    def is_norm(self) -> bool:
        return self.device_dtype == "f32"


def expected_manifest(cfg: DFlashConfig) -> list[ManifestEntry]:
    """The ``2 + 11*L + 1`` tensors in the order of docs/DFLASH.md: ``fc.weight``,
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
    """``L * (2*Dh + 2*H) + 2*H`` (:attr:`DFlashConfig.n_norm_elements`)."""
    return cfg.n_norm_elements


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
                ManifestProblem("extra", name, "absent (not in the DFlash manifest)", f"{info.dtype} {_fmt_shape(info.shape)}",
                                tensor_file(tensors, name))
            )
    present = set(names)
    for e in manifest:
        if e.name not in present:
            problems.append(ManifestProblem("missing", e.name, f"{e.disk_dtype} {_fmt_shape(e.shape)}", "absent"))
            continue
        info = tensors[e.name]
        if info.dtype != e.disk_dtype:
            problems.append(
                ManifestProblem("dtype", e.name, f"{e.disk_dtype} (DFlash drafters are BF16-only)", info.dtype,
                                tensor_file(tensors, e.name))
            )
        if tuple(info.shape) != tuple(e.shape):
            problems.append(ManifestProblem("shape", e.name, _fmt_shape(e.shape), _fmt_shape(info.shape),
                                            tensor_file(tensors, e.name)))
    problems.sort(key=lambda p: (_KIND_ORDER[p.kind], p.tensor))
    return problems


#: Problems a manifest error's message lists; the rest are counted.
MAX_LISTED_PROBLEMS = 50


def manifest_error(problems: Sequence[ManifestProblem], where: str) -> ManifestError:
    """The error for a non-empty problem list: class of the first kind present."""
    cls = _KIND_CLASS[problems[0].kind]
    # A bounded message (the full list is the error's `problems`).
    lines = "\n".join(f"  {p}" for p in problems[:MAX_LISTED_PROBLEMS])
    if len(problems) > MAX_LISTED_PROBLEMS:
        lines += f"\n  ... and {len(problems) - MAX_LISTED_PROBLEMS} more"
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

        from ... import ops

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


