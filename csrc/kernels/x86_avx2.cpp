// AVX2 + F16C paths. This translation unit alone is compiled with
// -mavx2 -mf16c; dispatch.cpp calls into it only after checking CPUID.
#include <immintrin.h>

#include "avx2_common.h"
#include "kernels_internal.h"

namespace hf2q::kernels::avx2 {
namespace {

using avx2_common::hmax8;

inline __m256 widen_bf16x8(const std::uint16_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

inline __m256 widen_f16x8(const std::uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Exact round-half-away-from-zero: t = trunc(p); t + sign(p) if |p - t| >= 0.5.
// (_mm256_round_ps to nearest and _mm256_cvtps_epi32 round ties to even: wrong.)
inline __m256 round_half_away(__m256 p) {
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  const __m256 t = _mm256_round_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256 frac = _mm256_andnot_ps(sign_mask, _mm256_sub_ps(p, t));
  const __m256 ge_half = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
  const __m256 signed_one = _mm256_or_ps(_mm256_set1_ps(1.0f), _mm256_and_ps(p, sign_mask));
  return _mm256_add_ps(t, _mm256_and_ps(ge_half, signed_one));
}

// The 32 quantized bytes of one block: round_half_away(x * id) as int8.
inline void store_qs(const __m256 v[4], float id, std::uint8_t* qs) {
  const __m256 vid = _mm256_set1_ps(id);
  __m256i q[4];
  for (int k = 0; k < 4; ++k) q[k] = _mm256_cvttps_epi32(round_half_away(_mm256_mul_ps(v[k], vid)));
  // Values lie in [-127, 127], so the saturating packs are exact. The packs
  // work per 128-bit lane; the permute restores element order.
  const __m256i p01 = _mm256_packs_epi32(q[0], q[1]);
  const __m256i p23 = _mm256_packs_epi32(q[2], q[3]);
  __m256i bytes = _mm256_packs_epi16(p01, p23);
  bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs), bytes);
}

// Quantize one block held in four registers. Returns the index within the
// block of the first non-finite element, or -1.
inline int quantize_block(const __m256 v[4], std::uint8_t* out, std::size_t& inf_scales) {
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  const __m256i max_finite = _mm256_set1_epi32(0x7F7FFFFF);
  __m256 a[4];
  __m256i bad = _mm256_setzero_si256();
  for (int k = 0; k < 4; ++k) {
    a[k] = _mm256_andnot_ps(sign_mask, v[k]);
    bad = _mm256_or_si256(bad, _mm256_cmpgt_epi32(_mm256_castps_si256(a[k]), max_finite));
  }
  if (!_mm256_testz_si256(bad, bad)) {
    for (int k = 0; k < 4; ++k) {
      const int m = _mm256_movemask_ps(
          _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_castps_si256(a[k]), max_finite)));
      if (m != 0) return k * 8 + __builtin_ctz(static_cast<unsigned>(m));
    }
  }
  // amax over non-negative finite values: max order does not matter.
  const __m256 m8 = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const BlockScale s = q8_block_scale(_mm_cvtss_f32(m4));
  store_le16(out, s.d16);
  inf_scales += s.inf_scale ? 1 : 0;
  if (s.zero_qs) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2), _mm256_setzero_si256());
    return -1;
  }
  store_qs(v, s.id, out + 2);
  return -1;
}

// Eight blocks at a time: the scales of all eight are computed in one vector
// (amax / 127, 1 / d and the F16C round-to-nearest-even conversion are the
// same IEEE operations as the scalar q8_block_scale, so the bytes are too),
// which takes the per-block scalar work off the critical path. Returns false
// when a block holds a non-finite value; the caller then redoes these blocks
// one by one to find its exact index.
template <typename Load>
bool quantize_8_blocks(std::size_t b0, std::uint8_t* dst, Load& load, std::size_t& inf_scales) {
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  const __m256i max_finite = _mm256_set1_epi32(0x7F7FFFFF);
  __m256 v[4];
  __m256 m[8];
  __m256i bad = _mm256_setzero_si256();
  for (int k = 0; k < 8; ++k) {
    load(b0 + static_cast<std::size_t>(k), v);
    __m256 a[4];
    for (int j = 0; j < 4; ++j) {
      a[j] = _mm256_andnot_ps(sign_mask, v[j]);
      bad = _mm256_or_si256(bad, _mm256_cmpgt_epi32(_mm256_castps_si256(a[j]), max_finite));
    }
    m[k] = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
  }
  if (!_mm256_testz_si256(bad, bad)) return false;
  const __m256 amax = hmax8(m);
  const __m256 d = _mm256_div_ps(amax, _mm256_set1_ps(127.0f));
  const __m256 nonzero = _mm256_cmp_ps(d, _mm256_setzero_ps(), _CMP_NEQ_OQ);
  const __m256 id = _mm256_and_ps(nonzero, _mm256_div_ps(_mm256_set1_ps(1.0f), d));
  alignas(32) float ids[8];
  alignas(16) std::uint16_t d16[8];
  _mm256_store_ps(ids, id);
  _mm_store_si128(reinterpret_cast<__m128i*>(d16), _mm256_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (int k = 0; k < 8; ++k) {
    std::uint8_t* out = dst + (b0 + static_cast<std::size_t>(k)) * kQ8BlockBytes;
    store_le16(out, d16[k]);
    inf_scales += d16[k] == 0x7C00u ? 1 : 0;
    if (is_inf(ids[k])) {  // 1/d overflowed: the reference stores zeros
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2), _mm256_setzero_si256());
      continue;
    }
    load(b0 + static_cast<std::size_t>(k), v);
    store_qs(v, ids[k], out + 2);
  }
  return true;
}

template <typename Load>
Q8Result quantize_blocks(std::size_t nblocks, std::uint8_t* dst, Load load) {
  Q8Result result;
  __m256 v[4];
  std::size_t b = 0;
  for (; b + 8 <= nblocks; b += 8) {
    if (!quantize_8_blocks(b, dst, load, result.inf_scales)) break;  // non-finite: locate it below
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

// Large aligned outputs are written with non-temporal stores: they skip the
// read-for-ownership of destination lines, a third of a decode's traffic.
constexpr std::size_t kStreamMinBytes = 1u << 20;

template <typename Widen8, typename Scalar>
void decode(const std::uint16_t* src, float* dst, std::size_t n, Widen8 widen, Scalar scalar_one) {
  std::size_t i = 0;
  // Scalar head up to 32-byte alignment so the streaming loop may run.
  while (i < n && (reinterpret_cast<std::uintptr_t>(dst + i) & 31u) != 0) {
    dst[i] = scalar_one(src[i]);
    ++i;
  }
  if ((n - i) * sizeof(float) >= kStreamMinBytes) {
    for (; i + 32 <= n; i += 32) {
      const __m256 a = widen(src + i), b = widen(src + i + 8);
      const __m256 c = widen(src + i + 16), d = widen(src + i + 24);
      _mm256_stream_ps(dst + i, a);
      _mm256_stream_ps(dst + i + 8, b);
      _mm256_stream_ps(dst + i + 16, c);
      _mm256_stream_ps(dst + i + 24, d);
    }
    _mm_sfence();
  }
  for (; i + 8 <= n; i += 8) _mm256_store_ps(dst + i, widen(src + i));
  for (; i < n; ++i) dst[i] = scalar_one(src[i]);
}

}  // namespace

void bf16_to_f32(const std::uint16_t* src, float* dst, std::size_t n) {
  decode(src, dst, n, widen_bf16x8, bf16_to_f32_inline);
}

void f16_to_f32(const std::uint16_t* src, float* dst, std::size_t n) {
  decode(src, dst, n, widen_f16x8, f16_to_f32_inline);
}

Q8Result quantize_q8_0(DType type, const void* src, std::uint8_t* dst, std::size_t nblocks) {
  switch (type) {
    case DType::F32: {
      const auto* s = static_cast<const float*>(src);
      return quantize_blocks(nblocks, dst, [s](std::size_t b, __m256* v) {
        const float* p = s + b * kQ8BlockElems;
        for (int k = 0; k < 4; ++k) v[k] = _mm256_loadu_ps(p + 8 * k);
      });
    }
    case DType::BF16: {
      const auto* s = static_cast<const std::uint16_t*>(src);
      return quantize_blocks(nblocks, dst, [s](std::size_t b, __m256* v) {
        const std::uint16_t* p = s + b * kQ8BlockElems;
        for (int k = 0; k < 4; ++k) v[k] = widen_bf16x8(p + 8 * k);
      });
    }
    case DType::F16: {
      const auto* s = static_cast<const std::uint16_t*>(src);
      return quantize_blocks(nblocks, dst, [s](std::size_t b, __m256* v) {
        const std::uint16_t* p = s + b * kQ8BlockElems;
        for (int k = 0; k < 4; ++k) v[k] = widen_f16x8(p + 8 * k);
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
    const __m256 d = _mm256_set1_ps(f16_to_f32_inline(load_le16(blk)));
    float* y = dst + b * kQ8BlockElems;
    for (int k = 0; k < 4; ++k) {
      const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + 8 * k));
      const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));
      _mm256_storeu_ps(y + 8 * k, _mm256_mul_ps(q, d));
    }
  }
}

}  // namespace hf2q::kernels::avx2
