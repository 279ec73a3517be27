"""Test vectors for the arm64 (NEON) kernel driver, tests/native/arm64_driver.cpp.

Every expected output comes from :mod:`hf2q.reference` (pure numpy) on the
x86 host; the driver, cross-compiled for aarch64 and run under qemu-aarch64,
checks the NEON and the scalar kernels against these bytes and each other.

Usage: python tests/native/gen_arm64_vectors.py OUT.bin   (or write_vectors(path))

File format (all integers little-endian):

    header   magic b"HF2QARM1", u32 version (=1), u32 record count
    record   u32 kind, u32 flags, u64 n, i64 first_nonfinite,
             u32 label length, label bytes (ASCII),
             u64 input length, input bytes,
             u64 expected-output length, expected-output bytes
    trailer  magic b"HF2QEND!"

kind: 1 BF16->F32, 2 F16->F32 (n = elements, input n*2 bytes, output n*4),
      3/4/5 Q8_0 from F32/BF16/F16 (n = elements, a multiple of 32; output =
      Q8_0 bytes of all blocks, or with a non-finite input only of the blocks
      before the one holding first_nonfinite), 6 Q8_0 dequantization
      (n = blocks, input n*34 bytes, output n*32 float32), 7 Q4_0 / Q4_K / Q5_K
      / Q6_K / Q5_0 / Q5_1 from F32 (n = elements; the format's native DType id
      in flags bits 8..15; expected bytes: ggml's own, from
      tests/data/kquants/ggml_ref.npz, not hf2q.reference).
first_nonfinite: smallest flat index of a NaN/Inf input element, -1 if none.
flags bit 0 (FLAG_NAN_ANY): the default NaN of an invalid operation (0 * Inf in a
      dequantized +-Inf-scale block) is 0xFFC00000 on x86 and 0x7FC00000 on
      arm64; the driver accepts exactly that difference (and no other).
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path
from typing import Callable

import ml_dtypes
import numpy as np

from hf2q import reference
from hf2q.errors import NonFiniteError

MAGIC = b"HF2QARM1"
TRAILER = b"HF2QEND!"
VERSION = 1

KIND_BF16_F32 = 1
KIND_F16_F32 = 2
KIND_Q8_F32 = 3
KIND_Q8_BF16 = 4
KIND_Q8_F16 = 5
KIND_DEQ_Q8 = 6
KIND_KQUANT_F32 = 7
KQUANT_FORMATS = ("q4_0", "q4_k", "q5_k", "q6_k", "q5_0", "q5_1")
KQUANT_DATA = Path(__file__).resolve().parents[1] / "data" / "kquants" / "ggml_ref.npz"
FLAG_NAN_ANY = 1

F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)
BF16 = np.dtype(ml_dtypes.bfloat16)
Q8_KIND = {F32: KIND_Q8_F32, BF16: KIND_Q8_BF16, F16: KIND_Q8_F16}


class _Writer:
    def __init__(self) -> None:
        self.records: list[bytes] = []
        self.counts: dict[int, int] = {}
        self.q8_blocks: list[np.ndarray] = []  # finite reference Q8_0 output, fed to dequantization

    def add(self, kind: int, n: int, label: str, src: bytes, expected: bytes, first_bad: int = -1, flags: int = 0) -> None:
        lab = label.encode("ascii")
        self.records.append(
            struct.pack("<IIQqI", kind, flags, n, first_bad, len(lab))
            + lab
            + struct.pack("<Q", len(src))
            + src
            + struct.pack("<Q", len(expected))
            + expected
        )
        self.counts[kind] = self.counts.get(kind, 0) + n

    def quant(self, label: str, x: np.ndarray) -> None:
        """A Q8_0 record: x is F32/F16/BF16 with a size that is a multiple of 32."""
        x = np.ascontiguousarray(x).reshape(-1, 32)
        try:
            q = reference.quantize_q8_0(x)
            first_bad = -1
            expected = q.tobytes()
            self.q8_blocks.append(q.reshape(-1, 34))
        except NonFiniteError as e:
            first_bad = int(e.index)
            prefix = x[: first_bad // 32]
            expected = reference.quantize_q8_0(prefix).tobytes() if prefix.size else b""
        self.add(Q8_KIND[x.dtype], x.size, label, x.tobytes(), expected, first_bad)

    def serialize(self) -> bytes:
        return MAGIC + struct.pack("<II", VERSION, len(self.records)) + b"".join(self.records) + TRAILER


def _f32(bits: np.ndarray | list[int]) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(F32)


def _finite_bits_f32(rng: np.random.Generator, n: int) -> np.ndarray:
    b = rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32)
    bad = (b & 0x7F800000) == 0x7F800000
    b[bad] &= 0xFF7FFFFF  # clear the exponent's low bit: finite
    return b


def _first_f32(pred: Callable[[np.float32], bool]) -> np.float32:
    """Smallest positive finite float32 a with pred(a) true (pred monotone in a)."""
    lo, hi = 0, 0x7F7FFFFF  # pred(lo) false, pred(hi) true
    assert not pred(_f32([lo])[0]) and pred(_f32([hi])[0])
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pred(_f32([mid])[0]):
            hi = mid
        else:
            lo = mid
    return _f32([hi])[0]


def thresholds() -> dict[str, np.float32]:
    """The exact float32 amax thresholds of docs/Q8_0.md."""
    one, f127 = np.float32(1.0), np.float32(127.0)

    def d_of(a: np.float32) -> np.float32:
        return np.float32(a / f127)

    with np.errstate(over="ignore", divide="ignore"):
        return {
            "d_nonzero": _first_f32(lambda a: d_of(a) != 0),  # ~8.97e-44
            "inv_finite": _first_f32(lambda a: d_of(a) != 0 and bool(np.isfinite(one / d_of(a)))),  # ~3.73e-37
            "d16_nonzero": _first_f32(lambda a: int(reference.f32_to_f16_bits(d_of(a))) != 0),  # ~3.79e-6
            "d16_normal": _first_f32(lambda a: int(reference.f32_to_f16_bits(d_of(a))) >= 0x0400),  # ~7.75e-3
            "d16_max": _first_f32(lambda a: int(reference.f32_to_f16_bits(d_of(a))) >= 0x7BFF),  # d rounds to 65504
            "d16_inf": _first_f32(lambda a: int(reference.f32_to_f16_bits(d_of(a))) == 0x7C00),  # 8,321,040
        }


def _blocks_with_amax(rng: np.random.Generator, amax: np.ndarray) -> np.ndarray:
    """One block per amax: random values in [-amax, amax] (float32), one
    element exactly +-amax, a few exact zeros/negative zeros."""
    nb = amax.size
    frac = rng.uniform(-1.0, 1.0, size=(nb, 32))
    x = (frac * amax[:, None].astype(np.float64)).astype(F32)
    pos = rng.integers(0, 32, size=nb)
    sign = np.where(rng.random(nb) < 0.5, np.float32(-1), np.float32(1))
    x[np.arange(nb), pos] = sign * amax
    x[np.abs(x) > amax[:, None]] = 0  # float64 -> float32 rounding could exceed amax
    return x


def _ulp_neighbourhood(a: np.float32, k: int) -> np.ndarray:
    b = int(np.asarray(a, F32).view(np.uint32))
    return _f32([v for v in range(b - k, b + k + 1) if 0 <= v <= 0x7F7FFFFF])


def _half_integer_blocks(rng: np.random.Generator, nb: int, scale_pow2: np.ndarray) -> np.ndarray:
    """Blocks whose products x*id are exact half-integers: amax = 127 * 2^k, so
    d = 2^k and id = 2^-k exactly."""
    h = rng.integers(-253, 254, size=(nb, 32)).astype(F32) / np.float32(2)  # [-126.5, 126.5]
    h[:, 0] = np.where(rng.random(nb) < 0.5, np.float32(-127), np.float32(127))
    rng.permuted(h, axis=1, out=h)
    return (h * np.exp2(scale_pow2.astype(F32))[:, None]).astype(F32)


def _quant_cases(w: _Writer, rng: np.random.Generator) -> None:
    th = thresholds()

    # -- ordinary data over scales 1e-30 .. 1e30, and randn * e^+-60
    nb = 1024
    exps = np.linspace(-30, 30, nb)
    x = (rng.standard_normal((nb, 32)) * (10.0 ** exps)[:, None]).astype(F32)
    w.quant("f32 randn x 1e-30..1e30", x)
    x = (rng.standard_normal((256, 32)) * np.where(np.arange(256) % 2, np.exp(60), np.exp(-60))[:, None]).astype(F32)
    w.quant("f32 randn x e^+-60", x)
    w.quant("f32 randn", rng.standard_normal((2048, 32)).astype(F32))

    # -- bf16-like weights (ties are common: ~5 % of blocks hold an exact .5 product)
    bf = (rng.standard_normal((4096, 32)) * 0.02).astype(BF16)
    w.quant("bf16-like randn x 0.02 (as f32)", bf.astype(F32))
    w.quant("bf16 randn x 0.02", bf)
    w.quant("f16 randn x 0.02", (rng.standard_normal((2048, 32)) * 0.02).astype(F16))

    # -- integers and exact ties (half-integers), in all three source types
    ints = rng.integers(-127, 128, size=(1024, 32)).astype(F32)
    ints[:, 0] = 127
    w.quant("f32 integers in [-127, 127]", ints)
    k = rng.integers(-40, 41, size=1024)
    w.quant("f32 half-integer ties x 2^k", _half_integer_blocks(rng, 1024, k))
    k16 = rng.integers(-5, 6, size=512)  # f16 keeps 126.5 * 2^k exactly for small k
    w.quant("bf16 half-integer ties x 2^k", _half_integer_blocks(rng, 512, k[:512]).astype(BF16))
    w.quant("f16 half-integer ties x 2^k", _half_integer_blocks(rng, 512, k16).astype(F16))
    ties = np.array([0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 3.5, -3.5, 126.5, -126.5, 125.5, -125.5, 63.5, -63.5,
                     0.49999997, -0.49999997, 1.4999999, 2.4999998, -2.5000002, 127, -127, 0, -0.0,
                     64.5, -64.5, 100.5, -100.5, 7.5, -7.5, 9.5, -9.5, 126.49999], dtype=F32)
    w.quant("f32 named ties (0.5->1, 2.5->3, -2.5->-3, 126.5->127)", np.stack([ties, -ties, ties * 4, ties / 1024]))

    # -- signed zeros and all-zero blocks
    pz = np.zeros(32, F32)
    nz = np.full(32, -0.0, F32)
    mixed = rng.standard_normal(32).astype(F32)
    mixed[::3] = -0.0
    tiny_neg = np.full(32, -0.0, F32)
    tiny_neg[5] = np.float32(-1e-3)  # small negatives round to -0.0 products -> 0x00
    zeros = np.stack([pz, nz, mixed, np.where(np.arange(32) % 2, pz, nz), tiny_neg])
    w.quant("f32 signed zeros / all-zero blocks", zeros)
    w.quant("bf16 signed zeros / all-zero blocks", zeros.astype(BF16))
    w.quant("f16 signed zeros / all-zero blocks", zeros.astype(F16))

    # -- float32 subnormals (IEEE subnormals, no FTZ/DAZ)
    sub = _f32(rng.integers(1, 0x00800000, size=(512, 32)))
    sub = np.where(rng.random((512, 32)) < 0.5, -sub, sub).astype(F32)
    w.quant("f32 subnormal blocks (1/d overflows: all zero)", sub)
    tiny = _f32(rng.integers(1, 64, size=(64, 32)))  # amax < 8.97e-44: d rounds to 0
    w.quant("f32 amax < 8.97e-44 (d == 0)", tiny)
    mix = rng.standard_normal((256, 32)).astype(F32)
    mix[:, 1::2] = sub[:256, 1::2]
    w.quant("f32 normal amax with subnormal elements", mix)
    w.quant("bf16 subnormal blocks", _f32(rng.integers(1, 0x00800000, size=(256, 32)) & 0xFFFF0000 | 0x00010000).astype(BF16))
    f16sub = rng.integers(1, 0x0400, size=(256, 32)).astype(np.uint16)
    f16sub[:, ::2] |= 0x8000
    w.quant("f16 subnormal blocks", f16sub.view(F16))

    # -- amax sweeps across every threshold of docs/Q8_0.md (+-48 ulp)
    for name, t in th.items():
        amax = _ulp_neighbourhood(t, 48)
        w.quant(f"f32 amax sweep around {name} = {float(t):.9g}", _blocks_with_amax(rng, amax))
    # ... and a log-uniform amax sweep over the whole float32 range
    amax = _f32(rng.integers(1, 0x7F7FFFFF, size=4096))
    w.quant("f32 log-uniform amax 1e-45..3.4e38", _blocks_with_amax(rng, amax))
    amax = np.array([1e-40, 2e-40, 1e-39, 5e-39, 1e-38, 3e-38, 1e-37, 3.7e-37, 1e-36, 3.79e-6, 7.75e-3,
                     65504 * 127, 8321040, 8321041, 8.4e6, 1e7, 1e10, 1e20, 1e30, 3.0e38,
                     np.finfo(F32).max], dtype=F32)
    w.quant("f32 named amax (1/d overflow, f16 scale overflow, FLT_MAX)", _blocks_with_amax(rng, amax))
    big = (rng.standard_normal((256, 32)) * 1e7).astype(F32)
    big[:, 3] = np.float32(8321040.0)
    w.quant("f32 scale overflows f16 (amax >= 8,321,040)", big)
    w.quant("bf16 scale overflows f16", (rng.standard_normal((256, 32)) * 3e7).astype(BF16))

    # -- random finite bit patterns (huge in-block dynamic range)
    w.quant("f32 random finite bit patterns", _finite_bits_f32(rng, 2048 * 32).view(F32))
    exps = rng.integers(1, 255, size=(1024, 1), dtype=np.uint32) << np.uint32(23)
    narrow = (_finite_bits_f32(rng, 1024 * 32).reshape(1024, 32) & np.uint32(0x807FFFFF)) | exps
    w.quant("f32 random bits, one exponent per block", narrow.view(F32))

    # -- every finite BF16 / F16 value, in bit order (adjacent values share a block) and shuffled
    for dt, expmask, label in ((BF16, 0x7F80, "bf16"), (F16, 0x7C00, "f16")):
        allb = np.arange(65536, dtype=np.uint32).astype(np.uint16)
        fin = allb[(allb & expmask) != expmask]
        fin = fin[: fin.size // 32 * 32]
        w.quant(f"{label} every finite value, bit order", fin.view(dt))
        w.quant(f"{label} every finite value, shuffled", rng.permutation(fin).view(dt))


def _nonfinite_cases(w: _Writer, rng: np.random.Generator) -> None:
    specials = {
        F32: {"nan": 0x7FC00000, "-nan": 0xFFC00000, "snan": 0x7F800001, "nan-payload": 0x7FFFFFFF,
              "+inf": 0x7F800000, "-inf": 0xFF800000},
        BF16: {"nan": 0x7FC0, "-nan": 0xFFC0, "snan": 0x7F81, "+inf": 0x7F80, "-inf": 0xFF80},
        F16: {"nan": 0x7E00, "-nan": 0xFE00, "snan": 0x7C01, "+inf": 0x7C00, "-inf": 0xFC00},
    }
    nb = 24
    for dt, sp in specials.items():
        ubits = np.uint32 if dt == F32 else np.uint16
        label = {F32: "f32", BF16: "bf16", F16: "f16"}[dt]
        base = (rng.standard_normal(nb * 32) * 3).astype(dt)
        positions = [0, 31, 32, 5 * 32 + 17, 23 * 32 + 31, 9 * 32]
        for i, (cls, bits) in enumerate(sp.items()):
            for pos in positions[i % 2 :: 2]:
                x = base.copy()
                xb = x.view(ubits)
                xb[pos] = bits
                # later bad values (another class, same block and later blocks) must not win
                for later in (pos + 1, pos + 3, pos + 64):
                    if later < x.size:
                        xb[later] = list(sp.values())[(i + 1) % len(sp)]
                w.quant(f"{label} {cls} at flat index {pos}", x)
        # many bad values, smallest index in the last block
        x = base.copy()
        x.view(ubits)[-20:] = sp["nan"]
        x.view(ubits)[-32 + 3] = sp["-inf"]
        w.quant(f"{label} nan/-inf only in the last block", x)


def _dequant_cases(w: _Writer, rng: np.random.Generator) -> None:
    q = np.concatenate(w.q8_blocks)
    w.add(KIND_DEQ_Q8, q.shape[0], "dequantize every finite Q8_0 output above", q.tobytes(),
          reference.dequantize_q8_0(q).tobytes(), flags=FLAG_NAN_ANY)
    # arbitrary blocks: every d16 bit pattern (Inf, NaN, -d, subnormal) with random qs incl. -128 and 0
    nb = 65536
    blocks = rng.integers(0, 256, size=(nb, 34), dtype=np.uint16).astype(np.uint8)
    blocks[:, :2] = np.arange(nb, dtype=np.uint32).astype(np.uint16).reshape(-1, 1).view(np.uint8)
    blocks[::7, 2:18] = 0
    blocks[::5, 20] = 0x80
    w.add(KIND_DEQ_Q8, nb, "dequantize every d16 bit pattern, random qs", blocks.tobytes(),
          reference.dequantize_q8_0(blocks).tobytes(), flags=FLAG_NAN_ANY)


def _decode_cases(w: _Writer) -> None:
    allbits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    w.add(KIND_BF16_F32, 65536, "bf16 -> f32, all 65536 bit patterns", allbits.tobytes(),
          reference.bf16_to_f32(allbits).tobytes())
    w.add(KIND_F16_F32, 65536, "f16 -> f32, all 65536 bit patterns", allbits.tobytes(),
          reference.f16_to_f32(allbits).tobytes())
    tail = allbits[0x7BF3:0x7C14]  # 33 values across max-finite/Inf/NaN: vector body + scalar tail
    w.add(KIND_BF16_F32, tail.size, "bf16 -> f32, 33 values (tail)", tail.tobytes(), reference.bf16_to_f32(tail).tobytes())
    w.add(KIND_F16_F32, tail.size, "f16 -> f32, 33 values (tail)", tail.tobytes(), reference.f16_to_f32(tail).tobytes())
    odd = np.roll(allbits, 3)[: 65536 - 5]
    w.add(KIND_F16_F32, odd.size, "f16 -> f32, 65531 rotated values", odd.tobytes(), reference.f16_to_f32(odd).tobytes())


def _kquant_cases(w: _Writer) -> None:
    """ggml's bytes for the committed adversarial and random rows (all finite)."""
    from hf2q import formats

    with np.load(KQUANT_DATA) as z:
        rows = np.ascontiguousarray(z["rows"], dtype=np.float32)
        for fmt in KQUANT_FORMATS:
            flags = formats.get(fmt).id << 8
            w.add(KIND_KQUANT_F32, rows.size, f"{fmt} from f32, {rows.shape[0]} ggml rows", rows.tobytes(),
                  np.ascontiguousarray(z[fmt]).tobytes(), flags=flags)


def build_vectors(seed: int = 20240607) -> tuple[bytes, dict[int, int]]:
    rng = np.random.default_rng(seed)
    w = _Writer()
    _decode_cases(w)
    _quant_cases(w, rng)
    _nonfinite_cases(w, rng)
    _dequant_cases(w, rng)
    _kquant_cases(w)
    return w.serialize(), w.counts


def write_vectors(path: str | Path, seed: int = 20240607) -> dict[int, int]:
    """Write the vector file; returns {kind: elements (blocks for kind 6)}."""
    data, counts = build_vectors(seed)
    Path(path).write_bytes(data)
    return counts


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} OUT.bin", file=sys.stderr)
        return 2
    counts = write_vectors(argv[1])
    names = {1: "bf16->f32 values", 2: "f16->f32 values", 3: "f32 q8 elements", 4: "bf16 q8 elements",
             5: "f16 q8 elements", 6: "q8 blocks dequantized", 7: "k-quant elements"}
    print(f"wrote {argv[1]} ({Path(argv[1]).stat().st_size} bytes): "
          + ", ".join(f"{counts.get(k, 0)} {v}" for k, v in names.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
