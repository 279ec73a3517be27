"""hf2q.plan: the byte accounting of pieces, entries and plans (computed once
per frozen object, never part of its identity)."""

from __future__ import annotations

import pickle

import pytest

from hf2q import formats
from hf2q.plan import LoadPlan, Piece, TensorPlan


def test_piece_sizes() -> None:
    whole = Piece("w", "bf16", (3, 5))
    assert (whole.numel, whole.nbytes) == (15, 30)
    half = Piece("gu", "f32", (4, 6, 8), rows=(3, 6))  # rows [3, 6) of axis 1, for each of 4
    assert (half.numel, half.nbytes) == (4 * 3 * 8, 4 * 3 * 8 * 4)
    assert Piece("q", "q8_0", (2, 64)).nbytes == 2 * 2 * 34
    assert Piece("s", "f4", (3, 2)).nbytes == 3


def test_cached_sizes_are_not_identity() -> None:
    pieces = (Piece("w", "bf16", (3, 5), 7),)
    a, b = TensorPlan("t", (3, 5), "f32", pieces), TensorPlan("t", (3, 5), "f32", pieces)
    assert (a.nbytes, a.source_nbytes) == (60, 30)  # a has them cached, b not
    assert a == b and hash(a) == hash(b) and repr(a) == repr(b)
    c = pickle.loads(pickle.dumps(a))
    assert c == a and (c.nbytes, c.source_nbytes) == (60, 30)
    with pytest.raises(AttributeError):
        a.dtype = "bf16"  # type: ignore[misc]  # still frozen
    assert a.nbytes == 60


def test_a_size_that_cannot_be_computed_raises_every_time() -> None:
    p = Piece("q", "q8_0", (3, 33))  # 99 elements: not whole Q8_0 blocks
    for _ in range(2):
        with pytest.raises(ValueError, match="multiple of 32"):
            p.nbytes


def test_entry_and_plan_totals() -> None:
    experts = tuple(Piece(f"e{i}", "bf16", (8, 32), i * 256) for i in range(4))
    stack = TensorPlan("blk.0.ffn_up_exps.weight", (4, 8, 32), "q8_0", experts, group=0, kind="expert")
    norm = TensorPlan("blk.0.attn_norm.weight", (32,), "f32", (Piece("n", "bf16", (32,)),),
                      transform=lambda arrays: arrays[0], group=0, kind="norm")
    assert stack.source_nbytes == 4 * 8 * 32 * 2 and stack.nbytes == formats.nbytes((4, 8, 32), "q8_0")
    assert (norm.source_nbytes, norm.nbytes) == (64, 128)
    assert stack.streamed and not norm.streamed
    plan = LoadPlan("test", [stack, norm])
    assert plan.source_nbytes == stack.source_nbytes + 64 and plan.nbytes == stack.nbytes + 128
    plan.entries.pop()  # a LoadPlan is mutable: its totals follow its entries
    assert plan.source_nbytes == stack.source_nbytes and plan.nbytes == stack.nbytes
    assert stack == TensorPlan("blk.0.ffn_up_exps.weight", (4, 8, 32), "q8_0", experts, group=0, kind="expert")


def test_source_bytes_of_mixed_pieces_are_each_piece_s() -> None:
    # Geometries sized once per (format, shape, rows, scale): pieces that
    # share some but not all of those, and selected ranges, still count as
    # their own sizes.
    import numpy as np

    from hf2q.plan import Scale

    s1 = Scale("a_s", "f32", (2, 2), (32, 32), (2, 2))
    s2 = Scale("b_s", "bf16", (2, 2), (32, 32), (2, 2))
    pieces = (
        Piece("a", "f8_e4m3", (64, 64), 0, scale=s1),
        Piece("b", "f8_e4m3", (64, 64), 4096, scale=s2),  # the same weight geometry, another scale format
        Piece("c", "f8_e4m3", (64, 64), 8192),  # no scale
        Piece("d", "bf16", (64, 64), 12288),  # another format
        Piece("e", "bf16", (4, 64, 16), 16384, rows=(0, 32)),  # rows of a fused tensor
        Piece("f", "bf16", (4, 64, 16), 18432, rows=(32, 64)),
        Piece("g", "bf16", (64, 64), select=np.array([[0, 0, 10], [20, 30, 5]], np.int64)),
        Piece("h", "f8_e4m3", (64, 64), 0, scale=s1),  # a repeat
    )
    t = TensorPlan("t", (8, 64, 64), "f32", pieces)
    naive = sum(p.nbytes + (p.scale.nbytes if p.scale is not None else 0) for p in pieces)
    assert t.source_nbytes == naive == 4096 + 16 + 4096 + 8 + 4096 + 8192 + 2 * 4 * 32 * 16 * 2 + 30 + 4096 + 16


def test_source_bytes_of_pieces_with_list_shapes() -> None:
    # Piece is public: a shape given as a list still sizes (it cannot key the memo).
    t = TensorPlan("t", (2, 4), "f32", (Piece("a", "f32", [2, 2]), Piece("b", "f32", [2, 2], 4)))
    assert t.source_nbytes == 32
