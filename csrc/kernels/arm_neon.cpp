// arm64 NEON paths (Apple Silicon, arm64 Linux). NEON is part of the arm64
// baseline, so this path is chosen at compile time. It is verified under
// qemu-aarch64 by the native test driver (tests/native/).
#if defined(__aarch64__)
#include <arm_neon.h>

#include "kernels_internal.h"

namespace hf2q::kernels::neon {
namespace {

inline void widen_bf16x8(const std::uint16_t* p, float32x4_t* out) {
  const uint16x8_t v = vld1q_u16(p);
  out[0] = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(v), 16));
  out[1] = vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(v), 16));
}

inline void widen_f16x8(const std::uint16_t* p, float32x4_t* out) {
  const uint16x8_t v = vld1q_u16(p);
  out[0] = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(v)));
  out[1] = vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(v)));
}

inline void store_qs(const float32x4_t v[8], float id, std::int8_t* qs) {
  int32x4_t q[8];
  // vcvtaq (FCVTAS) rounds to nearest with ties away from zero: the exact
  // semantics of roundf. vcvtnq would round ties to even: wrong.
  for (int k = 0; k < 8; ++k) q[k] = vcvtaq_s32_f32(vmulq_n_f32(v[k], id));
  for (int h = 0; h < 2; ++h) {
    const int16x8_t lo = vcombine_s16(vqmovn_s32(q[4 * h + 0]), vqmovn_s32(q[4 * h + 1]));
    const int16x8_t hi = vcombine_s16(vqmovn_s32(q[4 * h + 2]), vqmovn_s32(q[4 * h + 3]));
    vst1q_s8(qs + 16 * h, vcombine_s8(vqmovn_s16(lo), vqmovn_s16(hi)));
  }
}

// Returns the in-block index of the first non-finite element, or -1.
inline int quantize_block(const float32x4_t v[8], std::uint8_t* out, std::size_t& inf_scales) {
  const uint32x4_t max_finite = vdupq_n_u32(0x7F7FFFFFu);
  float32x4_t a[8];
  uint32x4_t bad = vdupq_n_u32(0);
  for (int k = 0; k < 8; ++k) {
    a[k] = vabsq_f32(v[k]);
    bad = vorrq_u32(bad, vcgtq_u32(vreinterpretq_u32_f32(a[k]), max_finite));
  }
  if (vmaxvq_u32(bad) != 0) {
    float x[kQ8BlockElems];
    for (int k = 0; k < 8; ++k) vst1q_f32(x + 4 * k, v[k]);
    for (int j = 0; j < static_cast<int>(kQ8BlockElems); ++j) {
      if (is_nonfinite_bits(f32_bits(x[j]))) return j;
    }
  }
  float32x4_t m = vmaxq_f32(vmaxq_f32(vmaxq_f32(a[0], a[1]), vmaxq_f32(a[2], a[3])),
                            vmaxq_f32(vmaxq_f32(a[4], a[5]), vmaxq_f32(a[6], a[7])));
  const BlockScale s = q8_block_scale(vmaxvq_f32(m));
  store_le16(out, s.d16);
  inf_scales += s.inf_scale ? 1 : 0;
  auto* qs = reinterpret_cast<std::int8_t*>(out + 2);
  if (s.zero_qs) {
    std::memset(qs, 0, kQ8BlockElems);
    return -1;
  }
  store_qs(v, s.id, qs);
  return -1;
}

// Four blocks at a time: their scales are computed in one vector (amax / 127,
// 1 / d and the float16 conversion are the same IEEE operations as the scalar
// q8_block_scale under the default FPCR, so the bytes are too). Returns false
// when a block holds a non-finite value; the caller then redoes these blocks
// one by one to find its exact index.
template <typename Load>
bool quantize_4_blocks(std::size_t b0, std::uint8_t* dst, Load& load, std::size_t& inf_scales) {
  const uint32x4_t max_finite = vdupq_n_u32(0x7F7FFFFFu);
  float32x4_t v[8];
  float32x4_t m[4];
  uint32x4_t bad = vdupq_n_u32(0);
  for (int k = 0; k < 4; ++k) {
    load(b0 + static_cast<std::size_t>(k), v);
    float32x4_t a[8];
    for (int j = 0; j < 8; ++j) {
      a[j] = vabsq_f32(v[j]);
      bad = vorrq_u32(bad, vcgtq_u32(vreinterpretq_u32_f32(a[j]), max_finite));
    }
    m[k] = vmaxq_f32(vmaxq_f32(vmaxq_f32(a[0], a[1]), vmaxq_f32(a[2], a[3])),
                     vmaxq_f32(vmaxq_f32(a[4], a[5]), vmaxq_f32(a[6], a[7])));
  }
  if (vmaxvq_u32(bad) != 0) return false;
  // vpmaxq pairs neighbours: two rounds leave lane k = max of block k.
  const float32x4_t amax = vpmaxq_f32(vpmaxq_f32(m[0], m[1]), vpmaxq_f32(m[2], m[3]));
  const float32x4_t d = vdivq_f32(amax, vdupq_n_f32(127.0f));
  const uint32x4_t nonzero = vcgtq_f32(d, vdupq_n_f32(0.0f));
  const float32x4_t id = vreinterpretq_f32_u32(
      vandq_u32(nonzero, vreinterpretq_u32_f32(vdivq_f32(vdupq_n_f32(1.0f), d))));
  float ids[4];
  std::uint16_t d16[4];
  vst1q_f32(ids, id);
  vst1_u16(d16, vreinterpret_u16_f16(vcvt_f16_f32(d)));
  for (int k = 0; k < 4; ++k) {
    std::uint8_t* out = dst + (b0 + static_cast<std::size_t>(k)) * kQ8BlockBytes;
    store_le16(out, d16[k]);
    inf_scales += d16[k] == 0x7C00u ? 1 : 0;
    auto* qs = reinterpret_cast<std::int8_t*>(out + 2);
    if (is_inf(ids[k])) {  // 1/d overflowed: the reference stores zeros
      std::memset(qs, 0, kQ8BlockElems);
      continue;
    }
    load(b0 + static_cast<std::size_t>(k), v);
    store_qs(v, ids[k], qs);
  }
  return true;
}

template <typename Load>
Q8Result quantize_blocks(std::size_t nblocks, std::uint8_t* dst, Load load) {
  Q8Result result;
  float32x4_t v[8];
  std::size_t b = 0;
  for (; b + 4 <= nblocks; b += 4) {
    if (!quantize_4_blocks(b, dst, load, result.inf_scales)) break;  // non-finite: locate it below
  }
  for (; b < nblocks; ++b) {
    load(b, v);
    const int bad = quantize_block(v, dst + b * kQ8BlockBytes, result.inf_scales);
    if (bad >= 0) {
      result.first_nonfinite = b * kQ8BlockElems + static_cast<std::size_t>(bad);
      return result;
    }
  }
  return result;
}

}  // namespace

void bf16_to_f32(const std::uint16_t* src, float* dst, std::size_t n) {
  std::size_t i = 0;
  float32x4_t v[2];
  for (; i + 8 <= n; i += 8) {
    widen_bf16x8(src + i, v);
    vst1q_f32(dst + i, v[0]);
    vst1q_f32(dst + i + 4, v[1]);
  }
  for (; i < n; ++i) dst[i] = bf16_to_f32_inline(src[i]);
}

void f16_to_f32(const std::uint16_t* src, float* dst, std::size_t n) {
  std::size_t i = 0;
  float32x4_t v[2];
  for (; i + 8 <= n; i += 8) {
    widen_f16x8(src + i, v);
    vst1q_f32(dst + i, v[0]);
    vst1q_f32(dst + i + 4, v[1]);
  }
  for (; i < n; ++i) dst[i] = f16_to_f32_inline(src[i]);
}

Q8Result quantize_q8_0(DType type, const void* src, std::uint8_t* dst, std::size_t nblocks) {
  switch (type) {
    case DType::F32: {
      const auto* s = static_cast<const float*>(src);
      return quantize_blocks(nblocks, dst, [s](std::size_t b, float32x4_t* v) {
        const float* p = s + b * kQ8BlockElems;
        for (int k = 0; k < 8; ++k) v[k] = vld1q_f32(p + 4 * k);
      });
    }
    case DType::BF16: {
      const auto* s = static_cast<const std::uint16_t*>(src);
      return quantize_blocks(nblocks, dst, [s](std::size_t b, float32x4_t* v) {
        const std::uint16_t* p = s + b * kQ8BlockElems;
        for (int k = 0; k < 4; ++k) widen_bf16x8(p + 8 * k, v + 2 * k);
      });
    }
    case DType::F16: {
      const auto* s = static_cast<const std::uint16_t*>(src);
      return quantize_blocks(nblocks, dst, [s](std::size_t b, float32x4_t* v) {
        const std::uint16_t* p = s + b * kQ8BlockElems;
        for (int k = 0; k < 4; ++k) widen_f16x8(p + 8 * k, v + 2 * k);
      });
    }
    default: break;
  }
  // Sources without a vector path: the scalar kernel (equal results).
  return scalar::quantize_q8_0(type, src, dst, nblocks);
}

void dequantize_q8_0(const std::uint8_t* src, float* dst, std::size_t nblocks) {
  for (std::size_t b = 0; b < nblocks; ++b) {
    const std::uint8_t* blk = src + b * kQ8BlockBytes;
    const float d = f16_to_f32_inline(load_le16(blk));
    float* y = dst + b * kQ8BlockElems;
    for (int h = 0; h < 2; ++h) {
      const int8x16_t q = vld1q_s8(reinterpret_cast<const std::int8_t*>(blk + 2 + 16 * h));
      const int16x8_t lo = vmovl_s8(vget_low_s8(q));
      const int16x8_t hi = vmovl_s8(vget_high_s8(q));
      vst1q_f32(y + 16 * h + 0, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), d));
      vst1q_f32(y + 16 * h + 4, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo))), d));
      vst1q_f32(y + 16 * h + 8, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), d));
      vst1q_f32(y + 16 * h + 12, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi))), d));
    }
  }
}

}  // namespace hf2q::kernels::neon
#endif  // __aarch64__
