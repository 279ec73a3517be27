"""The model container every family returns: named device buffers with one
layout check, one ``verify``, one byte count and one load summary.

Families subclass :class:`LoadedModel` only to add their own views
(``model.layers[3].ffn_down_exps``, ``drafter.fc``); names, ``[]``,
iteration, ``gpu_resident_bytes`` and ``verify`` are these."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

from .device import Buffer, Device
from .errors import Hf2qError

__all__ = ["DTypeInvariantError", "LoadedModel", "check_layout"]


class DTypeInvariantError(Hf2qError):
    """A device buffer does not hold the format or shape its plan says (the
    kernels that read it would misread it; docs/DFLASH.md tells the story of
    BF16 norms read as F32). ``problems`` has one line per bad buffer,
    ``names`` the buffers' names."""

    def __init__(self, message: str, problems: list[str] | None = None, names: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = list(problems or [])
        self.names = list(names or [])

    @property
    def lines(self) -> list[str]:
        """Alias of :attr:`problems`."""
        return self.problems


def check_layout(buffers: Mapping[str, Buffer], layout: Mapping[str, tuple[str, tuple[int, ...]]],
                 what: str) -> None:
    """Always-on invariant: every buffer has the format and shape of ``layout``
    (name -> (format, shape)). Raises :class:`DTypeInvariantError` listing
    every buffer that does not, ``what`` naming the model in the message."""
    problems: list[str] = []
    names: list[str] = []
    for name, (dtype, shape) in layout.items():
        buf = buffers.get(name)
        if buf is None:
            problems.append(f"{name}: expected {dtype} {tuple(shape)}, found no buffer")
        elif buf.dtype != dtype or buf.shape != tuple(shape):
            problems.append(f"{name}: expected {dtype} {tuple(shape)}, found {buf.dtype} {buf.shape}")
        else:
            continue
        names.append(name)
    if problems:
        raise DTypeInvariantError(f"{what}:\n  " + "\n  ".join(problems), problems, names)


class LoadedModel:
    """Weights resident on ``device``, addressable by name (``model[name]``);
    iteration yields the names in load order. ``config`` is the family's
    parsed config, ``summary`` the :class:`~hf2q.loader.LoadSummary`
    of the load that made it."""

    family: str = "model"

    def __init__(self, device: Device, config: Any, buffers: dict[str, Buffer]) -> None:
        self.device = device
        self.config = config
        self._buffers = buffers
        self.summary: Any = None

    # ------------------------------------------------------------------ access
    def buffers_by_name(self) -> dict[str, Buffer]:
        """Every buffer under its name, in load order, as a new dict. Family
        views whose fields can be reassigned override this to read the
        fields, so the checks below always see what a consumer would."""
        return dict(self._buffers)

    def named_buffers(self) -> Iterator[tuple[str, Buffer]]:
        """``(name, buffer)`` pairs in load order, as ``torch.nn.Module.named_buffers``
        yields them; :meth:`buffers_by_name` is the same as a dict."""
        return iter(self.buffers_by_name().items())

    def _by_name(self) -> Mapping[str, Buffer]:
        # the live mapping for the accessors below (no copy per lookup); a
        # family that overrides buffers_by_name is read through it
        if type(self).buffers_by_name is LoadedModel.buffers_by_name:
            return self._buffers
        return self.buffers_by_name()

    def names(self) -> list[str]:
        return list(self._by_name())

    def __getitem__(self, name: str) -> Buffer:
        try:
            return self._by_name()[name]
        except KeyError:
            raise KeyError(f"{name!r} is not a tensor of this model") from None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name()

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name())

    def __len__(self) -> int:
        return len(self._by_name())

    def state_dict(self, framework: str = "torch") -> dict[str, Any]:
        """``{name: torch.Tensor}`` sharing memory with the buffers (DLPack, no
        copy; on the buffers' device), each tensor keeping its buffer alive;
        see :mod:`hf2q.torch` for the dtypes (``q8_0``: ``uint8`` bytes of
        shape ``(rows, row_bytes)``). torch is imported here, on first use."""
        if framework != "torch":
            raise ValueError(f"state_dict: framework must be 'torch', got {framework!r}")
        from . import torch as hf2q_torch

        return hf2q_torch.state_dict(dict(self.named_buffers()))

    # ------------------------------------------------------------------ bytes
    def gpu_resident_bytes(self) -> int:
        """Sum of logical buffer lengths."""
        return sum(b.byte_len for b in self._by_name().values())

    def allocated_bytes(self) -> int:
        """Sum of page-rounded allocation sizes."""
        return sum(b.alloc_len for b in self._by_name().values())

    # ------------------------------------------------------------------ checks
    def verify(self) -> dict[str, Any]:
        """Read every buffer back through the device and compare with a CPU
        decode (see :meth:`hf2q.Device.verify`); raises DeviceError on a mismatch."""
        t0 = time.perf_counter()
        bufs = self._by_name()
        groups = sum(self.device.verify(b).groups for b in bufs.values())
        return {"buffers": len(bufs), "groups": groups, "seconds": time.perf_counter() - t0}

    def __repr__(self) -> str:
        return (f"<hf2q {self.family} model: {len(self)} tensors, {self.gpu_resident_bytes():,} resident bytes "
                f"on {self.device.kind}>")
