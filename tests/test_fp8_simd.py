"""The vector FP8 decoders (csrc/kernels/fp8_avx2.cpp) against the scalar
path: the same bytes for every byte pattern at every position of a 16-element
chunk, scale edge cases (subnormal, huge, 2^111 either side, Inf, NaN, signed
zeros), partial blocks, odd sizes and every output (docs/FP8.md). On a CPU
without a vector path both runs are scalar and the tests still pass."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from hf2q import ops
from hf2q.errors import NonFiniteError

OUTS = ("f32", "bf16", "f16", "q8_0")
ML = {"f8_e4m3": ml_dtypes.float8_e4m3fn, "f8_e5m2": ml_dtypes.float8_e5m2}


def _run(w: np.ndarray, s: np.ndarray, block: tuple[int, int], fmt: str, to: str) -> tuple[bytes | str, int]:
    try:
        y, first = ops.dequantize_fp8(w, s, block, fmt=fmt, to=to)
    except NonFiniteError as e:
        return f"NonFiniteError {e.index}", e.index
    return y.view(np.uint8).tobytes(), first


def _both(w: np.ndarray, s: np.ndarray, block: tuple[int, int], fmt: str, to: str) -> tuple:
    simd = _run(w, s, block, fmt, to)
    ops.set_simd_enabled(False)
    try:
        scalar = _run(w, s, block, fmt, to)
    finally:
        ops.set_simd_enabled(True)
    return simd, scalar


SCALES = [3.0e-3, -0.75, 1.7e36, 1e-40, -1e-45, 2.0**111, np.nextafter(np.float32(2.0**111), 0), 2.0**-126,
          0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, 15.875, 3.4e38]


@pytest.mark.parametrize("fmt", ["f8_e4m3", "f8_e5m2"])
def test_every_byte_at_every_chunk_position_under_every_scale(fmt) -> None:
    # 16 rows of 256 bytes: row k is every byte pattern rotated by k, so each
    # byte sits at each of the 16 lanes of a chunk; one scale per row.
    allb = np.arange(256, dtype=np.uint8)
    base = np.stack([np.roll(allb, k) for k in range(16)])
    for sv in SCALES:
        s = np.full((16, 1), sv, np.float32)
        for to in OUTS:
            simd, scalar = _both(base, s, (1, 256), fmt, to)
            assert simd == scalar, (fmt, sv, to)


@pytest.mark.filterwarnings("ignore::hf2q.errors.ScaleOverflowWarning")  # the 2^111 block
@pytest.mark.parametrize("fmt", ["f8_e4m3", "f8_e5m2"])
@pytest.mark.parametrize("scale_dtype", [np.float32, ml_dtypes.bfloat16, np.float16])
def test_finite_bytes_through_q8_0_and_mixed_scales(fmt, scale_dtype) -> None:
    # Only finite encodings, so Q8_0 quantizes them; scales differ per block,
    # some outside the fast range (>= 2^111) or subnormal.
    rng = np.random.default_rng(7)
    special = 0x7F if fmt == "f8_e4m3" else 0x7C
    w = rng.integers(0, 256, (6, 96, 192), dtype=np.uint8)
    w[(w & special) == special] = 0x21
    grid = (6, 3, 4)
    s = (rng.random(grid, dtype=np.float32) * 3e-3 + 1e-5).astype(np.float32)
    s[0, 0, 0] = 2.0**111 if scale_dtype is np.float32 else 1.0
    s[1, 1, 2] = 1e-41 if scale_dtype is np.float32 else 6e-8
    s[2, 2, 3] = -0.0
    s[3] *= -1
    s = s.astype(scale_dtype)
    for to in OUTS:
        simd, scalar = _both(w, s, (32, 48), fmt, to)
        assert simd[1] == -1 and simd == scalar, to
    # The Q8_0 bytes are the quantizer's on the float32 products.
    f32, _ = ops.dequantize_fp8(w, s, (32, 48), fmt=fmt, to="f32")
    q8, _ = ops.dequantize_fp8(w, s, (32, 48), fmt=fmt, to="q8_0")
    assert q8.tobytes() == ops.quantize_q8_0(f32).tobytes()


@pytest.mark.parametrize("block", [(1, 16), (2, 32), (3, 48), (1, 10**6), (10**6, 10**6), (5, 24), (1, 7), (4, 128)])
@pytest.mark.parametrize("cols", [1, 15, 16, 17, 31, 32, 33, 47, 64, 100, 160])
def test_partial_blocks_and_odd_sizes(block, cols) -> None:
    rng = np.random.default_rng(cols * 31 + block[1])
    rows = 7
    w = rng.integers(0, 256, (rows, cols), dtype=np.uint8)
    w[(w & 0x7F) == 0x7F] = 0x30
    br, bc = min(block[0], rows), min(block[1], cols)
    s = (rng.random((-(-rows // br), -(-cols // bc)), dtype=np.float32) * 2e-3 + 1e-4).astype(np.float32)
    for to in OUTS:
        if to == "q8_0" and cols % 32:
            continue
        simd, scalar = _both(w, s, (br, bc), "f8_e4m3", to)
        assert simd == scalar, (to, block, cols)
        want = w.view(ML["f8_e4m3"]).astype(np.float32) * np.repeat(np.repeat(s, br, 0), bc, 1)[:rows, :cols]
        if to == "f32":
            assert simd[0] == want.tobytes()


def test_q8_0_rounding_ties_and_first_nonfinite_index() -> None:
    # amax 8 * 15.875 = 127 gives d = 1: 4 * 15.875 = 63.5 is a tie, rounded
    # away from zero as ggml's reference does.
    w = np.array([[0x50, 0x48, 0xC8, 0x40, 0xC0, 0x38, 0x30, 0] * 4] * 3, np.uint8)  # 8, 4, -4, 2, -2, 1, .5, 0
    s = np.full((3, 1), 15.875, np.float32)
    simd, scalar = _both(w, s, (1, 32), "f8_e4m3", "q8_0")
    assert simd == scalar
    q = np.frombuffer(simd[0], np.uint8).reshape(3, 34)[:, 2:].view(np.int8)
    assert q[0, :8].tolist() == [127, 64, -64, 32, -32, 16, 8, 0]
    # A NaN byte, an overflowing product: the same first index both ways.
    for to in OUTS:
        w2 = np.full((4, 64), 0x38, np.uint8)
        w2[2, 37] = 0x7F
        simd, scalar = _both(w2, np.ones((1, 1), np.float32), (4, 64), "f8_e4m3", to)
        assert simd == scalar and simd[1] == 2 * 64 + 37, to
        w3 = np.full((4, 64), 0x30, np.uint8)
        w3[1, 50] = 0x7E
        simd, scalar = _both(w3, np.full((1, 1), 1e37, np.float32), (4, 64), "f8_e4m3", to)
        assert simd == scalar and simd[1] == 64 + 50, to


def test_round_half_away_formula() -> None:
    # The vector quantizer rounds p as trunc(p + copysign(0.49999997, p)):
    # equal to roundf near every half-integer and integer of its range.
    k = np.arange(0, 260, dtype=np.float32)
    ulps = np.arange(-300, 301, dtype=np.int32)
    centres = np.concatenate([k + np.float32(0.5), k, np.float32([0.25, 2.0**-20, 2.0**-149])])
    p = (centres.view(np.int32)[:, None] + ulps[None, :]).reshape(-1).view(np.float32)
    p = np.concatenate([p[np.isfinite(p) & (p >= 0)], -p[np.isfinite(p) & (p >= 0)]])
    half = np.copysign(np.float32(0.49999997), p).astype(np.float32)
    got = np.trunc((p + half).astype(np.float32))
    want = np.sign(p) * np.floor(np.abs(p).astype(np.float64) + 0.5)  # round half away from zero, exactly
    assert np.array_equal(got, want)


def _core_both(w: np.ndarray, s: np.ndarray, block: tuple[int, int], fmt: str, to: str) -> tuple:
    """(bytes, first non-finite, Inf Q8_0 scales) from the vector and the
    scalar path, through the binding (which also returns the Inf count)."""
    from hf2q import _core, formats

    rows, cols = w.shape[-2:]
    lead = int(np.prod(w.shape[:-2], dtype=np.int64))
    f = formats.get(to)
    nbytes = w.size // 32 * 34 if to == "q8_0" else w.size * f.block_bytes

    def run() -> tuple:
        out = np.zeros(nbytes, np.uint8)
        first, inf = _core.scaled_fp8(w.reshape(-1), fmt, np.ascontiguousarray(s).reshape(-1).view(np.uint8),
                                      formats.from_numpy(s.dtype).name, (lead, rows, cols), block, to, out)
        if first >= 0 and to == "q8_0":  # the rows from the NaN/Inf product's on are unwritten
            out = out[: first // cols * (cols // 32 * 34)]
        return (out.tobytes(), first, inf)

    simd = run()
    ops.set_simd_enabled(False)
    try:
        scalar = run()
    finally:
        ops.set_simd_enabled(True)
    return simd, scalar


@pytest.mark.parametrize("fmt", ["f8_e4m3", "f8_e5m2"])
@pytest.mark.parametrize("block", [(1, 16), (3, 32), (2, 48), (128, 128), (4, 10**6), (1, 96)])
def test_q8_0_and_bf16_groups_of_eight_blocks(fmt, block) -> None:
    # Q8_0 is computed eight blocks (256 columns) at a time, bf16 32 columns
    # at a time: rows of 1 to 19 blocks (partial groups), chunk scales that
    # differ within a block, the largest magnitude in either 16-element
    # chunk, zeros and negative zeros, under scales in and out of the fast
    # range (a negative one or -0 anywhere in a row sends the row to the
    # per-block path).
    rng = np.random.default_rng(block[1] * 7 + (fmt == "f8_e5m2"))
    special = 0x7F if fmt == "f8_e4m3" else 0x7C
    for nblocks in (1, 2, 7, 8, 9, 16, 19):
        rows, cols = 6, 32 * nblocks
        w = rng.integers(0, 256, (rows, cols), dtype=np.uint8)
        w[(w & special) == special] = 0x11
        w[:, ::5] &= 0x87  # small magnitudes and subnormals
        w[:, 3::11] = rng.choice(np.uint8([0x00, 0x80]), size=w[:, 3::11].shape)
        br, bc = min(block[0], rows), min(block[1], cols)
        grid = (-(-rows // br), -(-cols // bc))
        for case in ("plain", "negative", "minus zero", "zero", "tiny", "huge"):
            s = (rng.random(grid, dtype=np.float32) * 3e-3 + 1e-5).astype(np.float32)
            if case == "negative":
                s.flat[rng.integers(0, s.size)] *= -1
            elif case == "minus zero":
                s.flat[rng.integers(0, s.size)] = -0.0
            elif case == "zero":
                s.flat[rng.integers(0, s.size)] = 0.0
            elif case == "tiny":  # d subnormal or 0, 1/d Inf: zeros stored
                s[:] = np.float32(1e-44)
            elif case == "huge":  # float16 d overflows (counted)
                s.flat[rng.integers(0, s.size)] = 1e30
            for to in ("q8_0", "bf16"):
                simd, scalar = _core_both(w, s, (br, bc), fmt, to)
                assert simd == scalar, (nblocks, case, to)
                assert simd[1] == -1, (nblocks, case, to)
                if case == "huge" and to == "q8_0":
                    assert simd[2] > 0


@pytest.mark.parametrize("fmt", ["f8_e4m3", "f8_e5m2"])
def test_a_nan_or_inf_byte_in_any_block_of_a_group(fmt) -> None:
    # A NaN/Inf encoding anywhere in eight blocks sends the group to the
    # per-block path, which finds the first non-finite product's index (Q8_0:
    # the rows before its row are written as always).
    codes = [0x7F, 0xFF] if fmt == "f8_e4m3" else [0x7C, 0xFC, 0x7D, 0xFF]
    rng = np.random.default_rng(3)
    w0 = rng.integers(0, 0x70, (2, 32 * 11), dtype=np.uint8) | rng.choice(np.uint8([0, 0x80]), (2, 32 * 11))
    s = np.full((1, 1), 2.5e-3, np.float32)
    for col in (0, 15, 16, 31, 32, 100, 255, 256, 287, 300, 351):
        for code in codes:
            w = w0.copy()
            w[1, col] = code
            for to in ("q8_0", "bf16"):
                simd, scalar = _core_both(w, s, (2, 32 * 11), fmt, to)
                assert simd == scalar and simd[1] == 32 * 11 + col, (col, code, to)


def test_q8_0_just_below_one_half_rounds_to_zero() -> None:
    # p = 0.49999997 (the float below 1/2) must round to 0: p + 0.5 would
    # round up to 1.0 in float32. Under one scale a block cannot produce it
    # (p is about 127 * a / b for FP8 magnitudes a <= b: never within 0.003
    # of 1/2); two chunk scales can: 448 * 1.0 is the amax, 0.5 * 3.527559
    # has that p.
    w = np.zeros((1, 32), np.uint8)
    w[0, 0] = 0x7E  # 448
    w[0, 16], w[0, 17], w[0, 18] = 0x30, 0xB0, 0x38  # 0.5, -0.5, 1.0
    s = np.array([[1.0, np.uint32(0x4061C387).view(np.float32)]], np.float32)
    simd, scalar = _core_both(w, s, (1, 16), "f8_e4m3", "q8_0")
    assert simd == scalar
    q = np.frombuffer(simd[0], np.int8)[2:]
    assert q[0] == 127 and q[16] == 0 and q[17] == 0 and q[18] == 1
    f32, _ = ops.dequantize_fp8(w, s, (1, 16), fmt="f8_e4m3", to="f32")
    assert simd[0] == ops.quantize_q8_0(f32).tobytes()
