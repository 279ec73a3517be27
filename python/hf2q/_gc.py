"""The cyclic garbage collector paused while hf2q opens, plans and loads a
checkpoint (docs/ARCHITECTURE.md, "Garbage collection during a load").

Opening and planning make a few objects per tensor (32,000 tensors: about
100,000 tuples), none of them in a reference cycle. Each 700 new container
objects start a young collection, every tenth of those a middle one and,
once enough objects survived, a full collection, which walks every object of
the process: with torch imported (200,000 objects) the collections took 0.5 of
the 1.5-1.6 s that opening and planning the one-tensor-per-expert Qwen3.6 took on
the CI-sized machine, and found nothing to free. :func:`paused` turns the
collector off for such a step and back on after it, if it was on: reference
counting still frees everything at once; only cycles made meanwhile wait for
the next collection.

Thread-safe and nestable (the collector is one per process: it comes back on
when the last paused step of any thread ends, if it was on when the first of
them began; a ``gc.disable()`` by other code during a step is undone then).
A step's bookkeeping is one entry in a list, made inside its ``try``: an
exception that arrives anywhere on the way in (a Ctrl-C) still ends the step
and leaves the collector as the other steps need it; one that lands on the
way out before the step is ended is caught up with when the step's frame
is let go (a finalizer on a token only that frame holds). Fork-safe: the fork
waits for the lock, and the child keeps only the forking thread's steps (the
others' threads do not exist there), so a child forked during another
thread's step gets the collector back as it was.
"""

from __future__ import annotations

import functools
import gc
import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Callable, TypeVar

__all__ = ["paused", "pausing"]

F = TypeVar("F", bound=Callable[..., object])

# Reentrant: a finalizer or signal handler that runs while this thread holds
# it (and opens a checkpoint) must not wait for itself.
_lock = threading.RLock()
_steps: list[tuple[int, int]] = []  # (thread ident, id of its token) of each paused step running
_restore = False  # whether the collector was on when the first of them began


class _Token:
    """A step's token: alive as long as the step's frame."""

    __slots__ = ("__weakref__",)


@contextmanager
def paused() -> Iterator[None]:
    """The collector off for the ``with`` block (if it was on), then back on
    once no other thread is inside such a block."""
    global _restore
    # The finally's first line is a line like any other: a Ctrl-C landing
    # there, before _leave runs, would leave the step counted (the collector
    # off for good). So the step also ends when its token, held by this
    # frame alone, is let go with the frame (a finalizer: _leave is
    # idempotent), made before the step is counted.
    token = _Token()
    step = (threading.get_ident(), id(token))
    backstop = weakref.finalize(token, _leave, step)
    try:
        with _lock:
            if not _steps:
                _restore = gc.isenabled()
            _steps.append(step)
            gc.disable()
        yield
    finally:
        interrupted: BaseException | None = None
        while True:
            try:
                _leave(step)
                break
            except KeyboardInterrupt as e:  # (a signal) mid-way: the step is ended first, then it is raised
                interrupted = e
        backstop.detach()
        if interrupted is not None:
            raise interrupted


def _leave(step: tuple[int, int]) -> None:
    """``step`` no longer counted (idempotent), the collector back on after the last."""
    with _lock:
        try:
            _steps.remove(step)
        except ValueError:  # not counted: interrupted on its way in, or already left
            pass
        if not _steps and _restore:
            gc.enable()


def pausing(fn: F) -> F:
    """``fn`` run inside :func:`paused`."""

    @functools.wraps(fn)
    def wrapper(*args: object, **kwargs: object) -> object:
        with paused():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _before_fork() -> None:
    _lock.acquire()  # no step is half-way in or out while the process is copied


def _after_fork_in_parent() -> None:
    _lock.release()


def _after_fork_in_child() -> None:
    # Only the forking thread exists here: the other threads' steps never
    # end in this process, so they are dropped (the forking thread's own
    # step, if any, ends as usual and restores the collector then).
    global _lock
    mine = threading.get_ident()
    _steps[:] = [s for s in _steps if s[0] == mine]
    if not _steps and _restore:
        gc.enable()
    _lock = threading.RLock()  # the parent's is held by this thread's copy


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)
