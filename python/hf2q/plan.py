"""Tensor plans: what a load will do, decided before any tensor byte is read.

Every model family turns a checkpoint's headers and its ``config.json`` into
a :class:`LoadPlan`: an ordered list of :class:`TensorPlan` entries, each
naming its destination (name, logical shape, device format) and its sources
(checkpoint tensors, or parts of them, with where they land). One loader
(:mod:`hf2q.loader`) executes any plan on any device:

- no ``transform`` and every source natively convertible to the destination
  format: the file's bytes go straight into the device buffer (``pread`` and
  the native decode / quantize kernels; expert slices and fused halves land at
  their element offset);
- an ``elementwise`` conversion (e.g. f32 -> bf16): the source passes through
  a bounded staging buffer, a chunk of whole rows at a time;
- a scaled source (an FP8 weight and its ``scale``, docs/FP8.md): weight and
  scale are read whole (one tensor, or one expert, at a time) and decoded
  natively into the destination format in one pass;
- a :class:`UnitTranspose` (a reorder that moves whole blocks of storage:
  Qwen3.5's V-head reorders of rows or columns): the sources are streamed as
  they are and the device then transposes the unit grid in place (a GPU
  kernel on CUDA); where the destination format's blocks do not divide the
  units, the loader does it in numpy as a transform instead;
- a ``transform`` (the tensor needs all of its sources at once: +1 norms,
  ``-exp(A_log)``): the sources are read, transformed in numpy and uploaded.
  Only small tensors take this path.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
else:  # numpy on first use (hf2q._lazy)
    from ._lazy import numpy as np

from . import formats

__all__ = ["Piece", "Scale", "UnitTranspose", "TensorPlan", "LoadPlan", "CONVERT_DTYPES"]

#: The device formats a family offers for the tensors it converts (its
#: ``dense_dtype`` / ``expert_dtype`` / ``dtype`` options): every family and
#: the command line read this one tuple.
CONVERT_DTYPES: tuple[str, ...] = ("f32", "bf16", "f16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k")


@dataclass(frozen=True)
class Scale:
    """The scale of a scaled FP8 source (docs/FP8.md): checkpoint tensor
    ``tensor`` of format ``dtype`` (f32 / bf16 / f16) and file ``shape``,
    one value per ``block`` = (rows, cols) of the weight's last two
    dimensions (edge blocks partial). ``scheme`` says where it came from:
    ``"block"`` (``weight_block_size``: DeepSeek / Qwen ``-FP8``,
    ``weight_scale_inv``), ``"channel"`` (one per output row), ``"tensor"``
    (one for the whole matrix). ``grid`` is the shape the file's values take
    as the decoder reads them: the weight's leading dimensions, then
    ``ceil(rows / block rows)``, ``ceil(cols / block cols)``."""

    tensor: str
    dtype: str
    shape: tuple[int, ...]
    block: tuple[int, int]
    grid: tuple[int, ...]
    scheme: str = "block"

    @property
    def nbytes(self) -> int:
        """Bytes read from the file for this scale."""
        return formats.nbytes(self.shape, self.dtype)


@dataclass(frozen=True)
class Piece:
    """One source of a planned tensor.

    ``tensor`` is the checkpoint name, ``dtype`` its format as the format
    table knows it (the hf2q name ``"bf16"`` or the safetensors code
    ``"BF16"``: :func:`hf2q.formats.get` takes both), ``shape`` its shape in
    the file. The piece lands at element
    ``dest_offset`` of the destination. ``rows`` selects rows ``[start, stop)``
    of axis 1 of a source shaped ``[N, R, ...]``, for each of the ``N``
    leading entries (the gate or up half of a fused expert tensor); those
    slices land back to back.

    ``select`` (a shard's slice, :mod:`hf2q.shard`): explicit element
    ranges, an int64 array of ``(destination offset, source offset,
    elements)`` rows; when given it replaces ``dest_offset`` and ``rows``
    (the ranges already say where every element comes from and lands).

    ``scale``: the piece is a scaled FP8 weight (:class:`Scale`); the loader
    decodes weight and scale together, never the weight's bytes alone."""

    tensor: str
    dtype: str
    shape: tuple[int, ...]
    dest_offset: int = 0
    rows: tuple[int, int] | None = None
    select: np.ndarray | None = field(default=None, compare=False, repr=False)
    scale: Scale | None = None

    @property
    def numel(self) -> int:
        """Elements this piece contributes."""
        if self.select is not None:
            return int(self.select[:, 2].sum())
        if self.rows is None:
            return formats.numel(self.shape)
        start, stop = self.rows
        return self.shape[0] * (stop - start) * formats.numel(self.shape[2:])

    @property
    def nbytes(self) -> int:
        """Bytes read from the file for this piece."""
        return formats.nbytes((self.numel,), self.dtype)


@dataclass(frozen=True)
class UnitTranspose:
    """A reorder of a tensor's elements that moves whole units: the tensor,
    flattened, is ``outer`` periods of ``period`` elements; in each, the
    ``a * b`` units of ``unit`` elements that start at element ``start`` form
    an ``[a, b]`` grid (unit ``i * b + j``) and are stored as its transpose
    ``[b, a]`` (position ``j * a + i`` receives unit ``i * b + j``).

    Qwen3.5's V-head reorders (grouped by key head -> tiled, docs/QWEN35MOE.md)
    are such grids with ``a`` key heads and ``b`` value heads per key head:
    rows of a matrix (``outer`` 1, a unit = a head's rows) or columns
    (``outer`` = rows, a unit = a head's columns). The loader writes the
    sources as they are, then transposes the grid where the tensor lies
    (:meth:`fits`), else in numpy (:meth:`apply`)."""

    outer: int
    period: int
    start: int
    a: int
    b: int
    unit: int

    def fits(self, dtype: str) -> bool:
        """Whether every unit is whole blocks of ``dtype`` (so that the
        transpose moves stored blocks, which is the same as transposing the
        values and then converting them)."""
        block = formats.get(dtype).block_elems
        return self.period % block == 0 and self.start % block == 0 and self.unit % block == 0

    def apply(self, x: np.ndarray) -> np.ndarray:
        """The reorder of ``x`` (any shape of ``outer * period`` elements) in
        numpy: a new array of ``x``'s shape and dtype."""
        x = np.asarray(x)
        flat = np.ascontiguousarray(x).reshape(self.outer, self.period)
        out = flat.copy()
        end = self.start + self.a * self.b * self.unit
        grid = flat[:, self.start:end].reshape(self.outer, self.a, self.b, self.unit)
        out[:, self.start:end] = np.swapaxes(grid, 1, 2).reshape(self.outer, -1)
        return out.reshape(x.shape)


@dataclass(frozen=True)
class TensorPlan:
    """One destination tensor: ``name``, logical ``shape``, device format
    ``dtype``, its ``sources``, and how they become it (see the module doc).
    ``group`` is the residency commit group (a layer); ``kind`` a family's
    label for summaries (``"expert"``, ``"norm"``, ...). ``unit_transpose``:
    a block reorder done where the tensor lies once its sources are written
    (:class:`UnitTranspose`)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    sources: tuple[Piece, ...]
    transform: Callable[[list[np.ndarray]], np.ndarray] | None = field(default=None, compare=False)
    elementwise: Callable[[np.ndarray], np.ndarray] | None = field(default=None, compare=False)
    group: int | None = None
    kind: str = ""
    unit_transpose: UnitTranspose | None = None

    # Both cached (the fields are frozen): a load asks per entry (its progress
    # bar) and for the plan's totals, and an expert stack has hundreds of pieces.
    @functools.cached_property
    def nbytes(self) -> int:
        """Device bytes (:func:`hf2q.formats.nbytes`)."""
        return formats.nbytes(self.shape, self.dtype)

    @functools.cached_property
    def source_nbytes(self) -> int:
        """Bytes read from the checkpoint (scales included)."""
        # Each distinct piece geometry sized once: an expert stack's hundreds
        # of pieces (and their scales) share one.
        total = 0
        sized: dict[tuple[Any, ...], int] = {}
        for p in self.sources:
            s = p.scale
            if p.select is not None:
                total += p.nbytes + (s.nbytes if s is not None else 0)
                continue
            key = (p.dtype, p.shape, p.rows) if s is None else (p.dtype, p.shape, p.rows, s.dtype, s.shape)
            try:
                n = sized.get(key)
            except TypeError:  # a shape given as a list: sized on its own
                n = p.nbytes + (s.nbytes if s is not None else 0)
            else:
                if n is None:
                    n = sized[key] = p.nbytes + (s.nbytes if s is not None else 0)
            total += n
        return total

    @property
    def streamed(self) -> bool:
        """File bytes go straight into the device buffer (no numpy stage)."""
        # Each source format once, in first-seen order (an expert stack's
        # hundreds of pieces share one): the same answer, and the same error
        # for an unknown format, as asking piece by piece.
        return (self.transform is None and self.elementwise is None
                and (self.unit_transpose is None or self.unit_transpose.fits(self.dtype))
                and all(p.scale is None for p in self.sources)
                and all(formats.can_convert(d, self.dtype) for d in dict.fromkeys(p.dtype for p in self.sources)))

    def transposed_in_numpy(self) -> "TensorPlan":
        """This entry with its unit transpose done by a numpy transform (the
        loader's fallback where the format's blocks do not divide the units;
        a shard, which slices the reordered tensor): its one source is read
        whole (an FP8 source decoded), reordered, then put through
        ``elementwise`` if it has one."""
        t = self.unit_transpose
        if t is None:
            return self
        if len(self.sources) != 1 or self.sources[0].rows is not None or self.sources[0].select is not None:
            raise ValueError(f"{self.name}: a unit transpose in numpy takes one whole source")
        return dataclasses.replace(self, transform=_NumpyTranspose(t, self.shape, self.elementwise),
                                   elementwise=None, unit_transpose=None)


class _NumpyTranspose:
    """A unit transpose as a loader transform (:meth:`TensorPlan.transposed_in_numpy`)."""

    __slots__ = ("t", "shape", "elementwise")

    def __init__(self, t: UnitTranspose, shape: tuple[int, ...],
                 elementwise: Callable[[np.ndarray], np.ndarray] | None) -> None:
        self.t, self.shape, self.elementwise = t, tuple(shape), elementwise

    @property
    def raw_bf16(self) -> bool:
        """A pure reorder may take BF16 sources as raw uint16 bits (no
        ml_dtypes import); an elementwise step after it wants typed values."""
        return self.elementwise is None

    def __call__(self, arrays: list[np.ndarray]) -> np.ndarray:
        y = self.t.apply(np.asarray(arrays[0]).reshape(self.shape))
        return y if self.elementwise is None else self.elementwise(y)


@dataclass
class LoadPlan(Sequence[TensorPlan]):
    """The ordered entries of one load, the family that made them and its
    parsed config; ``skipped`` lists checkpoint tensors left out on purpose;
    ``extra`` the family's numbers for the load summary. Entries are found
    by position or by destination name (``plan["token_embd.weight"]``,
    ``name in plan``)."""

    family: str
    entries: list[TensorPlan]
    config: Any = None
    skipped: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    _index: dict[str, int] = field(default_factory=dict, init=False, compare=False, repr=False)

    def __len__(self) -> int:
        return len(self.entries)

    def _names(self) -> dict[str, int]:
        if len(self._index) != len(self.entries):  # built on first use (entries may be appended until then)
            self._index.clear()
            self._index.update({e.name: i for i, e in enumerate(self.entries)})
        return self._index

    def __getitem__(self, key):  # type: ignore[override]
        if isinstance(key, str):
            return self.entries[self._names()[key]]
        return self.entries[key]

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    @property
    def names(self) -> list[str]:
        """Destination names, in plan order."""
        return [e.name for e in self.entries]

    def __iter__(self) -> Iterator[TensorPlan]:
        return iter(self.entries)

    @property
    def nbytes(self) -> int:
        """Device-resident bytes of the whole plan."""
        return sum(e.nbytes for e in self.entries)

    @property
    def source_nbytes(self) -> int:
        """Checkpoint bytes the plan reads."""
        return sum(e.source_nbytes for e in self.entries)

    def layout(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """name -> (device format, logical shape), for the layout check."""
        return {e.name: (e.dtype, tuple(e.shape)) for e in self.entries}


def destinations_by_source(plan: LoadPlan) -> dict[str, list[str]]:
    """Checkpoint tensor -> the planned tensors it feeds, in plan order
    (``hf2q inspect``'s listing of GGUF names; a fused ``gate_up_proj``
    feeds two: its gate and up halves)."""
    out: dict[str, list[str]] = {}
    for e in plan:
        for p in e.sources:
            names = out.setdefault(p.tensor, [])
            if e.name not in names:
                names.append(e.name)
    return out
