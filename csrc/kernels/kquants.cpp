// Scalar Q4_0 / Q4_K / Q5_K / Q6_K / Q5_0 / Q5_1 (kquants.h). Every float operation below
// is one IEEE binary32 operation in the order ggml's reference C code
// performs it (written from docs/KQUANTS.md); the build compiles this file
// with -ffp-contract=off, so no multiply-add is fused. Changing the order of
// a sum, or a/b into a*(1/b), changes bytes.
#include <string>
#include "kquants.h"

#include <stdexcept>
#include <cmath>
#include <cstring>

#include "kernels_internal.h"

namespace hf2q::kernels {
namespace {

constexpr int kQK = 256;   // elements of a k-quant super-block
constexpr int kQ40 = 32;   // elements of a Q4_0 block
// Below this a k-quant group counts as all zero (ggml's GROUP_MAX_EPS).
constexpr float kGroupMaxEps = 1e-15f;

// ggml's nearest_int: add 1.5 * 2^23, read the low 23 mantissa bits. For
// |v| < 2^22 that is round-half-to-even. Outside that range (and for NaN),
// release builds of ggml (NDEBUG: the assert is gone) use whatever these
// bits are, and so do we: the same formula gives the same int for every
// float. Only the range check is undefined in C; none is done here.
inline int nearest_int(float v) {
  const float t = v + 12582912.0f;
  std::int32_t i;
  std::memcpy(&i, &t, sizeof i);
  return (i & 0x007FFFFF) - 0x00400000;
}

// ggml's float -> half (software, round to nearest even): equal to ours
// for every non-NaN input; NaN becomes 0x7E00 with the sign.
inline std::uint16_t fp16_of(float f) {
  const std::uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>(((u >> 16) & 0x8000u) | 0x7E00u);
  return f32_to_f16_rne_inline(f);
}

inline float f32_of(const std::uint8_t* p) { return f16_to_f32_inline(load_le16(p)); }

inline bool is_inf_half(std::uint16_t h) { return (h & 0x7FFFu) == 0x7C00u; }

// C's (int8_t)(float) as x86-64 compilers emit it (CVTTSS2SI to 32 bits,
// keep the low byte): a value outside int32 or NaN gives INT32_MIN, low
// byte 0. Only reachable in Q4_0 when 1/d overflows (subnormal block max).
inline int trunc_to_int8_x86(float f) {
  std::int32_t i;
  if (f > -2147483904.0f && f < 2147483648.0f) {
    i = static_cast<std::int32_t>(f);
  } else {
    i = INT32_MIN;
  }
  return static_cast<std::int8_t>(static_cast<std::uint8_t>(static_cast<std::uint32_t>(i) & 0xFFu));
}

inline int imin(int a, int b) { return a < b ? a : b; }
inline int imax(int a, int b) { return a > b ? a : b; }

// ggml's make_qkx2_quants with use_mad = false: the affine (scale, min) fit
// of one 32-value group to levels 0..nmax, searching nstep + 1 candidate
// scales; L gets the levels, *the_min the negated min.
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, std::uint8_t* L, float* the_min,
                       std::uint8_t* Laux, float rmin, float rdelta, int nstep) {
  float min = x[0];
  float max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.f;
  }
  float iscale = static_cast<float>(nmax) / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = static_cast<std::uint8_t>(imax(0, imin(nmax, l)));
    float diff = scale * static_cast<float>(L[i]) + min - x[i];
    diff = diff * diff;
    best_error += weights[i] * diff;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * static_cast<float>(is) + static_cast<float>(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * (x[i] - min));
      l = imax(0, imin(nmax, l));
      Laux[i] = static_cast<std::uint8_t>(l);
      const float w = weights[i];
      const float fl = static_cast<float>(l);
      sum_l += w * fl;
      sum_l2 += w * fl * fl;
      sum_xl += w * fl * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * static_cast<float>(Laux[i]) + this_min - x[i];
        diff = diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = Laux[i];
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// ggml's make_qx_quants with rmse_type = 1 and no weights (Q6_K): the
// symmetric fit of n values to levels -nmax..nmax-1, weights x^2, searching
// 18 scales around nmax / max; L gets level + nmax.
float make_qx_quants_rmse1(int n, int nmax, const float* x, std::int8_t* L) {
  float max = 0;
  float amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  float iscale = static_cast<float>(-nmax) / max;
  float sumlx = 0;
  float suml2 = 0;
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * x[i]);
    l = imax(-nmax, imin(nmax - 1, l));
    L[i] = static_cast<std::int8_t>(l + nmax);
    const float w = x[i] * x[i];
    const float fl = static_cast<float>(l);
    sumlx += w * x[i] * fl;
    suml2 += w * fl * fl;
  }
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(is)) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * x[i]);
      l = imax(-nmax, imin(nmax - 1, l));
      const float w = x[i] * x[i];
      const float fl = static_cast<float>(l);
      sumlx += w * x[i] * fl;
      suml2 += w * fl * fl;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        const int l = nearest_int(iscale * x[i]);
        L[i] = static_cast<std::int8_t>(nmax + imax(-nmax, imin(nmax - 1, l)));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// The 12 scale bytes of Q4_K / Q5_K: eight 6-bit scales and eight 6-bit
// mins; groups 0..3 in the low 6 bits of bytes 0..7, groups 4..7 split
// over the low/high nibbles of bytes 8..11 and the top 2 bits of 0..7.
inline void get_scale_min_k4(int j, const std::uint8_t* q, std::uint8_t* d, std::uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = static_cast<std::uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<std::uint8_t>((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
  }
}

}  // namespace

// The eight group fits of a Q4_K / Q5_K super-block, one after the other.
void qkx2_fit_groups_scalar(const float* x, std::uint8_t* L, float* scales, float* mins, int nmax, float rmin,
                            int nstep) {
  std::uint8_t Laux[32];
  float weights[32];
  for (int j = 0; j < kQK / 32; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep);
  }
}

// The sixteen group fits of a Q6_K super-block.
void qx_fit_groups_scalar(const float* x, std::int8_t* L, float* scales) {
  for (int ib = 0; ib < kQK / 16; ++ib) scales[ib] = make_qx_quants_rmse1(16, 32, x + 16 * ib, L + 16 * ib);
}

#if defined(HF2Q_HAVE_AVX2)
namespace avx2 {
// kquants_avx2.cpp: the same fits, one group per vector lane.
void qkx2_fit_groups(const float* x, std::uint8_t* L, float* scales, float* mins, int nmax, float rmin, int nstep);
void qx_fit_groups(const float* x, std::int8_t* L, float* scales);
void quantize_row_q4_0(const float* x, std::uint8_t* y, std::int64_t n);
}  // namespace avx2
#endif
#if defined(__aarch64__)
namespace neon {
// kquants_neon.cpp: the same fits, one group per vector lane (four at a time).
void qkx2_fit_groups(const float* x, std::uint8_t* L, float* scales, float* mins, int nmax, float rmin, int nstep);
void qx_fit_groups(const float* x, std::int8_t* L, float* scales);
void quantize_row_q4_0(const float* x, std::uint8_t* y, std::int64_t n);
}  // namespace neon
#endif

namespace {

inline void qkx2_fit_groups(const float* x, std::uint8_t* L, float* scales, float* mins, int nmax, float rmin,
                            int nstep) {
#if defined(HF2Q_HAVE_AVX2)
  if (active_isa() == Isa::Avx2) return avx2::qkx2_fit_groups(x, L, scales, mins, nmax, rmin, nstep);
#endif
#if defined(__aarch64__)
  if (active_isa() == Isa::Neon) return neon::qkx2_fit_groups(x, L, scales, mins, nmax, rmin, nstep);
#endif
  qkx2_fit_groups_scalar(x, L, scales, mins, nmax, rmin, nstep);
}

inline void qx_fit_groups(const float* x, std::int8_t* L, float* scales) {
#if defined(HF2Q_HAVE_AVX2)
  if (active_isa() == Isa::Avx2) return avx2::qx_fit_groups(x, L, scales);
#endif
#if defined(__aarch64__)
  if (active_isa() == Isa::Neon) return neon::qx_fit_groups(x, L, scales);
#endif
  qx_fit_groups_scalar(x, L, scales);
}

// The shared part of Q4_K and Q5_K: per group weights, the affine fits,
// 6-bit scales and mins, the two half scales, and the final levels in L.
// Writes d, dmin and scales into `y` (bytes 0..15).
void qk_affine_superblock(const float* x, std::uint8_t* y, std::uint8_t* L, int nmax, float rmin, int nstep) {
  float mins[kQK / 32];
  float scales[kQK / 32];
  qkx2_fit_groups(x, L, scales, mins, nmax, rmin, nstep);
  float max_scale = 0;  // scales are positive: the min is taken out
  float max_min = 0;
  for (int j = 0; j < kQK / 32; ++j) {
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  std::uint8_t* sc = y + 4;
  std::memset(sc, 0, 12);
  for (int j = 0; j < kQK / 32; ++j) {
    // ggml stores nearest_int's result in a uint8_t first: modulo 256.
    std::uint8_t ls = static_cast<std::uint8_t>(nearest_int(inv_scale * scales[j]));
    std::uint8_t lm = static_cast<std::uint8_t>(nearest_int(inv_min * mins[j]));
    ls = ls < 63 ? ls : 63;
    lm = lm < 63 ? lm : 63;
    if (j < 4) {
      sc[j] = ls;
      sc[j + 4] = lm;
    } else {
      sc[j + 4] = static_cast<std::uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
      sc[j - 4] = static_cast<std::uint8_t>(sc[j - 4] | ((ls >> 4) << 6));
      sc[j - 0] = static_cast<std::uint8_t>(sc[j - 0] | ((lm >> 4) << 6));
    }
  }
  store_le16(y, fp16_of(max_scale / 63.f));
  store_le16(y + 2, fp16_of(max_min / 63.f));
  const float dall = f32_of(y);
  const float dmin = f32_of(y + 2);
  for (int j = 0; j < kQK / 32; ++j) {
    std::uint8_t s, m;
    get_scale_min_k4(j, sc, &s, &m);
    const float d = dall * static_cast<float>(s);
    // A zero group scale keeps the levels of the fit (ggml does the same).
    if (!(d != 0)) continue;
    const float dm = dmin * static_cast<float>(m);
    for (int ii = 0; ii < 32; ++ii) {
      const int l = nearest_int((x[32 * j + ii] + dm) / d);
      L[32 * j + ii] = static_cast<std::uint8_t>(imax(0, imin(nmax, l)));
    }
  }
}

}  // namespace

namespace {
constexpr int kNumBlockFormats = 6;
// Index of a format of this file in the tables below.
constexpr int index_of(BlockFormat f) { return static_cast<int>(f) - static_cast<int>(DType::Q4_0); }
static_assert(static_cast<int>(DType::Q5_1) - static_cast<int>(DType::Q4_0) == kNumBlockFormats - 1 &&
                  static_cast<int>(DType::Q5_0) == static_cast<int>(DType::Q6_K) + 1,
              "Q4_0, Q4_K, Q5_K, Q6_K, Q5_0, Q5_1 are consecutive DTypes");
static_assert(format_of(DType::Q5_0).block_elems == 32 && format_of(DType::Q5_0).block_bytes == 22,
              "block_q5_0: f16 d + 4 bytes qh + 16 bytes");
static_assert(format_of(DType::Q5_1).block_elems == 32 && format_of(DType::Q5_1).block_bytes == 24,
              "block_q5_1: f16 d + f16 m + 4 bytes qh + 16 bytes");
// The layouts below hard-code these offsets (ggml's block_q4_0 / _K structs).
static_assert(format_of(DType::Q4_0).block_elems == 32 && format_of(DType::Q4_0).block_bytes == 18,
              "block_q4_0: f16 d + 16 bytes");
static_assert(format_of(DType::Q4_K).block_elems == 256 && format_of(DType::Q4_K).block_bytes == 144,
              "block_q4_K: 2 f16 + 12 + 128");
static_assert(format_of(DType::Q5_K).block_elems == 256 && format_of(DType::Q5_K).block_bytes == 176,
              "block_q5_K: 2 f16 + 12 + 32 + 128");
static_assert(format_of(DType::Q6_K).block_elems == 256 && format_of(DType::Q6_K).block_bytes == 210,
              "block_q6_K: 128 + 64 + 16 + f16");

const FormatRow& block_geometry(BlockFormat f) {
  const int i = index_of(f);
  if (i < 0 || i >= kNumBlockFormats) throw std::invalid_argument("not a k-quant format");
  return format_of(f);
}
}  // namespace

// ---------------------------------------------------------------- Q4_0
// Block: f16 d, then 16 bytes; byte j holds element j (low nibble) and
// element j + 16 (high nibble); value = (q - 8) * d.
void quantize_row_q4_0(const float* x, std::uint8_t* y, std::int64_t n) {
#if defined(HF2Q_HAVE_AVX2)
  if (active_isa() == Isa::Avx2) return avx2::quantize_row_q4_0(x, y, n);
#endif
#if defined(__aarch64__)
  if (active_isa() == Isa::Neon) return neon::quantize_row_q4_0(x, y, n);
#endif
  const std::int64_t nb = n / kQ40;
  for (std::int64_t i = 0; i < nb; ++i, x += kQ40, y += 18) {
    float amax = 0.0f;
    float max = 0.0f;
    for (int j = 0; j < kQ40; ++j) {
      const float v = x[j];
      if (amax < std::fabs(v)) {
        amax = std::fabs(v);
        max = v;
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    store_le16(y, fp16_of(d));
    for (int j = 0; j < kQ40 / 2; ++j) {
      const float x0 = x[j] * id;
      const float x1 = x[kQ40 / 2 + j] * id;
      const int xi0 = imin(15, trunc_to_int8_x86(x0 + 8.5f));
      const int xi1 = imin(15, trunc_to_int8_x86(x1 + 8.5f));
      y[2 + j] = static_cast<std::uint8_t>(static_cast<std::uint8_t>(xi0) | (static_cast<std::uint8_t>(xi1) << 4));
    }
  }
}

void dequantize_row_q4_0(const std::uint8_t* x, float* y, std::int64_t n) {
  const std::int64_t nb = n / kQ40;
  for (std::int64_t i = 0; i < nb; ++i, x += 18, y += kQ40) {
    const float d = f32_of(x);
    for (int j = 0; j < kQ40 / 2; ++j) {
      const int x0 = (x[2 + j] & 0x0F) - 8;
      const int x1 = (x[2 + j] >> 4) - 8;
      y[j] = static_cast<float>(x0) * d;
      y[j + kQ40 / 2] = static_cast<float>(x1) * d;
    }
  }
}

// ---------------------------------------------------------------- Q5_0 / Q5_1
// Q5_0 block: f16 d, 4 bytes qh (little-endian u32: bit j is the fifth bit
// of element j), 16 nibble bytes as Q4_0; value = (q - 16) * d.
// Q5_1 block: f16 d, f16 m, qh, 16 nibble bytes; value = q * d + m.
namespace {
inline void store_le32(std::uint8_t* p, std::uint32_t v) {
  p[0] = static_cast<std::uint8_t>(v);
  p[1] = static_cast<std::uint8_t>(v >> 8);
  p[2] = static_cast<std::uint8_t>(v >> 16);
  p[3] = static_cast<std::uint8_t>(v >> 24);
}
inline std::uint32_t load_le32(const std::uint8_t* p) {
  return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
         (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
}
// C's (uint8_t)(float) as x86-64 compilers emit it: CVTTSS2SI to 32 bits, keep
// the low byte (INT32_MIN, low byte 0, for NaN and out-of-range values).
inline unsigned trunc_to_uint8_x86(float f) {
  std::int32_t i;
  if (f > -2147483904.0f && f < 2147483648.0f) {
    i = static_cast<std::int32_t>(f);
  } else {
    i = INT32_MIN;
  }
  return static_cast<std::uint32_t>(i) & 0xFFu;
}
// Nibbles and fifth bits of 32 levels (element j and j + 16 share byte j).
inline void pack5(const unsigned* q, std::uint8_t* qh_out, std::uint8_t* qs) {
  std::uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<std::uint8_t>((q[j] & 0x0Fu) | ((q[16 + j] & 0x0Fu) << 4));
    qh |= ((q[j] & 0x10u) >> 4) << j;
    qh |= ((q[16 + j] & 0x10u) >> 4) << (j + 16);
  }
  store_le32(qh_out, qh);
}
}  // namespace

void quantize_row_q5_0(const float* x, std::uint8_t* y, std::int64_t n) {
  const std::int64_t nb = n / 32;
  for (std::int64_t i = 0; i < nb; ++i, x += 32, y += 22) {
    float amax = 0.0f;
    float max = 0.0f;
    for (int j = 0; j < 32; ++j) {
      const float v = x[j];
      if (amax < std::fabs(v)) {
        amax = std::fabs(v);
        max = v;
      }
    }
    const float d = max / -16.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    store_le16(y, fp16_of(d));
    unsigned q[32];
    for (int j = 0; j < 32; ++j) {
      const float v = x[j] * id;
      q[j] = static_cast<std::uint8_t>(imin(31, trunc_to_int8_x86(v + 16.5f)));
    }
    pack5(q, y + 2, y + 6);
  }
}

void quantize_row_q5_1(const float* x, std::uint8_t* y, std::int64_t n) {
  const std::int64_t nb = n / 32;
  for (std::int64_t i = 0; i < nb; ++i, x += 32, y += 24) {
    float min = 3.40282347e+38f;
    float max = -3.40282347e+38f;
    for (int j = 0; j < 32; ++j) {
      const float v = x[j];
      if (v < min) min = v;
      if (v > max) max = v;
    }
    const float d = (max - min) / 31.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    store_le16(y, fp16_of(d));
    store_le16(y + 2, fp16_of(min));
    unsigned q[32];
    for (int j = 0; j < 32; ++j) {
      const float v = (x[j] - min) * id;
      q[j] = trunc_to_uint8_x86(v + 0.5f);
    }
    pack5(q, y + 4, y + 8);
  }
}

void dequantize_row_q5_0(const std::uint8_t* x, float* y, std::int64_t n) {
  const std::int64_t nb = n / 32;
  for (std::int64_t i = 0; i < nb; ++i, x += 22, y += 32) {
    const float d = f32_of(x);
    const std::uint32_t qh = load_le32(x + 2);
    for (int j = 0; j < 16; ++j) {
      const int x0 = static_cast<int>((x[6 + j] & 0x0F) | (((qh >> j) << 4) & 0x10)) - 16;
      const int x1 = static_cast<int>((x[6 + j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16;
      y[j] = static_cast<float>(x0) * d;
      y[j + 16] = static_cast<float>(x1) * d;
    }
  }
}

void dequantize_row_q5_1(const std::uint8_t* x, float* y, std::int64_t n) {
  const std::int64_t nb = n / 32;
  for (std::int64_t i = 0; i < nb; ++i, x += 24, y += 32) {
    const float d = f32_of(x);
    const float m = f32_of(x + 2);
    const std::uint32_t qh = load_le32(x + 4);
    for (int j = 0; j < 16; ++j) {
      const int x0 = static_cast<int>((x[8 + j] & 0x0F) | (((qh >> j) << 4) & 0x10));
      const int x1 = static_cast<int>((x[8 + j] >> 4) | ((qh >> (j + 12)) & 0x10));
      y[j] = static_cast<float>(x0) * d + m;
      y[j + 16] = static_cast<float>(x1) * d + m;
    }
  }
}

// ---------------------------------------------------------------- Q4_K
// Block: f16 d, f16 dmin, 12 scale bytes, 128 bytes of nibbles: for each
// 64-value chunk c, byte l holds element 64c + l (low) and 64c + 32 + l
// (high); value = d * scale_g * q - dmin * min_g.
void quantize_row_q4_K(const float* x, std::uint8_t* y, std::int64_t n) {
  const std::int64_t nb = n / kQK;
  std::uint8_t L[kQK];
  for (std::int64_t i = 0; i < nb; ++i, x += kQK, y += 144) {
    qk_affine_superblock(x, y, L, 15, -1.f, 20);
    std::uint8_t* q = y + 16;
    for (int j = 0; j < kQK; j += 64, q += 32) {
      for (int l = 0; l < 32; ++l) q[l] = static_cast<std::uint8_t>(L[j + l] | (L[j + l + 32] << 4));
    }
  }
}

void dequantize_row_q4_K(const std::uint8_t* x, float* y, std::int64_t n) {
  const std::int64_t nb = n / kQK;
  for (std::int64_t i = 0; i < nb; ++i, x += 144) {
    const float d = f32_of(x);
    const float min = f32_of(x + 2);
    const std::uint8_t* sc = x + 4;
    const std::uint8_t* q = x + 16;
    for (int j = 0, is = 0; j < kQK; j += 64, q += 32, is += 2) {
      std::uint8_t s, m;
      get_scale_min_k4(is + 0, sc, &s, &m);
      const float d1 = d * static_cast<float>(s);
      const float m1 = min * static_cast<float>(m);
      get_scale_min_k4(is + 1, sc, &s, &m);
      const float d2 = d * static_cast<float>(s);
      const float m2 = min * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

// ---------------------------------------------------------------- Q5_K
// As Q4_K plus 32 bytes of fifth bits (qh, before the nibbles): bit 2c of
// qh[l] is the high bit of element 64c + l, bit 2c + 1 of 64c + 32 + l.
void quantize_row_q5_K(const float* x, std::uint8_t* y, std::int64_t n) {
  const std::int64_t nb = n / kQK;
  std::uint8_t L[kQK];
  for (std::int64_t i = 0; i < nb; ++i, x += kQK, y += 176) {
    qk_affine_superblock(x, y, L, 31, -0.5f, 15);
    std::uint8_t* qh = y + 16;
    std::uint8_t* ql = y + 48;
    std::memset(qh, 0, kQK / 8);
    std::uint8_t m1 = 1, m2 = 2;
    for (int nn = 0; nn < kQK; nn += 64, ql += 32) {
      for (int j = 0; j < 32; ++j) {
        int l1 = L[nn + j];
        if (l1 > 15) {
          l1 -= 16;
          qh[j] |= m1;
        }
        int l2 = L[nn + j + 32];
        if (l2 > 15) {
          l2 -= 16;
          qh[j] |= m2;
        }
        ql[j] = static_cast<std::uint8_t>(l1 | (l2 << 4));
      }
      m1 = static_cast<std::uint8_t>(m1 << 2);
      m2 = static_cast<std::uint8_t>(m2 << 2);
    }
  }
}

void dequantize_row_q5_K(const std::uint8_t* x, float* y, std::int64_t n) {
  const std::int64_t nb = n / kQK;
  for (std::int64_t i = 0; i < nb; ++i, x += 176) {
    const float d = f32_of(x);
    const float min = f32_of(x + 2);
    const std::uint8_t* sc = x + 4;
    const std::uint8_t* qh = x + 16;
    const std::uint8_t* ql = x + 48;
    unsigned u1 = 1, u2 = 2;
    for (int j = 0, is = 0; j < kQK; j += 64, ql += 32, is += 2, u1 <<= 2, u2 <<= 2) {
      std::uint8_t s, m;
      get_scale_min_k4(is + 0, sc, &s, &m);
      const float d1 = d * static_cast<float>(s);
      const float m1 = min * static_cast<float>(m);
      get_scale_min_k4(is + 1, sc, &s, &m);
      const float d2 = d * static_cast<float>(s);
      const float m2 = min * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    }
  }
}

// ---------------------------------------------------------------- Q6_K
// Block: 128 bytes low nibbles (ql), 64 bytes of 2-bit highs (qh), 16
// signed 8-bit group scales, f16 d; value = d * scale_g * (q - 32).
void quantize_row_q6_K(const float* x, std::uint8_t* y, std::int64_t n) {
  const std::int64_t nb = n / kQK;
  std::int8_t L[kQK];
  float scales[kQK / 16];
  for (std::int64_t i = 0; i < nb; ++i, x += kQK, y += 210) {
    float max_scale = 0;
    float max_abs_scale = 0;
    qx_fit_groups(x, L, scales);
    for (int ib = 0; ib < kQK / 16; ++ib) {
      const float scale = scales[ib];
      const float abs_scale = std::fabs(scale);
      if (abs_scale > max_abs_scale) {
        max_abs_scale = abs_scale;
        max_scale = scale;
      }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(y, 0, 210);  // fp16(0) is 0x0000 too
      continue;
    }
    const float iscale = -128.f / max_scale;
    store_le16(y + 208, fp16_of(1 / iscale));
    auto* sc = reinterpret_cast<std::int8_t*>(y + 192);
    for (int ib = 0; ib < kQK / 16; ++ib) {
      // int -> int8_t: modulo 256, as gcc/clang define it.
      sc[ib] = static_cast<std::int8_t>(imin(127, nearest_int(iscale * scales[ib])));
    }
    const float dall = f32_of(y + 208);
    for (int j = 0; j < kQK / 16; ++j) {
      const float d = dall * static_cast<float>(sc[j]);
      if (!(d != 0)) continue;
      for (int ii = 0; ii < 16; ++ii) {
        int l = nearest_int(x[16 * j + ii] / d);
        l = imax(-32, imin(31, l));
        L[16 * j + ii] = static_cast<std::int8_t>(l + 32);
      }
    }
    std::uint8_t* ql = y;
    std::uint8_t* qh = y + 128;
    for (int j = 0; j < kQK; j += 128, ql += 64, qh += 32) {
      for (int l = 0; l < 32; ++l) {
        const int q1 = L[j + l + 0] & 0xF;
        const int q2 = L[j + l + 32] & 0xF;
        const int q3 = L[j + l + 64] & 0xF;
        const int q4 = L[j + l + 96] & 0xF;
        ql[l + 0] = static_cast<std::uint8_t>(q1 | (q3 << 4));
        ql[l + 32] = static_cast<std::uint8_t>(q2 | (q4 << 4));
        qh[l] = static_cast<std::uint8_t>((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                                          ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
      }
    }
  }
}

void dequantize_row_q6_K(const std::uint8_t* x, float* y, std::int64_t n) {
  const std::int64_t nb = n / kQK;
  for (std::int64_t i = 0; i < nb; ++i, x += 210) {
    const float d = f32_of(x + 208);
    const std::uint8_t* ql = x;
    const std::uint8_t* qh = x + 128;
    const auto* sc = reinterpret_cast<const std::int8_t*>(x + 192);
    for (int nn = 0; nn < kQK; nn += 128, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = static_cast<std::int8_t>((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = static_cast<std::int8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = static_cast<std::int8_t>((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = static_cast<std::int8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l + 0] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
    }
  }
}

// ---------------------------------------------------------------- blocks
namespace {

using RowQuant = void (*)(const float*, std::uint8_t*, std::int64_t);
using RowDequant = void (*)(const std::uint8_t*, float*, std::int64_t);
constexpr RowQuant kQuant[kNumBlockFormats] = {quantize_row_q4_0, quantize_row_q4_K, quantize_row_q5_K,
                                               quantize_row_q6_K, quantize_row_q5_0, quantize_row_q5_1};
constexpr RowDequant kDequant[kNumBlockFormats] = {dequantize_row_q4_0, dequantize_row_q4_K,
                                                   dequantize_row_q5_K, dequantize_row_q6_K,
                                                   dequantize_row_q5_0, dequantize_row_q5_1};

// Block scales stored as +-Inf (the data's range overflows float16).
std::size_t inf_scales_of(BlockFormat f, const std::uint8_t* b) {
  switch (f) {
    case BlockFormat::Q4_0: return is_inf_half(load_le16(b)) ? 1 : 0;
    case BlockFormat::Q4_K:
    case BlockFormat::Q5_K: return is_inf_half(load_le16(b)) || is_inf_half(load_le16(b + 2)) ? 1 : 0;
    case BlockFormat::Q6_K: return is_inf_half(load_le16(b + 208)) ? 1 : 0;
    case BlockFormat::Q5_0: return is_inf_half(load_le16(b)) ? 1 : 0;
    case BlockFormat::Q5_1: return is_inf_half(load_le16(b)) || is_inf_half(load_le16(b + 2)) ? 1 : 0;
    default: break;
  }
  return 0;
}

}  // namespace

EncodeResult quantize_blocks_range(BlockFormat f, DType type, const void* src, std::uint8_t* dst,
                               std::size_t nblocks) {
  const FormatRow& g = block_geometry(f);
  const RowQuant quant = kQuant[index_of(f)];
  // Work in runs of 256 values (one k-quant block, eight Q4_0 blocks):
  // widen, check, quantize.
  const std::size_t per_run = kQK / g.block_elems;
  EncodeResult result;
  float x[kQK];
  for (std::size_t b = 0; b < nblocks; b += per_run) {
    const std::size_t nb = nblocks - b < per_run ? nblocks - b : per_run;
    const std::size_t base = b * g.block_elems;
    const std::size_t count = nb * g.block_elems;
    switch (type) {
      case DType::F32: std::memcpy(x, static_cast<const float*>(src) + base, count * 4); break;
      case DType::F16: {
        const auto* h = static_cast<const std::uint16_t*>(src) + base;
        for (std::size_t j = 0; j < count; ++j) x[j] = f16_to_f32_inline(h[j]);
        break;
      }
      case DType::BF16: {
        const auto* h = static_cast<const std::uint16_t*>(src) + base;
        for (std::size_t j = 0; j < count; ++j) x[j] = bf16_to_f32_inline(h[j]);
        break;
      }
      default: throw std::invalid_argument(std::string("no kernel encodes this dtype into ") + g.name);
    }
    std::uint32_t bad = 0;
    for (std::size_t j = 0; j < count; ++j) bad |= is_nonfinite_bits(f32_bits(x[j])) ? 1u : 0u;
    if (bad != 0) {
      // Blocks before the bad one are written, as a block-by-block pass would.
      std::size_t j = 0;
      while (!is_nonfinite_bits(f32_bits(x[j]))) ++j;
      const std::size_t good = j / g.block_elems;
      quant(x, dst + b * g.block_bytes, static_cast<std::int64_t>(good * g.block_elems));
      result.first_nonfinite = base + j;
      return result;
    }
    std::uint8_t* out = dst + b * g.block_bytes;
    quant(x, out, static_cast<std::int64_t>(count));
    for (std::size_t k = 0; k < nb; ++k) result.inf_scales += inf_scales_of(f, out + k * g.block_bytes);
  }
  return result;
}

void dequantize_blocks_range(BlockFormat f, const std::uint8_t* src, float* dst, std::size_t nblocks) {
  const FormatRow& g = block_geometry(f);
  kDequant[index_of(f)](src, dst, static_cast<std::int64_t>(nblocks * g.block_elems));
}

// ---------------------------------------------------------------- rows
// The kernels of the six rows in formats.h (format_kernels.h): decode to
// float32, encode from f32 / f16 / bf16.
namespace {
template <DType F>
void to_f32_of(const std::uint8_t* src, float* dst, std::size_t n) {
  dequantize_blocks_range(F, src, dst, n / format_of(F).block_elems);
}
template <DType F>
EncodeResult encode_of(DType src_type, const void* src, std::uint8_t* dst, std::size_t nblocks) {
  return quantize_blocks_range(F, src_type, src, dst, nblocks);
}
}  // namespace

// GPU kernels (shaders/cuda_kernels.cu): the CUDA encoders run one group fit
// per thread, so a 256-thread CTA covers 32 Q4_K / Q5_K super-blocks (eight
// groups each), 16 Q6_K super-blocks (sixteen groups) or 256 blocks of 32;
// read-back checksums for each. No Metal kernels yet: Metal refuses them.
const FormatKernels kQ4_0Kernels{to_f32_of<DType::Q4_0>, nullptr, encode_of<DType::Q4_0>, nullptr,
                                 "hf2q_checksums_q4_0", nullptr, "hf2q_quantize_q4_0", 256};
const FormatKernels kQ4_KKernels{to_f32_of<DType::Q4_K>, nullptr, encode_of<DType::Q4_K>, nullptr,
                                 "hf2q_checksums_q4_k", nullptr, "hf2q_quantize_q4_k", 32};
const FormatKernels kQ5_KKernels{to_f32_of<DType::Q5_K>, nullptr, encode_of<DType::Q5_K>, nullptr,
                                 "hf2q_checksums_q5_k", nullptr, "hf2q_quantize_q5_k", 32};
const FormatKernels kQ6_KKernels{to_f32_of<DType::Q6_K>, nullptr, encode_of<DType::Q6_K>, nullptr,
                                 "hf2q_checksums_q6_k", nullptr, "hf2q_quantize_q6_k", 16};
const FormatKernels kQ5_0Kernels{to_f32_of<DType::Q5_0>, nullptr, encode_of<DType::Q5_0>, nullptr,
                                 "hf2q_checksums_q5_0", nullptr, "hf2q_quantize_q5_0", 256};
const FormatKernels kQ5_1Kernels{to_f32_of<DType::Q5_1>, nullptr, encode_of<DType::Q5_1>, nullptr,
                                 "hf2q_checksums_q5_1", nullptr, "hf2q_quantize_q5_1", 256};

}  // namespace hf2q::kernels
