"""Sharded loads: each rank of a multi-GPU job loads, and reads from the
files, only its slice of every tensor (docs/SHARDING.md).

A :class:`Shard` names the rank, the world size and the mode:

- ``"tensor"`` (tensor parallel, as vLLM / SGLang / Megatron split a
  decoder): column-parallel matrices (q/k/v, gate/up, embeddings and the LM
  head: vocab-parallel) are split by output rows; row-parallel matrices
  (o_proj, down_proj) by input columns; expert stacks ``[E, out, in]`` the
  same way on their last two axes; everything else (norms, routers, small
  tensors, tensors a family lists as replicated) is loaded whole on every rank.
- ``"expert"`` (expert parallel): rank ``r`` of ``w`` holds experts
  ``[r*E/w, (r+1)*E/w)`` of every routed-expert stack (or of every layer's
  per-expert tensors); every other tensor is replicated.

A family says which tensors split on which axis (:meth:`hf2q.models.base.ModelFamily.shard_rule`,
default :func:`name_rule`); :func:`shard_plan` turns a whole-model
:class:`~hf2q.plan.LoadPlan` into the rank's plan: sliced shapes, and
sources whose pieces carry the exact element ranges to read (``Piece.select``),
so the loader preads only the rank's bytes straight into its buffer. A
row split is one contiguous range per piece; a column split one range per
row, adjacent ranges coalesced. A block format (Q8_0) is split on whole
blocks. A split the world does not divide is a :class:`~hf2q.errors.ShardError`.

Entries that need a numpy step on whole tensors (Qwen3.5's F32 -> BF16
conversions and reorders) and are split are read whole and sliced after the
step: the only case where a rank reads more than its share.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Union

if TYPE_CHECKING:
    import numpy as np
else:  # numpy on first use (hf2q._lazy)
    from ._lazy import numpy as np

from . import formats
from .errors import ShardError
from .plan import LoadPlan, Piece, TensorPlan

__all__ = ["Shard", "Split", "Owned", "REPLICATE", "Rule", "name_rule", "shard_plan", "MODES"]

MODES = ("tensor", "expert")


@dataclass(frozen=True)
class Shard:
    """Rank ``rank`` of ``world`` in ``mode`` ``"tensor"`` or ``"expert"``
    (see the module doc); ``Shard(0, 1)`` is the whole model."""

    rank: int
    world: int
    mode: Literal["tensor", "expert"] = "tensor"

    def __post_init__(self) -> None:
        for what, v in (("rank", self.rank), ("world", self.world)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"Shard {what} must be an int, got {type(v).__name__}")
        if self.world < 1:
            raise ShardError(f"Shard world must be >= 1, got {self.world}", reason="world < 1")
        if not 0 <= self.rank < self.world:
            raise ShardError(f"Shard rank must be in [0, {self.world}), got {self.rank}", reason="rank out of range")
        if self.mode not in MODES:
            raise ValueError(f"Shard mode must be one of {', '.join(MODES)}, got {self.mode!r}")

    @classmethod
    def from_torch_distributed(cls, mode: Literal["tensor", "expert"] = "tensor", group: Any = None) -> "Shard":
        """This process's rank and the world size of ``group`` (default: the
        default group) of an initialised ``torch.distributed``."""
        import torch.distributed as dist  # only here: hf2q does not need torch

        if not dist.is_available() or not dist.is_initialized():
            raise ShardError("torch.distributed is not initialised (call torch.distributed.init_process_group "
                             "first, e.g. under torchrun)", reason="torch.distributed not initialised")
        return cls(int(dist.get_rank(group)), int(dist.get_world_size(group)), mode)

    def bounds(self, n: int, what: str, tensor: str | None = None) -> tuple[int, int]:
        """This rank's ``[start, stop)`` of ``n`` items split evenly."""
        if n % self.world:
            raise ShardError(f"{tensor or 'shard'}: {what} {n} is not divisible by the world size {self.world}",
                             tensor=tensor, reason=f"{what} not divisible")
        c = n // self.world
        return self.rank * c, (self.rank + 1) * c


@dataclass(frozen=True)
class Split:
    """Split the destination's ``axis``; ``parts`` > 1: the axis is that many
    equal blocks back to back (Gemma 4's fused gate|up expert stack), each
    split, and a rank's slices of them stay back to back."""

    axis: int
    parts: int = 1


@dataclass(frozen=True)
class Owned:
    """A tensor that belongs to routed expert ``expert`` of ``count`` (HF's
    per-expert tensors): in expert mode only its owner loads it."""

    expert: int
    count: int


#: A rule's answer for a tensor loaded whole on every rank.
REPLICATE = None
Decision = Union[Split, Owned, None]
#: ``rule(entry, mode, experts)``: how ``entry`` is split (``experts``: the
#: expert count of per-expert tensors, by their name with the index as ``*``).
Rule = Callable[[TensorPlan, str, dict[str, int]], Decision]

# Names are matched on their last part before ``.weight`` / ``.bias``: HF
# (``model.layers.0.self_attn.q_proj``) and GGUF (``blk.0.attn_q``) alike.
COLUMN = frozenset({
    "q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "w1", "w3", "embed_tokens", "lm_head",
    "attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up", "ffn_gate_exps", "ffn_up_exps",
    "ffn_gate_shexp", "ffn_up_shexp", "token_embd", "output",
})
#: column-parallel with two fused halves (gate | up)
FUSED_COLUMN = frozenset({"gate_up_proj", "ffn_gate_up_exps"})
ROW = frozenset({"o_proj", "down_proj", "w2", "attn_output", "ffn_down", "ffn_down_exps", "ffn_down_shexp"})
#: names of routed-expert stacks ([E, ...], axis 0 the expert)
EXPERT_STACKS = frozenset({"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_up_exps"})
_PER_EXPERT = re.compile(r"(^|\.)experts\.(\d+)\.")


def _stem(name: str) -> tuple[str, str]:
    """(last name part before ``.weight`` / ``.bias``, that suffix)."""
    for suffix in (".weight", ".bias"):
        if name.endswith(suffix):
            return name[: -len(suffix)].rsplit(".", 1)[-1], suffix
    return name.rsplit(".", 1)[-1], ""


def expert_key(name: str) -> tuple[str, int] | None:
    """``(name with the expert index as *, index)`` of a per-expert tensor."""
    m = _PER_EXPERT.search(name)
    if m is None:
        return None
    return name[: m.start(2)] + "*" + name[m.end(2):], int(m.group(2))


def name_rule(entry: TensorPlan, mode: str, experts: dict[str, int]) -> Decision:
    """The default rule (docs/SHARDING.md), by the tensor's name and shape."""
    stem, suffix = _stem(entry.name)
    nd = len(entry.shape)
    stacked = nd == 3 and (stem in EXPERT_STACKS or entry.kind == "expert"
                           or (stem in COLUMN | FUSED_COLUMN | ROW and ".experts" in entry.name))
    if mode == "expert":
        if stacked:
            return Split(0)
        key = expert_key(entry.name)
        if key is not None and key[0] in experts:
            return Owned(key[1], experts[key[0]])
        return REPLICATE
    if nd == 0 or (nd == 1 and suffix != ".bias") or nd > 3 or (nd == 3 and not stacked):
        return REPLICATE
    if stem in COLUMN:
        return Split(nd - 2 if suffix != ".bias" else 0)
    if stem in FUSED_COLUMN:
        return Split(nd - 2 if suffix != ".bias" else 0, parts=2)
    if stem in ROW and suffix != ".bias":  # a row-parallel bias is added once, after the reduce
        return Split(nd - 1)
    return REPLICATE


def expert_counts(plan: LoadPlan) -> dict[str, int]:
    """Per-expert tensor families of ``plan`` (name with the index as ``*``)
    and their expert count: the indices must run ``0..E-1``."""
    seen: dict[str, set[int]] = {}
    for e in plan:
        key = expert_key(e.name)
        if key is not None:
            seen.setdefault(key[0], set()).add(key[1])
    return {k: len(v) for k, v in seen.items() if v == set(range(len(v)))}


def _piece_ranges(p: Piece) -> np.ndarray:
    """``(destination offset, source offset, elements)`` rows of a piece
    (its ``select``, its row slices, or the whole tensor)."""
    if p.select is not None:
        return p.select
    if p.rows is None:
        return np.array([[p.dest_offset, 0, p.numel]], dtype=np.int64)
    start, stop = p.rows
    lead, rows = p.shape[0], p.shape[1]
    inner = formats.numel(p.shape[2:])
    per = (stop - start) * inner
    i = np.arange(lead, dtype=np.int64)
    return np.stack([p.dest_offset + i * per, (i * rows + start) * inner, np.full(lead, per, dtype=np.int64)], 1)


def _coalesce(r: np.ndarray) -> np.ndarray:
    """Ranges sorted by destination, neighbours contiguous on both sides merged."""
    if len(r) < 2:
        return r
    r = r[np.argsort(r[:, 0], kind="stable")]
    ends_d, ends_s = r[:-1, 0] + r[:-1, 2], r[:-1, 1] + r[:-1, 2]
    joins = (ends_d == r[1:, 0]) & (ends_s == r[1:, 1])
    starts = np.flatnonzero(np.concatenate([[True], ~joins]))
    sums = np.add.reduceat(r[:, 2], starts)
    return np.stack([r[starts, 0], r[starts, 1], sums], 1)


def _selection(shape: tuple[int, ...], split: Split, shard: Shard, name: str,
               ) -> tuple[tuple[int, ...], np.ndarray, np.ndarray, int]:
    """The rank's part of a destination of ``shape``: (sliced shape, start of
    each range in the whole destination, its start in the slice, range length)."""
    axis = split.axis
    n = shape[axis]
    if n % split.parts:
        raise ShardError(f"{name}: axis {axis} ({n}) is not {split.parts} equal parts", tensor=name,
                         reason="fused parts unequal")
    part = n // split.parts
    what = "expert count (axis 0)" if shard.mode == "expert" and axis == 0 else f"axis {axis} size"
    if split.parts > 1:
        what += f" (each of {split.parts} fused parts)"
    lo, hi = shard.bounds(part, what, name)
    c = hi - lo
    outer = formats.numel(shape[:axis])
    inner = formats.numel(shape[axis + 1:])
    o = np.arange(outer, dtype=np.int64)[:, None]
    q = np.arange(split.parts, dtype=np.int64)[None, :]
    old = ((o * n + q * part + lo) * inner).reshape(-1)
    new = ((o * (n // shard.world) + q * c) * inner).reshape(-1)
    sliced = shape[:axis] + (n // shard.world,) + shape[axis + 1:]
    return sliced, old, new, c * inner


def _slice_pieces(pieces: tuple[Piece, ...], old: np.ndarray, new: np.ndarray, length: int) -> tuple[Piece, ...]:
    """Each piece cut to the selection, re-based to the sliced destination;
    a piece with nothing in the selection is dropped (another rank's expert)."""
    out: list[Piece] = []
    for p in pieces:
        rows = []
        for d0, s0, n in _piece_ranges(p).tolist():
            # selection ranges overlapping [d0, d0 + n)
            k0 = max(int(np.searchsorted(old, d0, side="right")) - 1, 0)
            k1 = int(np.searchsorted(old, d0 + n, side="left"))
            if k1 <= k0:
                continue
            o = old[k0:k1]
            lo = np.maximum(o, d0)
            hi = np.minimum(o + length, d0 + n)
            keep = hi > lo
            if keep.any():
                lo, hi, o, nw = lo[keep], hi[keep], o[keep], new[k0:k1][keep]
                rows.append(np.stack([nw + (lo - o), s0 + (lo - d0), hi - lo], 1))
        if rows:
            sel = _coalesce(np.concatenate(rows).astype(np.int64, copy=False))
            out.append(dataclasses.replace(p, dest_offset=int(sel[0, 0]), rows=None, select=sel))
    return tuple(out)


def _check_blocks(entry: TensorPlan, split: Split, sliced: tuple[int, ...]) -> None:
    fmt = formats.get(entry.dtype)
    if fmt.block_elems > 1 and split.axis == len(entry.shape) - 1 and sliced[-1] % fmt.block_elems:
        raise ShardError(f"{entry.name}: a {fmt.name} slice of {sliced[-1]} columns is not a whole number of "
                         f"{fmt.block_elems}-element blocks (world size too large for this split)",
                         tensor=entry.name, reason="not whole blocks")


def _slice_array(a: np.ndarray, split: Split, shard: Shard) -> np.ndarray:
    """The rank's slice of a whole destination array (after a numpy step)."""
    shape = a.shape
    n = shape[split.axis]
    part = n // split.parts
    c = part // shard.world
    v = a.reshape(shape[:split.axis] + (split.parts, part) + shape[split.axis + 1:])
    idx = (slice(None),) * (split.axis + 1) + (slice(shard.rank * c, (shard.rank + 1) * c),)
    return np.ascontiguousarray(v[idx]).reshape(shape[:split.axis] + (n // shard.world,) + shape[split.axis + 1:])


def shard_entry(entry: TensorPlan, decision: Decision, shard: Shard) -> TensorPlan | None:
    """``entry`` as rank ``shard.rank`` loads it (None: not on this rank)."""
    if decision is None:
        return entry
    if isinstance(decision, Owned):
        lo, hi = shard.bounds(decision.count, "expert count", entry.name)
        return entry if lo <= decision.expert < hi else None
    if not -len(entry.shape) <= decision.axis < len(entry.shape):
        raise ValueError(f"{entry.name}: no axis {decision.axis} in shape {list(entry.shape)}")
    split = Split(decision.axis % len(entry.shape), decision.parts)
    sliced, old, new, length = _selection(tuple(entry.shape), split, shard, entry.name)
    _check_blocks(entry, split, sliced)
    if entry.unit_transpose is not None:
        entry = entry.transposed_in_numpy()  # the rank's slice of the reordered tensor
    if entry.transform is None:
        # streamed, or staged elementwise: only the rank's ranges are read
        return dataclasses.replace(entry, shape=sliced, sources=_slice_pieces(entry.sources, old, new, length))
    # a numpy step on whole tensors: read whole, step, then slice
    step = entry.transform

    def sliced_step(arrays: list[np.ndarray]) -> np.ndarray:
        return _slice_array(np.asarray(step(arrays)).reshape(entry.shape), split, shard)

    return dataclasses.replace(entry, shape=sliced, transform=sliced_step)


def _check_splittable(e: TensorPlan, names: set[str]) -> None:
    """Formats a rank's slice cannot be cut from yet (docs/SHARDING.md):
    MXFP4 tensors (repacked whole), and FP8 weights kept as FP8 whose block
    scales are their own tensors (the scale would stay whole while the weight
    is cut, with nothing recording where the slice starts in its grid)."""
    if e.dtype == "mxfp4" or any(p.scale is not None and p.scale.scheme == "mxfp4" for p in e.sources):
        raise ShardError(f"{e.name}: MXFP4 tensors are repacked or decoded whole, so a rank's slice of one "
                         "cannot be loaded yet (whatever the dtype)", tensor=e.name, reason="mxfp4")
    if e.dtype in ("f8_e4m3", "f8_e5m2") and any(n.startswith(e.name + "_scale") or
                                                n.startswith(e.name.removesuffix("weight") + "weight_scale")
                                                for n in names if n != e.name):
        raise ShardError(f"{e.name}: an FP8 weight kept as FP8 (dtype 'keep') is not sliced with its block "
                         "scales; shard FP8 checkpoints with dtype 'bf16', 'f16', 'f32' or 'q8_0'", tensor=e.name,
                         reason="fp8 kept with scales")


def shard_plan(plan: LoadPlan, shard: Shard, rule: Rule = name_rule) -> LoadPlan:
    """Rank ``shard.rank``'s plan: every entry sliced by ``rule`` (the
    family's), entries of other ranks' experts left out; ``extra["shard"]``
    says which shard, ``extra["shard_splits"]`` how each split tensor was cut."""
    experts = expert_counts(plan)
    entries: list[TensorPlan] = []
    splits: dict[str, str] = {}
    names = {e.name for e in plan}
    for e in plan:
        decision = rule(e, shard.mode, experts)
        if isinstance(decision, Split) and shard.world > 1:
            _check_splittable(e, names)
        s = shard_entry(e, decision, shard)
        if isinstance(decision, Split):
            splits[e.name] = f"axis {decision.axis}" + (f" ({decision.parts} parts)" if decision.parts > 1 else "")
        if s is not None:
            entries.append(s)
    out = dataclasses.replace(plan, entries=entries)
    out._index = {}
    out.extra = {**plan.extra, "shard": {"rank": shard.rank, "world": shard.world, "mode": shard.mode}}
    return out
