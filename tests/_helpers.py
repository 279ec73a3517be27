"""Helpers shared by test modules (pytest puts tests/ on sys.path)."""

from __future__ import annotations


class InterruptingBar:
    """A progress bar stand-in whose update raises KeyboardInterrupt after
    `after` updates: a Ctrl-C arriving in the middle of a load."""

    def __init__(self, after: int) -> None:
        self.after = after
        self.updates = 0
        self.closed = False

    def update(self, n: int) -> None:
        self.updates += 1
        if self.updates > self.after:
            raise KeyboardInterrupt

    def close(self) -> None:
        self.closed = True

    def set_postfix_str(self, s: str) -> None:
        pass
