"""The hand-off plan (docs/HANDOFF.md): a checkpoint's tensors placed where
transformers wants them, as a :class:`~hf2q.plan.LoadPlan` that the one
loader executes. No torch and no transformers here: :mod:`hf2q.transformers`
reads transformers' conversion mapping and hands this module plain data.

A conversion is a list of ops over named groups of source tensors, which we
evaluate on *boxes* instead of data: every intermediate tensor is a shape and,
for each source tensor in it, the box (start and size per dimension) it
occupies. ``("merge", dim)`` stacks each group's tensors along a new ``dim``
(transformers' ``MergeModulelist``), ``("concat", dim)`` joins all groups, in
the converter's pattern order, along ``dim`` (``Concatenate``). A source
whose final box is one contiguous run of the destination (every dimension
before the first one it spans is 1 wide, every one after is full) is a
:class:`~hf2q.plan.Piece` at that run's element offset, so its file bytes go
straight into the stacked buffer; anything else is refused."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import formats
from .errors import Hf2qError
from .plan import LoadPlan, Piece, TensorPlan

__all__ = ["HandoffError", "Target", "plan_handoff", "placements"]


class HandoffError(Hf2qError):
    """The checkpoint cannot be handed to transformers as asked: an
    architecture, a transformers version, a conversion op, a dtype or a
    tensor is missing or unsupported. ``missing`` names each such thing."""

    def __init__(self, message: str, *, missing: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.missing = list(missing)


@dataclass(frozen=True)
class _Box:
    tensor: str
    start: tuple[int, ...]
    size: tuple[int, ...]


@dataclass(frozen=True)
class _Sym:
    shape: tuple[int, ...]
    boxes: tuple[_Box, ...]


def _stack(items: Sequence[_Sym], dim: int, where: str) -> _Sym:
    shape = items[0].shape
    if any(s.shape != shape for s in items):
        raise HandoffError(f"{where}: cannot stack tensors of shapes {sorted({s.shape for s in items})}",
                           missing=[where])
    d = dim % (len(shape) + 1)
    boxes = tuple(_Box(b.tensor, b.start[:d] + (i,) + b.start[d:], b.size[:d] + (1,) + b.size[d:])
                  for i, s in enumerate(items) for b in s.boxes)
    return _Sym(shape[:d] + (len(items),) + shape[d:], boxes)


def _concat(items: Sequence[_Sym], dim: int, where: str) -> _Sym:
    rank = len(items[0].shape)
    d = dim % rank
    if any(len(s.shape) != rank or s.shape[:d] + s.shape[d + 1:] != items[0].shape[:d] + items[0].shape[d + 1:]
           for s in items):
        raise HandoffError(f"{where}: cannot concatenate shapes {[s.shape for s in items]} along {dim}",
                           missing=[where])
    boxes: list[_Box] = []
    at = 0
    for s in items:
        boxes.extend(_Box(b.tensor, b.start[:d] + (b.start[d] + at,) + b.start[d + 1:], b.size) for b in s.boxes)
        at += s.shape[d]
    shape = items[0].shape[:d] + (at,) + items[0].shape[d + 1:]
    return _Sym(shape, tuple(boxes))


def placements(groups: Mapping[str, Sequence[tuple[str, tuple[int, ...]]]], patterns: Sequence[str],
               ops: Sequence[tuple[str, int]], where: str) -> tuple[tuple[int, ...], list[tuple[str, int]]]:
    """Evaluate ``ops`` on ``groups`` (source pattern -> its tensors' names and
    shapes, in load order). Returns the result's shape and, for each source
    tensor, its element offset in the result; a HandoffError when a source
    would not be one contiguous run of the result."""
    state: dict[str, _Sym | list[_Sym]] = {
        pat: [_Sym(tuple(shape), (_Box(name, (0,) * len(shape), tuple(shape)),)) for name, shape in items]
        for pat, items in groups.items()}
    for op, dim in ops:
        if op == "merge":
            state = {pat: v if isinstance(v, _Sym) else _stack(v, dim, where) for pat, v in state.items()}
        elif op == "concat":
            parts: list[_Sym] = []
            for pat in patterns:
                v = state.get(pat)
                if v is not None:
                    parts.extend([v] if isinstance(v, _Sym) else v)
            state = {"": _concat(parts, dim, where)}
        else:  # pragma: no cover - hf2q.transformers only passes the two
            raise HandoffError(f"{where}: conversion op {op!r} is not supported", missing=[op])
    (out,) = state.values() if len(state) == 1 else (None,)
    if isinstance(out, list) and len(out) == 1:
        out = out[0]
    if not isinstance(out, _Sym):
        raise HandoffError(f"{where}: the conversion does not make exactly one tensor", missing=[where])
    strides = [1] * len(out.shape)
    for i in range(len(out.shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * out.shape[i + 1]
    result: list[tuple[str, int]] = []
    for b in out.boxes:
        spans = [i for i, n in enumerate(b.size) if n != 1]
        first = spans[0] if spans else len(b.size)
        ok = all(b.size[i] == out.shape[i] for i in range(first + 1, len(b.size)))
        if not ok:
            raise HandoffError(f"{where}: source '{b.tensor}' would not be one contiguous run of the destination "
                               f"(box {b.start}+{b.size} in {out.shape})", missing=[where])
        result.append((b.tensor, sum(s * k for s, k in zip(b.start, strides))))
    return out.shape, result


@dataclass(frozen=True)
class Target:
    """One destination tensor: its name in transformers' model, logical
    shape, hf2q format, and ``ops`` over ``groups`` (empty ops: one source,
    renamed only)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    groups: Mapping[str, Sequence[str]]
    patterns: Sequence[str] = ()
    ops: Sequence[tuple[str, int]] = ()


def _block_id(name: str) -> int | None:
    for part in name.split("."):
        if part.isdecimal() and len(part) < 19:
            return int(part)
    return None


def plan_handoff(ckpt: Any, targets: Sequence[Target], *, config: Any = None,
                 skipped: Sequence[str] = ()) -> LoadPlan:
    """The :class:`~hf2q.plan.LoadPlan` that fills ``targets`` from the open
    checkpoint ``ckpt``: sources land at their offsets in the destination
    buffer (converted by the loader where formats differ)."""
    entries: list[TensorPlan] = []
    for t in targets:
        where = f"transformers parameter '{t.name}'"
        src: dict[str, tuple[str, tuple[int, ...]]] = {}
        for names in t.groups.values():
            for n in names:
                info = ckpt[n]
                src[n] = (formats.from_safetensors(info.dtype).name, tuple(int(d) for d in info.shape))
        if t.ops:
            shape, where_each = placements({p: [(n, src[n][1]) for n in ns] for p, ns in t.groups.items()},
                                           t.patterns, t.ops, where)
        else:
            ((name,),) = [tuple(ns) for ns in t.groups.values()]
            shape, where_each = src[name][1], [(name, 0)]
        if tuple(shape) != tuple(t.shape):
            raise HandoffError(f"{where}: the checkpoint makes shape {tuple(shape)}, the model wants "
                               f"{tuple(t.shape)}", missing=[t.name])
        pieces = tuple(Piece(n, src[n][0], src[n][1], dest_offset=off) for n, off in where_each)
        kind = "expert" if len(pieces) > 1 else "weight"
        entries.append(TensorPlan(t.name, tuple(t.shape), t.dtype, pieces, group=_block_id(t.name), kind=kind))
    return LoadPlan("transformers", entries, config, skipped=tuple(skipped))
