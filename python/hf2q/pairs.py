"""Speculative pairs (a DFlash drafter bound to its target): the public name
of :mod:`hf2q.models.dflash.pairs`, where the code lives beside the drafter it
binds (docs/PAIRS.md)."""

from __future__ import annotations

from .models.dflash.pairs import (
    TARGET_HOOKS,
    PairError,
    SpeculativePair,
    TargetHeads,
    bind,
    check_pair,
    load_pair,
    load_pair_with,
    target_heads,
)

__all__ = ["PairError", "TargetHeads", "SpeculativePair", "check_pair", "target_heads", "bind", "load_pair",
           "load_pair_with", "TARGET_HOOKS"]
