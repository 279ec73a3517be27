// AVX2 + F16C row kernels of the scaled FP8 decoder (fp8_simd.h). This
// translation unit alone is compiled with -mavx2 -mf16c; fp8.cpp calls it
// only after checking CPUID. Bit-identical to the scalar path:
//
// - Decode: an FP8 byte becomes an exact binary16 and F16C widens it exactly.
//   E5M2 is the top byte of a binary16. E4M3FN `s eeee mmm` placed at binary16
//   bits `s 0eeee mmm0000000` is its value times 2^-8 (normals and the
//   subnormals m * 2^-9 alike), so the E4M3 chunk is multiplied by
//   scale * 2^8 instead: both factors are exact, so the one rounded float32
//   product is the same number as decode(w) * scale.
// - Fast chunks: 16 bytes without a NaN/Inf encoding under a scale of
//   magnitude below 2^111. Their products are finite (|w| <= 57344 < 2^16),
//   so they need no NaN handling and scale * 2^8 is exact. Every other chunk
//   is computed by the scalar expression, table[w] * scale, and checked.
// - Even/odd decode (bf16 and Q8_0): 32 bytes are read as sixteen 16-bit
//   words; the low bytes (even elements) and the high bytes (odd elements)
//   become binary16 bits in place by shifts and masks, with no shuffle. The
//   two results meet again in each 32-bit lane of the output (bf16: two
//   bfloat16 words; Q8_0: two int8 bytes before the 32 -> 16 bit pack).
// - Q8_0: eight blocks at a time, the scales of the eight computed in one
//   vector (amax / 127, 1 / d and the F16C round to nearest even: the same
//   IEEE operations as q8_block_scale). Rows whose scales are all in
//   [+0, 2^111) take q8_group_fast (amax from the largest |w| of each
//   16-element chunk, quantized magnitudes, the sign put back by vpsignb);
//   other rows, and groups holding a NaN/Inf byte, q8_group_products (the 32
//   products of each block kept in a 1 KiB stack buffer between the amax and
//   the quantize pass). Rounding half away from zero is
//   trunc(p + copysign(0.49999997f, p)): equal to roundf for |p| < 2^23 (the
//   sum reaches the next integer only when frac(|p|) >= 0.5; tests check it
//   against the scalar quantizer), and |p| = |x| * (1 / d) <= amax / d is a
//   few hundred at most here.
// - The row loops prefetch their input 1 KiB ahead: without it the Q8_0 loop
//   waited on memory for about as long as it computed (docs/FP8.md, Speed).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "avx2_common.h"
#include "fp8_simd.h"
#include "fp8_product.h"
#include "format_kernels.h"
#include "kernels_internal.h"

namespace hf2q::kernels::fp8_avx2 {
namespace {

using avx2_common::hmax8;

constexpr std::uint32_t kSafeScaleBits = (111u + 127u) << 23;  // |scale| < 2^111 (and finite)

inline bool safe_scale(float s) { return (f32_bits(s) & 0x7FFFFFFFu) < kSafeScaleBits; }

constexpr int kPrefetchBytes = 1024;

// The value, opaque to the optimiser: a constant vector stays in its register
// instead of being rebuilt inside a loop.
template <class V>
inline V opaque(V v) {
  __asm__("" : "+x"(v));
  return v;
}

template <bool E5>
inline bool special16(__m128i raw) {
  const __m128i m = _mm_set1_epi8(static_cast<char>(E5 ? 0x7C : 0x7F));
  return _mm_movemask_epi8(_mm_cmpeq_epi8(_mm_and_si128(raw, m), m)) != 0;
}

// The scalar expression for a chunk the fast path does not take (kept out of
// line so that the fast path stays compact). Returns the index of the first
// NaN/Inf product, or -1.
__attribute__((noinline, cold)) int slow16(const std::uint8_t* p, float s, const float* table, float* y) {
  int bad = -1;
  for (int j = 0; j < 16; ++j) {
    y[j] = fp8_product(table[p[j]], s);
    if (bad < 0 && is_nonfinite_bits(f32_bits(y[j]))) bad = j;
  }
  return bad;
}

// Products of 16 elements. Returns -1 when all are finite, else the index of
// the first NaN/Inf product (the products are still the scalar path's).
template <bool E5>
inline int products16(const std::uint8_t* p, float s, const float* table, __m256& lo, __m256& hi) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if (__builtin_expect(safe_scale(s) && !special16<E5>(raw), 1)) {
    __m256i h;
    if (E5) {
      h = _mm256_slli_epi16(_mm256_cvtepu8_epi16(raw), 8);
    } else {
      h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(raw), 7),
                           _mm256_set1_epi16(static_cast<short>(0xBF80)));
    }
    const __m256 vs = _mm256_set1_ps(E5 ? s : s * 256.0f);
    lo = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), vs);
    hi = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), vs);
    return -1;
  }
  alignas(32) float y[16];
  const int bad = slow16(p, s, table, y);
  lo = _mm256_load_ps(y);
  hi = _mm256_load_ps(y + 8);
  return bad;
}

template <bool E5>
inline __m256i widen_half(__m128i raw) {
  if (E5) return _mm256_slli_epi16(_mm256_cvtepu8_epi16(raw), 8);
  return _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(raw), 7), _mm256_set1_epi16(static_cast<short>(0xBF80)));
}

// The 32 products of one Q8_0 block (chunks k and k + 1). Returns -1 when all
// are finite, else the index of the first NaN/Inf product.
template <bool E5>
inline int products32(const std::uint8_t* p, const float* cs, const float* table, __m256 v[4]) {
  const float s0 = cs[0], s1 = cs[1];
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i m = _mm256_set1_epi8(static_cast<char>(E5 ? 0x7C : 0x7F));
  const bool special = _mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_and_si256(raw, m), m)) != 0;
  if (__builtin_expect(safe_scale(s0) && safe_scale(s1) && !special, 1)) {
    const __m256i h0 = widen_half<E5>(_mm256_castsi256_si128(raw));
    const __m256i h1 = widen_half<E5>(_mm256_extracti128_si256(raw, 1));
    const __m256 vs0 = _mm256_set1_ps(E5 ? s0 : s0 * 256.0f);
    const __m256 vs1 = _mm256_set1_ps(E5 ? s1 : s1 * 256.0f);
    v[0] = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h0)), vs0);
    v[1] = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h0, 1)), vs0);
    v[2] = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h1)), vs1);
    v[3] = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h1, 1)), vs1);
    return -1;
  }
  const int e0 = products16<E5>(p, s0, table, v[0], v[1]);
  if (e0 >= 0) return e0;
  const int e1 = products16<E5>(p + 16, s1, table, v[2], v[3]);
  return e1 >= 0 ? 16 + e1 : -1;
}

// float32 -> bfloat16 round to nearest even of 8 finite values (Inf too).
inline __m256i bf16_rne_finite(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  return _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), odd), 16);
}

inline std::uint16_t bf16_rne_scalar(float f) {
  const std::uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// Whether the n scales are all finite with magnitude below 2^111 (and, with
// `nonneg`, no sign bit set: +0 included, -0 excluded).
inline bool scales_safe(const float* cs, std::size_t n, bool nonneg) {
  const __m256i limit = _mm256_set1_epi32(static_cast<int>(kSafeScaleBits - 1));
  const __m256i mag = _mm256_set1_epi32(nonneg ? -1 : 0x7FFFFFFF);
  __m256i ok = _mm256_set1_epi32(-1);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i b = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(cs + i)), mag);
    ok = _mm256_and_si256(ok, _mm256_cmpeq_epi32(_mm256_min_epu32(b, limit), b));  // b <= limit, unsigned
  }
  if (_mm256_movemask_epi8(ok) != -1) return false;
  for (; i < n; ++i) {
    const std::uint32_t b = f32_bits(cs[i]) & (nonneg ? 0xFFFFFFFFu : 0x7FFFFFFFu);
    if (b >= kSafeScaleBits) return false;
  }
  return true;
}

// The input a few rows of 64-byte lines ahead (the hardware prefetcher alone
// left these loops waiting on memory: docs/FP8.md, Speed).
inline void prefetch_ahead(const std::uint8_t* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes, _MM_HINT_T0);
}

// 32 FP8 bytes as the binary16 bits of the magnitudes |w| of their even
// elements (the low byte of each 16-bit word: elements 0, 2, .., 30) and of
// their odd elements, in place, without shuffles: 128-bit lane 0 of each
// holds elements 0..15, lane 1 elements 16..31. E4M3 values are times 2^-8
// (the file comment). Sign bits cleared, the words' integer order is their
// value order.
template <bool E5>
inline void abs_halves(__m256i raw, __m256i& even, __m256i& odd) {
  even = _mm256_slli_epi16(_mm256_and_si256(raw, _mm256_set1_epi16(0x007F)), E5 ? 8 : 7);
  odd = E5 ? _mm256_and_si256(raw, _mm256_set1_epi16(0x7F00))
           : _mm256_and_si256(_mm256_srli_epi16(raw, 1), _mm256_set1_epi16(0x3F80));
}

// One 16-element chunk of a bf16 row by products16 (any bytes, any scale).
template <bool E5>
inline void bf16_chunk16(const std::uint8_t* w, const float* cs, std::size_t c, const float* table, std::uint16_t* o,
                         std::size_t& bad) {
  __m256 lo, hi;
  const int b = products16<E5>(w + c, cs[c / 16], table, lo, hi);
  if (b < 0) {
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(bf16_rne_finite(lo), bf16_rne_finite(hi)), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + c), packed);
    return;
  }
  if (bad == kNoIndex) bad = c + static_cast<std::size_t>(b);
  alignas(32) float y[16];
  _mm256_store_ps(y, lo);
  _mm256_store_ps(y + 8, hi);
  for (int j = 0; j < 16; ++j) o[c + j] = bf16_rne_scalar(y[j]);
}

template <bool E5>
std::size_t row_bf16(const std::uint8_t* w, const float* cs, std::size_t cols, const float* table, std::uint16_t* o) {
  std::size_t bad = kNoIndex;
  std::size_t c = 0;
  // 32 elements a step when the row's scales are all in the fast range: even
  // and odd elements decoded apart (no shuffles), their bf16 words meeting
  // again in each 32-bit lane, stored in order.
  const bool fast = scales_safe(cs, cols / 32 * 2, false);
  // Constants kept in registers: GCC otherwise rebuilds each one in the loop
  // (a GPR move and a broadcast, on the shuffle port).
  const __m256i special = opaque(_mm256_set1_epi8(static_cast<char>(E5 ? 0x7C : 0x7F)));
  const __m256i sign_exp = opaque(_mm256_set1_epi16(static_cast<short>(E5 ? 0xFF00 : 0xBF80)));
  const __m256i bias = opaque(_mm256_set1_epi32(0x7FFF));
  const __m256i one = opaque(_mm256_set1_epi32(1));
  const __m256i hi_words = opaque(_mm256_set1_epi32(static_cast<int>(0xFFFF0000u)));
  const auto rne = [&](__m256 v) {  // u + 0x7FFF + (bit 16 of u): bfloat16(v) in its top 16 bits
    const __m256i u = _mm256_castps_si256(v);
    return _mm256_add_epi32(_mm256_add_epi32(u, bias), _mm256_and_si256(_mm256_srli_epi32(u, 16), one));
  };
  for (; c + 32 <= cols; c += 32) {
    prefetch_ahead(w + c);
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + c));
    if (__builtin_expect(fast && _mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_and_si256(raw, special), special)) == 0, 1)) {
      // Even elements (low byte of each 16-bit word) and odd ones apart, as
      // binary16 bits with their signs (abs_halves' layout).
      const __m256i e = E5 ? _mm256_slli_epi16(raw, 8) : _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(raw, 8), 1), sign_exp);
      const __m256i od = E5 ? _mm256_and_si256(raw, sign_exp) : _mm256_and_si256(_mm256_srai_epi16(raw, 1), sign_exp);
      const __m256 vs0 = _mm256_set1_ps(E5 ? cs[c / 16] : cs[c / 16] * 256.0f);
      const __m256 vs1 = _mm256_set1_ps(E5 ? cs[c / 16 + 1] : cs[c / 16 + 1] * 256.0f);
      const __m256i e0 = rne(_mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(e)), vs0));
      const __m256i o0 = rne(_mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(od)), vs0));
      const __m256i e1 = rne(_mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(e, 1)), vs1));
      const __m256i o1 = rne(_mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(od, 1)), vs1));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + c),
                          _mm256_or_si256(_mm256_srli_epi32(e0, 16), _mm256_and_si256(o0, hi_words)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + c + 16),
                          _mm256_or_si256(_mm256_srli_epi32(e1, 16), _mm256_and_si256(o1, hi_words)));
      continue;
    }
    bf16_chunk16<E5>(w, cs, c, table, o, bad);
    bf16_chunk16<E5>(w, cs, c + 16, table, o, bad);
  }
  for (; c + 16 <= cols; c += 16) bf16_chunk16<E5>(w, cs, c, table, o, bad);
  for (; c < cols; ++c) {
    const float y = fp8_product(table[w[c]], cs[c / 16]);
    if (bad == kNoIndex && is_nonfinite_bits(f32_bits(y))) bad = c;
    o[c] = bf16_rne_scalar(y);
  }
  return bad;
}

template <bool E5>
std::size_t row_f16(const std::uint8_t* w, const float* cs, std::size_t cols, const float* table, std::uint16_t* o) {
  std::size_t bad = kNoIndex;
  std::size_t c = 0;
  for (; c + 16 <= cols; c += 16) {
    if ((c & 63) == 0) prefetch_ahead(w + c);
    __m256 lo, hi;
    const int b = products16<E5>(w + c, cs[c / 16], table, lo, hi);
    if (b < 0) {
      const __m128i a = _mm256_cvtps_ph(lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m128i z = _mm256_cvtps_ph(hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + c), _mm256_set_m128i(z, a));
      continue;
    }
    if (bad == kNoIndex) bad = c + static_cast<std::size_t>(b);
    alignas(32) float y[16];
    _mm256_store_ps(y, lo);
    _mm256_store_ps(y + 8, hi);
    for (int j = 0; j < 16; ++j) o[c + j] = f32_to_f16_rne_inline(y[j]);  // NaN as the scalar path writes it
  }
  for (; c < cols; ++c) {
    const float y = fp8_product(table[w[c]], cs[c / 16]);
    if (bad == kNoIndex && is_nonfinite_bits(f32_bits(y))) bad = c;
    o[c] = f32_to_f16_rne_inline(y);
  }
  return bad;
}

template <bool E5>
std::size_t row_f32(const std::uint8_t* w, const float* cs, std::size_t cols, const float* table, float* o) {
  std::size_t bad = kNoIndex;
  std::size_t c = 0;
  for (; c + 16 <= cols; c += 16) {
    if ((c & 63) == 0) prefetch_ahead(w + c);
    __m256 lo, hi;
    const int b = products16<E5>(w + c, cs[c / 16], table, lo, hi);
    if (b >= 0 && bad == kNoIndex) bad = c + static_cast<std::size_t>(b);
    _mm256_storeu_ps(o + c, lo);
    _mm256_storeu_ps(o + c + 8, hi);
  }
  for (; c < cols; ++c) {
    o[c] = fp8_product(table[w[c]], cs[c / 16]);
    if (bad == kNoIndex && is_nonfinite_bits(f32_bits(o[c]))) bad = c;
  }
  return bad;
}

// roundf(v * id) as int32, 8 at a time (see the file comment).
inline __m256i round_half_away_i32(__m256 v, __m256 vid) {
  const __m256 p = _mm256_mul_ps(v, vid);
  const __m256 half = _mm256_or_ps(_mm256_and_ps(p, _mm256_set1_ps(-0.0f)), _mm256_set1_ps(0.49999997f));
  return _mm256_cvttps_epi32(_mm256_add_ps(p, half));
}

// The scales of up to eight Q8_0 blocks from their amax, as
// q8_block_scale computes them, in one vector: d = amax / 127, id = 1 / d
// (0 where d is 0), d rounded to float16 by F16C (nearest even). Counts the
// live blocks whose float16 scale is Inf; returns the mask of those whose 1/d
// overflowed (the reference stores zeros there).
inline unsigned q8_scales8(__m256 amax, std::size_t n, float ids[8], std::uint16_t d16[8], std::size_t* inf_scales) {
  const __m256 d = _mm256_div_ps(amax, _mm256_set1_ps(127.0f));
  const __m256 nonzero = _mm256_cmp_ps(d, _mm256_setzero_ps(), _CMP_NEQ_OQ);
  const __m256 id = _mm256_and_ps(nonzero, _mm256_div_ps(_mm256_set1_ps(1.0f), d));
  _mm256_store_ps(ids, id);
  const __m128i h = _mm256_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(d16), h);
  const unsigned live = (1u << n) - 1u;
  const unsigned inf_d = static_cast<unsigned>(_mm_movemask_epi8(_mm_packs_epi16(
                             _mm_cmpeq_epi16(h, _mm_set1_epi16(0x7C00)), _mm_setzero_si128()))) & live;
  const unsigned inf_id = static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(
                              _mm256_andnot_ps(_mm256_set1_ps(-0.0f), id), _mm256_set1_ps(INFINITY), _CMP_EQ_OQ))) & live;
  *inf_scales += static_cast<std::size_t>(__builtin_popcount(inf_d));
  return inf_id;
}

// Blocks [b0, b0 + n) of a Q8_0 row, n <= 8, by products32 (any bytes, any
// scales): the 32 products of each block kept in a 1 KiB stack buffer (L1)
// between the amax pass and the quantize pass. Returns the column of the
// first NaN/Inf product, or kNoIndex.
template <bool E5>
std::size_t q8_group_products(const std::uint8_t* w, const float* cs, const float* table, std::uint8_t* dst,
                              std::size_t b0, std::size_t n, std::size_t* inf_scales) {
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  alignas(32) float buf[8 * kQ8BlockElems];
  __m256 m[8];
  for (std::size_t k = 0; k < 8; ++k) {
    if (k >= n) {
      m[k] = _mm256_setzero_ps();
      continue;
    }
    const std::size_t c = (b0 + k) * kQ8BlockElems;
    __m256 v[4];
    const int e = products32<E5>(w + c, cs + c / 16, table, v);
    if (e >= 0) return c + static_cast<std::size_t>(e);
    float* y = buf + k * kQ8BlockElems;
    _mm256_store_ps(y, v[0]);
    _mm256_store_ps(y + 8, v[1]);
    _mm256_store_ps(y + 16, v[2]);
    _mm256_store_ps(y + 24, v[3]);
    m[k] = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign_mask, v[0]), _mm256_andnot_ps(sign_mask, v[1])),
                         _mm256_max_ps(_mm256_andnot_ps(sign_mask, v[2]), _mm256_andnot_ps(sign_mask, v[3])));
  }
  alignas(32) float ids[8];
  alignas(16) std::uint16_t d16[8];
  const unsigned inf_id = q8_scales8(hmax8(m), n, ids, d16, inf_scales);
  for (std::size_t k = 0; k < n; ++k) {
    std::uint8_t* out = dst + (b0 + k) * kQ8BlockBytes;
    store_le16(out, d16[k]);
    if (__builtin_expect((inf_id >> k) & 1u, 0)) {  // 1/d overflowed: the reference stores zeros
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2), _mm256_setzero_si256());
      continue;
    }
    const __m256 vid = _mm256_set1_ps(ids[k]);
    const float* y = buf + k * kQ8BlockElems;
    const __m256i q0 = round_half_away_i32(_mm256_load_ps(y), vid);
    const __m256i q1 = round_half_away_i32(_mm256_load_ps(y + 8), vid);
    const __m256i q2 = round_half_away_i32(_mm256_load_ps(y + 16), vid);
    const __m256i q3 = round_half_away_i32(_mm256_load_ps(y + 24), vid);
    // Saturating packs (per 128-bit lane), then the permute restores order.
    __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
    bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2), bytes);
  }
  return kNoIndex;
}

// Per 128-bit lane, the maximum of each of eight vectors of 16-bit words:
// word k of lane l of the result is the largest word of lane l of m[k].
inline __m256i lane_max8_epu16(const __m256i m[8]) {
  const auto pair = [](__m256i a, __m256i b, int level) {
    if (level == 0) return _mm256_max_epu16(_mm256_unpacklo_epi16(a, b), _mm256_unpackhi_epi16(a, b));
    if (level == 1) return _mm256_max_epu16(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
    return _mm256_max_epu16(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
  };
  const __m256i a01 = pair(m[0], m[1], 0), a23 = pair(m[2], m[3], 0);
  const __m256i a45 = pair(m[4], m[5], 0), a67 = pair(m[6], m[7], 0);
  return pair(pair(a01, a23, 1), pair(a45, a67, 1), 2);
}

// Blocks [b0, b0 + n) of a Q8_0 row, n <= 8, in two passes over registers
// and a 512-byte stack buffer, for bytes without a NaN/Inf encoding under
// scales in [+0, 2^111) (else the group is redone by q8_group_products; the
// caller checked the scales). Each block's 32 magnitudes |w| become float16
// bits of their even and odd elements (abs_halves, no shuffles). Rounding is
// monotonic, so a block's amax, max |decode(w) * scale|, is
// max(|w|) * scale for each of its two 16-element chunks: the largest
// float16 word of each chunk (integers in value order), widened and
// multiplied once. The second pass multiplies |w| by the scale (the
// product's magnitude: one float32 multiply, as the converter's), then by
// 1/d, rounds half away from zero (all non-negative here), packs even and
// odd results back into byte order, and puts each w's sign back with
// vpsignb (a zero byte, +0, has q = 0 already).
template <bool E5>
std::size_t q8_group_fast(const std::uint8_t* w, const float* cs, const float* table, std::uint8_t* dst,
                          std::size_t b0, std::size_t n, std::size_t* inf_scales) {
  alignas(32) __m256i halves[16];
  __m256i mx[8];
  for (std::size_t k = 0; k < 8; ++k) {
    if (k >= n) {
      mx[k] = _mm256_setzero_si256();
      continue;
    }
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + (b0 + k) * kQ8BlockElems));
    __m256i e, od;
    abs_halves<E5>(raw, e, od);
    halves[2 * k] = e;
    halves[2 * k + 1] = od;
    mx[k] = _mm256_max_epu16(e, od);
  }
  const __m256i wmax = lane_max8_epu16(mx);  // lane 0: chunk 0 of each block, lane 1: chunk 1
  // A NaN/Inf encoding is the largest magnitude byte (E4M3 0x7F, E5M2 0x7C and up).
  const __m256i special = E5 ? _mm256_cmpgt_epi16(wmax, _mm256_set1_epi16(0x7BFF))
                             : _mm256_cmpeq_epi16(wmax, _mm256_set1_epi16(0x3F80));
  if (__builtin_expect(_mm256_movemask_epi8(special) != 0, 0)) {
    return q8_group_products<E5>(w, cs, table, dst, b0, n, inf_scales);
  }
  // Chunk scales (x 2^8 for E4M3: exact, the scales being below 2^111).
  alignas(32) float sc[16];
  const float* cg = cs + 2 * b0;
  const __m256 f = _mm256_set1_ps(E5 ? 1.0f : 256.0f);
  __m256 s_lo, s_hi;
  if (n == 8) {
    s_lo = _mm256_mul_ps(_mm256_loadu_ps(cg), f);
    s_hi = _mm256_mul_ps(_mm256_loadu_ps(cg + 8), f);
  } else {
    alignas(32) float t[16] = {};
    for (std::size_t j = 0; j < 2 * n; ++j) t[j] = cg[j];
    s_lo = _mm256_mul_ps(_mm256_load_ps(t), f);
    s_hi = _mm256_mul_ps(_mm256_load_ps(t + 8), f);
  }
  _mm256_store_ps(sc, s_lo);
  _mm256_store_ps(sc + 8, s_hi);
  // Scales of chunk 0 (sc[2k]) and chunk 1 (sc[2k + 1]) of blocks k = 0..7.
  const __m256 s_even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(s_lo, s_hi, 0x88)), 0xD8));
  const __m256 s_odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(s_lo, s_hi, 0xDD)), 0xD8));
  const __m256 amax = _mm256_max_ps(_mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(wmax)), s_even),
                                    _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(wmax, 1)), s_odd));
  alignas(32) float ids[8];
  alignas(16) std::uint16_t d16[8];
  const unsigned inf_id = q8_scales8(amax, n, ids, d16, inf_scales);
  const __m256 half = _mm256_set1_ps(0.49999997f);
  for (std::size_t k = 0; k < n; ++k) {
    std::uint8_t* out = dst + (b0 + k) * kQ8BlockBytes;
    std::memcpy(out, &d16[k], 2);  // little-endian: x86
    if (__builtin_expect((inf_id >> k) & 1u, 0)) {  // 1/d overflowed: the reference stores zeros
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2), _mm256_setzero_si256());
      continue;
    }
    const __m256 vid = _mm256_set1_ps(ids[k]);
    const __m256 s0 = _mm256_set1_ps(sc[2 * k]);
    const __m256 s1 = _mm256_set1_ps(sc[2 * k + 1]);
    const __m128i* h = reinterpret_cast<const __m128i*>(&halves[2 * k]);  // even lo, even hi, odd lo, odd hi
    const auto q = [&](__m128i bits, __m256 sv) {
      const __m256 p = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtph_ps(_mm_load_si128(&bits)), sv), vid);
      return _mm256_cvttps_epi32(_mm256_add_ps(p, half));
    };
    const __m256i qe0 = q(h[0], s0), qe1 = q(h[1], s1), qo0 = q(h[2], s0), qo1 = q(h[3], s1);
    // Each 32-bit lane: element 2j in byte 0, 2j + 1 in byte 1 (values 0..127).
    const __m256i t0 = _mm256_or_si256(qe0, _mm256_slli_epi32(qo0, 8));  // elements 0..15
    const __m256i t1 = _mm256_or_si256(qe1, _mm256_slli_epi32(qo1, 8));  // elements 16..31
    const __m256i bytes = _mm256_permute4x64_epi64(_mm256_packus_epi32(t0, t1), 0xD8);
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + (b0 + k) * kQ8BlockElems));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2), _mm256_sign_epi8(bytes, raw));
  }
  return kNoIndex;
}

template <bool E5>
std::size_t row_q8_0(const std::uint8_t* w, const float* cs, std::size_t cols, const float* table, std::uint8_t* dst,
                     std::size_t* inf_scales) {
  const std::size_t nb = cols / kQ8BlockElems;
  const bool fast = scales_safe(cs, 2 * nb, true);
  for (std::size_t b0 = 0; b0 < nb; b0 += 8) {
    const std::size_t n = std::min<std::size_t>(8, nb - b0);
    for (int l = 0; l < 4; ++l) prefetch_ahead(w + b0 * kQ8BlockElems + 64 * l);
    const std::size_t bad = fast ? q8_group_fast<E5>(w, cs, table, dst, b0, n, inf_scales)
                                 : q8_group_products<E5>(w, cs, table, dst, b0, n, inf_scales);
    if (bad != kNoIndex) return bad;
  }
  return kNoIndex;
}

template <bool E5>
std::size_t row(const std::uint8_t* w, const float* cs, std::size_t cols, const float* table, DType out,
                std::uint8_t* dst, std::size_t* inf_scales) {
  switch (out) {
    case DType::F32: return row_f32<E5>(w, cs, cols, table, reinterpret_cast<float*>(dst));
    case DType::BF16: return row_bf16<E5>(w, cs, cols, table, reinterpret_cast<std::uint16_t*>(dst));
    case DType::F16: return row_f16<E5>(w, cs, cols, table, reinterpret_cast<std::uint16_t*>(dst));
    case DType::Q8_0: return row_q8_0<E5>(w, cs, cols, table, dst, inf_scales);
    default: return kNoIndex;  // fp8.cpp checks the format first
  }
}

}  // namespace

std::size_t scaled_row(const std::uint8_t* w, const float* chunk_scale, std::size_t cols, bool e5m2,
                       const float* table, DType out, std::uint8_t* dst, std::size_t* inf_scales) {
  return e5m2 ? row<true>(w, chunk_scale, cols, table, out, dst, inf_scales)
              : row<false>(w, chunk_scale, cols, table, out, dst, inf_scales);
}

}  // namespace hf2q::kernels::fp8_avx2
