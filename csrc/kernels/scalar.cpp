// Scalar reference paths: the fallback on CPUs without SIMD, the path forced
// by tests, and the tail handler of the SIMD paths' callers.
#include "kernels_internal.h"

namespace hf2q::kernels {

std::uint16_t f32_to_f16_rne(float f) { return f32_to_f16_rne_inline(f); }
float f16_bits_to_f32(std::uint16_t h) { return f16_to_f32_inline(h); }

namespace scalar {
namespace {

// Exact round-half-away-from-zero (docs/Q8_0.md); equal to roundf.
inline float round_half_away(float p) {
  const float t = std::trunc(p);
  return t + (std::fabs(p - t) >= 0.5f ? std::copysign(1.0f, p) : 0.0f);
}

template <typename Widen>
Q8Result quantize_blocks(std::size_t nblocks, std::uint8_t* dst, Widen widen) {
  Q8Result result;
  float x[kQ8BlockElems];
  for (std::size_t b = 0; b < nblocks; ++b) {
    widen(b, x);
    float amax = 0.0f;
    for (std::size_t j = 0; j < kQ8BlockElems; ++j) {
      if (is_nonfinite_bits(f32_bits(x[j]))) {
        result.first_nonfinite = b * kQ8BlockElems + j;
        return result;
      }
      amax = std::fmax(amax, std::fabs(x[j]));
    }
    const BlockScale s = q8_block_scale(amax);
    std::uint8_t* out = dst + b * kQ8BlockBytes;
    store_le16(out, s.d16);
    result.inf_scales += s.inf_scale ? 1 : 0;
    auto* qs = reinterpret_cast<std::int8_t*>(out + 2);
    if (s.zero_qs) {
      std::memset(qs, 0, kQ8BlockElems);
      continue;
    }
    for (std::size_t j = 0; j < kQ8BlockElems; ++j) {
      qs[j] = static_cast<std::int8_t>(round_half_away(x[j] * s.id));
    }
  }
  return result;
}

}  // namespace

void bf16_to_f32(const std::uint16_t* src, float* dst, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32_inline(src[i]);
}

void f16_to_f32(const std::uint16_t* src, float* dst, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = f16_to_f32_inline(src[i]);
}

Q8Result quantize_q8_0(DType type, const void* src, std::uint8_t* dst, std::size_t nblocks) {
  switch (type) {
    case DType::F32: {
      const auto* s = static_cast<const float*>(src);
      return quantize_blocks(nblocks, dst, [s](std::size_t b, float* x) {
        std::memcpy(x, s + b * kQ8BlockElems, sizeof(float) * kQ8BlockElems);
      });
    }
    case DType::BF16: {
      const auto* s = static_cast<const std::uint16_t*>(src);
      return quantize_blocks(nblocks, dst, [s](std::size_t b, float* x) {
        for (std::size_t j = 0; j < kQ8BlockElems; ++j) x[j] = bf16_to_f32_inline(s[b * kQ8BlockElems + j]);
      });
    }
    case DType::F16: {
      const auto* s = static_cast<const std::uint16_t*>(src);
      return quantize_blocks(nblocks, dst, [s](std::size_t b, float* x) {
        for (std::size_t j = 0; j < kQ8BlockElems; ++j) x[j] = f16_to_f32_inline(s[b * kQ8BlockElems + j]);
      });
    }
    default: {
      // Any other float source the q8_0 row lists: widened a block at a
      // time by its own decode (to_f32_kernel throws for one without).
      const ToF32Fn widen = to_f32_kernel(type);
      const std::size_t in_block = kQ8BlockElems * kFormats[static_cast<int>(type)].block_bytes;
      const auto* s = static_cast<const std::uint8_t*>(src);
      return quantize_blocks(nblocks, dst, [s, widen, in_block](std::size_t b, float* x) {
        widen(s + b * in_block, x, kQ8BlockElems);
      });
    }
  }
}

void dequantize_q8_0(const std::uint8_t* src, float* dst, std::size_t nblocks) {
  for (std::size_t b = 0; b < nblocks; ++b) {
    const std::uint8_t* blk = src + b * kQ8BlockBytes;
    const float d = f16_to_f32_inline(load_le16(blk));
    const auto* qs = reinterpret_cast<const std::int8_t*>(blk + 2);
    float* y = dst + b * kQ8BlockElems;
    for (std::size_t j = 0; j < kQ8BlockElems; ++j) y[j] = static_cast<float>(qs[j]) * d;
  }
}

}  // namespace scalar
}  // namespace hf2q::kernels
