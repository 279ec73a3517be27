"""The cyclic garbage collector paused while hf2q opens, plans and loads a
checkpoint (docs/ARCHITECTURE.md, "Garbage collection during a load").

Opening and planning make a few objects per tensor (32,000 tensors: about
100,000 tuples), none of them in a reference cycle. Each 700 new container
objects start a young collection, every tenth of those a middle one and,
once enough objects survived, a full collection, which walks every object of
the process: with torch imported (200,000 objects) the collections took 0.3 of
the 1.3 s that opening and planning the one-tensor-per-expert Qwen3.6 took on
the CI-sized machine, and found nothing to free. :func:`paused` turns the
collector off for such a step and back on after it, if it was on: reference
counting still frees everything at once; only cycles made meanwhile wait for
the next collection.

Thread-safe and nestable (the collector is one per process: it comes back on
when the last paused step of any thread ends), and fork-safe: a child forked
during a paused step (which it never finishes: only the forking thread exists
in the child) gets the collector back as it was before the step.
"""

from __future__ import annotations

import functools
import gc
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Callable, TypeVar

__all__ = ["paused", "pausing"]

F = TypeVar("F", bound=Callable[..., object])

_lock = threading.Lock()
_depth = 0  # paused steps running, all threads together
_restore = False  # whether the collector was on when the first of them began
_generation = 0  # bumped in a forked child: steps begun before the fork do not count there


@contextmanager
def paused() -> Iterator[None]:
    """The collector off for the ``with`` block (if it was on), then back on
    once no other thread is inside such a block."""
    global _depth, _restore
    with _lock:
        if _depth == 0:
            _restore = gc.isenabled()
            gc.disable()
        _depth += 1
        generation = _generation
    try:
        yield
    finally:
        with _lock:
            if generation == _generation and _depth > 0:
                _depth -= 1
                if _depth == 0 and _restore:
                    gc.enable()


def pausing(fn: F) -> F:
    """``fn`` run inside :func:`paused`."""

    @functools.wraps(fn)
    def wrapper(*args: object, **kwargs: object) -> object:
        with paused():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _after_fork_in_child() -> None:
    # The lock may have been held by a thread that does not exist here; the
    # steps that were running do not run here (the forking thread's own,
    # if any, ends without touching the new state: the generation changed).
    global _lock, _depth, _restore, _generation
    _lock = threading.Lock()
    if _depth > 0 and _restore:
        gc.enable()
    _depth = 0
    _restore = False
    _generation += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
