// AVX2 group fits of Q4_K / Q5_K (kquants.cpp calls this after CPUID said
// AVX2; compiled with -mavx2 -mf16c and -ffp-contract=off, never FMA).
//
// A super-block has eight groups of 32, and ggml fits each group on its own
// (make_qkx2_quants). Here lane j of every vector is group j: the 256 values
// are read transposed (element i of all eight groups in one vector) and
// every scalar operation of the C code becomes the same IEEE operation on
// eight lanes, in the same order. Branches become masks: a lane takes an
// update exactly when the scalar code's condition holds for its group
// (comparisons are ordered, so NaN compares false, as in C). min_ps/max_ps
// are written as C's `x < m ? x : m`, which is what they compute.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels_internal.h"

namespace hf2q::kernels::avx2 {
namespace {

// ggml's nearest_int on eight lanes: the same bits as the scalar formula
// for every float, including huge values and NaN.
inline __m256i nearest_int(__m256 v) {
  const __m256 t = _mm256_add_ps(v, _mm256_set1_ps(12582912.0f));
  const __m256i i = _mm256_castps_si256(t);
  return _mm256_sub_epi32(_mm256_and_si256(i, _mm256_set1_epi32(0x007FFFFF)), _mm256_set1_epi32(0x00400000));
}

inline __m256i clamp(__m256i l, int hi) {
  return _mm256_max_epi32(_mm256_setzero_si256(), _mm256_min_epi32(_mm256_set1_epi32(hi), l));
}

inline __m256 blend(__m256 keep, __m256 take, __m256 mask) { return _mm256_blendv_ps(keep, take, mask); }

}  // namespace

void qkx2_fit_groups(const float* x, std::uint8_t* L, float* scales, float* mins, int nmax, float rmin, int nstep) {
  constexpr int n = 32;
  const __m256 zero = _mm256_setzero_ps();
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256i vindex = _mm256_setr_epi32(0, 32, 64, 96, 128, 160, 192, 224);
  __m256 xt[n];
  for (int i = 0; i < n; ++i) xt[i] = _mm256_i32gather_ps(x + i, vindex, 4);

  // Weights: av_x + |x| with av_x = sqrt(sum(x*x) / 32).
  __m256 sum_x2 = zero;
  for (int i = 0; i < n; ++i) sum_x2 = _mm256_add_ps(sum_x2, _mm256_mul_ps(xt[i], xt[i]));
  const __m256 av_x = _mm256_sqrt_ps(_mm256_div_ps(sum_x2, _mm256_set1_ps(32.0f)));
  __m256 w[n];
  for (int i = 0; i < n; ++i) w[i] = _mm256_add_ps(av_x, _mm256_and_ps(xt[i], abs_mask));

  // make_qkx2_quants, lane by lane.
  __m256 min = xt[0];
  __m256 max = xt[0];
  __m256 sum_w = w[0];
  __m256 sum_x = _mm256_mul_ps(sum_w, xt[0]);
  for (int i = 1; i < n; ++i) {
    min = _mm256_min_ps(xt[i], min);  // x < min ? x : min
    max = _mm256_max_ps(xt[i], max);  // x > max ? x : max
    sum_w = _mm256_add_ps(sum_w, w[i]);
    sum_x = _mm256_add_ps(sum_x, _mm256_mul_ps(w[i], xt[i]));
  }
  min = blend(min, zero, _mm256_cmp_ps(min, zero, _CMP_GT_OQ));
  // Groups with max == min return early in C (levels 0, scale 0, this min).
  const __m256 flat = _mm256_cmp_ps(max, min, _CMP_EQ_OQ);
  const __m256 flat_min = min;
  const __m256 fnmax = _mm256_set1_ps(static_cast<float>(nmax));
  __m256 iscale = _mm256_div_ps(fnmax, _mm256_sub_ps(max, min));
  __m256 scale = _mm256_div_ps(_mm256_set1_ps(1.0f), iscale);
  __m256 best_error = zero;
  __m256i Lv[n];
  for (int i = 0; i < n; ++i) {
    Lv[i] = clamp(nearest_int(_mm256_mul_ps(iscale, _mm256_sub_ps(xt[i], min))), nmax);
    __m256 diff = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(scale, _mm256_cvtepi32_ps(Lv[i])), min), xt[i]);
    diff = _mm256_mul_ps(diff, diff);
    best_error = _mm256_add_ps(best_error, _mm256_mul_ps(w[i], diff));
  }
  for (int is = 0; is <= nstep; ++is) {
    // The same scalar expression as the C code, then broadcast.
    const float num = rmin + 0.1f * static_cast<float>(is) + static_cast<float>(nmax);
    iscale = _mm256_div_ps(_mm256_set1_ps(num), _mm256_sub_ps(max, min));
    __m256 sum_l = zero, sum_l2 = zero, sum_xl = zero;
    __m256i Laux[n];
    __m256 fl[n];
    for (int i = 0; i < n; ++i) {
      Laux[i] = clamp(nearest_int(_mm256_mul_ps(iscale, _mm256_sub_ps(xt[i], min))), nmax);
      fl[i] = _mm256_cvtepi32_ps(Laux[i]);
      const __m256 wl = _mm256_mul_ps(w[i], fl[i]);
      sum_l = _mm256_add_ps(sum_l, wl);
      sum_l2 = _mm256_add_ps(sum_l2, _mm256_mul_ps(wl, fl[i]));
      sum_xl = _mm256_add_ps(sum_xl, _mm256_mul_ps(wl, xt[i]));
    }
    const __m256 D = _mm256_sub_ps(_mm256_mul_ps(sum_w, sum_l2), _mm256_mul_ps(sum_l, sum_l));
    const __m256 d_pos = _mm256_cmp_ps(D, zero, _CMP_GT_OQ);
    if (_mm256_movemask_ps(d_pos) == 0) continue;
    __m256 this_scale = _mm256_div_ps(_mm256_sub_ps(_mm256_mul_ps(sum_w, sum_xl), _mm256_mul_ps(sum_x, sum_l)), D);
    __m256 this_min = _mm256_div_ps(_mm256_sub_ps(_mm256_mul_ps(sum_l2, sum_x), _mm256_mul_ps(sum_l, sum_xl)), D);
    const __m256 min_pos = _mm256_cmp_ps(this_min, zero, _CMP_GT_OQ);
    this_min = blend(this_min, zero, min_pos);
    this_scale = blend(this_scale, _mm256_div_ps(sum_xl, sum_l2), min_pos);
    __m256 cur_error = zero;
    for (int i = 0; i < n; ++i) {
      __m256 diff = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(this_scale, fl[i]), this_min), xt[i]);
      diff = _mm256_mul_ps(diff, diff);
      cur_error = _mm256_add_ps(cur_error, _mm256_mul_ps(w[i], diff));
    }
    const __m256 take = _mm256_and_ps(d_pos, _mm256_cmp_ps(cur_error, best_error, _CMP_LT_OQ));
    if (_mm256_movemask_ps(take) == 0) continue;
    const __m256i take_i = _mm256_castps_si256(take);
    for (int i = 0; i < n; ++i) Lv[i] = _mm256_blendv_epi8(Lv[i], Laux[i], take_i);
    best_error = blend(best_error, cur_error, take);
    scale = blend(scale, this_scale, take);
    min = blend(min, this_min, take);
  }
  scale = blend(scale, zero, flat);
  min = blend(min, flat_min, flat);
  alignas(32) float s8[8], mn8[8];
  _mm256_store_ps(s8, scale);
  _mm256_store_ps(mn8, min);
  for (int j = 0; j < 8; ++j) {
    scales[j] = s8[j];
    mins[j] = -mn8[j];  // C's *the_min = -min (a negation: -0 for a zero min)
  }
  const __m256i flat_i = _mm256_castps_si256(flat);
  alignas(32) std::int32_t li[8];
  for (int i = 0; i < n; ++i) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(li), _mm256_andnot_si256(flat_i, Lv[i]));
    for (int j = 0; j < 8; ++j) L[32 * j + i] = static_cast<std::uint8_t>(li[j]);
  }
}

// make_qx_quants(16, 32, x, L, rmse_type = 1, no weights) for the sixteen
// groups of 16 of a Q6_K super-block: groups 8h..8h+7 in the lanes of pass h.
void qx_fit_groups(const float* x, std::int8_t* L, float* scales) {
  constexpr int n = 16;
  constexpr int nmax = 32;
  const __m256 zero = _mm256_setzero_ps();
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256i vindex = _mm256_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112);
  const __m256i lo = _mm256_set1_epi32(-nmax);
  const __m256i hi = _mm256_set1_epi32(nmax - 1);
  for (int h = 0; h < 2; ++h) {
    const float* xs = x + 128 * h;
    __m256 xt[n];
    for (int i = 0; i < n; ++i) xt[i] = _mm256_i32gather_ps(xs + i, vindex, 4);
    __m256 max = zero;
    __m256 amax = zero;
    for (int i = 0; i < n; ++i) {
      const __m256 ax = _mm256_and_ps(xt[i], abs_mask);
      const __m256 gt = _mm256_cmp_ps(ax, amax, _CMP_GT_OQ);
      amax = blend(amax, ax, gt);
      max = blend(max, xt[i], gt);
    }
    // Groups below GROUP_MAX_EPS return early in C: levels 0 (not 32), scale 0.
    const __m256 tiny = _mm256_cmp_ps(amax, _mm256_set1_ps(1e-15f), _CMP_LT_OQ);
    __m256 iscale = _mm256_div_ps(_mm256_set1_ps(static_cast<float>(-nmax)), max);
    __m256 sumlx = zero, suml2 = zero;
    __m256i Lv[n];
    __m256 w[n];
    for (int i = 0; i < n; ++i) w[i] = _mm256_mul_ps(xt[i], xt[i]);
    for (int i = 0; i < n; ++i) {
      Lv[i] = _mm256_max_epi32(lo, _mm256_min_epi32(hi, nearest_int(_mm256_mul_ps(iscale, xt[i]))));
      const __m256 fl = _mm256_cvtepi32_ps(Lv[i]);
      sumlx = _mm256_add_ps(sumlx, _mm256_mul_ps(_mm256_mul_ps(w[i], xt[i]), fl));
      suml2 = _mm256_add_ps(suml2, _mm256_mul_ps(_mm256_mul_ps(w[i], fl), fl));
    }
    // suml2 ? sumlx / suml2 : 0 (NaN counts as true)
    __m256 scale = blend(zero, _mm256_div_ps(sumlx, suml2), _mm256_cmp_ps(suml2, zero, _CMP_NEQ_UQ));
    __m256 best = _mm256_mul_ps(scale, sumlx);
    for (int is = -9; is <= 9; ++is) {
      if (is == 0) continue;
      const float num = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(is));
      iscale = _mm256_div_ps(_mm256_set1_ps(num), max);
      sumlx = suml2 = zero;
      __m256i Laux[n];
      for (int i = 0; i < n; ++i) {
        Laux[i] = _mm256_max_epi32(lo, _mm256_min_epi32(hi, nearest_int(_mm256_mul_ps(iscale, xt[i]))));
        const __m256 fl = _mm256_cvtepi32_ps(Laux[i]);
        sumlx = _mm256_add_ps(sumlx, _mm256_mul_ps(_mm256_mul_ps(w[i], xt[i]), fl));
        suml2 = _mm256_add_ps(suml2, _mm256_mul_ps(_mm256_mul_ps(w[i], fl), fl));
      }
      const __m256 take = _mm256_and_ps(
          _mm256_cmp_ps(suml2, zero, _CMP_GT_OQ),
          _mm256_cmp_ps(_mm256_mul_ps(sumlx, sumlx), _mm256_mul_ps(best, suml2), _CMP_GT_OQ));
      if (_mm256_movemask_ps(take) == 0) continue;
      const __m256i take_i = _mm256_castps_si256(take);
      for (int i = 0; i < n; ++i) Lv[i] = _mm256_blendv_epi8(Lv[i], Laux[i], take_i);
      const __m256 new_scale = _mm256_div_ps(sumlx, suml2);
      scale = blend(scale, new_scale, take);
      best = blend(best, _mm256_mul_ps(new_scale, sumlx), take);
    }
    scale = blend(scale, zero, tiny);
    alignas(32) float s8[8];
    _mm256_store_ps(s8, scale);
    for (int j = 0; j < 8; ++j) scales[8 * h + j] = s8[j];
    const __m256i tiny_i = _mm256_castps_si256(tiny);
    const __m256i off = _mm256_set1_epi32(nmax);
    alignas(32) std::int32_t li[8];
    for (int i = 0; i < n; ++i) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(li), _mm256_andnot_si256(tiny_i, _mm256_add_epi32(Lv[i], off)));
      for (int j = 0; j < 8; ++j) L[16 * (8 * h + j) + i] = static_cast<std::int8_t>(li[j]);
    }
  }
}

// Q4_0, one block of 32 at a time. The block's `max` is the first value of
// largest magnitude (C's strict `<` scan), +0 when every value is zero; the
// levels are x*id + 8.5 truncated by CVTTPS2DQ, which gives INT32_MIN for
// NaN and out-of-range values exactly as the scalar CVTTSS2SI does, then
// C's (int8_t) cast (the low byte) and MIN(15, .).
void quantize_row_q4_0(const float* x, std::uint8_t* y, std::int64_t k) {
  const std::int64_t nb = k / 32;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (std::int64_t b = 0; b < nb; ++b, x += 32, y += 18) {
    __m256 v[4], a[4];
    for (int q = 0; q < 4; ++q) {
      v[q] = _mm256_loadu_ps(x + 8 * q);
      a[q] = _mm256_and_ps(v[q], abs_mask);
    }
    __m256 m = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
    m = _mm256_max_ps(m, _mm256_permute2f128_ps(m, m, 1));
    m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, 0x4E));
    m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, 0xB1));
    const float amax = _mm256_cvtss_f32(m);
    float max = 0.0f;
    if (amax > 0.0f) {
      std::uint32_t hits = 0;
      for (int q = 0; q < 4; ++q) {
        const int mask = _mm256_movemask_ps(_mm256_cmp_ps(a[q], m, _CMP_EQ_OQ));
        hits |= static_cast<std::uint32_t>(mask) << (8 * q);
      }
      max = x[__builtin_ctz(hits)];
    }
    const float d = max / -8.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    store_le16(y, f32_to_f16_rne_inline(d));
    const __m256 vid = _mm256_set1_ps(id);
    const __m256 half = _mm256_set1_ps(8.5f);
    const __m256i fifteen = _mm256_set1_epi32(15);
    __m256i l[4];
    for (int q = 0; q < 4; ++q) {
      const __m256i t = _mm256_cvttps_epi32(_mm256_add_ps(_mm256_mul_ps(v[q], vid), half));
      l[q] = _mm256_min_epi32(_mm256_srai_epi32(_mm256_slli_epi32(t, 24), 24), fifteen);
    }
    // byte j = level j | level j+16 << 4 (the low 8 bits of it, as C stores)
    const __m256i lo_mask = _mm256_set1_epi32(0xFF);
    alignas(32) std::int32_t out[16];
    _mm256_store_si256(reinterpret_cast<__m256i*>(out),
                       _mm256_and_si256(_mm256_or_si256(_mm256_and_si256(l[0], lo_mask), _mm256_slli_epi32(l[2], 4)),
                                        lo_mask));
    _mm256_store_si256(reinterpret_cast<__m256i*>(out + 8),
                       _mm256_and_si256(_mm256_or_si256(_mm256_and_si256(l[1], lo_mask), _mm256_slli_epi32(l[3], 4)),
                                        lo_mask));
    for (int j = 0; j < 16; ++j) y[2 + j] = static_cast<std::uint8_t>(out[j]);
  }
}

}  // namespace hf2q::kernels::avx2
