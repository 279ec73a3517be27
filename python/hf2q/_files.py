"""How hf2q opens the files it reads (config.json, index, shards, upload
sources, the demo cache): without blocking, regular files only, with a size
cap that fits the kind of file, and with the file's identity recorded so a
rewrite in place is noticed (docs/RELIABILITY.md, "Files").

A FIFO, a device node, a directory or a socket is refused at once: the open
uses ``O_NONBLOCK`` (a FIFO without a writer would otherwise block the open
forever) and ``fstat`` checks the type before a byte is read; ``O_NONBLOCK``
is then cleared again.
"""

from __future__ import annotations

import io
import os
import stat
from dataclasses import dataclass
from typing import Callable

__all__ = ["FileIdentity", "OwnedFd", "open_owned", "open_regular", "read_capped", "file_kind", "CONFIG_MAX_BYTES", "INDEX_MAX_BYTES"]

#: A model's config.json: real ones are a few KiB (the largest published,
#: with long layer lists, ~100 KiB). More than this is refused unread.
CONFIG_MAX_BYTES = 4 << 20
#: model.safetensors.index.json: ~100 bytes per tensor name; 100 MB allows
#: about a million tensors.
INDEX_MAX_BYTES = 100_000_000

_OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_NOCTTY", 0)
)


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


@dataclass(frozen=True)
class FileIdentity:
    """Device, inode, size and modification time of an open file. Not the
    change time: it also moves when the file is renamed over or unlinked,
    which leaves an open descriptor's bytes intact (an atomic re-download)."""

    dev: int
    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileIdentity:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def differences(self, other: FileIdentity) -> list[str]:
        out = []
        if (self.dev, self.ino) != (other.dev, other.ino):
            out.append("device/inode")
        if self.size != other.size:
            out.append(f"size {self.size} -> {other.size}")
        if self.mtime_ns != other.mtime_ns:
            out.append("modification time")
        return out


def _marked(err: BaseException, cause: OSError) -> BaseException:
    """``err`` marked as the machine's failure when ``cause`` is one (EMFILE, ENOMEM, EIO ...)."""
    from .errors import mark_system_failure

    return mark_system_failure(err, cause)


def open_regular(path: str, error: Callable[[str, OSError | None], BaseException]) -> tuple[int, os.stat_result]:
    """Open ``path`` read-only without blocking and return ``(fd, fstat)`` of
    a regular file. Anything else, or an OSError, raises ``error(reason, oserror)``."""
    fd = -1
    try:
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except OSError as e:
            raise _marked(error(f"cannot open: {e.strerror or e}", e), e) from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"is {file_kind(st.st_mode)}, not a regular file", None)
        if _OPEN_FLAGS & getattr(os, "O_NONBLOCK", 0):
            os.set_blocking(fd, True)
        return fd, st
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise


class OwnedFd(io.FileIO):
    """A file opened read-only whose ``with`` gives its descriptor."""

    def __enter__(self) -> int:  # type: ignore[override]
        return self.fileno()


def open_owned(path: str, error: Callable[[str, OSError | None], BaseException]) -> OwnedFd:
    """:func:`open_regular`'s descriptor, owned by a FileIO from the moment
    it exists: the ``with`` closes it in C (its ``__exit__``), or, if a
    Ctrl-C lands before a ``with`` holds it, freeing the FileIO does. A
    ``finally: os.close(fd)`` (or a Python ``__exit__``) skipped its close
    when the interrupt landed on that line (tests/test_fault_injection.py,
    tests/test_hardening_files.py)."""
    return OwnedFd(path, "rb", opener=lambda p, _flags: open_regular(p, error)[0])


def _read_some(fd: int, n: int, error: Callable[[str, OSError | None], BaseException]) -> bytes:
    # A helper, not a try block inside read_capped's loop: CPython 3.11 skips
    # the enclosing finally (the fd's close) for an exception a line tracer
    # raises on a nested ``try:`` line (tests/test_fault_injection.py does so).
    try:
        return os.read(fd, n)
    except OSError as e:
        raise _marked(error(f"cannot read: {e.strerror or e}", e), e) from None


def read_capped(path: str, cap: int, what: str, error: Callable[[str, OSError | None], BaseException]) -> bytes:
    """The whole content of a small regular file, refused unread when it is
    larger than ``cap`` bytes (and when it grows past it or changes while read)."""
    with open_owned(path, error) as fd:  # a Ctrl-C on any line here leaves nothing open
        st = os.fstat(fd)
        if st.st_size > cap:
            raise error(f"is {st.st_size} bytes, more than the {cap} bytes a {what} may have", None)
        chunks = []
        total = 0
        while total <= cap:
            b = _read_some(fd, min(1 << 20, cap + 1 - total), error)
            if not b:
                break
            chunks.append(b)
            total += len(b)
        if total > cap:
            raise error(f"grew past the {cap} bytes a {what} may have while being read", None)
        changed = FileIdentity.of(st).differences(FileIdentity.of(os.fstat(fd)))
        if changed:
            raise error(f"changed while being read ({', '.join(changed)} changed)", None)
        return b"".join(chunks)
