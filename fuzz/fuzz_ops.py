"""Fuzz target: the hf2q.ops entry points and the raw hf2q._core kernels.

Random bytes reinterpreted with random dtypes, shapes, strides, alignments
and containers; random ``out`` buffers (None, right, wrong size, wrong dtype,
read-only, strided, misaligned, overlapping the source); SIMD on or off and
1-3 threads. Oracle:

* exceptions: :class:`hf2q.Hf2qError` (NonFiniteError) or
  ``TypeError``/``ValueError``/``OverflowError`` (misuse) only;
* a call that succeeds returns exactly (bit for bit) what the numpy
  reference :mod:`hf2q.reference` returns for the same input, and writes
  into ``out`` when one was given;
* the reference must not accept what ops refuses and vice versa, except for
  the native-only rules (alignment of the raw kernels, overlapping buffers).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import atheris  # noqa: E402
import numpy as np  # noqa: E402

from _gen import BF16, array, container, out_array, pick  # noqa: E402
from _harness import OracleFailure, expect, hf2q, run  # noqa: E402

_core = hf2q._core
ops = hf2q.ops
ref = hf2q.reference
F32 = np.dtype(np.float32)
U8 = np.dtype(np.uint8)


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8).tobytes()


def _count(src, per: int, unit: int) -> int:
    try:
        n = memoryview(src).nbytes if not isinstance(src, np.ndarray) else src.nbytes
    except TypeError:
        return 0
    return n // unit * per


def _snapshot(src):
    if isinstance(src, np.ndarray):
        return np.array(src, copy=True)
    try:
        return bytes(memoryview(src))
    except (TypeError, ValueError):
        return src


def _python_op(fdp: atheris.FuzzedDataProvider, name: str) -> None:
    alias = bytearray(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 2048)))
    src_arr = array(fdp, base=alias) if fdp.ConsumeIntInRange(0, 5) == 0 and alias else array(fdp)
    src = container(fdp, src_arr)
    fn = getattr(ops, name)
    rfn = getattr(ref, name)
    if name in ("bf16_to_f32", "f16_to_f32"):
        out = out_array(fdp, F32, _count(src, 1, 2), alias)
    elif name == "quantize_q8_0":
        out = out_array(fdp, U8, _count(src, 34, 32 * max(1, getattr(src, "itemsize", 4))), alias)
    else:
        out = out_array(fdp, F32, _count(src, 32, 34), alias)
    kwargs = {} if out is None else {"out": out}
    snapshot = _snapshot(src)  # out may overlap src: compare against the input as it was
    try:
        got = fn(src, **kwargs)
    except BaseException as e:  # noqa: BLE001 - the oracle decides
        expect(e, misuse=True, what=f"ops.{name}")
        # The reference must refuse too (for whatever reason: the order of the
        # checks may differ), unless ops refused for a native-only rule.
        if "overlap" in str(e):
            return
        try:
            rfn(src, **kwargs)
        except BaseException:  # noqa: BLE001
            return
        raise OracleFailure(f"ops.{name} refused ({type(e).__name__}: {e}) what the reference accepts") from e
    if out is not None and got is not out:
        raise OracleFailure(f"ops.{name} did not return out")
    want = rfn(snapshot)
    if got.shape != want.shape and out is None:
        raise OracleFailure(f"ops.{name}: shape {got.shape} != reference {want.shape}")
    if _bits(got) != _bits(want):
        raise OracleFailure(f"ops.{name}: result differs from the reference")


_Q8_SOURCES = {"f32": F32, "f16": np.dtype(np.float16), "bf16": BF16}


def _core_op(fdp: atheris.FuzzedDataProvider) -> None:
    which = fdp.ConsumeIntInRange(0, 4)
    alias = bytearray(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 2048)))
    src = array(fdp, base=alias) if fdp.ConsumeBool() else array(fdp)
    if fdp.ConsumeBool():  # mostly the layout the bindings accept: 1-D uint8
        src = src.reshape(-1).view(np.uint8) if src.flags.c_contiguous and src.ndim else src
    out = out_array(fdp, U8 if which != 4 else np.dtype(np.uint16), 0, alias)
    if isinstance(out, np.ndarray) and fdp.ConsumeBool() and out.flags.c_contiguous and out.ndim:
        out = out.reshape(-1).view(np.uint8) if which != 4 else out
    try:
        if which == 0:
            _core.bf16_to_f32(src, out)
        elif which == 1:
            _core.f16_to_f32(src, out)
        elif which == 2:
            # The q8_0 row's sources, other device formats, unknown names, non-strings.
            src_type = pick(fdp, ["f32", "f16", "bf16", "u8", "i32", "q8_0", "f8_e4m3", "", "F32", 0, None])
            first, _ = _core.quantize_q8_0(src, src_type, out)
            if src_type in _Q8_SOURCES and first < -1:
                raise OracleFailure("quantize_q8_0 returned an index below -1")
        elif which == 3:
            _core.dequantize_q8_0(src, out)
        else:
            _core.f32_to_f16_rne(src, out)
    except BaseException as e:  # noqa: BLE001
        expect(e, misuse=True, what=f"_core op {which}")
        return
    # Success: compare with the reference where the result is defined.
    s = np.asarray(src).reshape(-1).view(np.uint8)
    o = np.asarray(out).reshape(-1).view(np.uint8)
    if which == 0:
        want = ref.bf16_to_f32(s)
    elif which == 1:
        want = ref.f16_to_f32(s)
    elif which == 2:
        if src_type not in _Q8_SOURCES:
            raise OracleFailure(f"quantize_q8_0 accepted src_type {src_type!r}")
        if first >= 0:
            return  # non-finite input: partial output by contract
        dt = _Q8_SOURCES[src_type]
        want = ref.quantize_q8_0(s.view(dt).reshape(-1, 32)) if s.size else np.empty(0, np.uint8)
    elif which == 3:
        want = ref.dequantize_q8_0(s.reshape(-1, 34)) if s.size else np.empty(0, F32)
    else:
        x = s.view(np.float32)
        want = ref.f32_to_f16_bits(x)
        nan = np.isnan(x)
        got16 = o.view(np.uint16)
        if not np.array_equal(got16[~nan], want[~nan]) or not np.all((got16[nan] & 0x7C00) == 0x7C00):
            raise OracleFailure("f32_to_f16_rne differs from the reference")
        return
    if o.tobytes() != _bits(want):
        raise OracleFailure(f"_core op {which}: result differs from the reference")


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    knobs = fdp.ConsumeIntInRange(0, 255)
    _core.set_simd_enabled(bool(knobs & 1))
    if knobs >> 1 == 0:  # now and then switch the thread count (1-3)
        hf2q.set_num_threads(1 + (knobs & 3) % 3)
    for _ in range(fdp.ConsumeIntInRange(1, 3)):
        op = fdp.ConsumeIntInRange(0, 4)
        if op == 4:
            _core_op(fdp)
        else:
            _python_op(fdp, ("bf16_to_f32", "f16_to_f32", "quantize_q8_0", "dequantize_q8_0")[op])


if __name__ == "__main__":
    run(test_one_input)
