"""hf2q.formats: the one format table, checked against what others define
(gguf-py's ggml type sizes, numpy / ml_dtypes itemsizes, the safetensors
package's dtype codes) and used by the device layer."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import hf2q
import hf2q.device  # hf2q imports it lazily; the first test reads hf2q.device.DTYPES
from hf2q import _core, formats


def test_table_comes_from_native_core() -> None:
    rows = _core.format_table()
    assert [r[0] for r in rows] == list(formats.FORMATS)
    assert formats.DEVICE_FORMATS == ("f32", "f16", "bf16", "u8", "i32", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k",
                                      "q5_0", "q5_1", "f8_e4m3", "f8_e5m2", "mxfp4")
    assert formats.DEVICE_FORMATS == hf2q.device.DTYPES
    for i, name in enumerate(formats.DEVICE_FORMATS):
        assert formats.get(name).id == i


def test_gguf_block_sizes_match_gguf_py() -> None:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    checked = 0
    for f in formats.FORMATS.values():
        if f.gguf_type < 0:
            continue
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(f.gguf_type)]
        assert (f.block_elems, f.block_bytes) == (block, type_size), f.name
        checked += 1
    assert checked >= 5  # f32, f16, bf16, q8_0, i32 ...
    assert formats.get("q8_0").gguf_type == GGMLQuantizationType.Q8_0


def test_numpy_dtypes_have_the_table_itemsize() -> None:
    for f in formats.FORMATS.values():
        if f.numpy_name and f.numpy_dtype is not None:
            assert f.numpy_dtype.itemsize * f.block_elems == f.block_bytes, f.name
    assert formats.get("bf16").storage_dtype == np.dtype(ml_dtypes.bfloat16)
    assert formats.get("q8_0").storage_dtype == np.dtype(np.uint8)
    assert formats.from_numpy(np.float32).name == "f32"
    assert formats.from_numpy(ml_dtypes.bfloat16).name == "bf16"
    # Rows hold little-endian elements: a byte-swapped dtype shares the name
    # ("float32") but not the bytes, so it has no row.
    for swapped in (">f4", ">f2", ">i4"):
        assert np.dtype(swapped).name in ("float32", "float16", "int32")
        assert formats.from_numpy(swapped) is None


def test_safetensors_codes_are_the_packages() -> None:
    # Every code the safetensors package's numpy loader knows is in the table
    # with the same element size.
    from safetensors import numpy as stnp

    known = getattr(stnp, "_TYPES", None)
    if known is None:
        pytest.skip("safetensors.numpy has no _TYPES table in this version")
    for code, dt in known.items():
        f = formats.from_safetensors(code)
        assert np.dtype(dt).itemsize == f.block_bytes, code
    assert set(hf2q.safetensors.DTYPE_BITS) == set(formats.safetensors_codes())
    assert hf2q.safetensors.DTYPE_BITS["F4"] == 4 and hf2q.safetensors.DTYPE_BITS["F6_E3M2"] == 6


@pytest.mark.parametrize(
    "shape,dtype,expect",
    [
        ((256, 512, 2048), "q8_0", 285_212_672),  # docs/Q8_0.md
        ((3, 5), "f32", 60),
        ((3, 5), "BF16", 30),
        ((7,), "u8", 7),
        ((), "f32", 4),
        ((0, 32), "q8_0", 0),
        ((4,), "f4", 2),
        ((8,), "f6_e2m3", 6),
    ],
)
def test_nbytes(shape: tuple[int, ...], dtype: str, expect: int) -> None:
    assert formats.nbytes(shape, dtype) == expect


def test_nbytes_equals_the_device_byte_len() -> None:
    dev = hf2q.Device("host")
    for dtype in formats.DEVICE_FORMATS:
        k = formats.get(dtype).block_elems // 32 or 1  # whole blocks: 32 (q8_0, q4_0) or 256 (k-quants)
        for shape in ((64 * k,), (2, 96 * k), (3, 1, 32 * k)):
            buf = dev.alloc(shape, dtype)
            assert buf.byte_len == formats.nbytes(shape, dtype)
            assert buf.numpy().shape == formats.storage_shape(shape, dtype)
            assert formats.logical_shape(buf.numpy().shape, dtype) == shape
            del buf


def test_block_formats_need_whole_blocks_in_the_last_axis() -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        formats.nbytes((64, 33), "q8_0")
    with pytest.raises(ValueError, match="multiple of 32"):
        formats.nbytes((), "q8_0")
    with pytest.raises(ValueError, match="multiple of 256"):
        formats.nbytes((4, 128), "q4_k")
    with pytest.raises(ValueError, match="unknown dtype"):
        formats.get("q3_k")
    assert formats.storage_shape((4, 64), "q8_0") == (4, 68)
    assert formats.storage_shape((4, 512), "q6_k") == (4, 420)
    assert formats.nbytes((3, 256), "q4_k") == 3 * 144


def test_nbytes_of_every_format() -> None:
    """Plain dtypes take a short path in nbytes; every row keeps the one rule:
    numel / block_elems * block_bytes, whole blocks (in the last axis for block formats)."""
    for f in formats.FORMATS.values():
        for shape in ((), (0,), (1,), (3, 5), (2, 64), (np.int64(4), 32), [6, 2]):
            n = int(np.prod([int(d) for d in shape], dtype=object))
            last = int(shape[-1]) if len(shape) else None
            whole = n % f.block_elems == 0 and (not f.is_block or (last is not None and last % f.block_elems == 0))
            if whole:
                got = formats.nbytes(shape, f)
                assert got == n // f.block_elems * f.block_bytes and type(got) is int, (f.name, shape)
                assert formats.nbytes(shape, f.name) == got
            else:
                with pytest.raises(ValueError, match=f"{f.name} needs a"):
                    formats.nbytes(shape, f)
    assert formats.nbytes((1 << 40, 1 << 40), "f32") == 1 << 82  # exact Python ints
    with pytest.raises(TypeError):
        formats.nbytes(3, "f32")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown dtype"):
        formats.nbytes((1,), "f128")


def test_can_convert_is_the_native_table() -> None:
    from hf2q import _core

    for s in formats.FORMATS.values():
        for d in formats.FORMATS.values():
            want = s.is_device and d.is_device and bool(_core.can_convert(s.name, d.name))
            assert formats.can_convert(s, d) is want and formats.can_convert(s.name, d.name) is want


def test_conversions_are_the_rows_sources() -> None:
    # The rows of csrc/kernels/formats.h say which sources convert into them.
    assert formats.sources_of("f32") == ("f16", "bf16", "f8_e4m3", "f8_e5m2")
    assert formats.sources_of("q8_0") == ("f32", "f16", "bf16")
    for name in ("f16", "bf16", "u8", "i32", "f8_e4m3", "f8_e5m2", "mxfp4"):
        assert formats.sources_of(name) == ()
    dev = hf2q.Device("host")
    buf = dev.alloc((32,), "q8_0")
    with pytest.raises(ValueError, match=r"cannot convert i32 to q8_0 \(supported: same dtype, f16/bf16/f8_e4m3/f8_e5m2 -> f32, "
                                         r"f32/f16/bf16 -> q8_0"):
        dev.write(buf, np.zeros(32, np.int32))
    with pytest.raises(TypeError, match=r"raw src needs src_dtype \('f32', 'f16' or 'bf16'\) to be quantized"):
        dev.write(buf, np.zeros(64, np.uint8))


def test_ops_block_formats_are_the_rows_with_kernels() -> None:
    # hf2q.ops names no format: quantize takes the block rows whose kernels
    # encode, dequantize those whose kernels decode (mxfp4: decode only), so a
    # new block row needs no edit of ops.py.
    from hf2q import ops

    rows = _core.format_table()
    assert all(len(r) == 9 for r in rows)
    enc = {r[0] for r in rows if r[7]}
    dec = {r[0] for r in rows if r[8]}
    assert ops.BLOCK_FORMATS == formats.ENCODED_BLOCK_FORMATS == tuple(
        n for n in formats.DEVICE_FORMATS if formats.get(n).is_block and n in enc)
    assert formats.DECODED_BLOCK_FORMATS == tuple(
        n for n in formats.DEVICE_FORMATS if formats.get(n).is_block and n in dec)
    # the names of before, in native id order (a new block row adds its own after them)
    assert ops.BLOCK_FORMATS[:7] == ("q8_0", "q4_0", "q4_k", "q5_k", "q6_k", "q5_0", "q5_1")
    assert set(formats.DECODED_BLOCK_FORMATS) == {*ops.BLOCK_FORMATS, "mxfp4"}
    assert formats.get("f32").decodes and not formats.get("f32").encodes
    assert not formats.get("i32").decodes and not formats.get("mxfp4").encodes
    for fmt in formats.DECODED_BLOCK_FORMATS:
        f = formats.get(fmt)
        assert ops.dequantize(np.zeros(f.block_bytes, np.uint8), fmt).shape == (f.block_elems,)
    for bad in ("f32", "mxfp4"):
        with pytest.raises(ValueError, match=f"'{bad}' is not a block format; expected one of q8_0, q4_0, q4_k"):
            ops.quantize(np.zeros(32, np.float32), bad)
    with pytest.raises(ValueError, match="'bf16' is not a block format; expected one of q8_0, q4_0"):
        ops.dequantize(np.zeros(4, np.uint8), "bf16")


def test_kernels_refuse_a_source_their_row_does_not_list() -> None:
    # The quantizer never reads another type as one it knows (the old
    # "otherwise F16" fallbacks): a source outside the q8_0 row fails.
    from hf2q import _core

    out = np.empty(34, np.uint8)
    for src in ("u8", "i32", "q8_0"):
        with pytest.raises(ValueError, match="unknown source type"):
            _core.quantize_q8_0(np.zeros(128, np.uint8), src, out)
    with pytest.raises(ValueError, match="unknown dtype"):
        _core.quantize_q8_0(np.zeros(128, np.uint8), "f8_e8m0", out)
    with pytest.raises(ValueError, match="unknown source type"):  # a device format, not a q8_0 source
        _core.quantize_q8_0(np.zeros(128, np.uint8), "f8_e4m3", out)


def test_every_device_format_has_a_readback_oracle() -> None:
    # reference.READBACK is the numpy side of verify.h: one entry per device
    # format, and none for anything else (a format without one fails loudly).
    from hf2q import reference

    assert set(reference.READBACK) == set(formats.DEVICE_FORMATS)
    with pytest.raises(ValueError, match="no numpy read-back oracle"):
        reference.readback_bits("f8_e8m0", np.zeros(4, np.uint8))
    dev = hf2q.Device("host")
    x = np.linspace(-3, 3, 512, dtype=np.float32).reshape(2, 256)
    for dtype in formats.DEVICE_FORMATS:
        src = x if dtype != "u8" else np.arange(512, dtype=np.uint8)
        buf = dev.alloc(src.shape, dtype)
        if dtype in ("u8", "i32"):
            dev.write(buf, src.astype(np.int32) if dtype == "i32" else src.view(np.uint8))
        elif dtype == "f32" or formats.can_convert("f32", dtype):
            dev.write(buf, x)
        elif dtype == "mxfp4":  # written only as repacked bytes (docs/FP8.md)
            raw = np.random.default_rng(0).integers(0, 256, formats.nbytes(src.shape, dtype), dtype=np.uint8)
            dev.write(buf, raw, src_dtype="mxfp4")
        else:
            dev.write(buf, x.astype(formats.get(dtype).numpy_dtype))
        assert dev.verify(buf).ok, dtype


def test_backend_facts_come_from_the_native_registry() -> None:
    from hf2q import _core, device

    rows = {r[0]: r for r in _core.backend_registry()}
    assert [r[0] for r in _core.backend_registry()] == _core.backend_kinds()
    assert rows["cuda"][1:] == (True, 1, True)  # indexed, second by default, prepared (hf2q/_cuda.py)
    assert rows["host"][1] is False and rows["metal"][1] is False
    assert device._DEFAULT_ORDER == ("metal", "cuda", "host")
    assert device._device_spec("cuda") == "cuda:0" and device._device_spec("cuda:3") == "cuda:3"
    with pytest.raises(ValueError, match="expected 'cuda' or 'cuda:N'"):
        device._device_spec("cuda:x")
    with pytest.raises(ValueError, match="the host device takes no index"):
        device._device_spec("host:0")
