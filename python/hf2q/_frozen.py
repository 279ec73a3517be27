"""Fast construction of frozen dataclass instances, for the few records
made once per checkpoint tensor (``TensorInfo``, a per-expert
``SourcePiece``, an FP8 ``Scale``: 30,000-60,000 of each in a full-size
Qwen3.6 checkpoint of one tensor per expert or in FP8).

A frozen dataclass's generated ``__init__`` sets each field with
``object.__setattr__`` (the class's own ``__setattr__`` refuses); that is
most of its cost: 0.9 us for a 6-field ``TensorInfo`` and 1.4 us for a
9-field ``SourcePiece`` on the CI-sized VM. :func:`constructor` builds, the
way ``dataclasses`` builds ``__init__``, a function that writes the fields
into the new instance's ``__dict__`` directly: 0.4 us (a few percent of
opening and planning such a checkpoint). The instance is the same as the class's
constructor makes (same fields, equality, hash, repr); it takes every field,
positionally, and the class (and its bases) must have no ``__post_init__``
or ``__slots__``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["constructor"]

T = TypeVar("T")


def constructor(cls: type[T]) -> Callable[..., T]:
    """``make(field1, field2, ...)`` -> an instance of frozen dataclass ``cls``,
    every field given in declaration order (base classes' fields first)."""
    slotted = any("__slots__" in k.__dict__ for k in cls.__mro__ if k is not object)
    if not dataclasses.is_dataclass(cls) or hasattr(cls, "__post_init__") or slotted:
        raise TypeError(f"{cls.__name__}: a dataclass without __post_init__ or __slots__ is needed")
    names = [f.name for f in dataclasses.fields(cls)]
    if any(not n.isidentifier() for n in names):
        raise TypeError(f"{cls.__name__}: field names must be identifiers")
    body = "".join(f"    d[{n!r}] = {n}\n" for n in names)
    src = f"def make({', '.join(names)}):\n    o = new(cls)\n    d = o.__dict__\n{body}    return o\n"
    ns: dict[str, Any] = {"new": object.__new__, "cls": cls}
    exec(src, ns)  # noqa: S102 - generated from the dataclass's own field names, as dataclasses does
    make: Callable[..., T] = ns["make"]
    make.__qualname__ = f"{cls.__qualname__}.<fast constructor>"
    return make
