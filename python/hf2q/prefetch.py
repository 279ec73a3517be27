"""Shards read onto a GPU while the checkpoint is opened and planned.

Opening a checkpoint and planning its load is per-tensor work on the CPU
(an FP8 Qwen3.6 has 62,000 tensors: about 0.25 s), during which the copy
engine would sit idle. A load through :func:`hf2q.load` (or a family's
``load``) of a checkpoint whose config.json declares FP8 with scales, onto
an open GPU :class:`~hf2q.Device`, therefore starts reading the first
shards' data, raw, into device buffers of their own as soon as it knows
the files (before their headers are parsed), on the load's batch queue (a
native thread). Once planned, the loader decodes the
block-scaled FP8 expert stacks and matrices that lie in those shards
straight from that copy (:meth:`Device.scaled_fp8_gather`), while the rest
of the checkpoint follows through the staging ring as before; the copies
are freed when the load ends (docs/CUDA.md, "Prefetching shards").

The copy costs device memory for its lifetime: at most
:data:`PREFETCH_BYTES`, a quarter of the device's free memory, and only
while the plan's own buffers also fit (else it is dropped before the load
allocates anything: the load is then as it was without it; so too where
the plan decodes nothing on the device, e.g. FP8 kept as FP8). Only whole
shards are read, in file-name order (the order a Hub checkpoint's layers
are in). Nothing here is a source of truth about the checkpoint: every
shard used is matched to the opened, validated file by its identity
(device, inode, size, modification time) and its data offset, and its read
is checked for a rewrite like any other.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from . import formats
from ._files import FileIdentity, open_owned

if TYPE_CHECKING:
    from .device import Buffer, Device, _FileBatch
    from .plan import Piece
    from .safetensors import Checkpoint

#: The most device memory the shards read ahead may take (bytes), and the
#: share of the free device memory (1 / FREE_SHARE).
PREFETCH_BYTES = 16 << 30
FREE_SHARE = 4
#: Device memory left free beside the plan's buffers and the shards read ahead.
MARGIN_BYTES = 2 << 30
#: Tests: prefetch where the CPU addresses the memory too (the host backend).
_FORCE = False


@dataclass(eq=False)
class _Shard:
    path: Path
    file: Any  # the open shard (_files.OwnedFd): closed with the prefetch
    identity: FileIdentity
    data_offset: int
    nbytes: int
    buf: Buffer | None = None
    batch: _FileBatch | None = None
    landed: bool = False
    files: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class Located:
    """A scaled run found in a shard read ahead: its weights as (byte
    offset in the shard's copy, matrices) and its scale tensors, of
    ``scale_dtype``, as (byte offset, values), both in the run's order."""

    shard: _Shard
    weights: list[tuple[int, int]]
    scale_dtype: str
    scales: list[tuple[int, int]]


def _shard_paths(path: Path) -> list[Path] | None:
    """The safetensors files of the checkpoint at ``path`` as
    :func:`~hf2q.safetensors.open_checkpoint` finds them, or None where
    that is not plain (the opening says what is wrong)."""
    from . import _core
    from ._files import read_capped
    from .safetensors import INDEX_FILE_NAME, INDEX_MAX_BYTES, _bad_shard_name, checkpoint_entry

    entry = checkpoint_entry(path)
    if entry is None:
        return None
    is_index, file = entry
    if not is_index:
        return [file]
    try:  # (a regular file of at most the index's size, opened without blocking: never a FIFO's reader)
        raw = read_capped(str(file), INDEX_MAX_BYTES, INDEX_FILE_NAME, _NotPlain)
    except (_NotPlain, OSError):
        return None
    scanned = _core.scan_index(raw)
    if scanned is None:
        return None
    names = {shard for _, shard in scanned[1]}
    if not all(isinstance(n, str) and _bad_shard_name(n) is None for n in names):
        return None
    return [file.parent / n for n in sorted(names)]


class _NotPlain(Exception):
    """(a file the prefetch leaves to the opening, which words what is wrong)"""

    def __init__(self, reason: str, cause: OSError | None = None) -> None:
        super().__init__(reason)


def _memory(device: Device) -> int | None:
    mem = device._native.memory()
    return None if mem is None else int(mem[0])


class Prefetch:
    """The shards being read ahead for one load (:func:`start`); the loader
    takes it over (:func:`hf2q.loader.execute`), and :meth:`close` lets it go."""

    def __init__(self, device: Device, queue: Any, shards: list[_Shard], free: int | None) -> None:
        self.device = device
        self.queue = queue
        self.shards = shards
        self.free = free  # device memory free before the shards' buffers were made (None: unknown)
        self._by_file: dict[int, _Shard] = {}  # id(SafetensorsFile) -> its shard read ahead

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.shards if s.buf is not None)

    def match(self, ckpt: Checkpoint) -> None:
        """Each shard read ahead paired with the checkpoint's file that it
        is (same identity, same data offset); the others are not used."""
        for f in ckpt.shards:
            for s in self.shards:
                if s.buf is not None and s.identity == f.identity and s.data_offset == f.data_offset:
                    self._by_file[id(f)] = s
                    s.files.append(f)

    def fits(self, plan_bytes: int) -> bool:
        """Whether the plan's buffers fit beside the shards read ahead."""
        return self.free is None or plan_bytes + self.nbytes + MARGIN_BYTES <= self.free

    def locate(self, ckpt: Checkpoint, pieces: Sequence[Piece]) -> Located | None:
        """Where a scaled run's weights and their scale tensors lie in the
        shards read ahead (:class:`Located`); None where any of them is in
        another file (a run across two shards too), or the scales are not
        one format: the run then goes through the ring."""
        if not self._by_file:
            return None
        first = pieces[0].scale
        if first is None:
            return None
        file_for = ckpt.file_for
        f = file_for(pieces[0].tensor)
        shard = self._by_file.get(id(f))
        if shard is None:
            return None
        base, sdtype = shard.data_offset, first.dtype
        weights: list[tuple[int, int]] = []
        scales: list[tuple[int, int]] = []
        for p in pieces:  # (an expert stack: hundreds; kept to a few lookups each)
            sc = p.scale
            if sc is None or sc.dtype != sdtype or file_for(p.tensor) is not f or file_for(sc.tensor) is not f:
                return None
            weights.append((ckpt[p.tensor].offset - base, prod(p.shape[:-2])))
            scales.append((ckpt[sc.tensor].offset - base, prod(sc.shape)))
        return Located(shard, weights, formats.get(first.dtype).name, scales)

    def source(self, shard: _Shard) -> Buffer:
        """The shard's copy, once its read ended (raised here if it failed:
        a typed error naming the file)."""
        if not shard.landed:
            batch, shard.batch = shard.batch, None
            if batch is None:
                raise RuntimeError("a prefetched shard was let go")
            self.device._finish_file_batch(batch)
            shard.landed = True
        assert shard.buf is not None
        return shard.buf

    def release(self) -> None:
        """Every shard's copy let go (the reads not started are cancelled,
        those in flight waited for): the load goes on without them."""
        if any(s.batch is not None for s in self.shards):
            try:
                self.queue.cancel()
            except Exception:
                pass
        for s in self.shards:
            batch, s.batch = s.batch, None
            if batch is not None:
                try:
                    batch.close()  # waits for a queued read
                except Exception:
                    pass
            s.buf = None
        self._by_file.clear()

    def close(self) -> None:
        """:meth:`release`, the queue joined and the files closed; idempotent."""
        try:
            self.release()
        finally:
            try:
                self.queue.close()
            finally:
                for s in self.shards:
                    s.file.close()


def serves(device: Any) -> bool:
    """Whether a load onto ``device`` may read shards ahead: an open
    :class:`~hf2q.Device` whose memory the CPU does not address (a GPU)."""
    from .device import Device

    return isinstance(device, Device) and (not device._native.cpu_visible or _FORCE)


def start(device: Any, path: Path) -> Prefetch | None:
    """The first shards of the checkpoint at ``path`` being read onto
    ``device`` (an open GPU :class:`~hf2q.Device`; None for anything else,
    or where there is no room, or the files are not plain: the load then
    reads everything through the ring)."""
    if not serves(device):
        return None
    paths = _shard_paths(path)
    if not paths:
        return None
    free = _memory(device)
    budget = PREFETCH_BYTES if free is None else min(PREFETCH_BYTES, free // FREE_SHARE)
    shards: list[_Shard] = []
    total = 0
    try:
        for p in paths:
            try:  # (a regular file, opened without blocking: a FIFO is left to the opening's error)
                f = open_owned(str(p), _NotPlain)
            except (_NotPlain, OSError):
                break
            try:
                st = os.fstat(f.fileno())
                head = os.pread(f.fileno(), 8, 0)
            except OSError:
                f.close()
                break
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            start_at = 8 + n
            if n < 0 or start_at >= st.st_size or total + st.st_size - start_at > budget:
                f.close()
                break
            shards.append(_Shard(p, f, FileIdentity.of(st), start_at, st.st_size - start_at))
            total += st.st_size - start_at
        if not shards:
            return None
        pf = Prefetch(device, device._batch_queue(), shards, free)
    except BaseException:
        for s in shards:
            s.file.close()
        raise
    try:
        bufs = device.alloc_many([((s.nbytes,), "f8_e4m3") for s in shards])
        for s, b in zip(shards, bufs):
            s.buf = b
            # One raw job per shard: the file's data, byte for byte.
            batch = device._prepare_file_batch([(b, s.file.fileno(), [(0, s.data_offset, s.nbytes)], "f8_e4m3",
                                                 str(s.path))])
            s.batch = device._start_file_batch(batch, pf.queue)
    except Exception:
        pf.close()  # no room, a bad file: the load reads everything through the ring
        return None
    except BaseException:
        pf.close()
        raise
    return pf
