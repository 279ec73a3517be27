// NEON group fits of Q4_K / Q5_K / Q6_K and Q4_0 (arm64; kquants.cpp calls
// these when the NEON path is active). The design of kquants_avx2.cpp with
// four lanes: lane j of every vector is one group of the super-block, its
// values read transposed, and every scalar operation of ggml's C code
// becomes the same IEEE operation on the lanes, in the same order (this file
// is compiled with -ffp-contract=off like every kernel: gcc on arm64 would
// otherwise fuse the multiplies and adds into FMLA and change bytes).
// Branches become masks; comparisons are ordered (NaN compares false, as in
// C); C's `x < m ? x : m` is written as such (FMIN differs for NaN and
// signed zeros). Float -> int truncation emulates x86's CVTTSS2SI (INT32_MIN
// for NaN and out-of-range values), which the scalar path reproduces too:
// arm64's FCVTZS saturates instead.
#if defined(__aarch64__)
#include <arm_neon.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels_internal.h"

namespace hf2q::kernels::neon {
namespace {

// ggml's nearest_int on four lanes: the same bits as the scalar formula.
inline int32x4_t nearest_int(float32x4_t v) {
  const float32x4_t t = vaddq_f32(v, vdupq_n_f32(12582912.0f));
  const int32x4_t i = vreinterpretq_s32_f32(t);
  return vsubq_s32(vandq_s32(i, vdupq_n_s32(0x007FFFFF)), vdupq_n_s32(0x00400000));
}

inline int32x4_t clamp(int32x4_t l, int lo, int hi) {
  return vmaxq_s32(vdupq_n_s32(lo), vminq_s32(vdupq_n_s32(hi), l));
}

inline float32x4_t blend(float32x4_t keep, float32x4_t take, uint32x4_t mask) { return vbslq_f32(mask, take, keep); }
inline int32x4_t blend(int32x4_t keep, int32x4_t take, uint32x4_t mask) { return vbslq_s32(mask, take, keep); }
inline bool any(uint32x4_t m) { return vmaxvq_u32(m) != 0; }

// Four groups of `n` values, `stride` apart, transposed: out[i] lane j = x[stride*j + i].
template <int n>
inline void load_transposed(const float* x, int stride, float32x4_t* out) {
  alignas(16) float t[4];
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < 4; ++j) t[j] = x[stride * j + i];
    out[i] = vld1q_f32(t);
  }
}

// make_qkx2_quants of four groups of 32 (x: the first group's values).
void qkx2_fit4(const float* x, std::uint8_t* L, float* scales, float* mins, int nmax, float rmin, int nstep) {
  constexpr int n = 32;
  const float32x4_t zero = vdupq_n_f32(0.0f);
  float32x4_t xt[n];
  load_transposed<n>(x, 32, xt);

  // Weights: av_x + |x| with av_x = sqrt(sum(x*x) / 32).
  float32x4_t sum_x2 = zero;
  for (int i = 0; i < n; ++i) sum_x2 = vaddq_f32(sum_x2, vmulq_f32(xt[i], xt[i]));
  const float32x4_t av_x = vsqrtq_f32(vdivq_f32(sum_x2, vdupq_n_f32(32.0f)));
  float32x4_t w[n];
  for (int i = 0; i < n; ++i) w[i] = vaddq_f32(av_x, vabsq_f32(xt[i]));

  float32x4_t min = xt[0];
  float32x4_t max = xt[0];
  float32x4_t sum_w = w[0];
  float32x4_t sum_x = vmulq_f32(sum_w, xt[0]);
  for (int i = 1; i < n; ++i) {
    min = blend(min, xt[i], vcltq_f32(xt[i], min));
    max = blend(max, xt[i], vcgtq_f32(xt[i], max));
    sum_w = vaddq_f32(sum_w, w[i]);
    sum_x = vaddq_f32(sum_x, vmulq_f32(w[i], xt[i]));
  }
  min = blend(min, zero, vcgtq_f32(min, zero));
  const uint32x4_t flat = vceqq_f32(max, min);  // C returns early: levels 0, scale 0, this min
  const float32x4_t flat_min = min;
  const float32x4_t fnmax = vdupq_n_f32(static_cast<float>(nmax));
  float32x4_t iscale = vdivq_f32(fnmax, vsubq_f32(max, min));
  float32x4_t scale = vdivq_f32(vdupq_n_f32(1.0f), iscale);
  float32x4_t best_error = zero;
  int32x4_t Lv[n];
  for (int i = 0; i < n; ++i) {
    Lv[i] = clamp(nearest_int(vmulq_f32(iscale, vsubq_f32(xt[i], min))), 0, nmax);
    float32x4_t diff = vsubq_f32(vaddq_f32(vmulq_f32(scale, vcvtq_f32_s32(Lv[i])), min), xt[i]);
    diff = vmulq_f32(diff, diff);
    best_error = vaddq_f32(best_error, vmulq_f32(w[i], diff));
  }
  for (int is = 0; is <= nstep; ++is) {
    const float num = rmin + 0.1f * static_cast<float>(is) + static_cast<float>(nmax);
    iscale = vdivq_f32(vdupq_n_f32(num), vsubq_f32(max, min));
    float32x4_t sum_l = zero, sum_l2 = zero, sum_xl = zero;
    int32x4_t Laux[n];
    float32x4_t fl[n];
    for (int i = 0; i < n; ++i) {
      Laux[i] = clamp(nearest_int(vmulq_f32(iscale, vsubq_f32(xt[i], min))), 0, nmax);
      fl[i] = vcvtq_f32_s32(Laux[i]);
      const float32x4_t wl = vmulq_f32(w[i], fl[i]);
      sum_l = vaddq_f32(sum_l, wl);
      sum_l2 = vaddq_f32(sum_l2, vmulq_f32(wl, fl[i]));
      sum_xl = vaddq_f32(sum_xl, vmulq_f32(wl, xt[i]));
    }
    const float32x4_t D = vsubq_f32(vmulq_f32(sum_w, sum_l2), vmulq_f32(sum_l, sum_l));
    const uint32x4_t d_pos = vcgtq_f32(D, zero);
    if (!any(d_pos)) continue;
    float32x4_t this_scale = vdivq_f32(vsubq_f32(vmulq_f32(sum_w, sum_xl), vmulq_f32(sum_x, sum_l)), D);
    float32x4_t this_min = vdivq_f32(vsubq_f32(vmulq_f32(sum_l2, sum_x), vmulq_f32(sum_l, sum_xl)), D);
    const uint32x4_t min_pos = vcgtq_f32(this_min, zero);
    this_min = blend(this_min, zero, min_pos);
    this_scale = blend(this_scale, vdivq_f32(sum_xl, sum_l2), min_pos);
    float32x4_t cur_error = zero;
    for (int i = 0; i < n; ++i) {
      float32x4_t diff = vsubq_f32(vaddq_f32(vmulq_f32(this_scale, fl[i]), this_min), xt[i]);
      diff = vmulq_f32(diff, diff);
      cur_error = vaddq_f32(cur_error, vmulq_f32(w[i], diff));
    }
    const uint32x4_t take = vandq_u32(d_pos, vcltq_f32(cur_error, best_error));
    if (!any(take)) continue;
    for (int i = 0; i < n; ++i) Lv[i] = blend(Lv[i], Laux[i], take);
    best_error = blend(best_error, cur_error, take);
    scale = blend(scale, this_scale, take);
    min = blend(min, this_min, take);
  }
  scale = blend(scale, zero, flat);
  min = blend(min, flat_min, flat);
  alignas(16) float s4[4], m4[4];
  vst1q_f32(s4, scale);
  vst1q_f32(m4, min);
  for (int j = 0; j < 4; ++j) {
    scales[j] = s4[j];
    mins[j] = -m4[j];  // C's *the_min = -min (a negation: -0 for a zero min)
  }
  alignas(16) std::int32_t li[4];
  for (int i = 0; i < n; ++i) {
    vst1q_s32(li, vbicq_s32(Lv[i], vreinterpretq_s32_u32(flat)));
    for (int j = 0; j < 4; ++j) L[32 * j + i] = static_cast<std::uint8_t>(li[j]);
  }
}

// make_qx_quants(16, 32, x, L, rmse_type = 1, no weights) of four groups of 16.
void qx_fit4(const float* x, std::int8_t* L, float* scales) {
  constexpr int n = 16;
  constexpr int nmax = 32;
  const float32x4_t zero = vdupq_n_f32(0.0f);
  float32x4_t xt[n];
  load_transposed<n>(x, 16, xt);
  float32x4_t max = zero;
  float32x4_t amax = zero;
  for (int i = 0; i < n; ++i) {
    const float32x4_t ax = vabsq_f32(xt[i]);
    const uint32x4_t gt = vcgtq_f32(ax, amax);
    amax = blend(amax, ax, gt);
    max = blend(max, xt[i], gt);
  }
  // Groups below GROUP_MAX_EPS return early in C: levels 0 (not 32), scale 0.
  const uint32x4_t tiny = vcltq_f32(amax, vdupq_n_f32(1e-15f));
  float32x4_t iscale = vdivq_f32(vdupq_n_f32(static_cast<float>(-nmax)), max);
  float32x4_t sumlx = zero, suml2 = zero;
  int32x4_t Lv[n];
  float32x4_t w[n];
  for (int i = 0; i < n; ++i) w[i] = vmulq_f32(xt[i], xt[i]);
  for (int i = 0; i < n; ++i) {
    Lv[i] = clamp(nearest_int(vmulq_f32(iscale, xt[i])), -nmax, nmax - 1);
    const float32x4_t fl = vcvtq_f32_s32(Lv[i]);
    sumlx = vaddq_f32(sumlx, vmulq_f32(vmulq_f32(w[i], xt[i]), fl));
    suml2 = vaddq_f32(suml2, vmulq_f32(vmulq_f32(w[i], fl), fl));
  }
  // suml2 ? sumlx / suml2 : 0 (NaN counts as true)
  const uint32x4_t nz = vmvnq_u32(vceqq_f32(suml2, zero));
  float32x4_t scale = blend(zero, vdivq_f32(sumlx, suml2), nz);
  float32x4_t best = vmulq_f32(scale, sumlx);
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    const float num = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(is));
    iscale = vdivq_f32(vdupq_n_f32(num), max);
    sumlx = suml2 = zero;
    int32x4_t Laux[n];
    for (int i = 0; i < n; ++i) {
      Laux[i] = clamp(nearest_int(vmulq_f32(iscale, xt[i])), -nmax, nmax - 1);
      const float32x4_t fl = vcvtq_f32_s32(Laux[i]);
      sumlx = vaddq_f32(sumlx, vmulq_f32(vmulq_f32(w[i], xt[i]), fl));
      suml2 = vaddq_f32(suml2, vmulq_f32(vmulq_f32(w[i], fl), fl));
    }
    const uint32x4_t take = vandq_u32(vcgtq_f32(suml2, zero),
                                      vcgtq_f32(vmulq_f32(sumlx, sumlx), vmulq_f32(best, suml2)));
    if (!any(take)) continue;
    for (int i = 0; i < n; ++i) Lv[i] = blend(Lv[i], Laux[i], take);
    const float32x4_t new_scale = vdivq_f32(sumlx, suml2);
    scale = blend(scale, new_scale, take);
    best = blend(best, vmulq_f32(new_scale, sumlx), take);
  }
  scale = blend(scale, zero, tiny);
  alignas(16) float s4[4];
  vst1q_f32(s4, scale);
  for (int j = 0; j < 4; ++j) scales[j] = s4[j];
  alignas(16) std::int32_t li[4];
  for (int i = 0; i < n; ++i) {
    vst1q_s32(li, vbicq_s32(vaddq_s32(Lv[i], vdupq_n_s32(nmax)), vreinterpretq_s32_u32(tiny)));
    for (int j = 0; j < 4; ++j) L[16 * j + i] = static_cast<std::int8_t>(li[j]);
  }
}

// C's (int8_t)(float) as x86-64 compiles it: CVTTSS2SI (INT32_MIN for NaN
// and values outside int32), then the low byte, sign-extended.
inline int32x4_t trunc_to_int8_x86(float32x4_t v) {
  const uint32x4_t in = vandq_u32(vcgtq_f32(v, vdupq_n_f32(-2147483904.0f)), vcltq_f32(v, vdupq_n_f32(2147483648.0f)));
  const int32x4_t t = vbslq_s32(in, vcvtq_s32_f32(v), vdupq_n_s32(INT32_MIN));
  return vshrq_n_s32(vshlq_n_s32(t, 24), 24);
}

}  // namespace

void qkx2_fit_groups(const float* x, std::uint8_t* L, float* scales, float* mins, int nmax, float rmin, int nstep) {
  for (int g = 0; g < 8; g += 4) qkx2_fit4(x + 32 * g, L + 32 * g, scales + g, mins + g, nmax, rmin, nstep);
}

void qx_fit_groups(const float* x, std::int8_t* L, float* scales) {
  for (int g = 0; g < 16; g += 4) qx_fit4(x + 16 * g, L + 16 * g, scales + g);
}

// Q4_0, one block of 32 at a time: `max` is the first value of largest
// magnitude (C's strict `<` scan), +0 when every value is zero.
void quantize_row_q4_0(const float* x, std::uint8_t* y, std::int64_t k) {
  const std::int64_t nb = k / 32;
  for (std::int64_t b = 0; b < nb; ++b, x += 32, y += 18) {
    float32x4_t v[8], a[8];
    for (int q = 0; q < 8; ++q) {
      v[q] = vld1q_f32(x + 4 * q);
      a[q] = vabsq_f32(v[q]);
    }
    float32x4_t m = a[0];
    for (int q = 1; q < 8; ++q) m = vmaxq_f32(m, a[q]);  // finite input: FMAX is the plain maximum
    const float amax = vmaxvq_f32(m);
    float max = 0.0f;
    if (amax > 0.0f) {
      int first = 0;
      while (std::fabs(x[first]) != amax) ++first;
      max = x[first];
    }
    const float d = max / -8.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    store_le16(y, f32_to_f16_rne_inline(d));
    const float32x4_t vid = vdupq_n_f32(id);
    const float32x4_t half = vdupq_n_f32(8.5f);
    int32x4_t l[8];
    for (int q = 0; q < 8; ++q) l[q] = vminq_s32(trunc_to_int8_x86(vaddq_f32(vmulq_f32(v[q], vid), half)), vdupq_n_s32(15));
    // byte j = level j | level j+16 << 4 (the low 8 bits, as C stores it)
    alignas(16) std::int32_t out[16];
    const int32x4_t lo_mask = vdupq_n_s32(0xFF);
    for (int q = 0; q < 4; ++q) {
      vst1q_s32(out + 4 * q, vandq_s32(vorrq_s32(vandq_s32(l[q], lo_mask), vshlq_n_s32(l[q + 4], 4)), lo_mask));
    }
    for (int j = 0; j < 16; ++j) y[2 + j] = static_cast<std::uint8_t>(out[j]);
  }
}

}  // namespace hf2q::kernels::neon
#endif  // __aarch64__
