"""One loader for every family: executes a :class:`~hf2q.plan.LoadPlan` on
any device, with one progress bar, one commit per group, one cleanup path and
one load summary.

Streamed entries go from the file straight into their device buffer (native
``pread`` + decode / quantize, expert slices and fused halves at their element
offsets); ``elementwise`` entries pass through a bounded staging buffer a
chunk of whole rows at a time; scaled FP8 sources (a weight and its scale)
are read a tensor (an expert) at a time and decoded natively into the
destination format; ``transform`` entries are read whole,
transformed in numpy and uploaded. On any failure, KeyboardInterrupt
included, every buffer allocated so far is freed before the error leaves."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from math import prod
from typing import TYPE_CHECKING, Any, TypeVar, Union

if TYPE_CHECKING:
    from .prefetch import Located, Prefetch
    import numpy as np
else:  # numpy on first use (hf2q._lazy)
    from ._lazy import numpy as np

from . import formats
from ._gc import pausing
from ._progress import progress_bar, progress_enabled
from .device import Buffer, Device
from .device import _detached as detached
from .errors import FileReadError, NonFiniteError, SafetensorsError
from .plan import LoadPlan, Piece, Scale, TensorPlan
from .safetensors import Checkpoint

__all__ = ["execute", "LoadSummary", "STAGING_BYTES", "BATCH_BYTES", "GPU_BATCH_BYTES", "GPU_FIRST_BATCH_BYTES",
           "BATCH_ENTRIES", "GPU_BATCH_ENTRIES"]

#: Bytes of source data an ``elementwise`` entry stages at a time (at most).
STAGING_BYTES = 16 << 20

#: A batch of streamed entries ends once it holds this many source bytes (a
#: bound on the work between two progress updates or interrupt checks) ...
BATCH_BYTES = 1 << 30
#: ... on a device whose memory the CPU cannot address (a GPU), this many:
#: each batch ends with the staging pipeline drained and the GPU idle while
#: the next one is planned and allocated, so fewer, larger batches keep the
#: copy engine busy (4 GiB is about 75 ms of PCIe gen 5 x16).
GPU_BATCH_BYTES = 4 << 30
#: ... after a ramp: where a batch runs while the next is prepared (a GPU),
#: the first holds this many bytes and each next one twice the last, so that
#: the copy engine starts after a few milliseconds of planning instead of a
#: whole batch's (0.15 s for 4 GiB of per-expert FP8: 10,000 tensors' file
#: jobs and allocations, and the small entries filled on the way).
GPU_FIRST_BATCH_BYTES = 256 << 20
#: ... or this many entries ...
BATCH_ENTRIES = 256
#: ... on a GPU, this many: each batch drains the staging pipeline, and a
#: checkpoint of a buffer per tensor (the generic family keeping a per-expert
#: FP8 Qwen3.6's 62,303 tensors) made 244 batches of 256: 1.50-1.88 s of
#: execution against 1.23-1.58 s with 16,384 (H100 leases, docs/CUDA.md).
#: The byte bounds end a batch first; converting jobs still go to the device
#: in pipelines of at most 120 (cuda_backend.cpp, kQuantizeJobsPerRun).
GPU_BATCH_ENTRIES = 16384
#: ... or once its scaled FP8 entries' scale grids (float32 copies in device
#: memory beside the model's, freed with the batch; the weights are decoded
#: as they are read, :func:`_fill_batch`) take this many bytes.
SCALED_BATCH_BYTES = 1 << 30
#: The batch bound while a progress bar is drawn (a terminal): the bar moves
#: at least every this many bytes. On the host the jobs of a batch run one
#: after another anyway; on a GPU a batch of this size keeps the staging
#: ring (128 MiB) busy.
BAR_BATCH_BYTES = 128 << 20

M = TypeVar("M")
#: A file job of :meth:`Device.write_from_file_batch`: (buffer, fd, segments, source format, name), and for
#: scaled FP8 weights their scales (:func:`_scaled_jobs`) ...
Job = tuple[Any, ...]
#: ... and its segments' owners, for naming a failed read (a weight's piece, or a scale).
Owner = list[tuple[tuple[int, int, int], Any]]
#: What names a checkpoint tensor (``.tensor``): a plan's piece, or an FP8 weight's scale.
Named = Union[Piece, Scale]


def file_read_error(e: FileReadError, path: Any, tensor: str) -> SafetensorsError:
    """The native read error as a SafetensorsError naming file and tensor; its
    code (``FileTruncated`` / ``Io``) is the one the native reader set."""
    reason = getattr(e, "reason", str(e))
    code = getattr(e, "code", "Io")
    err = SafetensorsError(f"{path}: tensor '{tensor}': {reason}", code=code, path=path, tensor=tensor)
    if getattr(e, "system_failure", False):  # an I/O error of the machine (EIO): exit 1, not bad input
        err.system_failure = True
        err.system_errno = getattr(e, "system_errno", None)
    return err


@dataclass
class LoadSummary:
    """What a load did, for the CLI and benchmarks."""

    model: str
    device: str
    tensors: int
    resident_bytes: int
    data_bytes: int
    seconds: float
    residency: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    #: What ``seconds`` was spent on, from ``getrusage`` over the load (all
    #: of the process's threads; None where unavailable): CPU time (user +
    #: kernel), the kernel's part of it, and page faults. The kernel's part
    #: is the file's pages copied in and every page of fresh memory zeroed
    #: (on some machines compacted) on first touch: most of a first load in a
    #: fresh process. Wall time beyond the CPU time was spent waiting: for
    #: the disk (a cold page cache) or for cores other processes held.
    cpu_seconds: float | None = None
    system_seconds: float | None = None
    page_faults: int | None = None
    #: Seconds until the last byte was written, without building the
    #: model (``seconds`` includes it; in the hand-off that is transformers'
    #: assembly, which on a GPU runs during the last batch). Benchmarks'.
    landed_seconds: float | None = None

    @property
    def gb_per_s(self) -> float:
        return self.data_bytes / self.seconds / 1e9 if self.seconds > 0 else float("inf")

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "device": self.device,
            "tensors": self.tensors,
            "resident_bytes": self.resident_bytes,
            "data_bytes": self.data_bytes,
            "seconds": round(self.seconds, 3),
            "gb_per_s": round(self.gb_per_s, 2),
            **({} if self.cpu_seconds is None else {"cpu_seconds": round(self.cpu_seconds, 3),
                                                    "system_seconds": round(self.system_seconds or 0.0, 3),
                                                    "page_faults": self.page_faults}),
            "residency": self.residency,
            **self.extra,
        }


def process_usage() -> tuple[float, float, int] | None:
    """(CPU seconds, of them in the kernel, page faults) of this process so
    far, all threads (the native readers' included); None without
    ``resource`` (not POSIX)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Linux and macOS have it
        return None
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime, ru.ru_stime, ru.ru_minflt + ru.ru_majflt


def residency_state(device: Device, buffers: Iterable[Buffer]) -> dict[str, Any]:
    """Residency of one model's ``buffers`` (not of everything else on the
    device): how many are in a residency set, their page-rounded bytes, how
    many of those bytes are locked, and bytes left out over the wired budget."""
    enabled = bool(device.residency_enabled)
    count = allocated = locked = unwired = 0
    for b in buffers:
        if b.registered:
            count += 1
            allocated += b.alloc_len
            if b.locked:
                locked += b.alloc_len
        elif enabled:
            unwired += b.alloc_len
    return {
        "enabled": enabled,
        "buffers": count,
        "allocated_bytes": allocated,
        "locked_bytes": locked,
        "unwired_bytes": unwired,
    }


@pausing  # file jobs per piece, no cycles: no collection while they are made (hf2q._gc)
def execute(plan: LoadPlan, ckpt: Checkpoint, device: Device, make_model: Callable[[dict[str, Buffer]], M], *,
            progress: bool = False, extra: dict[str, Any] | None = None, check_finite: bool = False,
            alloc: Callable[[list[TensorPlan]], list[Buffer]] | None = None, make_early: bool = False,
            prefetch: Prefetch | None = None) -> M:
    """Run ``plan`` against the open checkpoint ``ckpt`` on ``device``;
    ``make_model(buffers)`` builds the family's container (and runs its
    layout check) before the summary is attached as ``model.summary``.

    Streamed entries go to the device in batches (one allocation call, one
    pipeline of reads and copies: on a GPU the staging ring and the copy
    engine stay busy from one tensor to the next) of up to
    :data:`BATCH_BYTES` (on a GPU :data:`GPU_BATCH_BYTES`) of source data or
    :data:`BATCH_ENTRIES` (:data:`GPU_BATCH_ENTRIES`) entries;
    the other entries (transforms and staged conversions, small tensors) are
    done as they come, while the batch around them keeps collecting. The
    residency set is committed once a group's (layer's) data is written:
    after each batch, and at a change of group with no batch pending.

    Every file's identity (device, inode, size, mtime) is checked before and
    after each entry's (or batch's) reads: a checkpoint rewritten in place
    since it was validated is a ``SafetensorsError`` (``FileChanged``) naming
    the file. ``check_finite``: NaN/Inf in entries copied or decoded as they
    are raise :class:`~hf2q.NonFiniteError` (found during the read;
    quantization always refuses them), and so do values the load makes
    non-finite: a transform's, a narrowing conversion's, a block format's
    float16 scale that overflows (docs/RELIABILITY.md). Off by default: the
    bytes are the file's (and ggml's, for an overflowing block scale).

    ``alloc(entries)``: the zero-filled buffers for those entries (their
    shapes and dtypes), in place of the device's own allocations (``hf2q
    convert`` places them in its output window).

    ``make_early``: on a GPU, ``make_model`` runs while the last batch is
    still being written (the hand-off assembles transformers' model
    meanwhile); it must not read the buffers' contents, nor export them in a
    way that waits for the device. A tail of fewer bytes than a batch then
    joins the last batch (within the entry and FP8 transient bounds). The
    load returns once every byte is written, as always; a failure of the
    last batch is raised and the model made early dropped.

    ``prefetch``: the first shards being read onto the device since before
    the checkpoint was opened (:func:`hf2q.prefetch.start`; taken over and
    closed here): block-scaled FP8 runs that lie in them are decoded from
    that copy (:func:`_decode_prefetched`), the rest read as above. It is
    let go first where the plan's buffers would not fit beside it, or with
    ``alloc``."""
    t0 = time.perf_counter()
    pf = prefetch
    if pf is not None and (alloc is not None or not pf.fits(plan.nbytes + SCALED_BATCH_BYTES)
                           or not any(_decodes_scaled(e) for e in plan)):
        pf.release()
    _check_representable(plan, ckpt)
    usage0 = process_usage()
    bufs: dict[str, Buffer] = {}
    # The plan's byte total only where a bar was asked for or an early
    # model needs it before the loop: it sizes every piece first (an FP8
    # Qwen3.6 has 62,000), which delayed a GPU load's first read by 40 ms.
    bar = progress_bar(plan.source_nbytes if progress else 0, "hf2q load", progress)
    group: object = object()
    pending: list[TensorPlan] = []  # streamed entries not yet read
    pending_runs: list[list[Piece]] = []  # each one's scaled run (_scaled_run_on_device), [] if none
    pending_sizes: list[int] = []
    pending_bytes = 0
    transient_bytes = 0  # scaled FP8 entries' scale grids (device transients) in the pending batch
    batch_bytes = BATCH_BYTES if device._native.cpu_visible else GPU_BATCH_BYTES
    batch_entries = BATCH_ENTRIES if device._native.cpu_visible else GPU_BATCH_ENTRIES
    if progress_enabled(progress):
        # A batch updates the bar once, when it is done: while a bar is drawn,
        # batches end every BAR_BATCH_BYTES so that it moves (one batch held the
        # whole full-size drafter: the bar was updated only when the read ended).
        batch_bytes = min(batch_bytes, BAR_BATCH_BYTES)

    # On a GPU a batch's reads and copies run in the load's batch queue (a
    # native thread) while this one prepares the next (allocations and file
    # jobs: Python work that grows with the tensor count) and queues it
    # behind the one in flight before joining that one; the scaled FP8
    # scale grids of the two together stay within SCALED_BATCH_BYTES. Not
    # where the CPU addresses the memory: there the next batch's allocation
    # populates its pages on the thread pool that the running batch's reads
    # are using.
    overlap = not device._native.cpu_visible if _OVERLAP is None else _OVERLAP
    scaled_batch_bytes = SCALED_BATCH_BYTES // 2 if overlap else SCALED_BATCH_BYTES
    inflight: list[_InFlight] = []  # batches submitted to the queue and not joined, oldest first (two at most)
    # This batch's byte bound: a GPU's first batches are small, so that its
    # copy engine starts early, unless shards were read ahead (the queue
    # reads them first: full batches are ready by the time it is done).
    bound = min(batch_bytes, GPU_FIRST_BATCH_BYTES) if overlap and not (pf and pf.nbytes) else batch_bytes

    # Scaled runs whose weights lie in a prefetched shard, decoded from its
    # copy once it landed: before a batch is joined (the queue reads the
    # shards first: the decodes then run while that batch is read) and
    # before the load ends.
    deferred: list[tuple[TensorPlan, list[Piece], Located]] = []
    deferred_sizes: list[int] = []

    def decode_deferred() -> None:
        if deferred:
            bufs.update(_decode_prefetched(device, ckpt, pf, deferred, check_finite))  # type: ignore[arg-type]
            for n in deferred_sizes:
                bar.update(n)
            deferred.clear()
            deferred_sizes.clear()
            device.residency.commit()

    def land() -> None:
        """The oldest batch in flight written: its buffers kept, the bar moved, the layer committed."""
        decode_deferred()
        if inflight:
            done = inflight.pop(0)
            bufs.update(done.join())
            for n in done.sizes:
                bar.update(n)
            device.residency.commit()

    def flush() -> None:
        nonlocal pending_bytes, transient_bytes, bound
        if pending:
            bound = min(batch_bytes, 2 * bound)
        if pending and overlap:
            batch = _prepare_batch(device, ckpt, pending, alloc, pending_runs, check_finite)
            # Queued behind the batch in flight before that one is joined:
            # the queue starts it as soon as the other's reads end.
            inflight.append(_InFlight(device, ckpt, batch, check_finite, list(pending_sizes), queue))
            batch = None  # type: ignore[assignment]  (the queue holds it)
            while len(inflight) > 1:
                land()
        else:
            land()
            if pending:
                bufs.update(_fill_batch(device, ckpt, pending, check_finite, alloc, pending_runs))
            for n in pending_sizes:
                bar.update(n)  # one update per tensor, batched or not
            device.residency.commit()
        pending.clear()
        pending_runs.clear()
        pending_sizes.clear()
        pending_bytes = transient_bytes = 0

    early = make_early and overlap
    rest = plan.source_nbytes if early else 0  # source bytes of the entries not yet seen
    # On a GPU the batches are read by a queue of the load's own (a native
    # thread), one after another with no Python between them.
    queue = (pf.queue if pf is not None else device._batch_queue()) if overlap else None
    # There too, the entries filled on this thread (transforms, staged
    # conversions: 131 small ones in an FP8 Qwen3.6) get their buffers in one
    # allocation first: one at a time each cost this thread about 0.8 ms (an
    # allocation, its zero fill and a wait), time the next batch's
    # preparation needs while the queue reads (docs/CUDA.md).
    made_ahead: dict[str, Buffer] = {}

    def take_ahead(entries: list[TensorPlan]) -> list[Buffer]:
        """The buffer made ahead for the one entry _fill asks for (the
        loop's transposed_in_numpy keeps its name, shape and format)."""
        (entry,) = entries
        return [made_ahead.pop(entry.name)]

    try:
        if overlap and alloc is None:
            ahead = [e for e in plan
                     if not e.streamed and (e.transform is not None or all(p.scale is None for p in e.sources))]
            if ahead:
                made_ahead.update(zip([e.name for e in ahead], device.alloc_many([(e.shape, e.dtype) for e in ahead])))
        for entry in plan:
            if (entry.unit_transpose is not None and not entry.unit_transpose.fits(entry.dtype)
                    and _transpose_source(entry) is None):
                entry = entry.transposed_in_numpy()  # units that are not whole blocks of the format
            if entry.group != group:
                if not pending:
                    device.residency.commit()  # the previous group is written
                group = entry.group
            size = entry.source_nbytes
            rest -= size
            run = _batched_run(device, entry)
            scaled = bool(run)
            where = pf.locate(ckpt, run) if scaled and pf is not None else None
            if where is not None:
                deferred.append((entry, run, where))
                deferred_sizes.append(size)
            elif entry.streamed or scaled:
                pending.append(entry)
                pending_runs.append(run)
                pending_sizes.append(size)
                pending_bytes += size
                if scaled:
                    transient_bytes += _scaled_grid_bytes(entry)
                # A model made early is made while the last batch is written:
                # that batch takes in a tail of fewer bytes than a batch, so
                # that it lasts about a batch's time (up to twice the byte
                # bound; the entry and FP8 transient bounds still hold).
                full = pending_bytes >= bound and not (early and rest < bound)
                if full or len(pending) >= batch_entries or transient_bytes >= scaled_batch_bytes:
                    flush()
            else:
                # Read, transformed or staged now (small tensors); the batch
                # pending around it keeps collecting.
                bufs[entry.name] = _fill(device, ckpt, entry, check_finite,
                                         take_ahead if entry.name in made_ahead else alloc)
                bar.update(size)
        if pending or not inflight:
            flush()  # else the batch in flight is the last: land() below
        decode_deferred()
        if make_early and inflight:
            inline_done = time.perf_counter()  # entries filled on this thread after the last batch left
            last = inflight[-1]
            every = {**bufs, **(last.buffers or {})}
            model = make_model({e.name: every[e.name] for e in plan})  # plan order
            del every
            land()
            landed = max(last.finished or time.perf_counter(), inline_done) - t0
        else:
            land()
            landed = time.perf_counter() - t0
            bufs = {e.name: bufs[e.name] for e in plan}  # plan order, whatever order they were read in
            model = make_model(bufs)
    except BaseException as e:
        # A model made early holds buffers, and the raise below puts this frame back in the traceback.
        model = every = None  # type: ignore[assignment]
        made_ahead.clear()
        deferred.clear()
        if queue is not None and (inflight or pf is not None):
            try:
                queue.cancel()  # the batches not started are not read
            except Exception:
                pass  # (the error being raised says enough)
        while inflight:  # their buffers are the device's until their reads end
            try:
                inflight.pop(0).wait()
            except KeyboardInterrupt:
                pass  # the error being raised says enough
        bufs.clear()
        bar.close()
        if isinstance(e, NonFiniteError):
            _name_file(e, plan, ckpt)
        raise detached(e)
    finally:
        if pf is not None:
            pf.close()  # the shards' copies let go (their reads waited for on a failure)
        if queue is not None:
            queue.close()  # nothing is queued by now: the thread joins at once
    bar.close()
    seconds = time.perf_counter() - t0
    usage1 = process_usage()
    model.summary = LoadSummary(  # type: ignore[attr-defined]
        model=plan.family, device=device.kind, tensors=len(bufs),
        resident_bytes=sum(b.byte_len for b in bufs.values()), data_bytes=plan.source_nbytes,
        seconds=seconds, residency=residency_state(device, bufs.values()), extra=dict(extra or {}),
        landed_seconds=landed,
    )
    if usage0 is not None and usage1 is not None:
        model.summary.cpu_seconds = usage1[0] - usage0[0]  # type: ignore[attr-defined]
        model.summary.system_seconds = usage1[1] - usage0[1]  # type: ignore[attr-defined]
        model.summary.page_faults = usage1[2] - usage0[2]  # type: ignore[attr-defined]
    return model


def _name_file(e: NonFiniteError, plan: LoadPlan, ckpt: Checkpoint) -> None:
    """A NonFiniteError of a load names the checkpoint file that holds the
    element's source (``e.path``, and the message starts with it, as the
    loader's other errors do)."""
    if e.path is not None or e.tensor is None:
        return
    src = e.tensor
    if src not in ckpt and e.tensor in plan:
        entry = plan[e.tensor]
        whole = [p for p in entry.sources if p.rows is None and p.select is None
                 and p.dest_offset <= e.index < p.dest_offset + p.numel]
        pieces = whole or list(entry.sources)
        src = pieces[0].tensor if pieces else src
    if src in ckpt:
        path = ckpt[src].path
        if path is not None:
            e.path = str(path)
            e.args = (f"{path}: {e.args[0]}", *e.args[1:]) if e.args else (str(path),)


def loadable_shape(shape: tuple[int, ...] | list[int]) -> bool:
    """Whether a buffer of logical ``shape`` can be loaded: numpy's rule (as
    ``read_array``), counted with the widest element (8 bytes), so that every
    view of the buffer exists. The loader refuses the others before anything
    is allocated; ``inspect`` lists them as unloadable."""
    from .safetensors import numpy_representable

    return numpy_representable(shape, 8)


def _check_representable(plan: LoadPlan, ckpt: Checkpoint) -> None:
    """A zero-element tensor loads as an empty buffer; one whose shape no
    buffer view can hold (``[0, 2^64-1]``: numpy's rule, as ``read_array``)
    is refused before anything is allocated, naming the tensor."""
    from .safetensors import NOT_REPRESENTABLE, REPRESENTABLE_RULE
    from .errors import SafetensorsError

    for entry in plan:
        if not loadable_shape(entry.shape):
            src = entry.sources[0].tensor if entry.sources else entry.name
            path = ckpt[src].path if src in ckpt else None
            raise SafetensorsError(f"{path}: tensor '{src}' of shape {list(entry.shape)} cannot be loaded: a buffer "
                                   f"holds {REPRESENTABLE_RULE}", code=NOT_REPRESENTABLE, path=path, tensor=src)


def _fill_batch(device: Device, ckpt: Checkpoint, entries: list[TensorPlan],
                check_finite: bool = False, alloc: Callable[[list[TensorPlan]], list[Buffer]] | None = None,
                runs: list[list[Piece]] | None = None) -> dict[str, Buffer]:
    """A run of batched entries: their buffers in one allocation call, their
    file bytes in one device call; all of them or none (on failure the
    buffers made so far are freed before the error leaves). Scaled FP8
    entries that the device decodes (:func:`_batched_run`) have their
    scale grids read into transient float32 buffers first, then their
    weights decoded as the same call reads them (on a GPU inside the staging
    pipeline, so the ring does not drain between expert stacks)."""
    return _run_batch(device, ckpt, _prepare_batch(device, ckpt, entries, alloc, runs, check_finite), check_finite)


class _Batch:
    """A batch made ready by :func:`_prepare_batch` (buffers allocated, file
    jobs built) for :func:`_run_batch`; ``drop()`` lets its buffers go."""

    __slots__ = ("entries", "pieces", "files", "made", "transients", "scaled", "jobs", "owner", "scaled_jobs",
                 "scaled_owner", "scale_jobs", "scale_owner", "scale_call", "write_call", "transposed")

    def drop(self) -> None:
        # The calls first: one still in a queue is waited for before its
        # buffers go (the queue itself holds them until then: this keeps
        # the device's state as the caller sees it). Whatever one call's
        # close raises, the other is closed too; a KeyboardInterrupt (or
        # else the first error) is raised once both are.
        raised: BaseException | None = None
        for k in ("scale_call", "write_call"):
            call = getattr(self, k, None)
            if call is not None:
                try:
                    call.close()
                except BaseException as e:
                    if raised is None or isinstance(e, KeyboardInterrupt):
                        raised = e
        for k in self.__slots__:
            setattr(self, k, None if k.endswith("_call") else {} if k == "files" else False if k == "transposed"
                    else [])
        if raised is not None:
            raise raised


def _prepare_batch(device: Device, ckpt: Checkpoint, entries: list[TensorPlan],
                   alloc: Callable[[list[TensorPlan]], list[Buffer]] | None = None,
                   runs: list[list[Piece]] | None = None, check_finite: bool = False) -> _Batch:
    """The Python half of :func:`_fill_batch`: the files checked, the buffers
    (and FP8 transients) allocated, every file job built and made ready for
    the device (:meth:`Device._prepare_file_batch`: on a GPU this runs while
    the batch before is read, and the thread that reads this one does no
    per-segment Python work). No byte is read. ``runs``: each entry's scaled
    run, where the caller has them."""
    if runs is None:
        runs = [_batched_run(device, e) for e in entries]
    pieces: list[Named] = [p for e in entries for p in e.sources]
    pieces += [q for run in runs for q in _scale_pieces(run)]
    batch = _Batch()
    batch.drop()
    batch.entries, batch.pieces = list(entries), pieces
    if alloc is not None:
        batch.made = alloc(entries)
    else:
        raw = [_filled_by_read(e) for e in entries] if device._native.cpu_visible else None
        batch.made = device.alloc_many([(e.shape, e.dtype) for e in entries], filled_by_read=raw)
    try:
        batch.scaled = [(e, b, run) for e, b, run in zip(entries, batch.made, runs) if run]
        if batch.scaled:
            batch.transients = device.alloc_many([_scale_grid_spec(run) for _, _, run in batch.scaled])
        for (entry, b, run), sbuf in zip(batch.scaled, batch.transients):
            (wj, wo), (sj, so) = _scaled_jobs(ckpt, entry, run, b, sbuf, files=batch.files)
            batch.scaled_jobs += wj
            batch.scaled_owner += wo
            batch.scale_jobs += sj
            batch.scale_owner += so
        for entry, b, run in zip(entries, batch.made, runs):
            if not run:
                j, o = _stream_jobs(ckpt, entry.name, entry.sources, b, files=batch.files)
                batch.jobs += j
                batch.owner += o
        _check_files(batch.files)  # the jobs' files (each met once while the jobs were made), before any read
        if batch.scale_jobs:
            batch.scale_call = device._prepare_file_batch(batch.scale_jobs)
        batch.write_call = device._prepare_file_batch(batch.jobs + batch.scaled_jobs, check_finite=check_finite)
    except BaseException as e:
        batch.drop()  # nothing may keep a buffer alive in the traceback
        raise detached(e)
    return batch


def _filled_by_read(entry: TensorPlan) -> bool:
    """Whether a batch's reads write every byte of ``entry``'s buffer as the
    file holds them (raw copies, ``pread`` straight into the buffer): the
    host then locks its pages as those reads fault them in instead of
    populating them first (:meth:`Device.alloc_many`); a conversion's
    stores from user code would take a page fault each."""
    if not entry.streamed or entry.unit_transpose is not None:
        return False
    want = formats.get(entry.dtype).name
    return all(p.select is None and formats.get(p.dtype).name == want for p in entry.sources)  # streamed: no scales


def _run_batch(device: Device, ckpt: Checkpoint, batch: _Batch, check_finite: bool = False) -> dict[str, Buffer]:
    """The device half of :func:`_fill_batch`: one pipeline of reads and
    copies, the FP8 decodes, the unit transposes, the checks. The batch's
    buffers are handed over: on failure they are freed before the error
    leaves; else returned by name (the transients freed)."""
    _start_batch(device, batch)
    return _finish_batch(device, ckpt, batch, check_finite)


def _start_batch(device: Device, batch: _Batch, queue: Any = None, check_finite: bool = False) -> None:
    """The batch's device calls begun (:meth:`Device._start_file_batch`):
    with ``queue``, submitted there, the scale grids' call first (they land
    before the weights that need them are read) and the weights' call not
    read if it failed. On failure the batch is dropped."""
    try:
        if batch.scale_call is not None:
            device._start_file_batch(batch.scale_call, queue)
        # The unit transposes ride with the weights' call (run by the queue
        # once it is read): on this thread they would wait for the next
        # batch's copies in flight (they wait for every upload), the time the
        # next batch's preparation needs. Not with check_finite: its errors
        # name buffer elements as read, before a transpose.
        ride = queue is not None and not check_finite
        transposes = _transpose_items(batch.entries, batch.made) if ride else []
        device._start_file_batch(batch.write_call, queue, after=batch.scale_call, transposes=transposes)
        batch.transposed = ride
    except BaseException as e:
        batch.drop()  # a call already queued is waited for first
        raise detached(e)


def _finish_batch(device: Device, ckpt: Checkpoint, batch: _Batch, check_finite: bool = False) -> dict[str, Buffer]:
    """:func:`_run_batch` after :func:`_start_batch`: the calls read (or
    waited for in their queue) and judged, the transposes, the checks."""
    b: Buffer | None = None
    try:
        pieces = batch.pieces
        if batch.scale_jobs:
            _write_jobs(device, ckpt, batch.scale_jobs, batch.scale_owner, pieces, False, batch.scale_call)
        # FP8 bytes are checked as products by the decode (always), not as they are read.
        results = _write_jobs(device, ckpt, batch.jobs + batch.scaled_jobs, batch.owner + batch.scaled_owner,
                              pieces, check_finite, batch.write_call)
        batch.transients = []
        _judge_scaled(batch.scaled, batch.scaled_jobs, results[len(batch.jobs):], check_finite)
        if not batch.transposed:  # (else done by the queue with the read)
            _transpose_batch(device, batch.entries, batch.made)
        _check_files(batch.files)
        if check_finite:
            for entry, b in zip(batch.entries, batch.made):
                _check_converted(b, entry)
        b = None
        out = {e.name: m for e, m in zip(batch.entries, batch.made)}
    except BaseException as e:
        b = None
        batch.drop()  # nothing may keep a buffer alive in the traceback (a queued call is waited for first)
        raise detached(e)
    batch.drop()
    return out


class _InFlight:
    """One batch whose reads and copies run in the load's batch queue (a
    native thread: :meth:`Device._batch_queue`) while the caller prepares
    the next: :meth:`join` waits for it and judges it on the calling thread.
    The queue reads batches back to back, so the next one, submitted before
    this one is joined, starts as soon as this one's reads end."""

    def __init__(self, device: Device, ckpt: Checkpoint, batch: _Batch, check_finite: bool, sizes: list[int],
                 queue: Any) -> None:
        self.sizes = sizes
        # the batch's buffers by name before their bytes land (execute's make_early)
        self.buffers: dict[str, Buffer] | None = {e.name: m for e, m in zip(batch.entries, batch.made)}
        self.finished: float | None = None  # when its bytes were written (perf_counter)
        self._args: tuple[Device, Checkpoint, _Batch, bool] | None = (device, ckpt, batch, check_finite)
        _start_batch(device, batch, queue, check_finite)

    def wait(self) -> None:
        """Until its reads ended, errors dropped, whatever arrives meanwhile
        (its buffers are the device's until then); the batch let go."""
        args, self._args = self._args, None
        self.buffers = None
        if args is not None:
            args[2].drop()

    def join(self) -> dict[str, Buffer]:
        args, self._args = self._args, None
        self.buffers = None
        if args is None:
            raise RuntimeError("a batch in flight is joined once")
        device, ckpt, batch, check_finite = args
        call = batch.write_call  # (dropped with the batch; its end time stays)
        try:
            return _finish_batch(device, ckpt, batch, check_finite)
        finally:
            self.finished = call.ended


def _file_groups(ckpt: Checkpoint, pieces: tuple[Piece, ...] | list[Piece], files: dict[Any, str] | None = None
                 ) -> dict[tuple[int, str], list[tuple[tuple[int, int, int], Piece]]]:
    """The segments of ``pieces`` by (file descriptor, source format): each
    group is one device call's worth (one conversion, one file). ``files``
    collects the open files met, as :func:`_files_of` does."""
    grouping = _Grouping(ckpt, files)
    for piece in pieces:
        group = grouping.group(piece.tensor, piece.dtype)
        if piece.rows is None and piece.select is None:  # a whole tensor: one segment (the common case)
            info = ckpt[piece.tensor]
            group.append(((piece.dest_offset, info.offset, info.nbytes), piece))
        else:
            group.extend((seg, piece) for seg in _segments(ckpt, piece))
    return grouping.groups


class _Grouping:
    """File segments grouped by (file descriptor, source format), the group
    of a tensor found with each file's descriptor and each format's device
    name asked once (an expert stack: hundreds of tensors, a few files);
    ``files`` (given) collects each open file met with its first tensor."""

    __slots__ = ("ckpt", "files", "groups", "fds", "names")

    def __init__(self, ckpt: Checkpoint, files: dict[Any, str] | None) -> None:
        self.ckpt, self.files = ckpt, files
        self.groups: dict[tuple[int, str], list[tuple[tuple[int, int, int], Any]]] = {}
        self.fds: dict[Any, int] = {}
        self.names: dict[str, str] = {}  # the table takes either spelling of a format

    def group(self, tensor: str, dtype: str) -> list[tuple[tuple[int, int, int], Any]]:
        f = self.ckpt.file_for(tensor)
        fd = self.fds.get(f)
        if fd is None:
            fd = self.fds[f] = f.fileno()
            if self.files is not None and f not in self.files:
                self.files[f] = tensor
        name = self.names.get(dtype)
        if name is None:
            name = self.names[dtype] = formats.get(dtype).name
        group = self.groups.get((fd, name))
        if group is None:
            group = self.groups[(fd, name)] = []
        return group


def _read_error(ckpt: Checkpoint, e: FileReadError,
                groups: list[tuple[int, list[tuple[tuple[int, int, int], Piece]]]]) -> Exception:
    """The failed read as a SafetensorsError naming the job that failed (the
    device says which where it knows), else the first piece its file no
    longer holds (truncated), else the first piece."""
    job = getattr(e, "job", -1)
    if isinstance(job, int) and 0 <= job < len(groups) and groups[job][1]:
        p = groups[job][1][0][1]
        return file_read_error(e, ckpt[p.tensor].path, p.tensor)
    sizes: dict[int, int] = {}
    for fd, segs in groups:
        size = sizes.setdefault(fd, os.fstat(fd).st_size)
        for (_, foff, n), p in segs:
            if foff + n > size:
                return file_read_error(e, ckpt[p.tensor].path, p.tensor)
    p = groups[0][1][0][1]
    return file_read_error(e, ckpt[p.tensor].path, p.tensor)


def _check_unchanged(ckpt: Checkpoint, pieces: Sequence[Named]) -> None:
    """Each source file still the one validated (rewritten in place?): one
    check per file, naming the first of the pieces it holds (an expert stack
    has hundreds of pieces in a handful of files)."""
    _check_files(_files_of(ckpt, pieces))


def _files_of(ckpt: Checkpoint, pieces: Sequence[Named]) -> dict[Any, str]:
    """The open files holding ``pieces``' tensors, each with the first of
    those tensors (a batch finds them once and checks them twice)."""
    files: dict[Any, str] = {}
    for p in pieces:
        f = ckpt.file_for(p.tensor)
        if f not in files:
            files[f] = p.tensor
    return files


def _check_files(files: dict[Any, str]) -> None:
    """:func:`_check_unchanged` for the files :func:`_files_of` found."""
    for f, tensor in files.items():
        f.check_unchanged(tensor)


def _check_finite_array(a: np.ndarray, name: str, step: str = "file", shape: tuple[int, ...] | None = None,
                        offset: int = 0, sources: tuple[Piece, ...] = ()) -> None:
    """NonFiniteError for the first NaN/Inf of ``a`` (``offset``: where ``a``
    starts in the tensor of logical ``shape``); ``step`` says what made it."""
    flat = a.reshape(-1)
    fmt = formats.from_numpy(flat.dtype)  # bfloat16's numpy kind is 'V': ask the table
    if flat.dtype.kind not in "fc" and (fmt is None or fmt.name not in ("bf16", "f16", "f32")):
        return
    vals = flat if flat.dtype.kind in "fc" else flat.astype(np.float32)  # (f64 as it is: 1e300 is finite)
    bad = np.flatnonzero(~np.isfinite(vals))
    if bad.size:
        from ._arrays import value_class

        i = int(bad[0])
        cls = value_class(float(flat[i]))
        shape = tuple(a.shape) if shape is None else shape
        i += offset
        multi = tuple(int(j) for j in np.unravel_index(i, shape)) if len(shape) > 1 else None
        of = f" of {', '.join(repr(p.tensor) for p in sources)}" if sources else ""
        if step == "file":
            made = ""
        elif step.startswith("conversion "):  # finite input that does not fit the narrower type
            made = f" (made by the {step}{of}: the file's value is finite but does not fit {step.rsplit('->', 1)[-1]})"
        else:
            made = f" (made by the {step}{of}; the file's values are finite)"
        raise NonFiniteError(f"non-finite weight in '{name}' at flat index {i}: {cls}{made}", index=i,
                             multi_index=multi, value_class=cls, tensor=name, step=step)


#: Conversions that can overflow: the destination's largest finite value is
#: smaller than the source's (f16: 65504; bf16: ~3.39e38, just under f32's
#: ~3.40e38). The others (widening, f16 -> bf16) and q8_0 (its own rule:
#: ScaleOverflowWarning) cannot make a finite value infinite.
NARROWING = frozenset({("f32", "bf16"), ("f32", "f16"), ("bf16", "f16"), ("f64", "f32"), ("f64", "bf16"),
                       ("f64", "f16")})


def _check_converted(buf: Buffer, entry: TensorPlan) -> None:
    """``check_finite`` after a narrowing conversion: the source was checked
    finite as it was read, so a NaN/Inf in ``buf`` now is the conversion's
    (read back once, only for these entries, only when asked)."""
    narrowed = sorted({p.dtype for p in entry.sources if (p.dtype, entry.dtype) in NARROWING})
    if narrowed:
        _check_finite_array(buf.to_host().reshape(-1), entry.name, f"conversion {'/'.join(narrowed)}->{entry.dtype}",
                            shape=tuple(entry.shape), sources=entry.sources)


def _fill(device: Device, ckpt: Checkpoint, entry: TensorPlan, check_finite: bool = False,
          alloc: Callable[[list[TensorPlan]], list[Buffer]] | None = None) -> Buffer:
    _check_unchanged(ckpt, entry.sources)
    if entry.transform is not None:
        # A transform that takes BF16 as raw bits gets them so (no ml_dtypes
        # import, about 0.6 s of CPU), unless the values are to be checked.
        raw = not check_finite and getattr(entry.transform, "raw_bf16", False)
        arrays = [_read_array(ckpt, p, raw_bf16=raw) for p in entry.sources]
        bits = raw and any(a.dtype == np.uint16 and p.dtype.upper() == "BF16" for p, a in zip(entry.sources, arrays))
        if check_finite:
            for p, a in zip(entry.sources, arrays):
                _check_finite_array(a, p.tensor)
        with np.errstate(all="ignore"):  # overflow is reported by check_finite, not as a numpy warning
            y = entry.transform(arrays)
        if check_finite:
            _check_finite_array(y, entry.name, "transform", shape=tuple(entry.shape), sources=entry.sources)
        if bits and y.dtype == np.uint16:  # BF16 bits, as the transform kept them
            y = _bf16_bits(y, entry.dtype)
        buf = upload_array(device, y, entry.dtype, entry.shape, entry.name, check_finite, entry,
                           into=None if alloc is None else alloc([entry])[0])
        if check_finite:
            src = formats.from_numpy(y.dtype)
            if src is not None and (src, entry.dtype) in NARROWING:
                try:
                    _check_finite_array(buf.to_host().reshape(-1), entry.name, f"conversion {src}->{entry.dtype}",
                                        shape=tuple(entry.shape), sources=entry.sources)
                except BaseException as e:
                    del buf
                    raise detached(e)
        return buf
    buf = device.alloc(entry.shape, entry.dtype) if alloc is None else alloc([entry])[0]
    try:
        if entry.unit_transpose is not None and not entry.unit_transpose.fits(entry.dtype):
            _transpose_then_convert(device, ckpt, entry, buf, check_finite)
            _check_unchanged(ckpt, entry.sources)
            return buf
        streamed = []
        scaled_run = _scaled_run_on_device(device, entry)
        if scaled_run:
            _scaled_stack_on_device(device, ckpt, entry, scaled_run, buf, check_finite)
        for piece in () if scaled_run else entry.sources:
            if piece.scale is not None:
                _write_scaled(device, ckpt, entry, piece, buf, check_finite)
            elif entry.elementwise is not None or not formats.can_convert(piece.dtype, entry.dtype):
                _stage(device, ckpt, entry, piece, buf, check_finite)
            else:
                streamed.append(piece)
        if streamed:
            _stream(device, ckpt, entry, streamed, buf, check_finite)
        _transpose_units(device, entry, buf)
        _check_unchanged(ckpt, entry.sources)
        if check_finite:
            _check_converted(buf, entry)
    except BaseException as e:
        del buf
        raise detached(e)
    return buf


def _transpose_units(device: Device, entry: TensorPlan, buf: Buffer) -> None:
    """The entry's unit transpose (:class:`~hf2q.plan.UnitTranspose`), done
    in place once all of its sources are written (a GPU kernel on CUDA)."""
    _transpose_batch(device, [entry], [buf])


def _transpose_batch(device: Device, entries: list[TensorPlan], bufs: list[Buffer]) -> None:
    """The unit transposes of a batch's entries in one device call: on a
    GPU one wait for the batch's uploads and one scratch for all of them,
    instead of a wait, an allocation and a free each (those took 47 ms of an
    FP8 Qwen3.6 load's 0.9 s on an H100)."""
    items = [(b._native, *spec) for b, *spec in _transpose_items(entries, bufs)]
    if items:
        device._native.transpose_units_many(items)


def _transpose_items(entries: list[TensorPlan], bufs: list[Buffer]) -> list[tuple[Any, ...]]:
    """``(buffer, outer, period, start, a, b, unit)`` of each entry's unit transpose."""
    return [(b, t.outer, t.period, t.start, t.a, t.b, t.unit)
            for e, b in zip(entries, bufs) if (t := e.unit_transpose) is not None]


def _transpose_source(entry: TensorPlan) -> str | None:
    """The source format in which an entry whose unit transpose does not fit
    its own format (128-column units of a K-quant's 256-element super-blocks)
    is transposed on the device before it is converted: its pieces' one
    format, when they stream into a buffer of it unchanged, its units are
    whole elements of it, and the device converts it into the entry's
    format. None: the loader reorders it in numpy instead (scaled FP8
    sources, an elementwise step)."""
    t = entry.unit_transpose
    if t is None or entry.elementwise is not None or entry.transform is not None or not entry.sources:
        return None
    src = formats.get(entry.sources[0].dtype).name
    if any(p.scale is not None or formats.get(p.dtype).name != src for p in entry.sources):
        return None
    if not (formats.get(src).is_device and t.fits(src) and formats.can_convert(src, entry.dtype)):
        return None
    return src


def _transpose_then_convert(device: Device, ckpt: Checkpoint, entry: TensorPlan, buf: Buffer,
                            check_finite: bool) -> None:
    """The entry's bytes streamed unchanged into a transient buffer of their
    own format, transposed there, then converted into ``buf`` by the device
    (a GPU kernel on CUDA): no numpy pass over the tensor. The conversion
    quantizes, so a NaN/Inf is refused (named by its index in the entry)."""
    src = _transpose_source(entry)
    assert src is not None
    tmp = device.alloc(entry.shape, src)
    try:
        _stream(device, ckpt, entry, list(entry.sources), tmp, check_finite)
        _transpose_units(device, entry, tmp)
        device._convert_into(buf, tmp, name=entry.name, check_finite=check_finite)
    except BaseException as e:
        del tmp
        raise detached(e)


def _segments(ckpt: Checkpoint, piece: Piece) -> list[tuple[int, int, int]]:
    """``(element offset in the destination, file offset, bytes)`` of a piece:
    the whole tensor, or one row slice per leading index."""
    info = ckpt[piece.tensor]
    if piece.select is not None:  # a shard's slice: its ranges, already coalesced
        fmt = formats.get(piece.dtype)
        return [(int(d), info.offset + fmt.storage_bytes(int(s)), fmt.storage_bytes(int(n)))
                for d, s, n in piece.select.tolist()]
    if piece.rows is None:
        return [(piece.dest_offset, info.offset, info.nbytes)]
    fmt = formats.get(piece.dtype)
    start, stop = piece.rows
    lead, rows = piece.shape[0], piece.shape[1]
    row_elems = formats.numel(piece.shape[2:])
    per_lead = (stop - start) * row_elems
    return [(piece.dest_offset + i * per_lead, info.offset + fmt.storage_bytes((i * rows + start) * row_elems),
             fmt.storage_bytes(per_lead)) for i in range(lead)]


def _stream_jobs(ckpt: Checkpoint, name: str, pieces: list[Piece] | tuple[Piece, ...], buf: Buffer,
                 base: int = 0, files: dict[Any, str] | None = None) -> tuple[list[Job], list[Owner]]:
    """File jobs (:meth:`Device.write_from_file_batch`) putting ``pieces``'
    bytes into ``buf`` at their element offsets less ``base``: one job per
    file and source format (on a GPU one pipeline of staged copies for a
    whole expert stack, instead of a round trip per expert), each with its
    segments' owners."""
    jobs: list[Job] = []
    owners: list[Owner] = []
    for (fd, dtype), segs in _file_groups(ckpt, pieces, files).items():
        if base:
            segs = [((d - base, f, n), p) for (d, f, n), p in segs]
        jobs.append((buf, fd, [seg for seg, _ in segs], dtype, name))
        owners.append(segs)
    return jobs, owners


def _stream(device: Device, ckpt: Checkpoint, entry: TensorPlan, pieces: list[Piece], buf: Buffer,
            check_finite: bool = False) -> None:
    """File bytes of ``pieces`` straight into ``buf`` at their element
    offsets, in one device call."""
    jobs, owners = _stream_jobs(ckpt, entry.name, pieces, buf)
    _write_jobs(device, ckpt, jobs, owners, pieces, check_finite)


def _stage(device: Device, ckpt: Checkpoint, entry: TensorPlan, piece: Piece, buf: Buffer,
           check_finite: bool = False) -> None:
    """``piece`` through a bounded staging array, whole rows at a time:
    read, convert (``entry.elementwise``, else a cast to the destination's
    element type), write at the element offset."""
    if piece.rows is not None:
        raise ValueError(f"{entry.name}: a row-sliced source cannot be staged")
    info = ckpt[piece.tensor]
    fmt = formats.get(piece.dtype)
    src_dt = fmt.numpy_dtype
    if src_dt is None:
        raise TypeError(f"tensor '{piece.tensor}' has dtype {info.dtype}, which has no numpy equivalent")
    row = max(1, piece.shape[-1] if piece.shape else 1)
    numel = formats.numel(piece.shape)
    step = max(row, STAGING_BYTES // fmt.itemsize // row * row)
    convert = entry.elementwise or _caster(entry.dtype)
    file = ckpt.file_for(piece.tensor)
    # (destination offset, source offset, elements): the whole tensor, or a
    # shard's ranges (each a whole number of rows of the destination, so a
    # row-sized step keeps a quantized destination's blocks whole).
    ranges = [(piece.dest_offset, 0, numel)] if piece.select is None else piece.select.tolist()
    stage = np.empty(min(step, max((int(r[2]) for r in ranges), default=0)), dtype=src_dt)
    for d0, s0, total in ranges:
        for e0 in range(0, total, step):
            n = min(step, total - e0)
            chunk = stage[:n]
            file.read_slice_into(piece.tensor, (s0 + e0) * fmt.itemsize, chunk)
            if check_finite:
                _check_finite_array(chunk, piece.tensor)
            with np.errstate(all="ignore"):  # overflow: check_finite's to report (after the entry), not numpy's
                out = convert(chunk)
            _check_cast(chunk, out, entry, d0 + e0, (piece,), check_finite)
            _write_cast(device, buf, out, offset=d0 + e0, name=entry.name, check_finite=check_finite)


def _write_cast(device: Device, buf: Buffer, out: np.ndarray, **kw: Any) -> None:
    """``Device.write`` of a cast's result, made contiguous: BF16 bits
    (``_bits_type()``) as bf16."""
    if isinstance(out, _bits_type()):
        device.write(buf, np.ascontiguousarray(out.view(np.ndarray)), src_dtype="bf16", **kw)
    else:
        device.write(buf, np.ascontiguousarray(out), **kw)


def _caster(dtype: str) -> Callable[[np.ndarray], np.ndarray]:
    if formats.get(dtype).name == "bf16":
        # To BF16 without ml_dtypes (its import costs 0.5-1.3 s of a load
        # that hands out no numpy bfloat16): the rounded bits, as _Bits that
        # the writes pass on as bf16 (_write_cast). Same values as the cast.
        from ._arrays import f32_to_bf16_bits

        def cast_bits(x: np.ndarray) -> np.ndarray:
            if formats.can_convert(formats.from_numpy(x.dtype) or "u8", dtype):
                return x
            with np.errstate(over="ignore", invalid="ignore"):
                return f32_to_bf16_bits(x.astype(np.float32, copy=False)).view(_bits_type())

        return cast_bits
    # A block format (q8_0) has no element dtype: hand the device float32,
    # which it quantizes natively.
    target = formats.get(dtype).numpy_dtype or np.dtype(np.float32)

    def cast(x: np.ndarray) -> np.ndarray:
        if formats.can_convert(formats.from_numpy(x.dtype) or "u8", dtype):
            return x
        # Through float32 (exact from bf16/f16), then round to nearest even. Overflow gives +-inf
        # quietly: check_finite reports it with the tensor and element; no numpy warning on stderr.
        with np.errstate(over="ignore", invalid="ignore"):
            return x.astype(np.float32, copy=False).astype(target)

    return cast


def _check_cast(src: np.ndarray, out: np.ndarray, entry: TensorPlan, offset: int, sources: tuple[Piece, ...],
                check_finite: bool) -> None:
    """A numpy conversion on the way to ``entry.dtype`` that made a finite
    value non-finite (f64 ``1e300`` -> f32 ``inf`` before Q8_0) is the
    conversion's: reported so (``step`` ``"conversion SRC->DST"``), not as
    non-finite input. Checked with ``check_finite``, and always when the
    destination quantizes (its quantizer refuses the Inf anyway); a value
    already non-finite in ``src`` is left to the file's own check."""
    if out is src or not (check_finite or formats.get(entry.dtype).is_block):
        return
    bits = isinstance(out, _bits_type())
    o = out.reshape(-1)
    if bits:
        from .ops import bf16_to_f32

        o = bf16_to_f32(np.ascontiguousarray(o.view(np.ndarray)))
    elif o.dtype.kind not in "fc":
        o = o.astype(np.float32)  # bfloat16 / float16 (kind 'V' for bfloat16): exact
    bad = np.flatnonzero(~np.isfinite(o))
    if not bad.size:
        return
    i = int(bad[0])
    s = src.reshape(-1)
    if not np.isfinite(s[i] if s.dtype.kind in "fc" else np.float32(s[i])):
        return  # the file's own NaN/Inf: check_finite (or the quantizer) reports it as such
    a = formats.from_numpy(src.dtype)
    b = formats.get("bf16") if bits else formats.from_numpy(out.dtype)
    step = f"conversion {a.name if a else src.dtype}->{b.name if b else out.dtype}"
    _check_finite_array(o[i:i + 1], entry.name, step, shape=tuple(entry.shape), offset=offset + i, sources=sources)


def upload_array(device: Device, x: np.ndarray, dtype: str, shape: tuple[int, ...], name: str,
                 check_finite: bool = False, entry: TensorPlan | None = None, into: Buffer | None = None) -> Buffer:
    """A new ``dtype`` buffer of logical ``shape`` holding the logical array
    ``x``: native conversion when the device has one, else a numpy cast
    (``entry``: its overflow reported as :func:`_check_cast` says).
    ``check_finite``: an overflowing block scale raises (Device.upload).
    ``into``: that buffer (zero-filled, of ``shape`` and ``dtype``) instead of a new one."""
    src_dtype = None
    if isinstance(x, _bits_type()):  # BF16 bits (_bf16_bits): the device converts them
        x, src_dtype = x.view(np.ndarray), "bf16"
    else:
        src = formats.from_numpy(x.dtype)
        if src is None or not formats.can_convert(src, dtype):
            y = _caster(dtype)(x)
            if entry is not None:
                _check_cast(x, y, entry, 0, entry.sources, check_finite)
            x = y
            if isinstance(x, _bits_type()):
                x, src_dtype = x.view(np.ndarray), "bf16"
    if into is None:
        return device.upload(np.ascontiguousarray(x), to=dtype, shape=shape, name=name, src_dtype=src_dtype,
                             check_finite=check_finite)
    if x.size != formats.numel(shape) or tuple(into.shape) != tuple(shape) or into.dtype != dtype:
        raise ValueError(f"{name}: an array of {x.size} elements for a {dtype} buffer of shape {list(into.shape)}, "
                         f"planned {list(shape)}")
    device.write(into, np.ascontiguousarray(x).reshape(-1), src_dtype=src_dtype, name=name, check_finite=check_finite)
    return into


def _read_array(ckpt: Checkpoint, piece: Piece, *, raw_bf16: bool = False) -> np.ndarray:
    """The whole source tensor: a transform selects its own part (``rows``
    and ``dest_offset`` place streamed pieces only). A scaled FP8 source is
    its float32 values (weight times scale), as llama.cpp's converter hands
    them to its transforms. ``raw_bf16``: a BF16 tensor as its uint16 bits
    (the transforms that declare ``raw_bf16`` take them)."""
    if piece.scale is not None:
        return _scaled_array(ckpt, piece, "f32")[0]
    if raw_bf16:
        from .safetensors import numpy_representable

        info = ckpt[piece.tensor]
        if str(info.dtype).upper() == "BF16" and numpy_representable(info.shape, 2):
            arr = np.empty(info.shape, dtype=np.uint16)
            ckpt.file_for(piece.tensor).read_slice_into(piece.tensor, 0, arr)  # the whole tensor
            return arr
    return ckpt.read_array(piece.tensor)


@functools.cache
def _bits_type() -> type:
    """``_Bits``: a uint16 ndarray subclass that holds BF16 bits (upload_array
    uploads it as bf16). Made on first use, as numpy is imported (hf2q._lazy)."""

    class _Bits(np.ndarray):
        pass

    return _Bits


def _bf16_bits(y: np.ndarray, dtype: str) -> np.ndarray:
    """A transform's uint16 result holding BF16 bits: marked so where the
    device converts bf16 into ``dtype`` natively, else as ml_dtypes'
    bfloat16 (the numpy cast path)."""
    if formats.can_convert("bf16", dtype):
        return np.ascontiguousarray(y).view(_bits_type())
    from ._arrays import bf16

    return y.view(bf16())


def _scaled_array(ckpt: Checkpoint, piece: Piece, to: str, check_finite: bool = False,
                  out: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """A scaled FP8 piece's whole tensor decoded into ``to`` (f32 / bf16 /
    f16 / q8_0) in one native pass (hf2q.ops.dequantize_fp8); ``out``: where
    (a view of the destination buffer's memory on a CPU-visible device)."""
    from .ops import dequantize_fp8

    sc = piece.scale
    assert sc is not None
    if sc.scheme == "mxfp4":
        return _mxfp4_array(ckpt, piece, to, check_finite)
    w, wfmt, s, sfmt = _read_scaled(ckpt, piece)
    return dequantize_fp8(w, np.ascontiguousarray(s), sc.block, fmt=wfmt, to=to, name=piece.tensor,
                          check_finite=check_finite, out=out, scale_fmt=sfmt)


def _read_scaled(ckpt: Checkpoint, piece: Piece) -> tuple[np.ndarray, str, np.ndarray, str]:
    """A scaled FP8 piece's weight bytes and format, and its scale values'
    bits (unsigned integers of the scale's width) in the decoder's grid (a
    per-tensor scale of a stacked weight: one value for every matrix) and
    format. Raw reads: a BF16 scale or an FP8 weight as a typed array would
    import ml_dtypes (0.5-1.3 s) inside the load."""
    sc = piece.scale
    assert sc is not None
    w, s = ckpt.read_bits(piece.tensor), ckpt.read_bits(sc.tensor).reshape(-1)
    s = np.broadcast_to(s, (formats.numel(sc.grid),)).reshape(sc.grid) if s.size == 1 else s.reshape(sc.grid)
    ckpt.file_for(sc.tensor).check_unchanged(sc.tensor)
    return (w, formats.from_safetensors(ckpt[piece.tensor].dtype).name, s,
            formats.from_safetensors(ckpt[sc.tensor].dtype).name)


def _scale_as_f32(bits: np.ndarray, fmt: str) -> np.ndarray:
    """Scale values from their bits (:func:`_read_scaled`) as float32, exact."""
    if fmt == "f32":
        return np.ascontiguousarray(bits).view(np.float32)
    if fmt == "bf16":
        return (bits.astype(np.uint32) << 16).view(np.float32)
    return bits.view(np.float16).astype(np.float32)


def _mxfp4_array(ckpt: Checkpoint, piece: Piece, to: str, check_finite: bool = False) -> tuple[np.ndarray, int]:
    """gpt-oss MXFP4 codes and exponents repacked into ggml's MXFP4 blocks
    (``to="mxfp4"``), or decoded from them to float32 (docs/FP8.md)."""
    from .errors import NonFiniteError
    from .ops import dequantize, repack_mxfp4

    sc = piece.scale
    assert sc is not None
    blocks = ckpt.read_array(piece.tensor)
    exps = ckpt.read_bits(sc.tensor)  # (F8_E8M0 as a typed array would import ml_dtypes)
    ckpt.file_for(sc.tensor).check_unchanged(sc.tensor)
    packed = repack_mxfp4(blocks, exps)
    if to == "mxfp4":
        return packed, -1
    if to != "f32":
        raise ValueError(f"MXFP4 decodes to f32 here, not {to}")
    with np.errstate(over="ignore"):
        y = dequantize(packed, "mxfp4")
    bad = np.flatnonzero(~np.isfinite(y.reshape(-1)))
    first = int(bad[0]) if bad.size else -1
    if first >= 0 and check_finite:
        raise NonFiniteError(f"non-finite weight in '{piece.tensor}' at flat index {first}: an E8M0 exponent of 255 "
                             "overflows float32", index=first, tensor=piece.tensor, value_class="inf",
                             step="mxfp4 scale")
    return y, first


#: Tests: True / False forces the batch overlap of :func:`execute` (None: on
#: devices whose memory the CPU does not address).
_OVERLAP: bool | None = None

#: Tests: decode scaled FP8 with the device's own kernels (Device.scaled_fp8)
#: also where the CPU addresses the memory (a GPU always does).
_SCALED_ON_DEVICE = False


def _scaled_on_device(device: Device, ckpt: Checkpoint, entry: TensorPlan, piece: Piece, buf: Buffer,
                      check_finite: bool) -> None:
    """A scaled FP8 piece decoded by the device (CUDA kernels on a GPU): the
    weight's bytes and its scale grid (as float32, exact) are uploaded, then
    decoded into ``buf`` at the piece's offset (docs/FP8.md)."""
    assert piece.scale is not None
    w, wfmt, s, sfmt = _read_scaled(ckpt, piece)
    wbuf = device.upload(w, wfmt, src_dtype=wfmt)  # the FP8 bytes as they are
    sbuf = device.upload(_scale_as_f32(s.reshape(-1), sfmt))
    try:
        _decode_scaled(device, ckpt, entry, [piece], buf, wbuf, sbuf, check_finite)
    finally:
        del wbuf, sbuf


def _scaled_run_on_device(device: Device, entry: TensorPlan) -> list[Piece]:
    """The entry's pieces when the device decodes them all in one call: every
    piece a whole block-scaled FP8 matrix (or stack) of one format, shape and
    block, laid end to end in the destination in plan order (an expert stack
    from per-expert tensors), decoded straight into the entry's format on a
    device whose memory the CPU does not address (a GPU). Else []."""
    from .ops import FP8_OUTPUTS

    if not (_SCALED_ON_DEVICE or not device._native.cpu_visible):
        return []
    pieces = list(entry.sources)
    if not pieces or entry.transform is not None or entry.elementwise is not None or entry.dtype not in FP8_OUTPUTS:
        return []
    first = pieces[0]
    if first.scale is None or len(first.shape) < 2:
        return []
    offset = first.dest_offset
    for p in pieces:
        sc = p.scale
        if (sc is None or sc.scheme == "mxfp4" or p.rows is not None or p.select is not None
                or p.dtype != first.dtype or p.shape[-2:] != first.shape[-2:] or len(p.shape) < 2
                or sc.block != first.scale.block or p.dest_offset != offset):  # type: ignore[union-attr]
            return []
        offset += prod(p.shape)
    return pieces


def _scale_values(ckpt: Checkpoint, name: str, dtype: str) -> np.ndarray:
    """A scale tensor's values as flat float32 (exact from f32 / bf16 / f16),
    read with one ``pread``: an expert stack has a scale tensor per expert
    (30,720 in a full-size Qwen3.6 FP8 checkpoint) and the general reader
    costs ~0.1 ms each. The file's identity is checked by the caller; a short
    read, or another format, goes through the general reader and its errors."""
    info = ckpt[name]
    kind = formats.get(dtype).name
    if kind in ("f32", "bf16", "f16"):
        try:
            raw = os.pread(ckpt.file_for(name).fileno(), info.nbytes, info.offset)
        except OSError:
            raw = b""  # read again by the general reader below, which words a failure (typed, naming the file)
        if len(raw) == info.nbytes:
            if kind == "f32":
                return np.frombuffer(raw, dtype="<f4")
            from .ops import bf16_to_f32, f16_to_f32

            return (bf16_to_f32 if kind == "bf16" else f16_to_f32)(raw)
    return ckpt.read_array(name).reshape(-1).astype(np.float32)


def _scale_streamable(piece: Piece) -> bool:
    """The piece's scale file holds its whole grid (not one value broadcast
    over it) in a format the device widens to float32 exactly as numpy does
    (f32 raw; bf16 / f16 by its own widening kernels): its bytes can then go
    to the device through the file pipeline like any tensor's."""
    sc = piece.scale
    return (sc is not None and formats.numel(sc.shape) == formats.numel(sc.grid)
            and formats.get(sc.dtype).name in ("f32", "bf16", "f16"))


def _batched_run(device: Device, entry: TensorPlan) -> list[Piece]:
    """The entry's scaled run (:func:`_scaled_run_on_device`) where the
    device decodes it while the loader's batched file pipeline reads its
    weights, its scale grids read by the same pipeline first, so it joins a
    batch like a streamed entry (docs/FP8.md); else [] (a streamed entry, or
    one decoded some other way)."""
    if entry.streamed:
        return []
    run = _scaled_run_on_device(device, entry)
    return run if run and all(_scale_streamable(p) for p in run) else []


def _grid_cells(pieces: Iterable[Piece]) -> int:
    """Values in the scale grids of ``pieces`` (those with a scale)."""
    return sum(prod(p.scale.grid) for p in pieces if p.scale is not None)


def _scale_grid_spec(pieces: list[Piece]) -> tuple[tuple[int, ...], str]:
    """The transient buffer a device decode of ``pieces`` reads besides
    their weights: their scale grids as float32, end to end."""
    return ((max(_grid_cells(pieces), 1),), "f32")


def _scaled_grid_bytes(entry: TensorPlan) -> int:
    """Device bytes of a batched scaled entry's scale grids (:func:`_scale_grid_spec`)."""
    return 4 * _grid_cells(entry.sources)


def _scaled_jobs(ckpt: Checkpoint, entry: TensorPlan, pieces: list[Piece], buf: Buffer, sbuf: Buffer,
                 streamable: bool = True, files: dict[Any, str] | None = None
                 ) -> tuple[tuple[list[Job], list[Owner]], tuple[list[Job], list[Owner]]]:
    """File jobs (:meth:`Device.write_from_file_batch`) for a run of scaled
    pieces (:func:`_scaled_run_on_device`): the weights' segments as
    :func:`_stream` cuts them, read into ``buf`` and decoded there with the
    grids in ``sbuf`` (the stack starts at the first piece's offset); and
    (``streamable``) each scale's bytes at its grid's place in ``sbuf``,
    widened to float32 by the device, to be written first. With each job,
    the segments' owners (scales named as themselves). ``files`` collects the
    open files met (:func:`_file_groups`)."""
    first = pieces[0]
    rows, cols = first.shape[-2:]
    br, bc = first.scale.block  # type: ignore[union-attr]
    spec = (sbuf, rows, cols, br, bc, first.dest_offset)
    jobs, owners = _stream_jobs(ckpt, entry.name, pieces, buf, files=files)
    weights = ([(*job, spec) for job in jobs], owners)
    if not streamable:
        return weights, ([], [])
    grouping = _Grouping(ckpt, files)
    at = 0
    for p in pieces:
        sc = p.scale
        assert sc is not None
        info = ckpt[sc.tensor]
        grouping.group(sc.tensor, sc.dtype).append(((at, info.offset, info.nbytes), sc))
        at += prod(sc.grid)
    scale_jobs: list[Job] = []
    scale_owners: list[Owner] = []
    for (fd, name), segs in grouping.groups.items():
        scale_jobs.append((sbuf, fd, [seg for seg, _ in segs], name, entry.name))
        scale_owners.append(segs)
    return weights, (scale_jobs, scale_owners)


def _decodes_scaled(entry: TensorPlan) -> bool:
    """Whether ``entry`` may be a scaled FP8 run decoded on the device (its
    first source block-scaled, its format one the decoders write): a plan
    with none has no use for shards read ahead."""
    from .ops import FP8_OUTPUTS

    src = entry.sources[0] if entry.sources else None
    return (entry.dtype in FP8_OUTPUTS and src is not None and src.scale is not None
            and src.scale.scheme != "mxfp4")


def _decode_prefetched(device: Device, ckpt: Checkpoint, pf: Prefetch,
                       group: list[tuple[TensorPlan, list[Piece], Located]], check_finite: bool) -> dict[str, Buffer]:
    """Scaled runs that lie in one prefetched shard each, weights and scale
    tensors (:meth:`~hf2q.prefetch.Prefetch.locate`) decoded from its copy:
    their buffers and float32 grids allocated at once, then one gathered
    call per shard and weight format (:meth:`Device.scaled_fp8_gather`:
    the grids widened from the scale tensors there, the decodes), judged as
    a batch's scaled entries are; the unit transposes and checks after.
    All or none: on failure every buffer made here is freed before the
    error leaves."""
    entries = [e for e, _, _ in group]
    made = device.alloc_many([(e.shape, e.dtype) for e in entries])
    grids: list[Buffer] = []
    try:
        grids = device.alloc_many([_scale_grid_spec(run) for _, run, _ in group])
        calls: dict[tuple[int, str], list[int]] = {}
        for k, (_, run, at) in enumerate(group):
            calls.setdefault((id(at.shard), run[0].dtype), []).append(k)
        for ks in calls.values():
            shard = group[ks[0]][2].shard
            try:
                src = pf.source(shard)
            except FileReadError as e:
                # A file changed since validation explains it better (as a batch's failed read).
                _check_unchanged(ckpt, [p for k in ks for p in group[k][1]])
                raise file_read_error(e, str(shard.path), group[ks[0]][1][0].tensor) from None
            stacks = []
            for k in ks:
                _, run, at = group[k]
                first = run[0]
                stacks.append((made[k]._native, first.dest_offset, grids[k]._native, tuple(first.shape[-2:]),
                               first.scale.block, at.weights, at.scale_dtype, at.scales))  # type: ignore[union-attr]
            results = device._native.scaled_fp8_gather(src._native, formats.get(group[ks[0]][1][0].dtype).name,
                                                       stacks)
            for k, (bad, inf) in zip(ks, results):
                entry, run, _ = group[k]
                _scaled_outcome(entry, run, made[k], bad, inf, check_finite)
        grids = []
        _transpose_batch(device, entries, made)
        if check_finite:
            for entry, b in zip(entries, made):
                _check_converted(b, entry)
        return dict(zip([e.name for e in entries], made))
    except BaseException as e:
        made = grids = []  # nothing may keep a buffer alive in the traceback
        raise detached(e)


def _judge_scaled(scaled: list[tuple[TensorPlan, Buffer, list[Piece]]], jobs: list[Job],
                  results: list[tuple[int, int]], check_finite: bool) -> None:
    """The outcome of batched scaled decodes: each entry's jobs' results
    (first non-finite buffer element, overflowed Q8_0 scales) combined, then
    judged by :func:`_scaled_outcome`, entries in order."""
    by_buf: dict[int, tuple[int, int]] = {}
    for job, (bad, inf) in zip(jobs, results):
        k = id(job[0])
        was_bad, was_inf = by_buf.get(k, (-1, 0))
        by_buf[k] = (bad if was_bad < 0 or 0 <= bad < was_bad else was_bad, was_inf + inf)
    for entry, buf, run in scaled:
        bad, inf = by_buf.get(id(buf), (-1, 0))
        _scaled_outcome(entry, run, buf, bad - run[0].dest_offset if bad >= 0 else -1, inf, check_finite)


def _scale_pieces(pieces: list[Piece]) -> list[Named]:
    """The scale tensors of scaled pieces (their files' identity is checked
    with the weights'; a :class:`~hf2q.plan.Scale` names its tensor as a
    piece does)."""
    return [p.scale for p in pieces if p.scale is not None]


def _write_jobs(device: Device, ckpt: Checkpoint, jobs: list[Job], owners: list[Owner],
                pieces: Sequence[Named], check_finite: bool, prepared: Any = None) -> list[tuple[int, int]]:
    """One :meth:`Device.write_from_file_batch` call (``prepared``: those
    ``jobs`` made ready by :meth:`Device._prepare_file_batch`, with
    ``check_finite``, and begun by :meth:`Device._start_file_batch`), its errors named after
    the checkpoint: a file changed since validation first, a failed read by
    the job's tensor; non-finite input found in the bytes as read is the
    ``"file"`` step. Returns the jobs' results (scaled jobs' are the caller's
    to judge)."""
    try:
        if prepared is not None:  # begun by _start_batch
            return device._finish_file_batch(prepared)
        return device.write_from_file_batch(jobs, check_finite=check_finite)
    except NonFiniteError as e:
        _check_unchanged(ckpt, pieces)  # a file changed since validation explains it better
        if e.step is None:
            e.step = "file"  # found in the bytes as read, before any conversion
        raise
    except FileReadError as e:
        _check_unchanged(ckpt, pieces)
        raise _read_error(ckpt, e, [(job[1], segs) for job, segs in zip(jobs, owners)]) from None


def _scaled_stack_on_device(device: Device, ckpt: Checkpoint, entry: TensorPlan, pieces: list[Piece], buf: Buffer,
                            check_finite: bool) -> None:
    """Block-scaled FP8 pieces laid end to end (an expert stack) decoded by
    the device as their file bytes are read (on a GPU inside the staging
    ring, at the speed of a raw load): their scale grids go first to a
    transient float32 buffer, through the device's file pipeline (widened by
    the device) or, where a scale is one value for its whole grid, as the
    values read here; the weights then stream into ``buf`` as one stack of
    matrices (docs/FP8.md). A batch of such entries does the same in one
    pipeline (:func:`_fill_batch`)."""
    streamable = all(_scale_streamable(p) for p in pieces)
    sbuf = device.alloc_many([_scale_grid_spec(pieces)])[0]
    every = list(pieces) + _scale_pieces(pieces)
    try:
        (jobs, owners), (sjobs, sowners) = _scaled_jobs(ckpt, entry, pieces, buf, sbuf, streamable)
        if sjobs:
            _write_jobs(device, ckpt, sjobs, sowners, every, False)
        if not streamable:
            grids = []
            for p in pieces:
                sc = p.scale
                assert sc is not None
                s = _scale_values(ckpt, sc.tensor, sc.dtype)
                grids.append(np.broadcast_to(s, (formats.numel(sc.grid),)) if s.size == 1 else s)
            _check_unchanged(ckpt, _scale_pieces(pieces))
            device.write(sbuf, np.ascontiguousarray(np.concatenate(grids)))
        results = _write_jobs(device, ckpt, jobs, owners, every, False)
    finally:
        del sbuf
    _judge_scaled([(entry, buf, pieces)], jobs, results, check_finite)
    _check_unchanged(ckpt, every)


def _decode_scaled(device: Device, ckpt: Checkpoint, entry: TensorPlan, pieces: list[Piece], buf: Buffer,
                   wbuf: Buffer, sbuf: Buffer, check_finite: bool) -> None:
    """The device's decode of scaled pieces uploaded whole (``wbuf``: their
    FP8 bytes end to end, ``sbuf``: their scale grids as float32) into
    ``buf``, judged by :func:`_scaled_outcome` (:func:`_scaled_on_device`:
    one piece from host memory)."""
    first = pieces[0]
    rows, cols = (1, first.shape[0]) if len(first.shape) == 1 else first.shape[-2:]  # a vector: one row
    lead = sum(formats.numel(p.shape[:-2]) for p in pieces)
    firstbad, inf_scales = device._native.scaled_fp8(buf._native, first.dest_offset, wbuf._native, sbuf._native,
                                                     (lead, rows, cols), first.scale.block)  # type: ignore[union-attr]
    _scaled_outcome(entry, pieces, buf, firstbad, inf_scales, check_finite)


def _scaled_outcome(entry: TensorPlan, pieces: list[Piece], buf: Buffer, firstbad: int, inf_scales: int,
                    check_finite: bool) -> None:
    """A device decode of scaled ``pieces`` (a stack from the first piece's
    offset) judged: a non-finite product (``firstbad``, a stack index) is a
    :class:`~hf2q.NonFiniteError` naming its piece (its tensor, its own flat
    index) where the output is Q8_0 or ``check_finite`` asks; an overflowing
    Q8_0 block scale a warning (an error under ``check_finite``)."""
    from .errors import NonFiniteError

    first = pieces[0]
    if firstbad >= 0 and (check_finite or entry.dtype == "q8_0"):
        at = firstbad
        for p in pieces:
            n = formats.numel(p.shape)
            if at < n:
                break
            at -= n
        shape = tuple(p.shape)
        multi = tuple(int(i) for i in np.unravel_index(at, shape)) if len(shape) > 1 else None
        raise NonFiniteError(f"non-finite weight in '{p.tensor}' at flat index {at}: the FP8 value times its "
                             "scale is not finite (NaN encoding, non-finite scale, or overflow)", index=at,
                             multi_index=multi, value_class="nan", tensor=p.tensor, step="fp8 scale")
    if inf_scales:
        if check_finite:  # as the host's decode: the load is refused
            from .device import scale_overflow_error

            raise scale_overflow_error(buf.to_host(), entry.dtype, entry.shape, entry.name, first.dtype)
        import warnings

        from .errors import ScaleOverflowWarning

        warnings.warn(f"'{entry.name}': {inf_scales} Q8_0 block scale(s) overflow float16 and are stored as +Inf "
                      "(as ggml's reference quantizer does)", ScaleOverflowWarning, stacklevel=4)


def _write_scaled(device: Device, ckpt: Checkpoint, entry: TensorPlan, piece: Piece, buf: Buffer,
                  check_finite: bool = False) -> None:
    """A scaled FP8 piece into ``buf``: decoded straight into the buffer's
    format where the decoder writes it (f32 / bf16 / f16 / q8_0) and the
    piece is whole; else to float32 first (row slices, shard ranges, the
    other block formats), which the device converts as any f32 source."""
    from .ops import FP8_OUTPUTS

    assert piece.scale is not None
    mx = piece.scale.scheme == "mxfp4"
    if mx and (piece.rows is not None or piece.select is not None):
        raise ValueError(f"{entry.name}: MXFP4 tensors load whole (no row slices or shard ranges)")
    whole = piece.rows is None and piece.select is None
    # An elementwise step (a recipe's rounding to BF16, as llama-quantize reads the
    # converter's BF16 file) runs on the float32 product: never the direct decode.
    direct = whole and entry.elementwise is None and (entry.dtype in ("mxfp4", "f32") if mx
                                                      else entry.dtype in FP8_OUTPUTS)
    if direct and not mx and (_SCALED_ON_DEVICE or not device._native.cpu_visible):
        _scaled_on_device(device, ckpt, entry, piece, buf, check_finite)
        return
    if direct and not mx and device._native.cpu_visible:
        # Memory the CPU addresses (host, Metal): decoded straight into the buffer, no second copy.
        fmt = formats.get(entry.dtype)
        begin = fmt.storage_bytes(piece.dest_offset)
        view = buf._native.numpy_view().reshape(-1).view(np.uint8)[begin:begin + fmt.storage_bytes(piece.numel)]
        # (as bits: a typed BF16 view would import ml_dtypes inside the load)
        _scaled_array(ckpt, piece, entry.dtype, check_finite,
                      out=view.view(fmt.bits_dtype))
        if check_finite and fmt.is_block:  # a block scale the decoder's quantizer overflowed
            _check_block_scales(view, entry, piece)
        return
    arr, _ = _scaled_array(ckpt, piece, entry.dtype if direct else "f32", check_finite)
    if direct:
        flat = arr.reshape(-1)
        raw = entry.dtype in ("q8_0", "mxfp4")
        device.write(buf, flat, offset=piece.dest_offset, src_dtype=entry.dtype if raw else None, name=entry.name)
        return
    cast = entry.elementwise or _caster(entry.dtype)
    if piece.select is not None:
        flat = arr.reshape(-1)
        for d0, s0, n in piece.select.tolist():
            _write_cast(device, buf, cast(flat[s0:s0 + n]), offset=d0, name=entry.name,
                        check_finite=check_finite)
        return
    if piece.rows is not None:
        start, stop = piece.rows
        arr = arr.reshape(piece.shape[0], piece.shape[1], -1)[:, start:stop]
    _write_cast(device, buf, cast(arr.reshape(-1)), offset=piece.dest_offset, name=entry.name,
                check_finite=check_finite)


def _check_block_scales(stored: np.ndarray, entry: TensorPlan, piece: Piece) -> None:
    """``check_finite`` on block-format bytes a decoder wrote itself (scaled
    FP8 straight into Q8_0): a float16 block scale stored as +-Inf is a
    :class:`~hf2q.NonFiniteError`, as the device's quantizers report it."""
    fmt = formats.get(entry.dtype)
    raw = np.ascontiguousarray(stored).reshape(-1).view(np.uint8)
    scales = raw.reshape(-1, fmt.block_bytes)[:, :2].copy().view(np.uint16)  # Q8_0: the f16 scale leads each block
    if np.any((scales & 0x7FFF) == 0x7C00):
        from .device import scale_overflow_error

        raise scale_overflow_error(raw, fmt.name, entry.shape, entry.name, piece.dtype, offset=piece.dest_offset)
