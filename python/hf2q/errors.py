"""The exception hierarchy. Every error hf2q raises on bad input is an
:class:`Hf2qError`; the subclasses say which stage refused it."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, Mapping, Sequence

__all__ = [
    "Hf2qError",
    "NonFiniteError",
    "ScaleOverflowWarning",
    "ResidencyWarning",
    "SafetensorsError",
    "ConfigError",
    "ManifestError",
    "ManifestProblem",
    "MissingTensorError",
    "ExtraTensorError",
    "DtypeMismatchError",
    "ShapeMismatchError",
    "DuplicateTensorError",
    "DeviceError",
    "FileReadError",
    "ShardError",
]


#: errno values that are this machine failing, not the input being wrong:
#: out of memory, out of file descriptors, disk or quota full, I/O error. An
#: error caused by one of them is a system failure (exit 1). Not ENXIO or
#: ENODEV: opening a socket or a device node in a checkpoint's place gives
#: those, and that is bad input.
SYSTEM_ERRNOS = frozenset(getattr(errno, n) for n in ("ENOMEM", "EMFILE", "ENFILE", "ENOSPC", "EDQUOT", "EIO")
                          if hasattr(errno, n))


class Hf2qError(Exception):
    """Base class of every hf2q error.

    ``system_failure`` says whose fault it is: False (the default) for bad
    input, True when this machine failed (``system_errno`` is then the errno
    behind it where one is known: ``ENOMEM``, ``EMFILE``, ``ENOSPC``, ``EIO``
    ...; a :class:`DeviceError` and :class:`hf2q.HubNetworkError` always are).
    The class still says which stage failed; the CLI exits 2 for bad input
    and 1 for a system failure."""

    system_failure: bool = False
    system_errno: int | None = None


def mark_system_failure(err: BaseException, cause: BaseException | None, *,
                        any_errno: bool = False) -> BaseException:
    """``err``, marked as a system failure when ``cause`` is an ``OSError``
    whose errno is in :data:`SYSTEM_ERRNOS` (any errno with ``any_errno``: a
    failed write of an output whose input was read and converted, e.g. EROFS
    after a remount, EFBIG), or a ``MemoryError``."""
    if isinstance(err, Hf2qError):
        if isinstance(cause, MemoryError):
            err.system_failure = True
            err.system_errno = errno.ENOMEM
        elif isinstance(cause, OSError) and (any_errno or cause.errno in SYSTEM_ERRNOS):
            err.system_failure = True
            err.system_errno = cause.errno
    return err


class NonFiniteError(Hf2qError, ValueError):
    """A NaN or +-Inf element in data that was to be quantized.

    ``index`` is the smallest flat (row-major) element index, ``multi_index`` the
    same position in the input's shape, ``value_class`` one of ``"nan"``,
    ``"+inf"``, ``"-inf"`` and ``tensor`` the tensor's name when known.
    ``step`` says where it appeared: ``"file"`` (the checkpoint holds it),
    ``"transform"`` (a load-time transform made it, e.g. Qwen's
    ``-exp(A_log)``), ``"conversion SRC->DST"`` (a narrowing conversion
    overflowed, e.g. ``f32->f16``), ``"quantization SRC->FMT"`` (a block
    format's float16 scale overflowed: finite values too large for the
    format), or None where not known. ``path``: the checkpoint file holding
    the element's source, when a load knows it.
    """

    def __init__(
        self,
        message: str,
        *,
        index: int,
        multi_index: tuple[int, ...] | None = None,
        value_class: str = "nan",
        tensor: str | None = None,
        step: str | None = None,
        path: str | None = None,
    ) -> None:
        super().__init__(message)
        self.index = index
        self.multi_index = multi_index
        self.value_class = value_class
        self.tensor = tensor
        self.step = step
        self.path = path


class ScaleOverflowWarning(UserWarning):
    """A Q8_0 block scale overflowed float16 (amax >= 8,321,040): it is stored
    as +Inf, exactly as ggml's reference quantizer does, and dequantizes to
    +-Inf/NaN."""


class ResidencyWarning(UserWarning):
    """Residency could not be had as asked, and the load goes on without it:
    on the host, ``mlock`` was refused (``RLIMIT_MEMLOCK``), so the buffers are
    tracked and prefaulted but may be paged out. Issued once per device."""


class SafetensorsError(Hf2qError):
    """A safetensors file or checkpoint broke a rule of the format.

    ``code`` names the rule: one of the reference implementation's error names
    (``HeaderTooSmall``, ``HeaderTooLarge``, ``InvalidHeaderLength``,
    ``InvalidHeader``, ``InvalidHeaderDeserialization``, ``InvalidOffset``,
    ``ValidationOverflow``, ``MisalignedSlice``, ``TensorInvalidInfo``,
    ``MetadataIncompleteBuffer``), hf2q's ``DuplicateKey``, a checkpoint/index
    code (``InvalidIndex``, ``InvalidShardName``, ``MissingShard``,
    ``TensorNotInShard``, ``TensorNotInIndex``, ``DuplicateTensor``,
    ``NoCheckpoint``), or an I/O code (``Io``, ``FileTruncated``,
    ``NotAFile``, ``FileChanged``: the file's device, inode, size or
    modification time changed after it was opened), or ``NotRepresentable``
    (a valid tensor numpy cannot hold, e.g. shape ``[0, 2^64-1]``). ``path`` is the file concerned and ``tensor`` the tensor's
    name, when there is one. The message names all three.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        path: str | os.PathLike[str] | None = None,
        tensor: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.path = None if path is None else os.fspath(path)
        self.tensor = tensor


class ConfigError(Hf2qError, ValueError):
    """A model config.json is missing a field or is inconsistent.

    ``key`` is the config key concerned (dotted for nested keys, e.g.
    ``dflash_config.target_layer_ids``) and ``rule`` the number of the model's
    validation rule that failed, when these apply.
    """

    def __init__(self, message: str, *, key: str | None = None, rule: int | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.rule = rule

    @property
    def field(self) -> str | None:
        """Alias of :attr:`key` (the name the Qwen3.5 config reader used)."""
        return self.key


@dataclass(frozen=True)
class ManifestProblem:
    """One mismatch between a checkpoint and a model manifest.

    ``kind`` is ``"extra"``, ``"missing"``, ``"dtype"`` or ``"shape"``;
    ``expected``/``actual`` are human-readable (``"absent"`` where the tensor
    does not exist on that side). ``file``: the file that holds the tensor,
    where the problem is with a tensor present and the file is known (the
    message names it; the error's lead names the checkpoint); not compared.
    """

    kind: str
    tensor: str
    expected: str
    actual: str
    file: str | None = field(default=None, compare=False)

    def __str__(self) -> str:
        label = {
            "extra": "extra tensor",
            "missing": "missing tensor",
            "dtype": "dtype mismatch",
            "shape": "shape mismatch",
        }.get(self.kind, self.kind)
        return f"{label} '{self.tensor}'{in_file(self.file)}: expected {self.expected}, actual {self.actual}"


def tensor_file(tensors: Any, name: str) -> str | None:
    """The file holding tensor ``name`` of ``tensors`` (an open checkpoint or
    file, or a mapping of :class:`~hf2q.safetensors.TensorInfo`), or None
    where that is not known (a plain mapping of dtypes and shapes): what a
    problem with that tensor names beside it."""
    try:
        path = getattr(tensors[name], "path", None)
    except (KeyError, TypeError):
        return None
    return None if path is None else str(path)


def in_file(path: str | None) -> str:
    """`` in <file name>`` for a problem line (the error's lead names the
    checkpoint's directory), or "" where the file is not known."""
    return f" in {PurePath(path).name}" if path else ""


class ManifestError(Hf2qError):
    """A checkpoint's tensors do not match the model's expected manifest.

    ``problems`` lists every mismatch found (sorted by kind, then tensor name);
    the class raised is that of the first kind present, in the order
    extra -> missing -> dtype -> shape.
    """

    def __init__(self, message: str, problems: Sequence[ManifestProblem] = ()) -> None:
        super().__init__(message)
        self.problems: list[ManifestProblem] = list(problems)


class ExtraTensorError(ManifestError):
    """The checkpoint holds tensors the manifest does not name."""


class MissingTensorError(ManifestError):
    """The manifest names tensors the checkpoint does not hold."""


class DtypeMismatchError(ManifestError):
    """A tensor's on-disk dtype is not the expected one."""


class ShapeMismatchError(ManifestError):
    """A tensor's shape is not the expected one."""


def _lead(where: Any) -> str:
    """``"<where>: "`` leading a message about a checkpoint, or "" where none is named."""
    return f"{where}: " if where else ""


def _listing(items: list[str], limit: int = 60) -> str:
    """``items`` one per indented line (the first ``limit``, then a count):
    the tail of a message that names many tensors."""
    head = "\n  ".join(items[:limit])
    more = f"\n  ... and {len(items) - limit} more" if len(items) > limit else ""
    return f"\n  {head}{more}"


class DuplicateTensorError(ManifestError):
    """Two or more checkpoint tensors feed the same destination. ``groups`` maps
    each destination (a Qwen3.5 GGUF name, with ``[expert e]`` for experts; a
    generic tensor name) to the names; ``where``, when given, leads the
    message (the checkpoint)."""

    def __init__(self, groups: Mapping[str, list[str]], where: str = "") -> None:
        self.groups = {k: sorted(v) for k, v in sorted(groups.items())}
        lines = [f"{k}: {', '.join(v)}" for k, v in self.groups.items()]
        super().__init__(f"{_lead(where)}{len(lines)} destination(s) are given more than once:{_listing(lines)}")


class FileReadError(Hf2qError, OSError):
    """A file could not be read completely (I/O error, or the file shrank or
    was rewritten while being read). ``code`` is ``"FileTruncated"`` (end of
    file before the bytes expected) or ``"Io"``, as the native reader says
    (it raises this class as ``hf2q.device.FileReadError``)."""

    code: str = "Io"


class DeviceError(Hf2qError):
    """A device could not be opened, or memory could not be allocated or made
    resident: the machine's own failure (``system_failure`` is True)."""

    system_failure = True


class ShardError(Hf2qError, ValueError):
    """A shard (:class:`hf2q.Shard`) that cannot be taken: a rank outside
    ``[0, world)``, or a tensor whose split dimension (or expert count) the
    world does not divide, or not on whole blocks of its format. ``tensor``
    names the tensor (None for a bad rank / world), ``reason`` says why."""

    def __init__(self, message: str, *, tensor: str | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.tensor = tensor
        self.reason = reason or message
