"""Fuzz target: device buffers and uploads (hf2q.Device on the host backend).

Each input runs a short program of random actions on a private host device:
``alloc``, ``write``, ``upload``, ``write_from_file``, ``upload_from_file``
(path or fd: the scratch file, a closed fd, -1, a directory, a pipe, huge
numbers), ``verify``, writes through ``numpy()`` views, residency
``end``/``request``/``commit``, ``register_weight_buffer``, dropping buffers.
Sizes, offsets, shapes and dtypes are random, edge values included. Oracle:

* exceptions: :class:`hf2q.Hf2qError` or ``TypeError``/``ValueError``/
  ``OverflowError`` only;
* a successful upload/write holds exactly what the numpy reference computes
  from the source (raw bytes, bf16/f16 -> f32, -> q8_0);
* ``verify`` passes for every live buffer;
* when the input's buffers are dropped, the residency count is back to where
  it was (no buffer leaked by a failed call).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import atheris  # noqa: E402
import ml_dtypes  # noqa: E402  (hf2q imports it only when asked for a bfloat16 view)
import numpy as np  # noqa: E402

from _gen import EDGE_INTS, array, container, pick, raw_bytes, small_or_edge_int  # noqa: E402
from _harness import OracleFailure, check_no_buffers, expect, hf2q, run, scratch_dir  # noqa: E402

DTYPES = ["f32", "f16", "bf16", "u8", "i32", "q8_0"]
SRC_DTYPES = DTYPES + [None, "f64", "", "F32", 3]
BF16 = np.dtype(ml_dtypes.bfloat16)
ITEM = {"f32": 4, "i32": 4, "f16": 2, "bf16": 2, "u8": 1}
MAX_BYTES = 4 << 20  # per buffer the harness lets through
HUGE_BYTES = 1 << 47  # beyond any address space: allocation must be refused

_DIR = scratch_dir("dev")
_FILE = _DIR / "data.bin"
_DEV = hf2q.Device._isolated("host")
_RD, _WR = os.pipe()
_DIRFD = os.open(_DIR, os.O_RDONLY)
_CLOSED = os.open(os.devnull, os.O_RDONLY)
os.close(_CLOSED)


def _nbytes(shape, dtype) -> int | None:
    """Bytes the buffer would take, or None when the call is bound to fail."""
    try:
        n = 1
        for d in shape:
            if not isinstance(d, (int, np.integer)) or d < 0:
                return None
            n *= int(d)
    except TypeError:
        return None
    return n * ITEM.get(dtype, 2)


def _safe_shape(shape, dtype) -> bool:
    """Keep the harness itself from asking for gigabytes that do exist: a
    shape is either small or impossibly large."""
    n = _nbytes(shape, dtype)
    return n is None or n <= MAX_BYTES or n >= HUGE_BYTES


def _shape(fdp: atheris.FuzzedDataProvider):
    kind = fdp.ConsumeIntInRange(0, 15)
    if kind == 0:
        return pick(fdp, [(), 5, -3, (2.5,), "abc", None, (True, 32), [np.int64(4), 32]])
    if kind == 1:  # zero elements, the other dimensions anything (issue 26: no overflow, an empty buffer)
        dims = [pick(fdp, [1, 3, 32, 2**31, 2**62, 2**63 - 1]) for _ in range(fdp.ConsumeIntInRange(1, 3))]
        dims.insert(fdp.ConsumeIntInRange(0, len(dims)), 0)
        return tuple(dims)
    rank = fdp.ConsumeIntInRange(1, 3)
    dims = [small_or_edge_int(fdp, 64) for _ in range(rank)]
    if fdp.ConsumeBool():
        dims[-1] = 32 * fdp.ConsumeIntInRange(1, 4)
    return tuple(dims)


def _expected(src: np.ndarray, sdt: str, to: str) -> bytes | None:
    """What a buffer of dtype `to` holds after writing flat source bytes of
    dtype `sdt`, by the numpy reference; None where that is unspecified."""
    ref = hf2q.reference
    u8 = src.reshape(-1).view(np.uint8)
    if sdt == to:
        return u8.tobytes()
    if to == "f32" and sdt in ("bf16", "f16"):
        return (ref.bf16_to_f32 if sdt == "bf16" else ref.f16_to_f32)(u8).tobytes()
    if to == "q8_0" and sdt in ("f32", "f16", "bf16"):
        dt = {"f32": np.float32, "f16": np.float16, "bf16": BF16}[sdt]
        x = u8.view(dt)
        if x.size == 0 or x.size % 32:
            return None
        try:
            return ref.quantize_q8_0(x.reshape(-1, 32)).tobytes()
        except hf2q.NonFiniteError:
            return None
    return None


class Program:
    def __init__(self, fdp: atheris.FuzzedDataProvider) -> None:
        self.fdp = fdp
        self.bufs: list[hf2q.Buffer] = []

    def buf(self):
        if self.bufs and self.fdp.ConsumeIntInRange(0, 7):
            return pick(self.fdp, self.bufs)
        return pick(self.fdp, [None, 3, np.zeros(4, np.float32)]) if not self.bufs else self.bufs[0]

    def file_arg(self, path_ok: bool = True):
        k = self.fdp.ConsumeIntInRange(0, 9)
        if k <= 3 and path_ok:
            return str(_FILE) if k else _FILE
        if k <= 6:
            return self._fd
        return pick(self.fdp, [-1, _CLOSED, _RD, _DIRFD, 1 << 31, 1 << 40, str(_DIR / "missing"), str(_DIR), True])

    def check_contents(self, buf: hf2q.Buffer, elem_offset: int, src_bytes: bytes, sdt: str) -> None:
        src = np.frombuffer(src_bytes, np.uint8)
        want = _expected(src, sdt, buf.dtype)
        if want is None:
            return
        start = elem_offset * ITEM[buf.dtype] if buf.dtype != "q8_0" else elem_offset // 32 * 34
        got = buf.numpy().reshape(-1).view(np.uint8)[start : start + len(want)].tobytes()
        if got != want:
            raise OracleFailure(f"{buf!r}: contents after a {sdt} -> {buf.dtype} write differ from the reference")

    def step(self) -> None:
        fdp = self.fdp
        action = fdp.ConsumeIntInRange(0, 13)
        if action == 0:  # alloc
            shape, dtype = _shape(fdp), pick(fdp, DTYPES + ["x", None])
            if _safe_shape(shape, dtype):
                self.bufs.append(_DEV.alloc(shape, dtype))
        elif action in (1, 2):  # upload from memory
            src_arr = array(fdp)
            src = container(fdp, src_arr)
            to = pick(fdp, DTYPES + [None])
            shape = _shape(fdp) if fdp.ConsumeIntInRange(0, 3) == 0 else None
            sdt = pick(fdp, SRC_DTYPES) if fdp.ConsumeBool() else None
            if shape is not None and not _safe_shape(shape, to or "u8"):
                return
            buf = _DEV.upload(src, to, shape, src_dtype=sdt, name="fuzz")
            self.bufs.append(buf)
            typed = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", BF16: "bf16"}
            if isinstance(src, np.ndarray) and src.dtype in typed:
                sdt = typed[src.dtype]
            elif sdt is None:
                sdt = buf.dtype
            self.check_contents(buf, 0, src_arr.tobytes(), sdt)
        elif action == 3:  # write into an existing buffer
            buf = self.buf()
            src_arr = array(fdp)
            off = small_or_edge_int(fdp, 300)
            sdt = pick(fdp, SRC_DTYPES) if fdp.ConsumeBool() else None
            src = container(fdp, src_arr)
            _DEV.write(buf, src, offset=off, src_dtype=sdt, name="fuzz")
            typed = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", BF16: "bf16"}
            if isinstance(src, np.ndarray) and src.dtype in typed:
                sdt = typed[src.dtype]
            elif sdt is None:
                sdt = buf.dtype
            self.check_contents(buf, off, src_arr.tobytes(), sdt)
        elif action in (4, 5):  # upload_from_file / write_from_file
            off = small_or_edge_int(fdp, 4200)
            nbytes = small_or_edge_int(fdp, 4200)
            sdt = pick(fdp, SRC_DTYPES)
            file = self.file_arg()
            if action == 4:
                shape = _shape(fdp)
                to = pick(fdp, DTYPES)
                if not _safe_shape(shape, to):
                    return
                buf = _DEV.upload_from_file(file, off, nbytes, sdt, to, shape, name="fuzz")
                self.bufs.append(buf)
                eoff = 0
            else:
                buf = self.buf()
                eoff = small_or_edge_int(fdp, 300)
                _DEV.write_from_file(buf, file, off, nbytes, sdt, offset=eoff, name="fuzz")
            if isinstance(sdt, str) and isinstance(buf, hf2q.Buffer) and 0 <= off and off + nbytes <= len(self.data):
                self.check_contents(buf, eoff, self.data[off : off + nbytes], sdt)
        elif action == 6 and self.bufs:  # verify
            _DEV.verify(pick(fdp, self.bufs))
        elif action == 7 and self.bufs:  # write through the view, then verify
            b = pick(fdp, self.bufs)
            v = b.numpy().reshape(-1).view(np.uint8)
            chunk = fdp.ConsumeBytes(min(v.size, fdp.ConsumeIntInRange(0, 512)))
            start = fdp.ConsumeIntInRange(0, max(0, v.size - len(chunk)))
            v[start : start + len(chunk)] = np.frombuffer(chunk, np.uint8)
            _DEV.verify(b)
        elif action == 8:
            op = fdp.ConsumeIntInRange(0, 3)
            if op == 0:
                _DEV.residency.end()
            elif op == 1:
                _DEV.residency.request()
            elif op == 2:
                _DEV.residency.commit()
            else:
                hf2q.register_weight_buffer(_DEV, self.buf())
        elif action == 9 and self.bufs:  # drop one
            self.bufs.pop(fdp.ConsumeIntInRange(0, len(self.bufs) - 1))
        elif action == 10:  # misuse of the device API itself
            pick(fdp, [lambda: _DEV.alloc(_shape(fdp), 7), lambda: _DEV.verify(3),
                       lambda: hf2q.register_weight_buffer(_DEV, None),
                       lambda: _DEV.write(self.buf(), b"\x00" * 4, offset=-1)])()
        elif action == 12:  # alloc_many (all or nothing)
            specs = [(_shape(fdp), pick(fdp, DTYPES + ["x", None])) for _ in range(fdp.ConsumeIntInRange(0, 4))]
            if not all(_safe_shape(sh, dt) for sh, dt in specs):
                pass  # gigabytes that exist: a host device makes them resident (found: 8 GiB, RSS past the limit)
            elif all(_nbytes(sh, dt) is not None and _nbytes(sh, dt) <= MAX_BYTES for sh, dt in specs):
                self.bufs.extend(_DEV.alloc_many(specs))
            elif specs:  # one is impossibly large (or invalid): all or nothing is refused
                before = _DEV.residency.count
                try:
                    _DEV.alloc_many(specs)
                finally:
                    if _DEV.residency.count != before:
                        raise OracleFailure("a failed alloc_many left buffers behind")
        elif action == 13:  # write_from_file_batch: many buffers' segments in one call
            jobs = []
            for _ in range(fdp.ConsumeIntInRange(0, 3)):
                segs = [(small_or_edge_int(fdp, 300), small_or_edge_int(fdp, 4200), small_or_edge_int(fdp, 4200))
                        for _ in range(fdp.ConsumeIntInRange(0, 3))]
                jobs.append((self.buf(), self.file_arg(), segs, pick(fdp, SRC_DTYPES), "fuzz"))
            _DEV.write_from_file_batch(jobs)
            for buf, _, segs, sdt, _ in jobs:  # it succeeded: no segment overlaps another
                for eoff, off, nbytes in segs:
                    if isinstance(sdt, str) and isinstance(buf, hf2q.Buffer) and 0 <= off and off + nbytes <= len(self.data):
                        self.check_contents(buf, eoff, self.data[off : off + nbytes], sdt)
        else:  # replace the scratch file's contents
            self.data = raw_bytes(fdp, 4200)
            _FILE.write_bytes(self.data)

    def run(self) -> None:
        self.data = raw_bytes(self.fdp, 4200)
        _FILE.write_bytes(self.data)
        self._fd = os.open(_FILE, os.O_RDONLY)
        try:
            for _ in range(self.fdp.ConsumeIntInRange(1, 10)):
                try:
                    self.step()
                except BaseException as e:  # noqa: BLE001 - the oracle decides
                    if isinstance(e, OracleFailure):
                        raise
                    expect(e, misuse=True, what="device action")
            for b in self.bufs:
                _DEV.verify(b)
        finally:
            os.close(self._fd)


def test_one_input(data: bytes) -> None:
    baseline = _DEV.residency.count
    prog = Program(atheris.FuzzedDataProvider(data))
    try:
        prog.run()
    finally:
        prog.bufs.clear()
    _DEV.residency.request()  # undo an end() of this input
    check_no_buffers(_DEV, baseline, "device program")


if __name__ == "__main__":
    run(test_one_input)
