"""Devices and device buffers: weights in memory the accelerator reads,
registered in the device's residency set.

``Device("host")`` works everywhere (page-aligned memory; residency = mlock +
prefault). ``Device("metal")`` uses shared-storage ``MTLBuffer`` objects in
``MTLResidencySet``\\ s on Apple silicon. Conversions (BF16/F16 -> F32, -> Q8_0)
run in native code straight into the buffer's memory. ``Device("cuda")`` /
``Device("cuda:N")`` keeps buffers in NVIDIA GPU memory: file bytes are staged
through pinned buffers, copied raw, and converted by GPU kernels (the driver
and NVRTC are loaded at run time; ``pip install "hf2q[cuda]"`` brings NVRTC).
"""

from __future__ import annotations

import os
from stat import S_ISREG as _S_ISREG
import sys
import threading
import time
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence, TypeVar, Union

from . import _core, formats
from .errors import DeviceError, Hf2qError, NonFiniteError, ResidencyWarning, ScaleOverflowWarning

__all__ = [
    "Device",
    "Buffer",
    "Residency",
    "VerifyReport",
    "FileReadError",
    "register_weight_buffer",
    "DTYPES",
]

if TYPE_CHECKING:
    import numpy as np
else:  # numpy (and hf2q.reference, hf2q._arrays) only once a buffer meets an array: hf2q._lazy
    from ._lazy import numpy as np

PathOrFd = Union[str, "os.PathLike[str]", int]

#: Buffer dtypes: the device rows of :mod:`hf2q.formats`. ``q8_0`` is u8
#: storage holding ggml Q8_0 blocks of a tensor whose logical shape the buffer
#: keeps (``byte_len = formats.nbytes(shape, "q8_0")``).
DTYPES = formats.DEVICE_FORMATS
# Which format an ndarray of each numpy dtype uploads as: the device formats
# with an element dtype, but u8 (uint8 arrays are raw bytes of `src_dtype`).
# Keyed by the dtype's name so that nothing here imports ml_dtypes: an array
# can only be bfloat16 once its caller imported it (README, "Benchmarks").
_NUMPY_SRC = {
    f.numpy_name: f.name
    for f in map(formats.get, DTYPES)
    if f.numpy_name and f.numpy_name != "uint8"
}


def _numpy_src(dtype: Any) -> str | None:
    """The device dtype of numpy data of ``dtype`` (None: raw bytes or
    unsupported, such as a byte-swapped ``">f4"``, whose name is "float32" too,
    or a ``dtype`` attribute that is not a numpy dtype)."""
    if dtype is None:
        return None
    try:
        dt = np.dtype(dtype)
    except TypeError:  # e.g. a torch tensor's dtype: not an ndarray, refused by _source
        return None
    return _NUMPY_SRC.get(dt.name) if dt.isnative else None


# With the other errors (hf2q.errors, data only); the native reader raises it by this name.
from .errors import FileReadError  # noqa: E402


def _dtype_name(dtype: str) -> str:
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    return dtype


def _is_int(d: object) -> bool:
    """An int or a numpy integer, not a bool. numpy is asked only once it is
    imported: before that no value can be one of its integers (a load of
    plain ints does not import it)."""
    if isinstance(d, bool):
        return False
    if isinstance(d, int):
        return True
    real = sys.modules.get("numpy")
    return real is not None and isinstance(d, real.integer)


def _shape(shape: Sequence[int] | int) -> tuple[int, ...]:
    if _is_int(shape):
        shape = (int(shape),)
    try:
        dims = tuple(shape)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"shape must be a sequence of ints, got {type(shape).__name__}") from None
    for d in dims:
        if not _is_int(d):
            raise TypeError(f"shape must be a sequence of ints, got {dims!r}")
        if d < 0:
            raise ValueError(f"shape {dims} has a negative dimension")
        if d >= 2**63:
            raise OverflowError(f"dimension {d} in shape {dims} is too large")
    return tuple(int(d) for d in dims)


class Buffer:
    """One tensor in device memory. ``numpy()`` and ``__dlpack__`` give
    zero-copy views that keep the memory alive on their own."""

    __slots__ = ("_native", "_device", "__weakref__")

    def __init__(self, native: Any, device: "Device") -> None:
        self._native = native
        self._device = device

    @property
    def device(self) -> "Device":
        return self._device

    @property
    def dtype(self) -> str:
        return str(self._native.dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        """Logical shape (for ``q8_0`` the unquantized shape)."""
        return tuple(self._native.shape)

    @property
    def numel(self) -> int:
        return int(self._native.numel)

    @property
    def byte_len(self) -> int:
        """Bytes of tensor data (for ``q8_0``: numel / 32 * 34)."""
        return int(self._native.byte_len)

    @property
    def alloc_len(self) -> int:
        """Bytes allocated: ``byte_len`` rounded up to the device page size."""
        return int(self._native.alloc_len)

    @property
    def address(self) -> int:
        return int(self._native.address)

    @property
    def registered(self) -> bool:
        """Whether the buffer is in its device's residency set."""
        return bool(self._device._native.is_registered(self._native))

    @property
    def locked(self) -> bool:
        """Host backend: whether the pages are mlock'ed."""
        locked = bool(self._device._native.is_locked(self._native))
        _warn_notice(self._device._native)
        return locked

    def numpy(self) -> np.ndarray:
        """Zero-copy writable view: ``bf16`` as ``ml_dtypes.bfloat16`` (raw
        bits: ``.view(np.uint16)``), ``q8_0`` as raw uint8 of shape
        ``(..., last // 32 * 34)``. Only for memory the CPU can address (host,
        Metal); a CUDA buffer raises :class:`hf2q.DeviceError`: use
        :meth:`to_host` for a copy, or ``torch.from_dlpack(buf)``.
        ``np.from_dlpack(buf)`` works for every dtype but bf16 (numpy has no
        DLPack bfloat16); ``torch.from_dlpack(buf)`` gives bf16 buffers as
        ``torch.bfloat16``."""
        if not self._device._native.cpu_visible:
            raise DeviceError(
                f"{self!r} lives in {self._device.kind} device memory, which the CPU cannot address: "
                "buf.numpy() is a zero-copy view only on host and Metal buffers; use buf.to_host() for a "
                "copy in host memory, or torch.from_dlpack(buf) for a view on the GPU"
            )
        arr = self._native.numpy_view()
        return _storage_typed(arr, self.dtype)

    def to_host(self) -> np.ndarray:
        """A copy of the buffer's storage in host memory, typed as
        :meth:`numpy` types it (on a GPU: a device-to-host copy)."""
        out = np.empty(self.byte_len, dtype=np.uint8)
        self._native.copy_out(0, out)
        return out.view(formats.get(self.dtype).storage_dtype).reshape(formats.storage_shape(self.shape, self.dtype))

    def _storage_bytes(self, begin: int, end: int) -> np.ndarray:
        """Storage bytes ``[begin, end)`` as uint8: a view where the CPU can
        address the memory, else a copy."""
        if self._device._native.cpu_visible:
            return self._native.numpy_view().reshape(-1).view(np.uint8)[begin:end]
        out = np.empty(end - begin, dtype=np.uint8)
        self._native.copy_out(begin, out)
        return out

    def __dlpack__(self, **kwargs: Any) -> Any:
        # The native view waits for uploads still in flight (CUDA keeps raw
        # and widening copies in flight after they return), so any consumer
        # stream may read the memory at once. A view kept across a later
        # write to the buffer must wait again: dev.synchronize() (docs/CUDA.md).
        return self._native.dlpack_view().__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        """(kDLCPU, 0) for host and Metal (shared storage on unified memory),
        (kDLCUDA, index) for a CUDA buffer."""
        kind, index = self._native.dlpack_device
        return (int(kind), int(index))

    def __repr__(self) -> str:
        return (
            f"hf2q.Buffer(dtype={self.dtype}, shape={self.shape}, byte_len={self.byte_len}, "
            f"device={self._device.kind})"
        )


@dataclass(frozen=True)
class VerifyReport:
    """Result of :meth:`Device.verify`: per-group checksums read back through
    the device equal those of a CPU (numpy) decode."""

    ok: bool
    groups: int
    mismatched_groups: tuple[int, ...]
    seconds: float


class Residency:
    """The device's residency set(s): counts are summed over all sets."""

    def __init__(self, device: "Device") -> None:
        self._device = device

    def _stats(self) -> dict[str, Any]:
        st = dict(self._device._native.stats())  # commits what is pending
        _warn_notice(self._device._native)
        return st

    @property
    def enabled(self) -> bool:
        return bool(self._device._native.residency_enabled)

    @property
    def count(self) -> int:
        return int(self._stats()["count"])

    @property
    def allocated_size(self) -> int:
        """Page-rounded bytes of the buffers in the set(s)."""
        return int(self._stats()["allocated_size"])

    @property
    def locked_bytes(self) -> int:
        return int(self._stats()["locked_bytes"])

    @property
    def locked(self) -> bool:
        """True when every buffer in the set is locked in memory (host: mlock
        succeeded; False when RLIMIT_MEMLOCK refused it, which is not an error)."""
        st = self._stats()
        return bool(st["count"]) and st["locked_bytes"] == st["allocated_size"]

    @property
    def unwired_bytes(self) -> int:
        """Bytes of buffers over the wired budget: allocated and usable, not in a set."""
        return int(self._stats()["unwired_bytes"])

    @property
    def sets(self) -> int:
        return int(self._stats()["sets"])

    @property
    def label(self) -> str:
        return str(self._stats()["label"])

    def stats(self) -> dict[str, Any]:
        return self._stats()

    def commit(self) -> None:
        """Apply staged additions/removals (batched; also done implicitly)."""
        self._device._native.commit()
        _warn_notice(self._device._native)

    def request(self) -> None:
        """Request residency again after :meth:`end` (host: lock again)."""
        self._device._native.request_residency()
        _warn_notice(self._device._native)

    def end(self) -> None:
        """End residency: the buffers stay valid but may be paged out (host: munlock)."""
        self._device._native.end_residency()

    def __repr__(self) -> str:
        st = self._stats()
        return (
            f"Residency(enabled={st['enabled']}, count={st['count']}, allocated_size={st['allocated_size']}, "
            f"locked_bytes={st['locked_bytes']}, sets={st['sets']})"
        )


_native_devices: dict[str, Any] = {}
_native_lock = threading.Lock()


def _warn_notice(native: Any) -> None:
    """The device's pending notice (host: mlock refused), as a
    :class:`~hf2q.ResidencyWarning`: native code never prints."""
    msg = native.take_notice()
    if msg:
        import warnings

        warnings.warn(msg, ResidencyWarning, stacklevel=3)


def _new_lock_in_child() -> None:
    # A forked child inherits the lock as it was: held, maybe, by a thread
    # that does not exist there. (The native devices' own mutexes are
    # handled by pthread_atfork in device.cpp.)
    global _native_lock
    _native_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_in_child)


@dataclass(frozen=True)
class _Backend:
    """A row of the native backend registry (csrc/device/registry.cpp)."""

    kind: str
    indexed: bool  # takes "kind:N"
    default_rank: int  # Device.default() order; -1: never by default
    prepare: bool  # hf2q._<kind>.prepare() runs before its first open


_BACKENDS: dict[str, _Backend] = {row[0]: _Backend(*row) for row in _core.backend_registry()}
_DEFAULT_ORDER: tuple[str, ...] = tuple(
    b.kind for b in sorted(_BACKENDS.values(), key=lambda b: b.default_rank) if b.default_rank >= 0
)


def _device_spec(kind: str) -> str:
    """The canonical spec of ``kind``: ``"cuda"`` is ``"cuda:0"``; unknown
    kinds raise ValueError naming the registered ones."""
    if not isinstance(kind, str):
        raise TypeError(f"device kind must be a str, got {type(kind).__name__}")
    base, sep, index = kind.partition(":")
    if base not in _BACKENDS:
        raise ValueError(f"unknown device kind {kind!r}; expected one of {', '.join(map(repr, _BACKENDS))}")
    if _BACKENDS[base].indexed:
        if sep and not (index.isdigit() and index.isascii() and len(index) <= 6):
            raise ValueError(f"bad device {kind!r}: expected '{base}' or '{base}:N' with N a device number")
        return f"{base}:{int(index) if sep else 0}"
    if sep:
        raise ValueError(f"bad device {kind!r}: the {base} device takes no index")
    return base


def _prepare_backend(kind: str) -> None:
    """A backend's Python set-up before its first open (CUDA: where NVRTC
    and the kernel cache are; it imports and searches ``sys.path``)."""
    backend = _BACKENDS[kind.partition(":")[0]]
    if backend.prepare:
        import importlib

        importlib.import_module(f"{__package__}._{backend.kind}").prepare()


def _open_native(spec: str) -> Any:
    _prepare_backend(spec)  # configured before the first open
    return _core.NativeDevice.open(spec)


def _shared_native(spec: str) -> Any:
    with _native_lock:
        dev = _native_devices.get(spec)
        if dev is None:
            dev = _open_native(spec)
            _native_devices[spec] = dev
        return dev


T = TypeVar("T")


def join_thread(thread: threading.Thread) -> None:
    """Until ``thread`` is done, whatever arrives meanwhile (its work may
    still be using memory the caller is about to free, or opening a device).
    A KeyboardInterrupt that arrives while waiting is raised once the thread
    is done."""
    def joined() -> bool | None:
        thread.join(0.05)
        return None if thread.is_alive() else True

    until_done(joined)


def until_done(poll: Callable[[], T | None]) -> T:
    """``poll()`` (a wait of its own with a short timeout) until it returns
    something, whatever arrives meanwhile: the work waited for may use
    memory the caller is about to free. A KeyboardInterrupt that arrives
    meanwhile is raised once it is done."""
    interrupted: BaseException | None = None
    try:
        while True:
            try:
                got = poll()
            except KeyboardInterrupt as e:
                interrupted = e
                continue
            if got is not None:
                return got
    finally:
        if interrupted is not None:
            raise interrupted


class DeviceOpening:
    """A device opened on a helper thread (``open_device()``, the GIL
    released in the native open) while the caller does work that does not
    need it: a loader resolving the path and opening and planning the
    checkpoint, the transformers hand-off building its model. A GPU's driver
    and context take about 0.2 s (docs/CUDA.md).

    :meth:`get` waits for it and returns it, or raises what opening raised,
    on the caller's thread; :meth:`close` waits for it and drops the outcome
    (the caller failed first: its own error says more). Either waits through
    a Ctrl-C (raised once the thread is done), so no opening outlives its
    caller's call. Where no thread could be started, the device is opened
    here, at once; in a child forked while the thread ran (the thread is not
    there), :meth:`get` opens it itself."""

    __slots__ = ("_open", "_thread", "_device", "_error")

    def __init__(self, open_device: Callable[[], "Device"]) -> None:
        self._open = open_device
        self._device: Device | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = threading.Thread(target=self._run, name="hf2q-device-open")
        try:
            self._thread.start()
        except RuntimeError:  # no thread to be had (a thread limit, interpreter shutdown): open it here
            self._thread = None
            self._device = open_device()

    def _run(self) -> None:
        try:
            self._device = self._open()
        except BaseException as e:  # noqa: BLE001 - handed to get(), raised on the caller's thread
            self._error = e

    def _wait(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            join_thread(thread)

    def get(self) -> "Device":
        self._wait()
        if self._error is not None:
            e, self._error = self._error, None
            raise e
        if self._device is None:
            self._device = self._open()
        return self._device

    def close(self) -> None:
        self._wait()
        self._error = None


def check_device_arg(device: object) -> None:
    """A loader's ``device`` argument checked, nothing opened: a
    :class:`Device`, a :class:`DeviceOpening`, None (the default device) or
    a kind hf2q knows (``"cuda"``, ``"cuda:1"``, ``"host"``); a ValueError
    for an unknown kind, a TypeError for another type."""
    if device is None or isinstance(device, (Device, DeviceOpening)):
        return
    if isinstance(device, str):
        _device_spec(device)  # ValueError for a kind hf2q does not know
        return
    raise TypeError(f"device must be an hf2q.Device, a kind such as 'cuda' or 'host', or None (the default "
                    f"device), got {type(device).__name__}")


def as_device(device: "Device | DeviceOpening | str | None") -> "Device | DeviceOpening":
    """A loader's ``device`` argument (:func:`check_device_arg`): a
    :class:`Device` as it is; None (the default device) or a kind begun on a
    helper thread (:class:`DeviceOpening`). The caller gets it with
    :func:`resolve_device` and closes it if it fails before that
    (:func:`close_device`)."""
    check_device_arg(device)
    if isinstance(device, (Device, DeviceOpening)):
        return device
    kind = device
    return open_meanwhile(kind, Device.default if kind is None else lambda: Device(kind))


def open_meanwhile(kind: str | None, open_device: Callable[[], "Device"]) -> DeviceOpening:
    """``open_device()`` (the device of ``kind``, None: the default one) on
    a helper thread. The backends' Python set-up (imports) runs first, here,
    on the calling thread: a child forked while another thread imports
    inherits that module's import lock held and waits for it forever; the
    helper thread then does native work only (the open, whose locks the
    native side holds across fork: docs/CUDA.md, "Fork")."""
    for k in (_DEFAULT_ORDER if kind is None else (kind,)):
        _prepare_backend(k)
    return DeviceOpening(open_device)


def resolve_device(device: "Device | DeviceOpening | str | None") -> "Device":
    """The device a loader was given (:func:`check_device_arg`), waiting for
    one being opened; None or a kind opened here (no helper to wait for)."""
    if isinstance(device, DeviceOpening):
        return device.get()
    check_device_arg(device)
    if isinstance(device, Device):
        return device
    return Device.default() if device is None else Device(device)


@contextmanager
def opened_meanwhile(device: "Device | DeviceOpening | str | None") -> Iterator["Device | DeviceOpening"]:
    """:func:`as_device` for a ``with`` block that opens and plans the
    checkpoint and then loads it (:func:`resolve_device` inside): an opening
    the block leaves by an error is closed first (:func:`close_device`)."""
    dev = as_device(device)
    try:
        yield dev
    except BaseException:
        close_device(dev)
        raise


def close_device(device: object) -> None:
    """After a failure: an opening's thread waited for, its outcome dropped
    (a :class:`Device` or anything else: nothing to do)."""
    if isinstance(device, DeviceOpening):
        device.close()


class Device:
    """A device: ``Device("host")``, ``Device("metal")``, ``Device("cuda")`` or
    ``Device("cuda:N")``; one native device per kind (and GPU) and process,
    so residency accounting is shared."""

    def __init__(self, kind: str = "host") -> None:
        self._native = _shared_native(_device_spec(kind))
        self.residency = Residency(self)

    @classmethod
    def _isolated(cls, kind: str = "host") -> "Device":
        """A device with its own native instance and residency accounting (tests)."""
        dev = cls.__new__(cls)
        dev._native = _open_native(_device_spec(kind))
        dev.residency = Residency(dev)
        return dev

    @classmethod
    def default(cls) -> "Device":
        """The first available in the native registry's default order: Metal
        (Apple), CUDA (a GPU with its driver and NVRTC), the host."""
        for kind in _DEFAULT_ORDER[:-1]:
            try:
                return cls(kind)
            except DeviceError:
                pass
        return cls(_DEFAULT_ORDER[-1])  # the last (the host) always opens: its error, if any, is raised

    @property
    def index(self) -> int:
        """The device number (``cuda:N``); 0 for host and Metal."""
        return int(self._native.index)

    @property
    def kind(self) -> str:
        return str(self._native.kind)

    @property
    def name(self) -> str:
        return str(self._native.name)

    @property
    def residency_enabled(self) -> bool:
        return bool(self._native.residency_enabled)

    @property
    def page_size(self) -> int:
        return int(self._native.page_size)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and other._native is self._native

    def __hash__(self) -> int:
        return id(self._native)

    def __repr__(self) -> str:
        kind = f"{self.kind}:{self.index}" if _BACKENDS[self.kind].indexed else self.kind
        return f"hf2q.Device({kind!r}, name={self.name!r}, residency_enabled={self.residency_enabled})"

    def attach_command_queue(self, queue: int) -> None:
        """Attach this device's residency sets to a consumer's command queue
        (Metal: the address of an ``id<MTLCommandQueue>`` of this device), so
        its command buffers see the weights resident; sets created later are
        attached too. Idempotent. The host backend has no queues: DeviceError."""
        if isinstance(queue, bool) or not isinstance(queue, int):
            raise TypeError(f"queue must be an int address, got {type(queue).__name__}")
        self._native.attach_queue(queue)

    def synchronize(self) -> None:
        """Wait until every upload so far is complete in device memory. On
        CUDA, uploads that need no answer from the GPU (raw copies, widening to
        f32) return once their bytes are staged, with the copies in flight;
        ``__dlpack__``, ``to_host``, ``verify`` and ``convert`` synchronize by
        themselves, so only a consumer of :attr:`Buffer.address` needs this.
        A no-op on host and Metal. Raises :class:`hf2q.DeviceError` for a
        copy that failed on the device."""
        self._native.synchronize()

    # ---------------------------------------------------------------- buffers

    def alloc(self, shape: Sequence[int] | int, dtype: str) -> Buffer:
        """A zero-filled buffer of logical ``shape`` and ``dtype`` (one of
        :data:`DTYPES`), registered in the residency set unless
        ``HF2Q_NO_RESIDENCY=1``."""
        native = self._native.alloc(list(_shape(shape)), _dtype_name(dtype))
        _warn_notice(self._native)  # an allocation may commit (and pin) what is pending
        return Buffer(native, self)

    def alloc_many(self, specs: Sequence[tuple[Sequence[int] | int, str]], *,
                   filled_by_read: Sequence[bool] | None = None) -> list[Buffer]:
        """Zero-filled buffers of ``(shape, dtype)`` each, as :meth:`alloc`
        makes them, all or none. On CUDA they share one device allocation
        (one ``cuMemAlloc`` instead of one per tensor; each buffer starts at a
        page-aligned offset), whose memory returns to the device when the last
        of them is freed; where that one block cannot be had, each gets its
        own. On host and Metal each is its own allocation.

        ``filled_by_read``: one flag per spec, true where the caller will
        write every byte of that buffer with file reads
        (:meth:`write_from_file` and the batch reads, raw copies): on the
        host such a buffer is locked without being populated first, its
        pages locked as the reads fault them in (docs/RESIDENCY.md). A hint:
        the buffers are the same either way."""
        flags = [] if filled_by_read is None else [bool(f) for f in filled_by_read]  # the core checks the count
        natives = self._native.alloc_many([(list(_shape(shape)), _dtype_name(dtype)) for shape, dtype in specs], flags)
        _warn_notice(self._native)
        return [Buffer(n, self) for n in natives]

    def _alloc_window(self, length: int, specs: Sequence[tuple[int, Sequence[int] | int, str]], *,
                      zero: bool = True) -> tuple[Buffer, list[Buffer]]:
        """One allocation of ``length`` bytes and buffers of ``(shape,
        dtype)`` placed in it at byte offsets (``hf2q convert``: the tensors
        where the file has them, the window written out as it is). Returns
        the window as a u8 buffer and the placed buffers; the memory lives
        until the last of them is gone. Zero-filled, or with ``zero=False``
        holding anything (a reused range's old bytes: the caller writes every
        byte it keeps). Host devices only (``DeviceError`` elsewhere);
        nothing is registered for residency."""
        natives = self._native.alloc_window(int(length), [(int(off), list(_shape(shape)), _dtype_name(dtype))
                                                          for off, shape, dtype in specs], bool(zero))
        return Buffer(natives[0], self), [Buffer(n, self) for n in natives[1:]]

    def _own(self, buf: Buffer) -> None:
        if not isinstance(buf, Buffer):
            raise TypeError(f"expected an hf2q.Buffer, got {type(buf).__name__}")
        if buf._device._native is not self._native:
            raise DeviceError(
                f"buffer belongs to the {buf._device.kind} device, not to this {self.kind} device"
            )

    # ---------------------------------------------------------------- uploads

    @staticmethod
    def _source(src: Any, src_dtype: str | None, to: str) -> tuple[np.ndarray, str, tuple[int, ...]]:
        from ._arrays import as_byte_array

        arr = as_byte_array(src)
        inferred = _numpy_src(arr.dtype)
        if inferred is not None:
            if src_dtype is not None and src_dtype != inferred:
                raise TypeError(f"src has dtype {arr.dtype} but src_dtype={src_dtype!r} was given")
            flat = arr.reshape(-1).view(np.uint8)
            if inferred != to and flat.ctypes.data % arr.dtype.itemsize:
                flat = flat.copy()  # conversions read aligned elements; unaligned input alone is copied
            return flat, inferred, tuple(arr.shape)
        if arr.dtype not in (np.dtype(np.uint8), np.dtype(np.uint16)):
            raise TypeError(f"src must be {_NUMPY_SRC_TEXT} or raw bytes, got dtype {arr.dtype}")
        if src_dtype is None:
            if formats.get(to).is_block:
                names = [repr(n) for n in formats.sources_of(to)]
                raise TypeError(f"raw src needs src_dtype ({_or_list(names)}) to be quantized")
            src_dtype = to
        _dtype_name(src_dtype)
        flat = arr.reshape(-1).view(np.uint8)
        if src_dtype != to and flat.ctypes.data % 4:
            flat = flat.copy()  # conversions read aligned elements; odd-address input alone is copied
        fmt = formats.get(src_dtype)
        if fmt.is_block:
            return flat, src_dtype, formats.logical_shape((flat.size,), fmt)
        itemsize = fmt.itemsize
        if flat.size % itemsize:
            raise ValueError(f"src holds {flat.size} bytes: not a multiple of the {src_dtype} element size {itemsize}")
        return flat, src_dtype, (flat.size // itemsize,)

    @staticmethod
    def _check_result(result: tuple[int, int], shape: tuple[int, ...], name: str | None,
                      src_view: np.ndarray | None = None, *, value_class: str = "", buf: Buffer | None = None,
                      src_dtype: str | None = None, check_finite: bool = False) -> None:
        first_bad, inf_scales = result
        if first_bad >= 0:
            multi = tuple(int(i) for i in np.unravel_index(first_bad, shape)) if len(shape) > 1 else None
            cls = value_class or (_value_class(src_view, first_bad) if src_view is not None else "nan")
            where = f" in '{name}'" if name else ""
            pos = f" {multi}" if multi is not None else ""
            raise NonFiniteError(
                f"non-finite input{where} at flat index {first_bad}{pos}: {cls}",
                index=first_bad, multi_index=multi, value_class=cls, tensor=name,
            )
        if inf_scales:
            fmt = buf.dtype if buf is not None else "q8_0"
            if check_finite and buf is not None:
                raise scale_overflow_error(buf.to_host(), fmt, shape, name, src_dtype)
            import warnings

            where = f"'{name}'" if name else "tensor"
            warnings.warn(
                f"{where}: {inf_scales} {fmt.upper()} block scale(s) overflow float16 and are stored as +-Inf "
                "(as ggml's reference quantizer does)",
                ScaleOverflowWarning,
                stacklevel=3,
            )

    def write(self, buf: Buffer, src: Any, *, offset: int = 0, src_dtype: str | None = None,
              name: str | None = None, check_finite: bool = False) -> None:
        """Write ``src`` into ``buf`` from logical element ``offset`` on,
        converting as needed (same dtype: raw copy; bf16/f16 -> f32;
        f32/f16/bf16 -> q8_0, ``offset`` a multiple of 32). ``check_finite``:
        a block scale that overflows float16 (finite input too large for the
        block format) raises :class:`~hf2q.NonFiniteError` instead of the
        :class:`~hf2q.ScaleOverflowWarning` (NaN/Inf input is refused by the
        quantizers always)."""
        self._own(buf)
        offset = _offset(offset)
        flat, sdt, _ = self._source(src, src_dtype, buf.dtype)
        first_bad, inf_scales = self._native.write(buf._native, offset, flat, sdt)
        # Non-finite positions are reported in the buffer's tensor, as for files. (Typed only then: a
        # bf16 view imports ml_dtypes.)
        cls = _value_class(_typed_view(flat, sdt), first_bad) if first_bad >= 0 else ""
        self._check_result((first_bad + offset if first_bad >= 0 else -1, inf_scales), buf.shape, name,
                           value_class=cls, buf=buf, src_dtype=sdt, check_finite=check_finite)

    def upload(self, src: Any, to: str | None = None, shape: Sequence[int] | None = None, *,
               src_dtype: str | None = None, name: str | None = None, check_finite: bool = False) -> Buffer:
        """A new buffer of dtype ``to`` holding ``src`` (a raw little-endian
        buffer or an ndarray of bf16/f16/f32). Decode and quantize kernels
        write straight into the buffer; no staging array. ``check_finite``
        as for :meth:`write`."""
        to = _dtype_name(to if to is not None else (_numpy_src(getattr(src, "dtype", None)) or "u8"))
        flat, sdt, src_shape = self._source(src, src_dtype, to)
        out_shape = _shape(shape) if shape is not None else src_shape
        numel, want = _numel(src_shape), _numel(out_shape)
        if want != numel:
            raise ValueError(f"shape {out_shape} holds {want} elements but src has {numel}")
        buf = self.alloc(out_shape, to)
        try:
            result = self._native.write(buf._native, 0, flat, sdt)
            self._check_result(result, out_shape, name, _typed_view(flat, sdt) if result[0] >= 0 else None,
                               buf=buf, src_dtype=sdt, check_finite=check_finite)
        except BaseException as e:
            del buf  # free now, not when the traceback's frames go
            raise _detached(e)
        return buf

    def write_from_file(self, buf: Buffer, file: PathOrFd, file_offset: int, nbytes: int, src_dtype: str, *,
                        offset: int = 0, name: str | None = None, check_finite: bool = False) -> None:
        """``pread`` ``nbytes`` of ``src_dtype`` data at ``file_offset`` into
        ``buf`` from element ``offset`` on: straight into the buffer for raw
        copies, through small per-thread chunks for conversions, in parallel.

        A path is opened without blocking and must be a regular file; the
        range must lie inside it; a file (path or fd) whose device, inode,
        size or modification time changed during the read raises
        :class:`FileReadError`. ``check_finite``: raw copies and decodes of
        float data raise :class:`~hf2q.NonFiniteError` on a NaN/Inf element
        too, found during the read (quantization always refuses them), and a
        quantization whose float16 block scale overflows (finite values too
        large for the block format) raises it instead of warning."""
        self._own(buf)
        _dtype_name(src_dtype)
        offset = _offset(offset)
        if file_offset < 0 or nbytes < 0:
            raise ValueError("file_offset and nbytes must be >= 0")
        with _opened(file) as fd:
            before = _fd_identity(file, fd)
            if before is not None and before[2] - file_offset < nbytes:
                raise _file_error(file, name, f"unexpected end of file: {nbytes} bytes at offset {file_offset} run "
                                  f"past the end of the {before[2]}-byte file (file truncated or rewritten?)", "FileTruncated")
            try:
                result = self._native.read_file(buf._native, int(offset), fd, int(file_offset), int(nbytes), src_dtype,
                                                bool(check_finite))
            except FileReadError as e:
                # Built by a helper: a local holding the new error would make a
                # cycle (error -> traceback -> this frame -> error) that keeps
                # `buf` alive until the cycle collector runs.
                raise _file_read_error(file, name, e) from None
            if before is not None and before != _fd_identity(file, fd):
                raise _file_error(file, name, "the file was modified while it was read (device, inode, size or "
                                  "modification time changed)")
            cls = _file_value_class(fd, file_offset, result[0], src_dtype) if result[0] >= 0 else ""
        first_bad = result[0] + offset if result[0] >= 0 else -1
        self._check_result((first_bad, result[1]), buf.shape, name, value_class=cls, buf=buf, src_dtype=src_dtype,
                           check_finite=check_finite)

    def write_from_file_segments(self, buf: Buffer, file: PathOrFd, segments: Sequence[tuple[int, int, int]],
                                 src_dtype: str, *, name: str | None = None, check_finite: bool = False) -> None:
        """Several ranges of one file into ``buf`` in one call: ``segments`` are
        ``(offset, file_offset, nbytes)`` triples (``offset`` in elements of
        ``buf``), converted as :meth:`write_from_file` does. On a GPU the
        segments share one pipeline of staged copies (an expert stack gathered
        from per-expert tensors), instead of one round trip each; where the
        CPU addresses the memory, the segments are read (and converted) on
        every thread at once. Opening, file identity and ``check_finite`` as
        for :meth:`write_from_file`."""
        self._own(buf)
        _dtype_name(src_dtype)
        segs = _checked_segments(segments)
        with _opened(file) as fd:
            before = _fd_identity(file, fd)
            try:
                result = self._native.read_file_segments(buf._native, [(o, fd, f, n) for o, f, n in segs], src_dtype,
                                                         bool(check_finite))
            except FileReadError as e:
                raise _file_read_error(file, name, e) from None
            if before is not None and before != _fd_identity(file, fd):
                raise _file_error(file, name, "the file was modified while it was read (device, inode, size or "
                                  "modification time changed)")
            cls = _segment_value_class(fd, segs, result[0], src_dtype)
        self._check_result(result, buf.shape, name, value_class=cls, buf=buf, src_dtype=src_dtype,
                           check_finite=check_finite)

    def write_from_file_batch(self, jobs: Sequence[tuple[Any, ...]], *,
                              check_finite: bool = False) -> list[tuple[int, int]]:
        """Many buffers' file ranges in one call: each job is ``(buf, file,
        segments, src_dtype, name)``, its ``segments`` as for
        :meth:`write_from_file_segments`. On a GPU all jobs share one pipeline
        of staged copies, so the staging ring and the copy engine stay busy
        from one tensor to the next (a loader's run of tensors); where the CPU
        addresses the memory, all jobs' segments are cut into pieces that
        run on every thread at once (one 2 MiB expert at a time would keep
        all but one thread idle), copied straight into the buffers or
        converted through a small per-thread chunk, and once a read fails the
        later jobs' pieces are skipped. Every job is checked before any byte
        is read. Errors as for :meth:`write_from_file_segments`: a read that
        fails names the job that failed (where the backend says which: where
        the CPU addresses the memory always, the earliest in order when
        several did; else the first job whose ranges the file no longer
        holds, else the first job); non-finite input names the first job, in order, that
        holds it.

        A job may carry a sixth element, ``(scale, rows, cols, block_rows,
        block_cols, base)``: its file bytes are block-scaled FP8 weights
        (``src_dtype`` ``f8_e4m3`` / ``f8_e5m2``, each segment whole rows), a
        stack of ``rows`` x ``cols`` matrices starting at element ``base`` of
        ``buf``, decoded as they are read (on a GPU inside the staging
        pipeline) with the scale grids that ``scale`` (an f32 buffer of this
        device, written before the call) holds end to end (docs/FP8.md).
        Such a job's result is not checked here: the returned list holds each
        job's ``(first non-finite buffer element or -1, Q8_0 blocks whose
        scale overflowed)``, for the caller to judge."""
        return self._run_file_batch(self._prepare_file_batch(jobs, check_finite=check_finite))

    def _prepare_file_batch(self, jobs: Sequence[tuple[Any, ...]], *, check_finite: bool = False) -> _FileBatch:
        """The checks and conversions of :meth:`write_from_file_batch`, no
        byte read: every job checked, its files opened, its segments
        converted for the native core. A loader prepares a batch while the
        one before it is read, so the call that reads it
        (:meth:`_run_file_batch`, or :meth:`_start_file_batch` into a queue
        then :meth:`_finish_file_batch`; ``close()`` if it never runs) does
        no per-segment work in Python."""
        planned = []
        for job in jobs:
            buf, file, segments, src_dtype, name = job[:5]
            scaled = job[5] if len(job) > 5 else None
            self._own(buf)
            _dtype_name(src_dtype)
            if scaled is not None:
                self._own(scaled[0])
                scaled = (scaled[0]._native, *(int(v) for v in scaled[1:]))
            planned.append((buf, file, _checked_segments(segments), src_dtype, name, scaled))
        batch = _FileBatch(planned, bool(check_finite))
        if not planned:
            return batch
        try:
            fds: dict[Any, int] = {}  # each file opened once: by path, or the fd itself
            for _, file, _, _, _, _ in planned:
                key = file if isinstance(file, int) and not isinstance(file, bool) else os.fspath(file)
                if key not in fds:
                    fds[key] = batch.files.enter_context(_opened(file))
                batch.fd_of.append(fds[key])
            batch.native = _core.NativeFileBatch(
                [(buf._native, [(o, fd, f, n) for o, f, n in segs], src_dtype, batch.check_finite and scaled is None,
                  scaled)
                 for (buf, _, segs, src_dtype, _, scaled), fd in zip(planned, batch.fd_of)])
        except BaseException:
            batch.close()
            raise
        return batch

    def _run_file_batch(self, batch: _FileBatch) -> list[tuple[int, int]]:
        """Reads a batch that :meth:`_prepare_file_batch` made ready (the
        second half of :meth:`write_from_file_batch`, its errors and
        results); its files are closed after."""
        return self._finish_file_batch(self._start_file_batch(batch))

    def _batch_queue(self) -> Any:
        """A queue that reads prepared batches in order on a native thread of
        its own (:meth:`_start_file_batch`; ``close()`` it when done)."""
        return _core.FileBatchQueue(self._native)

    def _start_file_batch(self, batch: _FileBatch, queue: Any = None, after: _FileBatch | None = None,
                          transposes: Sequence[tuple[Any, ...]] = ()) -> _FileBatch:
        """:meth:`_run_file_batch` begun: the files' identities taken and,
        with ``queue`` (:meth:`_batch_queue`), the batch planned and queued
        there (read after those queued before it, while this thread goes
        on; ``after``: a batch of the same queue whose failure means this one
        is not read; ``transposes``: ``transpose_units_many`` items run by
        the queue once the read succeeded). Then :meth:`_finish_file_batch`
        once, or ``close()`` to let it go (a queued batch is waited for
        first)."""
        if transposes and queue is None:
            raise ValueError("unit transposes ride with a queued batch only")
        if batch.native is None:
            if batch.planned:
                raise ValueError("a prepared file batch runs once")
            return batch
        batch.before = {fd: _fd_identity(fd, fd) for fd in set(batch.fd_of)}
        if queue is not None:
            native, batch.native = batch.native, None
            batch.ticket = queue.submit(native, after.ticket if after is not None and after.ticket else 0,
                                        [(b._native, *spec) for b, *spec in transposes])
            batch.queue = queue
        return batch

    def _wait_file_batch(self, batch: _FileBatch) -> list[tuple[int, int]]:
        """A started batch's raw results: read here, or waited for in its queue."""
        if batch.queue is None:
            native, batch.native = batch.native, None
            return self._native.read_prepared_file_batch(native)
        return batch.wait_queued()

    def _finish_file_batch(self, batch: _FileBatch) -> list[tuple[int, int]]:
        """The rest of :meth:`_run_file_batch` for a batch
        :meth:`_start_file_batch` began: read (or waited for), its errors
        and results checked, its files closed."""
        if batch.native is None and batch.queue is None:
            if batch.planned:
                raise ValueError("a prepared file batch runs once")
            return []
        planned, fd_of, check_finite = batch.planned, batch.fd_of, batch.check_finite
        with batch.files:
            before = batch.before
            try:
                results = self._wait_file_batch(batch)
            except FileReadError as e:
                bad = getattr(e, "job", -1)  # set natively where the backend knows (host: always)
                if not isinstance(bad, int) or not 0 <= bad < len(planned):
                    bad = 0
                    for i, ((_, _, segs, _, _, _), fd) in enumerate(zip(planned, fd_of)):
                        size = os.fstat(fd).st_size
                        if any(foff + n > size for _, foff, n in segs):
                            bad = i
                            break
                raise _file_read_error(planned[bad][1], planned[bad][4], e, bad) from None
            for i, ((_, file, _, _, name, _), fd) in enumerate(zip(planned, fd_of)):
                if before[fd] is not None and before[fd] != _fd_identity(file, fd):
                    raise _file_error(file, name, "the file was modified while it was read (device, inode, size "
                                      "or modification time changed)")
            for (buf, _, segs, src_dtype, name, scaled), fd, result in zip(planned, fd_of, results):
                if scaled is not None:
                    continue  # the caller judges a scaled decode's products
                cls = _segment_value_class(fd, segs, result[0], src_dtype)
                self._check_result(tuple(result), buf.shape, name, value_class=cls, buf=buf, src_dtype=src_dtype,
                                   check_finite=check_finite)
        return [(int(a), int(b)) for a, b in results]

    def upload_from_file(self, file: PathOrFd, offset: int, nbytes: int, src_dtype: str, to: str,
                         shape: Sequence[int], *, name: str | None = None, check_finite: bool = False) -> Buffer:
        """A new buffer of dtype ``to`` and ``shape`` filled from ``nbytes`` of
        ``src_dtype`` data at ``offset`` in a file (path or open fd)."""
        want = _source_nbytes(_numel(_shape(shape)), _dtype_name(src_dtype))
        if nbytes != want:
            raise ValueError(f"{nbytes} bytes of {src_dtype} do not fill shape {tuple(shape)}: expected {want}")
        buf = self.alloc(shape, to)
        try:
            self.write_from_file(buf, file, offset, nbytes, src_dtype, name=name, check_finite=check_finite)
        except BaseException as e:
            del buf  # inner frames in the traceback would keep it alive
            raise _detached(e)
        return buf

    def convert(self, buf: Buffer, to: str, *, name: str | None = None) -> Buffer:
        """A new buffer of dtype ``to`` holding ``buf`` converted on this device
        (GPU kernels on CUDA; the CPU kernels on host and Metal): the
        conversions of :meth:`write` (bf16/f16 -> f32, f32/f16/bf16 -> q8_0,
        same dtype: a copy)."""
        self._own(buf)
        out = self.alloc(buf.shape, _dtype_name(to))
        try:
            self._convert_into(out, buf, name=name)
        except BaseException as e:
            del out
            raise _detached(e)
        return out

    def _convert_into(self, out: Buffer, buf: Buffer, *, name: str | None = None, check_finite: bool = False) -> None:
        """:meth:`convert` into an existing buffer ``out`` of ``buf``'s
        element count (the loader's transient -> placed buffer); a non-finite
        input is a NonFiniteError naming the value found in ``buf``."""
        result = self._native.convert(out._native, buf._native)
        cls = ""
        if result[0] >= 0:  # the offending value, read back from the source
            fmt = formats.get(buf.dtype)
            one = buf._storage_bytes(fmt.storage_bytes(result[0]), fmt.storage_bytes(result[0] + 1))
            cls = _value_class(one.view(fmt.storage_dtype), 0)
        self._check_result(result, buf.shape, name, value_class=cls, buf=out, src_dtype=buf.dtype,
                           check_finite=check_finite)

    # ------------------------------------------------------------ read-back

    def verify(self, buf: Buffer) -> VerifyReport:
        """Read ``buf`` back through the device (GPU kernels on Metal, the CPU
        kernels on the host) and compare per-group checksums with a numpy decode
        of its bytes. Raises :class:`hf2q.DeviceError` on a mismatch."""
        self._own(buf)
        t0 = time.perf_counter()
        device_sums = np.asarray(self._native.checksums(buf._native))
        cpu_sums = reference_checksums(buf)
        bad = np.flatnonzero(device_sums != cpu_sums)
        seconds = time.perf_counter() - t0
        if bad.size:
            raise DeviceError(
                f"read-back mismatch on the {self.kind} device for {buf!r}: {bad.size} of {cpu_sums.size} "
                f"checksum groups differ (first: {bad[:8].tolist()})"
            )
        return VerifyReport(True, int(cpu_sums.size), (), seconds)


def _storage_typed(arr: np.ndarray, dtype: str) -> np.ndarray:
    """The native view re-typed as :mod:`hf2q.formats` says (bf16 -> ml_dtypes.bfloat16)."""
    storage = formats.get(dtype).storage_dtype
    return arr.view(storage) if storage != arr.dtype else arr


def _detached(e: BaseException) -> BaseException:
    """`e` without the frames (traceback, chained exceptions) that would keep a
    failed upload's buffer alive until the exception is cleared."""
    e.__context__ = None
    e.__cause__ = None
    return e.with_traceback(None)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _typed_view(flat: np.ndarray, sdt: str) -> np.ndarray | None:
    """The source's elements typed (for naming a non-finite one); None for block formats."""
    dt = formats.get(sdt).numpy_dtype
    return flat.view(dt) if dt is not None else None


def _or_list(items: Sequence[str]) -> str:
    """``a, b or c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


_NUMPY_SRC_TEXT = ", ".join(str(dt) for dt in _NUMPY_SRC)  # "float32, float16, bfloat16, int32"


def _offset(offset: int) -> int:
    if not _is_int(offset):
        raise TypeError(f"offset must be an int, got {type(offset).__name__}")
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    return int(offset)


def _source_nbytes(numel: int, src_dtype: str) -> int:
    return formats.get(src_dtype).storage_bytes(numel)


def scale_overflow_error(stored: np.ndarray, fmt: str, shape: Sequence[int], name: str | None,
                         src_dtype: str | None = None, offset: int = 0) -> NonFiniteError:
    """The :class:`~hf2q.NonFiniteError` of a block-format tensor whose
    quantizer stored a float16 block scale as +-Inf (finite input too large
    for the format): the first element that decodes non-finite, its class,
    and ``step`` ``"quantization SRC->FMT"``. ``stored``: the tensor's bytes
    from element ``offset`` on (a piece of it), ``shape`` the whole tensor's."""
    from .ops import dequantize

    fmt = formats.get(fmt).name
    with np.errstate(all="ignore"):
        y = dequantize(np.ascontiguousarray(stored).reshape(-1).view(np.uint8), fmt).reshape(-1)
    bad = np.flatnonzero(~np.isfinite(y))
    i = int(bad[0]) if bad.size else 0
    cls = _value_class(y, i) if bad.size else "+inf"
    i += offset
    shape = tuple(int(d) for d in shape)
    multi = tuple(int(j) for j in np.unravel_index(i, shape)) if len(shape) > 1 else None
    block = formats.get(fmt).block_elems
    where = f" in '{name}'" if name else ""
    pos = f" {multi}" if multi is not None else ""
    step = f"quantization {formats.get(src_dtype).name}->{fmt}" if src_dtype else f"quantization to {fmt}"
    return NonFiniteError(
        f"non-finite weight{where} at flat index {i}{pos}: {cls} (made by the {step}: the float16 scale of its "
        f"block of {block} overflows, the block's finite values being too large for {fmt}; ggml's quantizer "
        f"stores the same Inf scale)", index=i, multi_index=multi, value_class=cls, tensor=name, step=step)


def _value_class(view: np.ndarray | None, index: int) -> str:
    from ._arrays import value_class

    return value_class(float(view.reshape(-1)[index])) if view is not None else "nan"


def _file_value_class(fd: int, file_offset: int, index: int, src_dtype: str) -> str:
    """``nan``/``+inf``/``-inf`` of the element at ``index`` in a file."""
    dt = formats.get(src_dtype).storage_dtype
    raw = np.empty(dt.itemsize, dtype=np.uint8)
    try:
        _core.read_file(fd, file_offset + index * dt.itemsize, raw)  # the one native reader
    except FileReadError:
        return "nan"
    return _value_class(raw.view(dt), 0)


class _FileBatch:
    """A :meth:`Device.write_from_file_batch` call made ready by
    :meth:`Device._prepare_file_batch`: the checked jobs, their files (opened
    here where a job names a path; closed by the run or by ``close()``) and
    the native jobs, which hold the buffers by address (the jobs here keep
    them alive)."""

    __slots__ = ("planned", "check_finite", "files", "fd_of", "native", "before", "queue", "ticket", "ended")

    def __init__(self, planned: list[tuple[Any, ...]], check_finite: bool) -> None:
        from contextlib import ExitStack

        self.planned = planned
        self.check_finite = check_finite
        self.files = ExitStack()
        self.fd_of: list[int] = []
        self.native: Any = None
        self.before: dict[int, Any] = {}  # each file's identity as the batch began (Device._start_file_batch)
        self.queue: Any = None  # the queue it was submitted to, until waited for
        self.ticket = 0
        self.ended: float | None = None  # when a queued batch's reads ended (perf_counter)

    def wait_queued(self) -> list[tuple[int, int]]:
        """The results of a batch submitted to a queue (its error raised),
        once it ended, whatever arrives meanwhile: its reads may be using
        memory the caller is about to free, so a KeyboardInterrupt is raised
        once it ended. The ticket is spent either way."""
        queue, ticket, self.queue = self.queue, self.ticket, None
        results, ago = until_done(lambda: queue.wait(ticket, 0.05))
        self.ended = time.perf_counter() - ago
        return results

    def close(self) -> None:
        """Let the batch go unread (one in a queue: waited for first, its
        error dropped, since the caller is failing already): its files
        closed, nothing kept."""
        self.native = None
        try:
            if self.queue is not None:
                try:
                    self.wait_queued()
                except Exception:
                    pass
        finally:
            self.files.close()


def _checked_segments(segments: Sequence[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """``(element offset, file offset, bytes)`` triples as ints, none negative."""
    segs = []
    for off, foff, n in segments:
        if foff < 0 or n < 0:
            raise ValueError("file_offset and nbytes must be >= 0")
        segs.append((_offset(off), int(foff), int(n)))
    return segs


def _segment_value_class(fd: int, segs: list[tuple[int, int, int]], first_bad: int, src_dtype: str) -> str:
    """What the non-finite buffer element ``first_bad`` (if >= 0) is, read
    back from the segment of the file it came from ("" when none is)."""
    if first_bad < 0:
        return ""
    esize = formats.get(src_dtype).itemsize
    for off, foff, n in segs:
        if off <= first_bad < off + n // esize:
            return _file_value_class(fd, foff, first_bad - off, src_dtype)
    return ""


def _file_read_error(file: PathOrFd, name: str | None, e: BaseException, job: int = -1) -> FileReadError:
    from .errors import SYSTEM_ERRNOS

    what = f" for '{name}'" if name else ""
    err = FileReadError(f"{_describe(file)}{what}: {e}")
    err.reason = str(e)  # without the file/tensor prefix, for callers that name them
    err.code = getattr(e, "code", "Io")  # set natively: "FileTruncated" or "Io"
    err.job = job  # type: ignore[attr-defined]  # (a batch: the job that failed)
    if getattr(e, "system_errno", None) in SYSTEM_ERRNOS:  # EIO: the machine, not the file (exit 1)
        err.system_failure = True
        err.system_errno = e.system_errno  # type: ignore[attr-defined]
    return err


def _file_error(file: PathOrFd, name: str | None, reason: str, code: str = "Io") -> FileReadError:
    # Returned, not raised here: see write_from_file (no local holds the error).
    err = FileReadError(f"{_describe(file)}{_for(name)}: {reason}")
    err.reason = reason  # type: ignore[attr-defined]
    err.code = code
    return err


def _for(name: str | None) -> str:
    return f" for '{name}'" if name else ""


def _fd_identity(file: PathOrFd, fd: int) -> tuple[int, int, int, int] | None:
    """(device, inode, size, mtime) of a regular file behind ``fd`` (None
    for a borrowed fd of another kind: a pipe's reads fail on their own).
    A plain tuple: called twice per file read, so kept cheap."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None  # a bad fd: the read reports it
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) if _S_ISREG(st.st_mode) else None


def _describe(file: PathOrFd) -> str:
    return f"fd {file}" if isinstance(file, int) else os.fspath(file)


def _opened(file: PathOrFd) -> AbstractContextManager[int]:
    """Context manager yielding an fd: opens a path read-only (without
    blocking, regular files only: a FIFO must not hang us; owned as
    :func:`hf2q._files.open_owned` owns it), or borrows an fd."""
    if isinstance(file, bool):
        raise TypeError("file must be a path or an int file descriptor")
    if isinstance(file, int):
        return nullcontext(file)
    from ._files import open_owned

    path = os.fspath(file)

    def error(reason: str, e: OSError | None) -> FileReadError:
        if e is not None:
            return FileReadError(e.errno, f"cannot open {path!s}: {e.strerror}")
        return FileReadError(f"{path!s}: {reason}")

    return open_owned(path, error)


_GROUP = int(_core.VERIFY_GROUP)


def reference_checksums(buf: Buffer, chunk_groups: int = 4096) -> np.ndarray:
    """Per-group checksums of ``buf``'s decoded float32 values computed with
    numpy (:mod:`hf2q.reference` decoders), in chunks to bound memory (on a
    GPU each chunk is copied to the host first)."""
    from . import reference

    weights = (2 * np.arange(_GROUP, dtype=np.uint32) + 1).astype(np.uint32)
    numel = buf.numel
    ngroups = -(-numel // _GROUP)
    out = np.empty(ngroups, dtype=np.uint32)
    dtype = buf.dtype
    for g0 in range(0, ngroups, chunk_groups):
        g1 = min(ngroups, g0 + chunk_groups)
        e0, e1 = g0 * _GROUP, min(numel, g1 * _GROUP)
        fmt = formats.get(dtype)
        b0, b1 = fmt.storage_bytes(e0), fmt.storage_bytes(e1)  # group bounds are whole blocks
        bits = reference.readback_bits(dtype, buf._storage_bytes(b0, b1))
        padded = np.zeros((g1 - g0) * _GROUP, dtype=np.uint32)
        padded[: bits.size] = bits
        with np.errstate(over="ignore"):
            out[g0:g1] = (padded.reshape(-1, _GROUP) * weights).sum(axis=1, dtype=np.uint32)
    return out


def register_weight_buffer(device: Device, buf: Buffer) -> bool:
    """Add ``buf`` to ``device``'s residency set (idempotent). Returns whether
    it is in a set (False when residency is disabled or over the wired budget).
    A buffer of another device is refused with :class:`hf2q.DeviceError`."""
    device._own(buf)
    return bool(device._native.register_buffer(buf._native))
