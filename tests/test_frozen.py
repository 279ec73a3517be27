"""hf2q._frozen.constructor: the fast constructor of the per-tensor records
makes the instances the dataclass's own constructor makes."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hf2q._frozen import constructor
from hf2q.models.qwen35.plan import SourcePiece, new_piece
from hf2q.plan import Scale
from hf2q.safetensors import TensorInfo, _new_tensor_info

names = st.text(min_size=1, max_size=20)
shapes = st.lists(st.integers(0, 10**6), max_size=4).map(tuple)


def _same(a: object, b: object) -> None:
    assert a == b and hash(a) == hash(b) and repr(a) == repr(b)
    assert vars(a) == vars(b) and list(vars(a)) == list(vars(b))  # field order too
    assert type(a) is type(b)
    assert pickle.loads(pickle.dumps(a)) == b
    assert copy.copy(a) == b and dataclasses.replace(a) == b  # type: ignore[type-var]


@given(names, st.sampled_from(["BF16", "F32", "F8_E4M3"]), shapes, st.integers(0, 2**40), st.integers(0, 2**40))
def test_tensor_info(name: str, dtype: str, shape: tuple[int, ...], offset: int, nbytes: int) -> None:
    path = Path("/x/model.safetensors")
    _same(_new_tensor_info(name, dtype, shape, offset, nbytes, path), TensorInfo(name, dtype, shape, offset, nbytes, path))


@given(names, shapes, st.integers(0, 2**40), st.integers(0, 255), st.booleans())
def test_source_piece(name: str, shape: tuple[int, ...], at: int, expert: int, scaled: bool) -> None:
    scale = Scale(name + "_scale_inv", "f32", (2, 2), (128, 128), (2, 2)) if scaled else None
    fast = new_piece(name, "F8_E4M3", shape, at, None, None, scale, expert, None)
    _same(fast, SourcePiece(name, "F8_E4M3", shape, at, expert=expert, scale=scale))


def test_scale() -> None:
    make = constructor(Scale)
    _same(make("w_scale", "bf16", (4, 2), (128, 128), (4, 2), "block"), Scale("w_scale", "bf16", (4, 2), (128, 128), (4, 2)))


def test_the_instance_stays_frozen() -> None:
    info = _new_tensor_info("a", "BF16", (2,), 8, 4, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.name = "b"  # type: ignore[misc]


def test_refuses_what_it_cannot_build() -> None:
    @dataclasses.dataclass(frozen=True)
    class Checked:
        x: int

        def __post_init__(self) -> None:
            raise ValueError

    @dataclasses.dataclass(frozen=True, slots=True)
    class Slotted:
        x: int

    class Plain:
        pass

    @dataclasses.dataclass(frozen=True)
    class OnSlots(Slotted):  # a base's slots hold its fields: not in __dict__
        y: int = 0

    for cls in (Checked, Slotted, Plain, OnSlots):
        with pytest.raises(TypeError, match="dataclass without __post_init__ or __slots__"):
            constructor(cls)
    with pytest.raises(TypeError):
        constructor(SourcePiece)(1, 2)  # every field, positionally
