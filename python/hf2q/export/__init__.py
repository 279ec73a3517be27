"""``hf2q convert``: the GGUF file llama.cpp's ``convert_hf_to_gguf.py``
writes, streamed from the load plan to disk (docs/CONVERT.md).

The plan a family makes for a load (same tensors, same bytes as the
converter's) is executed a batch at a time on the host device, each batch
into an output window laid out as its part of the file (the tensors' buffers
placed at their file offsets, in the converter's order); each window is
written as it is (``O_DIRECT`` where the file system takes it) while the
next batch is read and converted, then freed. The header (key/values, tensor
infos) is encoded first: every size is known from the plan. Host memory
stays within :data:`MEMORY_BUDGET` plus the largest tensor.

The file is written under a temporary name in the output's folder, fsynced
and renamed into place only when complete: an interrupted or failed
conversion leaves no file that looks finished.
"""

from __future__ import annotations

import errno
import os
import queue
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import numpy as np

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

from .. import formats
from ..errors import Hf2qError, mark_system_failure
from ..plan import LoadPlan, TensorPlan
from . import metadata as md
from .gguf import ALIGNMENT, GGUFEncodeError, TensorInfo, encode_header, padded
from .order import converter_order

__all__ = ["convert", "ConvertSummary", "ConvertError", "OutputExistsError", "UnsupportedModelError",
           "OUTTYPES", "MEMORY_BUDGET", "BATCH_BYTES"]

PathLike = Union[str, "os.PathLike[str]"]

#: ``--outtype`` values (llama.cpp's converter's names).
OUTTYPES = ("f32", "f16", "bf16", "q8_0")
#: Converted bytes held in host memory at once, besides one tensor larger
#: than :data:`BATCH_BYTES` (the output windows being read into and those
#: not yet written;
#: a stack of per-expert tensors is read and written in parts of whole
#: experts of at most BATCH_BYTES, so it is no such tensor).
MEMORY_BUDGET = 192 << 20
#: Output bytes per batch (a larger tensor is a batch of its own).
BATCH_BYTES = 64 << 20
#: Through the page cache: start the disk's writeback of each window as it
#: is written (_Output._start_writeback; ``HF2Q_CONVERT_WRITEBACK=0``: not).
WRITEBACK_EARLY = os.environ.get("HF2Q_CONVERT_WRITEBACK", "1") != "0"
#: Write the file with O_DIRECT where the file system takes it (Linux;
#: ``HF2Q_CONVERT_DIRECT=0``: through the page cache): see _Output.
OUTPUT_DIRECT = os.environ.get("HF2Q_CONVERT_DIRECT", "1") != "0"
#: Windows being written at once (each by its own I/O thread), and the
#: offset / length alignment of every write (a multiple of any logical block
#: size up to 4 KiB; a file system wanting more refuses O_DIRECT writes with
#: EINVAL, and the page cache takes over).
DIRECT_DEPTH = 2
DIRECT_ALIGN = 4096
#: Windows are not zero-filled first (reused memory keeps its old bytes):
#: only the ranges nothing writes are zeroed (_unwritten).
WINDOW_UNZEROED = True
#: Through the page cache: writeback is started for windows of at least this many bytes.
WRITEBACK_MIN = 1 << 20
#: Elements rounded from F32 to F16 at a time (``--outtype f16``).
HALF_CHUNK = 1 << 22


class ConvertError(Hf2qError):
    """A conversion could not be done; ``path`` names the output."""

    def __init__(self, message: str, path: Any = None) -> None:
        super().__init__(message)
        self.path = None if path is None else str(path)


class OutputExistsError(ConvertError, FileExistsError):
    """The output file exists and ``force`` was not given."""


class UnsupportedModelError(ConvertError, ValueError):
    """The checkpoint's family (or the options asked for) has no GGUF
    conversion here."""


@dataclass
class ConvertSummary:
    """What a conversion did (the CLI's ``--json`` report)."""

    output: str
    family: str
    architecture: str
    outtype: str
    tensors: int
    bytes: int
    data_bytes: int
    source_bytes: int
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else float("inf")

    def as_dict(self) -> dict[str, Any]:
        return {"output": self.output, "family": self.family, "architecture": self.architecture,
                "outtype": self.outtype, "tensors": self.tensors, "bytes": self.bytes,
                "data_bytes": self.data_bytes, "source_bytes": self.source_bytes,
                "seconds": round(self.seconds, 3), "gb_per_s": round(self.gb_per_s, 3), **self.extra}


# ----------------------------------------------------------------------------- families
def _planner(family: str) -> Any:
    """The family's plan for one ``outtype``: ``--outtype X`` sets both of
    its tensor classes (``expert_dtype``, ``dense_dtype``) to X, the options
    given win for theirs (with a ``recipe``, which replaces them, neither is
    set). Returns ``(plan, the plan's resolved config)``."""
    def plan(ckpt: Any, config: Mapping[str, Any], outtype: str, options: dict[str, Any]) -> tuple[LoadPlan, Any]:
        from ..models import family as family_row

        # (a recipe chooses every format itself: the dtype options would be refused beside it)
        by_outtype = {} if options.get("recipe") is not None else {"expert_dtype": outtype, "dense_dtype": outtype}
        p = family_row(family).impl().plan_checkpoint(ckpt, config=config, **{**by_outtype, **options})
        return p, p.config

    return plan


def _f16_plan(planner: Any, ckpt: Any, config: Mapping[str, Any],
              options: dict[str, Any]) -> tuple[LoadPlan, Any, set[str]]:
    """``--outtype f16``, as the converter makes it whatever the family: the
    tensors that ``--outtype bf16`` makes BF16 (its rule is the same for
    both) are planned in F32 (exact from BF16 / F16 sources, the
    families' transforms computed in F32 as the converter computes them) and
    rounded to F16 (nearest even, numpy's cast, as the converter's) while
    they are written. Returns the F32 plan and the names to round. The
    family options given still win for their tensors."""
    a, cfg = planner(ckpt, config, "f32", options)
    b, _ = planner(ckpt, config, "bf16", options)
    to_half = {e.name for e in b if e.dtype == "bf16"}
    return a, cfg, {e.name for e in a if e.name in to_half and e.dtype == "f32"}


def _generic_planner(ckpt: Any, config: Mapping[str, Any], outtype: str,
                     options: dict[str, Any]) -> tuple[LoadPlan, Any]:
    from .generic import plan_generic_gguf

    return plan_generic_gguf(ckpt, config, outtype, options)


def _generic_kv(kv: md.KVList, config: Mapping[str, Any], cfg: Any, outtype: str) -> None:
    from .generic import write_kv

    write_kv(kv, config, cfg, outtype)


#: family -> (GGUF architecture (None: by config.json, the generic family's
#: llama-like ones: export/generic.py), planner, key/value writer, options the family takes)
_FAMILIES = {
    "qwen35moe": ("qwen35moe", _planner("qwen35moe"), md.qwen35moe, ("expert_dtype", "dense_dtype", "mtp", "recipe")),
    "gemma4": ("gemma4", _planner("gemma4"), md.gemma4, ("expert_dtype", "dense_dtype", "recipe")),
    "generic": (None, _generic_planner, _generic_kv, ("recipe",)),
}


# ----------------------------------------------------------------------------- the file
def _tensor_infos(entries: list[TensorPlan], half: set[str], ggml_dims: bool = False) -> list[TensorInfo]:
    """Each entry's tensor info; ``ggml_dims``: the shape as ggml counts its
    dimensions (numpy's leading 1s dropped, ``ggml_n_dims``), as
    llama-quantize writes it (the converter keeps ``[1, 32]``)."""
    from ..recipes import ggml_n_dims

    out = []
    for e in entries:
        dtype = "f16" if e.name in half else e.dtype
        ggml = formats.get(dtype).gguf_type
        if ggml < 0:
            raise UnsupportedModelError(f"{e.name}: format {dtype} has no GGUF type")
        shape = tuple(e.shape)
        if ggml_dims and shape:
            shape = shape[len(shape) - ggml_n_dims(shape):]
        out.append(TensorInfo(e.name, shape, ggml, formats.nbytes(e.shape, dtype)))
    return out


def _quantize_order(entries: list[TensorPlan]) -> list[TensorPlan]:
    """The order llama-quantize writes tensors in: its model loader's map,
    by block (tensors of no block first) then by name (``_layer_key``)."""
    from ..recipes import _layer_key

    return sorted(entries, key=lambda e: _layer_key(e.name))


def _temp_name(out: Path) -> Path:
    return out.with_name(f".{out.name}.hf2q-{os.getpid()}-{threading.get_ident():x}.partial")


@dataclass
class _Unit:
    """One batch as executed and written: its entries, the file range
    ``[start, end)`` its bytes fill (the header's too for the first one,
    padding included), and where each entry's bytes go in the file."""

    entries: list[TensorPlan]
    start: int
    end: int
    offsets: list[int]  # file offset of each entry's bytes
    out_bytes: list[int]  # bytes each entry has in the file (an F16-rounded entry: half its F32 buffer)
    last: bool = False  # the file's last window: written whole, padded to the alignment

    def window(self, align: int) -> tuple[int, int]:
        """The window's file range: from the page before ``start`` (its first
        bytes are the previous window's last, carried over) to ``end``
        rounded up."""
        return self.start // align * align, padded(self.end, align)


def _layout(units: list[list[TensorPlan]], half: set[str], head_len: int) -> list[_Unit]:
    """Where every unit's entries go in the file: back to back from the end
    of the header, each padded to ALIGNMENT (a stack's parts are ALIGNMENT
    multiples: no padding between them, _parts)."""
    out: list[_Unit] = []
    pos = head_len
    for i, u in enumerate(units):
        start = 0 if i == 0 else pos
        offs, sizes = [], []
        for e in u:
            n = formats.nbytes(e.shape, "f16" if e.name in half else e.dtype)
            offs.append(pos)
            sizes.append(n)
            pos = padded(pos + n, ALIGNMENT)
        out.append(_Unit(u, start, pos, offs, sizes))
    if not out:  # no tensors: the header alone
        out.append(_Unit([], 0, head_len, [], []))
    out[-1].last = True
    return out


def _fully_written(e: TensorPlan) -> bool:
    """Whether the loader writes every element of ``e``'s buffer: a
    transform's result is the whole tensor (the loader checks its size);
    otherwise the pieces' destination ranges (a shard's ranges, a row slice's
    run, a whole source) must cover ``[0, numel)``. A placed buffer that is
    not is zero-filled before the loader runs (its window is not)."""
    if e.transform is not None:
        return True
    spans: list[tuple[int, int]] = []
    for p in e.sources:
        if p.select is not None:
            spans.extend((int(d), int(d) + int(n)) for d, _, n in p.select.tolist())
        else:
            spans.append((p.dest_offset, p.dest_offset + p.numel))
    end = 0
    for a, b in sorted(spans):
        if a > end:
            return False
        end = max(end, b)
    return end >= formats.numel(e.shape)


def _unwritten(unit: _Unit, wstart: int, wlen: int, head_len: int, half: set[str]) -> list[tuple[int, int]]:
    """The byte ranges of a window nothing writes (padding, the last page's
    tail, a buffer the loader may leave partly unwritten): zeroed before the
    loader runs, as the file's bytes there are zeros. The writer copies in
    the header (first window) or the carried page, and writes F16 roundings
    whole."""
    kept = [(0, head_len if unit.start == 0 else unit.start - wstart)]
    for e, off, n in zip(unit.entries, unit.offsets, unit.out_bytes):
        if e.name in half or _fully_written(e):
            kept.append((off - wstart, off - wstart + n))
    out, pos = [], 0
    for a, b in sorted(kept):
        if a > pos:
            out.append((pos, a))
        pos = max(pos, b)
    if pos < wlen:
        out.append((pos, wlen))
    return out


class _Output:
    """The file's bytes, written a window at a time with ``pwrite`` by
    :data:`DIRECT_DEPTH` I/O threads, through ``O_DIRECT`` where the file
    system takes it (Linux; ``HF2Q_CONVERT_DIRECT=0`` turns it off): the
    kernel then copies nothing into the page cache, which on a VM that
    backs fresh page-cache pages on first touch was most of a conversion's
    CPU (docs/CONVERT.md, "Speed"). Every write starts and ends on a
    :data:`DIRECT_ALIGN` boundary (the last one is padded with the window's
    zeros; the caller truncates the file to its size), and no two overlap.

    A write refused with ``EINVAL`` (an alignment the file system does not
    take) turns ``O_DIRECT`` off for the file and is done again through the
    page cache, and so is every later one (:attr:`direct` says which path
    ran to the end); through the page cache each window's writeback starts
    as soon as it is written (``POSIX_FADV_DONTNEED``). Any other failure
    (``ENOSPC``, ``EIO``) is kept in :attr:`error` and raised by the next
    :meth:`submit` or by :meth:`close`, as ``OSError``."""

    def __init__(self, fd: int, release: Any) -> None:
        self.fd = fd
        self.release = release  # release(nbytes): a window's budget, once its write is done
        self.direct = False
        if OUTPUT_DIRECT and hasattr(os, "O_DIRECT") and fcntl is not None:
            try:
                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_DIRECT)
                self.direct = True
            except OSError:
                pass  # this file system has no O_DIRECT: the page cache
        self.written = 0
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._jobs: queue.Queue[Any] = queue.Queue()
        self._io = [threading.Thread(target=self._run, name=f"hf2q-convert-io-{i}", daemon=True)
                    for i in range(DIRECT_DEPTH)]
        started = []
        try:
            for t in self._io:
                t.start()
                started.append(t)
        except BaseException:
            # A thread that could not start: the ones running stop, and the caller
            # removes the temporary file (nothing was written yet).
            self._io = started
            self.stop()
            raise

    def submit(self, window: Any, length: int, offset: int, budget: int) -> None:
        """Write the first ``length`` bytes of ``window`` (a u8 Buffer, kept
        alive until then) at ``offset``; ``release(budget)`` once done."""
        if self.error is not None:
            raise self.error
        self._jobs.put((window, length, offset, budget))

    def close(self) -> None:
        """Wait for every write; the first failure is raised."""
        self.stop()
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        """Stop the I/O threads once the writes queued are done (or skipped
        after a failure)."""
        for _ in self._io:
            self._jobs.put(None)
        for t in self._io:
            t.join()
        self._io = []

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            window, length, off, budget = job
            try:
                if self.error is None and length:
                    view = memoryview(window._storage_bytes(0, length))
                    self._pwrite(view, off)
                    del view
                    with self._lock:
                        self.written += length
                    if not self.direct:
                        self._start_writeback(off, length)
            except BaseException as e:  # raised by the main thread
                with self._lock:
                    if self.error is None:
                        self.error = e
            finally:
                del window, job
                self.release(budget)

    def _pwrite(self, view: memoryview, off: int) -> None:
        while view:
            # The mode this write goes out in: two writes in flight can both meet
            # the EINVAL, and the second finds O_DIRECT already off (it retries too).
            direct = self.direct
            try:
                n = os.pwrite(self.fd, view, off)
            except InterruptedError:
                continue
            except OSError as e:
                if e.errno != errno.EINVAL or not direct:
                    raise
                self._buffered_from_now()
                continue  # again, through the page cache
            if n == 0:
                raise OSError(errno.EIO, "write returned 0 bytes")
            view, off = view[n:], off + n

    def _buffered_from_now(self) -> bool:
        """O_DIRECT off for the file (an EINVAL: this file system wants
        another alignment); False where it was off already (the EINVAL is
        then the write's own)."""
        with self._lock:
            flags = fcntl.fcntl(self.fd, fcntl.F_GETFL)
            if not flags & os.O_DIRECT:
                return False
            fcntl.fcntl(self.fd, fcntl.F_SETFL, flags & ~os.O_DIRECT)
            self.direct = False
            return True

    def _start_writeback(self, off: int, length: int) -> None:
        """Hand a window written through the page cache to the disk now,
        asynchronously (``POSIX_FADV_DONTNEED`` starts writeback of a
        range's dirty pages and drops the clean ones): the final fsync has
        little left to do, and the file does not fill the page cache. Best
        effort."""
        if not WRITEBACK_EARLY or not hasattr(os, "posix_fadvise") or length < WRITEBACK_MIN:
            return
        try:
            os.posix_fadvise(self.fd, off, length, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass


class _Writer(threading.Thread):
    """Finishes each executed window in file order and hands it to the
    output: the previous window's last partial page (``carry``) copied to
    its start, the header into the first, F32 buffers rounded to F16 into
    their place; then everything up to its own last partial page (all of
    it, padded, for the last window) is written, and that page is carried
    over. The in-flight budget is released as windows are written."""

    def __init__(self, fd: int, head: bytes, bar: Any) -> None:
        super().__init__(name="hf2q-convert-writer", daemon=True)
        self.head = head
        self.bar = bar
        self.jobs: queue.Queue[Any] = queue.Queue()
        self.cond = threading.Condition()
        self.inflight = 0
        self.error: BaseException | None = None
        self.carry = b""
        self.out = _Output(fd, self._release)

    @property
    def written(self) -> int:
        return self.out.written

    def run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            unit, window, halves, budget = job
            try:
                if self.error is None:
                    self._finish(unit, window, halves, budget)
                    budget = 0  # the output releases it
            except BaseException as e:  # handed to the main thread
                self.error = e
            finally:
                halves.clear()
                del job, window
                if budget:
                    self._release(budget)

    def _finish(self, unit: _Unit, window: Any, halves: list[tuple[Any, int, int]], budget: int) -> None:
        wstart, wend = unit.window(DIRECT_ALIGN)
        win = window._storage_bytes(0, window.byte_len)
        if unit.start == 0:
            win[:len(self.head)] = np.frombuffer(self.head, dtype=np.uint8)
        c = unit.start - wstart
        if len(self.carry) != c:  # pragma: no cover - the layout makes them equal
            raise AssertionError(f"carry of {len(self.carry)} bytes, window needs {c}")
        win[:c] = np.frombuffer(self.carry, dtype=np.uint8)
        while halves:  # each F32 buffer dropped once rounded
            buf, off, n = halves.pop(0)
            x = buf.numpy().reshape(-1)
            dst = win[off - wstart:off - wstart + n].view(np.float16)
            for i in range(0, len(x), HALF_CHUNK):
                dst[i:i + HALF_CHUNK] = x[i:i + HALF_CHUNK]  # round to nearest even, as astype
            del buf, x
        cut = wend - wstart if unit.last else unit.end // DIRECT_ALIGN * DIRECT_ALIGN - wstart
        self.carry = b"" if unit.last else win[cut:unit.end - wstart].tobytes()
        del win
        self.bar.update(unit.end - unit.start)
        self.out.submit(window, cut, wstart, budget)

    def _release(self, nbytes: int) -> None:
        with self.cond:
            self.inflight -= nbytes
            self.cond.notify_all()

    def reserve(self, nbytes: int, budget: int) -> None:
        with self.cond:
            while self.inflight and self.inflight + nbytes > budget and self.error is None \
                    and self.out.error is None:
                self.cond.wait()
            self.inflight += nbytes


def _batches(entries: list[TensorPlan]) -> list[list[TensorPlan]]:
    out: list[list[TensorPlan]] = []
    cur: list[TensorPlan] = []
    size = 0
    for e in entries:
        if cur and size + e.nbytes > BATCH_BYTES:
            out.append(cur)
            cur, size = [], 0
        cur.append(e)
        size += e.nbytes
    if cur:
        out.append(cur)
    return out


def _parts(entry: TensorPlan, part_bytes: int) -> list[TensorPlan]:
    """A streamed stack larger than ``part_bytes`` (an expert stack of
    per-expert tensors) as consecutive runs of whole leading entries, each
    read into its own buffer: their bytes back to back are the tensor's.
    The writer writes one while the next is read, and frees each when
    written: a 570 MB stack no longer holds the whole memory budget while it
    is written (the read of the next tensor waited for it). Only where every
    piece lies within one run; anything else stays whole."""
    import dataclasses

    if (entry.nbytes <= part_bytes or len(entry.shape) < 2 or entry.shape[0] < 2 or not entry.streamed
            or entry.unit_transpose is not None or any(p.select is not None or p.rows is not None for p in entry.sources)):
        return [entry]
    lead = entry.shape[0]
    per = formats.numel(entry.shape[1:])  # elements of one leading entry
    row_bytes = formats.nbytes(entry.shape[1:], entry.dtype)
    # Whole blocks, and no padding between the parts (the writer pads each buffer to ALIGNMENT).
    if per == 0 or per % formats.get(entry.dtype).block_elems or row_bytes % ALIGNMENT:
        return [entry]
    k = max(1, min(lead, part_bytes // row_bytes))
    bounds = list(range(0, lead, k)) + [lead]
    runs: list[list[Any]] = [[] for _ in bounds[:-1]]
    for p in entry.sources:
        i = min(p.dest_offset // per // k, len(runs) - 1)
        a, b = bounds[i] * per, bounds[i + 1] * per
        if not (a <= p.dest_offset and p.dest_offset + p.numel <= b):
            return [entry]
        runs[i].append(dataclasses.replace(p, dest_offset=p.dest_offset - a))
    if any(sum(p.numel for p in r) != (b - a) * per for r, a, b in zip(runs, bounds, bounds[1:])):
        return [entry]  # a run not covered exactly once (its buffer would keep zeros): whole
    return [dataclasses.replace(entry, shape=(b - a,) + tuple(entry.shape[1:]), sources=tuple(r))
            for r, a, b in zip(runs, bounds, bounds[1:])]


class _Held:
    """The loader's model container for one batch: the buffers, nothing else."""

    def __init__(self, bufs: dict[str, Any]) -> None:
        self.bufs = bufs


def convert(src: PathLike, out: PathLike, outtype: str = "q8_0", *, force: bool = False, progress: bool = False,
            family: str | None = None, revision: str | None = None, download: bool = False,
            name: str | None = None, **options: Any) -> ConvertSummary:
    """Write the GGUF file llama.cpp's ``convert_hf_to_gguf.py --outtype
    OUTTYPE`` writes for the checkpoint ``src`` (a directory, file or
    cached Hugging Face repo id, as for :func:`hf2q.load`) to ``out``.

    ``outtype``: ``f32``, ``f16``, ``bf16`` or ``q8_0``, with the converter's meaning
    (which tensors take it; norms, routers and small tensors stay F32).
    ``options``: the family's own (``expert_dtype``, ``dense_dtype``,
    ``mtp`` for Qwen3.5 MoE) refine it; ``recipe="q4_k_m"`` (q4_k_s, q5_k_m,
    q6_k, q8_0) replaces both (every family): the file llama-quantize writes
    for that file type from the converter's BF16 file (docs/CONVERT.md,
    "Recipes"; docs/KQUANTS.md). FP8 checkpoints are decoded with their
    scales as the converter does (docs/FP8.md). ``force``: replace an existing
    ``out``. ``name``: ``general.name`` (default: the checkpoint folder's
    name, as the converter does). Supported: Qwen3.5/3.6 MoE
    (``qwen35moe``), Gemma 4 (``gemma4``) and, of the generic family,
    Llama, Mistral, Qwen3 and Qwen3-MoE (``llama``, ``qwen3``,
    ``qwen3moe``); other checkpoints raise :class:`UnsupportedModelError`."""
    from ..device import Device
    from ..hub import resolve
    from ..loader import execute
    from ..models import detect, family as family_row, read_config
    from ..safetensors import open_checkpoint
    from .._progress import progress_bar

    t0 = time.perf_counter()
    if outtype not in OUTTYPES:
        raise UnsupportedModelError(f"outtype must be one of {', '.join(OUTTYPES)}, got {outtype!r}")
    out_path = Path(os.fspath(out))
    if out_path.is_dir():  # (before the check below: --force would not help)
        raise ConvertError(f"{out_path}: is a directory; name the GGUF file to write", path=out_path)
    if out_path.exists() and not force:
        raise OutputExistsError(f"{out_path}: exists (pass --force, or force=True in Python, to replace it)",
                                path=out_path)
    if not out_path.parent.is_dir():
        raise ConvertError(f"{out_path.parent}: no such directory", path=out_path)
    from ..hub import parse_url

    src, revision, _ = parse_url(src, revision)  # (a Hub page's URL: its repo id names the model)
    src_path = resolve(src, revision, download=download, api="hf2q.convert", api_args=f", {os.fspath(out)!r}")
    _, config = read_config(src_path)
    fam = detect(config) if family is None else family_row(family)
    if fam.name not in _FAMILIES:
        raise UnsupportedModelError(
            f"{src_path}: hf2q convert writes GGUF files for {', '.join(f for f in _FAMILIES if f != 'generic')} "
            f"checkpoints and the generic family's {', '.join(_generic_archs())}; this one is "
            f"{fam.name!r} (config.json architectures: {(config or {}).get('architectures')})", path=out_path)
    arch, planner, kv_writer, takes = _FAMILIES[fam.name]
    if arch is None:  # the generic family: the converter's class for config.json's architecture
        from . import generic

        try:
            arch = generic.gguf_architecture(config)
        except UnsupportedModelError as e:
            raise UnsupportedModelError(f"{src_path}: {e}", path=out_path) from None
    unknown = sorted(set(options) - set(takes))
    if unknown:
        raise TypeError(f"hf2q convert: the {fam.name} family takes no option(s) {', '.join(unknown)}; "
                        f"it takes {', '.join(takes) if takes else 'none'}")
    recipe = options.get("recipe")
    assert config is not None  # every supported family needs one (detect() said so)
    default_name = src if isinstance(src, str) and not os.path.exists(src) else src_path.name
    device = Device._isolated("host")

    with open_checkpoint(src_path) as ckpt:
        _refuse_an_input_as_output(out_path, ckpt, src_path if src_path.is_dir() else src_path.parent)
        half: set[str] = set()
        if outtype == "f16" and recipe is None:
            plan, cfg, half = _f16_plan(planner, ckpt, config, dict(options))
        else:
            plan, cfg = planner(ckpt, config, outtype, dict(options))
        kv = md.KVList(arch)
        kv.string("general.architecture", arch)
        md.general(kv, name if name is not None else str(default_name))
        if recipe is None:
            entries = converter_order(list(plan), ckpt.keys())
            kv_writer(kv, config, cfg, outtype)
            kv.u32("general.quantization_version", md.QUANTIZATION_VERSION)
            tokenizer = _tokenizer(kv, fam.name, src_path if src_path.is_dir() else src_path.parent, cfg)
        else:
            # llama-quantize's file from the converter's BF16 file: the BF16 file's keys, then
            # general.quantization_version and general.file_type set again, which moves them to the
            # end (gguf_set_val_*: remove, append); its tensors in its loader's map order, each
            # shape as ggml counts its dimensions.
            from ..recipes import FILE_TYPES

            entries = _quantize_order(list(plan))
            kv_writer(kv, config, cfg, "bf16")
            tokenizer = _tokenizer(kv, fam.name, src_path if src_path.is_dir() else src_path.parent, cfg)
            kv.remove("general.file_type")
            kv.u32("general.quantization_version", md.QUANTIZATION_VERSION)
            kv.u32("general.file_type", FILE_TYPES[recipe])
        infos = _tensor_infos(entries, half, ggml_dims=recipe is not None)
        try:
            head, _offsets = encode_header(kv.items(), infos, ALIGNMENT)
        except GGUFEncodeError as e:
            raise ConvertError(f"{out_path}: {e}", path=out_path) from None
        data = sum(padded(t.nbytes, ALIGNMENT) for t in infos)
        total = len(head) + data
        # Batches as executed: a stack over BATCH_BYTES in parts of whole leading entries (_parts).
        units = [u for whole in _batches(entries)
                 for u in ([[p] for p in _parts(whole[0], BATCH_BYTES)] if len(whole) == 1 else [whole])]
        largest = max((e.nbytes for u in units for e in u), default=0)
        budget = MEMORY_BUDGET + largest
        # Buffers live for one batch: not pinned, and their memory is kept
        # for the next batches (within the budget) instead of being unmapped
        # and faulted in fresh every batch (docs/RESIDENCY.md, "Scratch").
        device._native.use_as_scratch(budget)

        # No space: fail now, not after minutes of work. (statvfs, not
        # posix_fallocate: where a file system has no fallocate, glibc
        # emulates it by writing every block once.)
        try:
            st = os.statvfs(out_path.parent)
            free = st.f_bavail * st.f_frsize
        except (AttributeError, OSError):
            free = None
        if free is not None and free < total:
            # The machine's limit, not the input's: exit 1 (README, "Exit status"), as ENOSPC mid-write.
            raise mark_system_failure(
                ConvertError(f"{out_path}: {total:,} bytes to write, {free:,} free on its file system",
                             path=out_path), OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
        tmp = _temp_name(out_path)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError as e:
            raise mark_system_failure(ConvertError(f"{out_path}: cannot create {tmp.name} there: {e.strerror or e}",
                                                   path=out_path), e) from None
        bar = progress_bar(total, "hf2q convert", progress)
        layout = _layout(units, half, len(head))
        if layout[-1].end != total:  # pragma: no cover - the header's offsets and the layout's agree
            raise AssertionError(f"layout ends at {layout[-1].end}, the header says {total}")
        try:
            writer = _Writer(fd, head, bar)
        except BaseException:  # e.g. its I/O threads could not start: no file left behind
            bar.close()
            os.close(fd)
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        done = False
        try:
            writer.start()
            for unit in layout:
                wstart, wend = unit.window(DIRECT_ALIGN)
                placed = [(o - wstart, e.shape, e.dtype) for e, o in zip(unit.entries, unit.offsets)
                          if e.name not in half]
                extra_bytes = sum(e.nbytes for e in unit.entries if e.name in half)  # their F32 buffers
                reserved = wend - wstart + extra_bytes
                writer.reserve(reserved, budget)
                if writer.error is not None or writer.out.error is not None:
                    writer._release(reserved)
                    break
                window, bufs = device._alloc_window(wend - wstart, placed, zero=not WINDOW_UNZEROED)
                if WINDOW_UNZEROED:  # a reused range holds old bytes: zeros where nothing writes
                    win = window._storage_bytes(0, wend - wstart)
                    for a, b in _unwritten(unit, wstart, wend - wstart, len(head), half):
                        win[a:b] = 0
                    del win
                where = {e.name: b for e, b in zip((e for e in unit.entries if e.name not in half), bufs)}
                del bufs

                def alloc(es: list[TensorPlan], where: dict[str, Any] = where) -> list[Any]:
                    return [where.pop(e.name) if e.name in where else device.alloc(e.shape, e.dtype) for e in es]

                try:
                    held = execute(LoadPlan(plan.family, unit.entries, plan.config), ckpt, device, _Held,
                                   alloc=alloc) if unit.entries else _Held({})
                except BaseException:
                    writer._release(reserved)
                    raise
                halves = [(held.bufs[e.name], o, n) for e, o, n in zip(unit.entries, unit.offsets, unit.out_bytes)
                          if e.name in half]
                del held, where, alloc
                writer.jobs.put((unit, window, halves, reserved))
                del window, halves
            writer.jobs.put(None)
            writer.join()
            if writer.error is None:
                try:
                    writer.out.close()
                except BaseException as e:
                    writer.error = e
            if writer.error is not None:
                err = writer.error
                if isinstance(err, OSError):
                    raise mark_system_failure(
                        ConvertError(f"{out_path}: write failed: {err.strerror or err}", path=out_path), err,
                        any_errno=True) from None
                raise err
            if writer.out.error is not None:
                err = writer.out.error
                raise mark_system_failure(
                    ConvertError(f"{out_path}: write failed: {getattr(err, 'strerror', None) or err}", path=out_path),
                    err, any_errno=True) from None
            total_written = padded(total, DIRECT_ALIGN)
            if writer.written != total_written:
                raise ConvertError(f"{out_path}: wrote {writer.written:,} bytes, planned {total_written:,}",
                                   path=out_path)
            os.ftruncate(fd, total)
            os.fsync(fd)
            os.close(fd)
            fd = -1
            _publish(tmp, out_path, force)
            _fsync_dir(out_path.parent)
            done = True
        finally:
            if writer.is_alive():
                writer.error = writer.error or KeyboardInterrupt()
                writer.jobs.put(None)
                writer.join()
            writer.out.stop()
            bar.close()
            if fd >= 0:
                os.close(fd)
            if not done:
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass
    return ConvertSummary(output=str(out_path), family=fam.name, architecture=arch, outtype=outtype,
                          tensors=len(entries), bytes=total, data_bytes=sum(t.nbytes for t in infos),
                          source_bytes=plan.source_nbytes, seconds=time.perf_counter() - t0,
                          extra={"kv_count": len(kv.items()), "tokenizer": tokenizer,
                                 "output_io": "O_DIRECT" if writer.out.direct else "page cache",
                                 **({"recipe": recipe} if recipe is not None else {}),
                                 **({"quantization": plan.extra["quantization"]}
                                    if "quantization" in plan.extra else {})})


def _generic_archs() -> list[str]:
    from .generic import ARCHITECTURES

    return list(ARCHITECTURES)


# Files a conversion reads beside the safetensors files (config, tokenizer).
_READ_BESIDE = ("config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                "special_tokens_map.json", "generation_config.json", "chat_template.jinja", "chat_template.json")


def _refuse_an_input_as_output(out_path: Path, ckpt: Any, directory: Path) -> None:
    """A ``ConvertError`` where ``out_path`` is one of the files the
    conversion reads (a shard, the index, config.json, a tokenizer file),
    by identity, links followed: the finished GGUF file is renamed over
    ``out_path``, which with ``force`` would replace the checkpoint itself."""
    try:
        st = out_path.stat()
    except OSError:
        return  # nothing there (or nothing statable): nothing read can be replaced
    inputs = [*ckpt.files, *([ckpt.index_path] if ckpt.index_path is not None else []),
              *(directory / n for n in _READ_BESIDE)]
    for p in inputs:
        try:
            other = p.stat()
        except OSError:
            continue
        if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
            raise ConvertError(f"{out_path}: is {p} of the checkpoint being converted (the GGUF file would "
                               f"replace it); write the GGUF file elsewhere", path=out_path)


def _tokenizer(kv: md.KVList, family: str, directory: Path, cfg: Any) -> str:
    """Write the tokenizer keys where hf2q reads the family's tokenizer;
    say what was written (the summary's ``tokenizer``)."""
    if not (directory / "tokenizer.json").is_file():
        return "not written: no tokenizer.json beside the checkpoint"
    from .vocab import gemma4_vocab, gpt2_vocab

    if family == "generic":
        from .generic import write_tokenizer

        return write_tokenizer(kv, directory, cfg)
    if family == "gemma4":
        if not (directory / "tokenizer_config.json").is_file():
            # (the converter stops there: its Gemma vocabulary is read through transformers)
            return "not written: no tokenizer_config.json beside the checkpoint"
        gemma4_vocab(kv, directory)
        return "gemma4"
    checked = gpt2_vocab(kv, directory, cfg.vocab_size)
    pre = next(k.value for k in kv.items() if k.key == "tokenizer.ggml.pre")
    return f"gpt2 (pre-tokenizer {pre}; fingerprint {checked})"


def _publish(tmp: Path, out: Path, force: bool) -> None:
    """Give the finished file its name: replacing ``out`` only with
    ``force``; without it a file that appeared at ``out`` during the
    conversion is kept (a hard link fails on an existing name, where the
    file system has them)."""
    if force:
        os.replace(tmp, out)
        return
    try:
        os.link(tmp, out)
    except FileExistsError:
        raise OutputExistsError(f"{out}: exists (pass --force, or force=True in Python, to replace it)", path=out) from None
    except OSError:  # no hard links here: check, then rename
        if os.path.lexists(out):
            raise OutputExistsError(f"{out}: exists (pass --force, or force=True in Python, to replace it)", path=out) from None
        os.replace(tmp, out)
        return
    os.unlink(tmp)


def _fsync_dir(d: Path) -> None:
    try:
        dfd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)
