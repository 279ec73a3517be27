// Internal to csrc/kernels: per-ISA range implementations and the helpers
// they share. Everything defined in this header has internal linkage on
// purpose: the AVX2 translation unit is compiled with -mavx2, and an inline
// function with external linkage could be merged by the linker into the
// scalar path and execute AVX2 instructions on a CPU that lacks them.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels.h"

namespace hf2q::kernels {
namespace {

inline std::uint32_t f32_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float bits_f32(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline bool is_nonfinite_bits(std::uint32_t u) { return (u & 0x7F800000u) == 0x7F800000u; }

// A bit test, not std::isinf: an inline libm helper with external linkage,
// emitted in the -mavx2 translation unit, could be the copy the linker keeps
// for the scalar path too (unoptimised builds).
inline bool is_inf(float f) { return (f32_bits(f) & 0x7FFFFFFFu) == 0x7F800000u; }

// IEEE binary32 -> binary16, round to nearest even, overflow to +-Inf, NaN
// kept quiet. Equal to numpy astype(float16) / F16C _cvtss_sh(x, 0) for every
// non-NaN input. Uses the FPU (default rounding mode) for the subnormal range.
inline std::uint16_t f32_to_f16_rne_inline(float f) {
  std::uint32_t x = f32_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7FFFFFFFu;
  std::uint32_t out;
  if (x >= 0x47800000u) {  // >= 65536 (or Inf/NaN)
    out = x > 0x7F800000u ? (0x7E00u | ((x >> 13) & 0x3FFu)) : 0x7C00u;
  } else if (x < 0x38800000u) {  // below 2^-14: fp16 subnormal or zero
    // Adding 0.5 puts the fp16 subnormal's bits at the bottom of the float32
    // mantissa, rounded to nearest even by the addition itself.
    const float magic = 0.5f;
    const float sum = bits_f32(x) + magic;
    out = f32_bits(sum) - f32_bits(magic);
  } else {
    const std::uint32_t mant_odd = (x >> 13) & 1u;
    x += (static_cast<std::uint32_t>(15 - 127) << 23) + 0xFFFu;  // rebias + round
    x += mant_odd;
    out = x >> 13;  // carries into the exponent give 0x7C00 for [65520, 65536)
  }
  return static_cast<std::uint16_t>(out | sign);
}

// IEEE binary16 -> binary32, exact. NaN: payload kept, quiet bit set, as the
// hardware converters (F16C VCVTPH2PS, arm64 FCVT) do.
inline float f16_to_f32_inline(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  const std::uint32_t mant = h & 0x3FFu;
  std::uint32_t bits;
  if (exp == 0) {
    // zero or subnormal: mant * 2^-24 is exact in float32
    bits = sign | f32_bits(static_cast<float>(mant) * 5.9604644775390625e-8f);
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | (mant << 13) | (mant ? 0x00400000u : 0u);
  } else {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  return bits_f32(bits);
}

inline float bf16_to_f32_inline(std::uint16_t b) {
  return bits_f32(static_cast<std::uint32_t>(b) << 16);
}

// Per-block scale, exactly as ggml's quantize_row_q8_0_ref: d = amax/127 in
// float32, id = 1/d from the already rounded d (never 127/amax).
struct BlockScale {
  float id;
  std::uint16_t d16;
  // 1/d overflowed to +Inf: every product is +-Inf or NaN, which the C
  // reference turns into 0x00 on x86. Store zeros.
  bool zero_qs;
  bool inf_scale;
};

inline BlockScale q8_block_scale(float amax) {
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const std::uint16_t d16 = f32_to_f16_rne_inline(d);
  return BlockScale{id, d16, is_inf(id), d16 == 0x7C00u};
}

inline void store_le16(std::uint8_t* p, std::uint16_t v) {
  p[0] = static_cast<std::uint8_t>(v & 0xFFu);
  p[1] = static_cast<std::uint8_t>(v >> 8);
}

inline std::uint16_t load_le16(const std::uint8_t* p) {
  return static_cast<std::uint16_t>(p[0] | (p[1] << 8));
}

}  // namespace

// Range implementations. Indices in Q8Result are relative to the range start.
namespace scalar {
void bf16_to_f32(const std::uint16_t* src, float* dst, std::size_t n);
void f16_to_f32(const std::uint16_t* src, float* dst, std::size_t n);
Q8Result quantize_q8_0(DType type, const void* src, std::uint8_t* dst, std::size_t nblocks);
void dequantize_q8_0(const std::uint8_t* src, float* dst, std::size_t nblocks);
}  // namespace scalar

#if defined(HF2Q_HAVE_AVX2)
namespace avx2 {
void bf16_to_f32(const std::uint16_t* src, float* dst, std::size_t n);
void f16_to_f32(const std::uint16_t* src, float* dst, std::size_t n);
Q8Result quantize_q8_0(DType type, const void* src, std::uint8_t* dst, std::size_t nblocks);
void dequantize_q8_0(const std::uint8_t* src, float* dst, std::size_t nblocks);
}  // namespace avx2
#endif

#if defined(__aarch64__)
namespace neon {
void bf16_to_f32(const std::uint16_t* src, float* dst, std::size_t n);
void f16_to_f32(const std::uint16_t* src, float* dst, std::size_t n);
Q8Result quantize_q8_0(DType type, const void* src, std::uint8_t* dst, std::size_t nblocks);
void dequantize_q8_0(const std::uint8_t* src, float* dst, std::size_t nblocks);
}  // namespace neon
#endif

}  // namespace hf2q::kernels
