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


def why_no_cuda() -> str:
    """Why ``Device("cuda")`` cannot be opened here ("" when it can): the
    reason the CUDA tests' skip line prints."""
    from hf2q.device import Device
    from hf2q.errors import DeviceError

    try:
        Device("cuda")
    except DeviceError as e:
        return str(e)
    return ""
