"""A compact byte encoding of a checkpoint directory, so that libFuzzer
mutates file names, JSON and safetensors headers, not megabytes of weights.

An input is a sequence of entries, read until the bytes run out::

    u8  tag     low 3 bits: file name (index into NAMES; 7 = literal name:
                u8 length + bytes follow); bits 3-4: kind
    kind 0, raw file:          u32 length, bytes
    kind 1, safetensors file:  u32 header length N, N header bytes,
                               u32 data length, u8 fill seed
                               -> file = le64(N) + header + generated data
    kind 2, safetensors file whose le64 prefix is given explicitly:
                               u64 prefix, u32 N, N header bytes, u32 data
                               length, u8 fill seed
    kind 3, truncate:          u32 length: cut the named file to this length
    kind 3 with tag bit 5 set, special entry: u8 what, then
        what % 5 == 0  the name is a FIFO
                  1  the name is a directory
                  2  the name is a symlink to /dev/zero
                  3  the name is a sparse regular file of (u16 + 1) MiB
                     (oversized config/index/shard, read from its size only)
                  4  rewrite in place once the checkpoint is open: the named
                     file's bytes after offset 8 + N are reversed (same size,
                     same inode), its mtime moved on (as a writer a clock tick
                     later would); the target applies it (REWRITE)

Generated data are finite bfloat16 values (so that a valid header reaches the
loaders' conversions), capped at MAX_DATA bytes per file. All numbers are
little-endian; a truncated entry is read as far as the bytes go.
"""

from __future__ import annotations

import re
import struct
from functools import lru_cache
from pathlib import Path

import numpy as np

NAMES = (
    "config.json",
    "model.safetensors.index.json",
    "model.safetensors",
    "model-00001-of-00003.safetensors",
    "model-00002-of-00003.safetensors",
    "model-00003-of-00003.safetensors",
    "model-00001-of-00002.safetensors",
)
LITERAL = 7
SPECIAL_BIT = 1 << 5
FIFO, DIRECTORY, DEV_ZERO, SPARSE, REWRITE = range(5)


class Special:
    """A file that is not plain bytes: FIFO, directory, /dev/zero link, sparse file."""

    __slots__ = ("what", "size")

    def __init__(self, what: int, size: int = 0) -> None:
        self.what = what
        self.size = size

    def __repr__(self) -> str:
        return f"Special({self.what}, {self.size})"
MAX_DATA = 4 << 20
MAX_FILES = 12
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def left(self) -> int:
        return len(self.data) - self.pos

    def take(self, n: int) -> bytes:
        out = self.data[self.pos : self.pos + n]
        self.pos += len(out)
        return out

    def uint(self, size: int) -> int:
        return int.from_bytes(self.take(size), "little")


@lru_cache(maxsize=16)
def fill(n: int, seed: int) -> bytes:
    """n bytes of finite bfloat16 values (a trailing odd byte is 0)."""
    rng = np.random.default_rng(seed)
    vals = (rng.standard_normal(n // 2) * 0.05).astype(np.float32)
    bf16 = (vals.view(np.uint32) >> 16).astype(np.uint16)
    return bf16.tobytes() + b"\x00" * (n % 2)


def decode(data: bytes) -> dict[str, bytes]:
    """The files (name -> bytes, or a :class:`Special`) an input describes;
    in-place rewrites to apply after opening are under the key ``REWRITES``
    (a tuple of names)."""
    r = _Reader(data)
    files: dict = {}
    rewrites: list[str] = []
    while r.left() > 0 and len(files) <= MAX_FILES:
        tag = r.uint(1)
        idx, kind = tag & 7, (tag >> 3) & 3
        if idx == LITERAL:
            raw = r.take(r.uint(1))
            name = raw.decode("utf-8", "replace")
            if not _SAFE_NAME.match(name):
                continue  # never write outside the scratch directory
        else:
            name = NAMES[idx]
        if kind == 0:
            files[name] = r.take(r.uint(4))
        elif kind in (1, 2):
            prefix = r.uint(8) if kind == 2 else None
            header = r.take(r.uint(4))
            n_data = min(r.uint(4), MAX_DATA)
            seed = r.uint(1)
            le = struct.pack("<Q", len(header) if prefix is None else prefix)
            files[name] = le + header + fill(n_data, seed)
        elif tag & SPECIAL_BIT:
            what = r.uint(1) % 5
            if what == REWRITE:
                rewrites.append(name)
            elif what == SPARSE:
                files[name] = Special(SPARSE, (r.uint(2) + 1) << 20)
            else:
                files[name] = Special(what)
        else:
            cut = r.uint(4)
            if isinstance(files.get(name), bytes):
                files[name] = files[name][:cut]
    if rewrites:
        files["REWRITES"] = tuple(rewrites)
    return files


def encode_special(name: str, what: int, size_mib: int = 1) -> bytes:
    """A special entry (see the module docstring)."""
    tag_name = NAMES.index(name) if name in NAMES else LITERAL
    lit = b"" if tag_name != LITERAL else bytes([len(name.encode())]) + name.encode()
    extra = struct.pack("<H", size_mib - 1) if what == SPARSE else b""
    return bytes([tag_name | (3 << 3) | SPECIAL_BIT]) + lit + bytes([what]) + extra


def rewrite_in_place(path: Path) -> None:
    """Reverse a safetensors file's data section in place; move mtime on."""
    import os

    try:
        with open(path, "r+b") as fh:
            raw = fh.read()
            if len(raw) < 8:
                return
            start = 8 + int.from_bytes(raw[:8], "little")
            if start >= len(raw):
                return
            fh.seek(start)
            fh.write(raw[start:][::-1])
        st = os.stat(path)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    except (OSError, ValueError):
        pass


def encode_file(name: str, body: bytes) -> bytes:
    """One entry for `name`: a safetensors file as kind 1 (header + generated
    data of the same length), anything else as a raw file."""
    tag_name = NAMES.index(name) if name in NAMES else LITERAL
    lit = b"" if tag_name != LITERAL else bytes([len(name.encode())]) + name.encode()
    if name.endswith(".safetensors") and len(body) >= 8:
        n = struct.unpack("<Q", body[:8])[0]
        header = body[8 : 8 + n]
        n_data = len(body) - 8 - n
        return bytes([tag_name | (1 << 3)]) + lit + struct.pack("<I", len(header)) + header + struct.pack("<IB", n_data, 0)
    return bytes([tag_name]) + lit + struct.pack("<I", len(body)) + body


def encode_dir(path: Path) -> bytes:
    return b"".join(encode_file(p.name, p.read_bytes()) for p in sorted(Path(path).iterdir()) if p.is_file())


def write(files: dict, directory: Path) -> None:
    """Replace `directory`'s files with `files`."""
    import os
    import shutil

    for p in directory.iterdir():
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    for name, body in files.items():
        if name == "REWRITES":
            continue
        path = directory / name
        if isinstance(body, Special):
            if body.what == FIFO:
                os.mkfifo(path)
            elif body.what == DIRECTORY:
                path.mkdir()
            elif body.what == DEV_ZERO:
                path.symlink_to("/dev/zero")
            else:
                with open(path, "wb") as fh:
                    fh.truncate(body.size)
        else:
            path.write_bytes(body)
