// FP8 element formats (f8_e4m3 = OCP E4M3FN, f8_e5m2 = OCP E5M2) and the
// scaled FP8 decoder: a checkpoint's FP8 weight times its scale grid
// (block-scaled `weight_scale_inv`, per-channel or per-tensor `weight_scale`),
// into f32 / bf16 / f16 / Q8_0 in one pass. docs/FP8.md has the facts.
//
// Arithmetic as llama.cpp's converter (`weight.float() * scale.float()`):
// each element is decoded exactly to float32 and multiplied by its block's
// scale, decoded exactly to float32, in ONE float32 multiply (the kernels
// are built with -ffp-contract=off: no fused or reordered arithmetic).
#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "fp8.h"
#include "fp8_product.h"
#include "fp8_simd.h"
#include "kernels_internal.h"
#include "thread_pool.h"

#if defined(HF2Q_HAVE_AVX2) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HF2Q_FP8_AVX2 1
#endif

namespace hf2q::kernels {
namespace {

// E4M3FN: s eeee mmm, bias 7; no infinities; s 1111 111 is NaN; the
// largest finite value is 448. Bits of the exact float32; NaN as torch's
// float8_e4m3fn -> float32 widening writes it (0x7FF00000 with the sign:
// the mantissa bits shifted in, as for a normal), which llama.cpp's
// converter's dequantized F32 / BF16 tensors carry (ml_dtypes: 0x7FC00000).
constexpr std::uint32_t e4m3_bits(unsigned b) {
  const std::uint32_t sign = static_cast<std::uint32_t>(b & 0x80u) << 24;
  const unsigned e = (b >> 3) & 0xFu;
  const unsigned m = b & 0x7u;
  if (e == 0xFu && m == 0x7u) return sign | 0x7FF00000u;  // NaN (quiet, torch's bits)
  if (e == 0) {
    if (m == 0) return sign;  // +-0
    // Subnormal m * 2^-9: normalise (m has its top bit at p = 0..2).
    const unsigned p = m >= 4 ? 2 : (m >= 2 ? 1 : 0);
    const std::uint32_t exp = static_cast<std::uint32_t>(static_cast<int>(p) - 9 + 127);
    const std::uint32_t mant = static_cast<std::uint32_t>(m - (1u << p)) << (23 - p);
    return sign | (exp << 23) | mant;
  }
  return sign | (static_cast<std::uint32_t>(e - 7 + 127) << 23) | (static_cast<std::uint32_t>(m) << 20);
}

// E5M2: the top byte of an IEEE binary16 (s eeeee mm, bias 15, with
// infinities and NaNs). NaN keeps its payload with the quiet bit set, as
// f16 -> f32 does.
constexpr std::uint32_t e5m2_bits(unsigned b) {
  const std::uint32_t h = static_cast<std::uint32_t>(b) << 8;
  const std::uint32_t sign = (h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1Fu;
  const std::uint32_t m = h & 0x3FFu;
  if (e == 31) return sign | 0x7F800000u | (m << 13) | (m ? 0x00400000u : 0u);
  if (e == 0) {
    if (m == 0) return sign;
    // Subnormal m * 2^-24 with m in {0x100, 0x200, 0x300}: m>>8 * 2^-16.
    const unsigned q = m >> 8;  // 1..3
    const unsigned p = q >= 2 ? 1 : 0;
    const std::uint32_t exp = static_cast<std::uint32_t>(static_cast<int>(p) - 16 + 127);
    const std::uint32_t mant = static_cast<std::uint32_t>(q - (1u << p)) << (23 - p);
    return sign | (exp << 23) | mant;
  }
  return sign | ((e + 112u) << 23) | (m << 13);
}

template <std::uint32_t (*Bits)(unsigned)>
struct Table {
  std::array<std::uint32_t, 256> v{};
  constexpr Table() {
    for (unsigned i = 0; i < 256; ++i) v[i] = Bits(i);
  }
};

constexpr Table<e4m3_bits> kE4M3{};
constexpr Table<e5m2_bits> kE5M2{};

// The 256 float32 values of a format (bits from the constexpr tables).
struct FloatTable {
  float v[256];
  explicit FloatTable(const std::array<std::uint32_t, 256>& bits) {
    for (unsigned i = 0; i < 256; ++i) std::memcpy(&v[i], &bits[i], 4);
  }
};

const FloatTable& table_of(DType t) {
  static const FloatTable e4m3(kE4M3.v);
  static const FloatTable e5m2(kE5M2.v);
  if (t == DType::F8_E4M3) return e4m3;
  if (t == DType::F8_E5M2) return e5m2;
  throw std::invalid_argument("not an FP8 format");
}

void e4m3_to_f32(const std::uint8_t* src, float* dst, std::size_t n) {
  const float* t = table_of(DType::F8_E4M3).v;
  for (std::size_t i = 0; i < n; ++i) dst[i] = t[src[i]];
}

void e5m2_to_f32(const std::uint8_t* src, float* dst, std::size_t n) {
  const float* t = table_of(DType::F8_E5M2).v;
  for (std::size_t i = 0; i < n; ++i) dst[i] = t[src[i]];
}

// float32 -> bfloat16, round to nearest even; NaN stays a quiet NaN with its
// sign and top payload bits (numpy/ml_dtypes and gguf-py's bf16 agree on
// every non-NaN value).
inline std::uint16_t f32_to_bf16_rne(float f) {
  const std::uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

float scale_value(DType t, const std::uint8_t* p) {
  switch (t) {
    case DType::F32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::BF16: {
      std::uint16_t h;
      std::memcpy(&h, p, 2);
      return bf16_to_f32_inline(h);
    }
    case DType::F16: {
      std::uint16_t h;
      std::memcpy(&h, p, 2);
      return f16_to_f32_inline(h);
    }
    default: throw std::invalid_argument("an FP8 scale is f32, bf16 or f16");
  }
}

std::size_t ceil_div(std::size_t a, std::size_t b) { return a / b + (a % b != 0); }

bool mul3(std::size_t a, std::size_t b, std::size_t c, std::size_t* out) {
  std::size_t t = 0;
  if (b != 0 && a > static_cast<std::size_t>(-1) / b) return false;
  t = a * b;
  if (c != 0 && t > static_cast<std::size_t>(-1) / c) return false;
  *out = t * c;
  return true;
}


#if defined(HF2Q_FP8_AVX2)
// AVX2 + F16C paths, chosen at run time (active_isa); bit-identical to the
// scalar code above: the same exact decode, the same single multiply.
// Function-level target attributes: the file is built for the baseline ISA.

// 8 FP8 bytes -> 8 exact float32 (E4M3FN by integer arithmetic on the bits:
// normals rebias the exponent, subnormals are m * 2^-9 from an exact
// int -> float conversion, NaN the table's; E5M2 through F16C).
__attribute__((target("avx2,f16c"))) inline __m256 decode8(const std::uint8_t* p, bool e5m2) {
  const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  if (e5m2) {
    const __m128i h = _mm_slli_epi16(_mm_cvtepu8_epi16(raw), 8);
    return _mm256_cvtph_ps(h);
  }
  const __m256i b = _mm256_cvtepu8_epi32(raw);
  const __m256i mag = _mm256_and_si256(b, _mm256_set1_epi32(0x7F));
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x80)), 24);
  const __m256i normal = _mm256_add_epi32(_mm256_slli_epi32(mag, 20), _mm256_set1_epi32(120 << 23));
  const __m256i sub = _mm256_castps_si256(_mm256_mul_ps(_mm256_cvtepi32_ps(mag), _mm256_set1_ps(0.001953125f)));
  const __m256i is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(8), mag);
  const __m256i is_nan = _mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7F));
  __m256i v = _mm256_blendv_epi8(normal, sub, is_sub);
  v = _mm256_blendv_epi8(v, _mm256_set1_epi32(0x7FF00000), is_nan);
  return _mm256_castsi256_ps(_mm256_or_si256(v, sign));
}

// y[c] = decode(w[c]) * scale of c's block, for a whole row; returns whether
// a product is NaN/Inf.
__attribute__((target("avx2,f16c"))) bool scale_row_avx2(const std::uint8_t* w, float* y, std::size_t cols,
                                                         std::size_t block_cols, const float* scales, bool e5m2) {
  __m256i bad = _mm256_setzero_si256();
  const __m256i expo = _mm256_set1_epi32(0x7F800000);
  std::size_t c = 0;
  for (std::size_t b = 0; c < cols; ++b) {
    const float sc = scales[b];
    const __m256 vs = _mm256_set1_ps(sc);
    const std::size_t end = std::min(cols, c + block_cols);
    for (; c + 8 <= end; c += 8) {
      const __m256 v = _mm256_mul_ps(decode8(w + c, e5m2), vs);
      _mm256_storeu_ps(y + c, v);
      bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(v), expo), expo));
    }
    for (; c < end; ++c) {
      y[c] = fp8_product(table_of(e5m2 ? DType::F8_E5M2 : DType::F8_E4M3).v[w[c]], sc);
      if (is_nonfinite_bits(f32_bits(y[c]))) bad = _mm256_set1_epi32(-1);
    }
  }
  return _mm256_movemask_epi8(bad) != 0;
}

__attribute__((target("avx2,f16c"))) void f32_to_bf16_avx2(const float* y, std::uint16_t* o, std::size_t n) {
  std::size_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(y + j));
    const __m256i absu = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
    const __m256i nan = _mm256_cmpgt_epi32(absu, _mm256_set1_epi32(0x7F800000));
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), odd), 16);
    const __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    const __m256i v = _mm256_blendv_epi8(r, q, nan);
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + j), _mm256_castsi256_si128(packed));
  }
  for (; j < n; ++j) o[j] = f32_to_bf16_rne(y[j]);
}

__attribute__((target("avx2,f16c"))) void f32_to_f16_avx2(const float* y, std::uint16_t* o, std::size_t n) {
  std::size_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 v = _mm256_loadu_ps(y + j);
    const __m256i u = _mm256_castps_si256(v);
    // NaN as the scalar conversion writes it (F16C keeps other payload bits).
    const __m256i absu = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
    if (_mm256_movemask_epi8(_mm256_cmpgt_epi32(absu, _mm256_set1_epi32(0x7F800000))) != 0) {
      for (std::size_t k = j; k < j + 8; ++k) o[k] = f32_to_f16_rne_inline(y[k]);
      continue;
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + j), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  for (; j < n; ++j) o[j] = f32_to_f16_rne_inline(y[j]);
}
#endif
}  // namespace

//                                  to_f32       to_u32   encode   metal    cuda verify              cuda to_f32            enc  per CTA
const FormatKernels kF8E4M3Kernels{e4m3_to_f32, nullptr, nullptr, nullptr, "hf2q_checksums_f8_e4m3", "hf2q_f8_e4m3_to_f32",
                                   nullptr, 0};
const FormatKernels kF8E5M2Kernels{e5m2_to_f32, nullptr, nullptr, nullptr, "hf2q_checksums_f8_e5m2", "hf2q_f8_e5m2_to_f32",
                                   nullptr, 0};

std::size_t ScaledFp8::numel() const {
  std::size_t n = 0;
  if (!mul3(lead, rows, cols, &n)) throw std::invalid_argument("FP8 tensor size overflows");
  return n;
}

void ScaledFp8::check() const {
  if (weight != DType::F8_E4M3 && weight != DType::F8_E5M2) {
    throw std::invalid_argument("the weight of a scaled FP8 tensor is f8_e4m3 or f8_e5m2");
  }
  if (scale != DType::F32 && scale != DType::BF16 && scale != DType::F16) {
    throw std::invalid_argument("an FP8 scale is f32, bf16 or f16");
  }
  if (block_rows == 0 || block_cols == 0) throw std::invalid_argument("an FP8 scale block has no zero dimension");
  if (scale_rows != ceil_div(rows, block_rows) || scale_cols != ceil_div(cols, block_cols)) {
    throw std::invalid_argument("the scale grid is not ceil(rows / block_rows) x ceil(cols / block_cols)");
  }
  (void)numel();
  std::size_t s = 0;
  if (!mul3(lead, scale_rows, scale_cols, &s)) throw std::invalid_argument("FP8 scale size overflows");
}

EncodeResult scaled_fp8_rows(const ScaledFp8& s, const std::uint8_t* w, const std::uint8_t* scale, DType out,
                             std::uint8_t* dst, std::size_t row_begin, std::size_t row_end, float* tmp) {
  EncodeResult result;
  const float* table = table_of(s.weight).v;
  const std::size_t sbytes = kFormats[static_cast<int>(s.scale)].block_bytes;
  const std::size_t cols = s.cols;
  const std::size_t q8_blocks = cols / kQ8BlockElems;
#if defined(HF2Q_FP8_AVX2)
  const bool avx2 = active_isa() == Isa::Avx2;
  const bool e5m2 = s.weight == DType::F8_E5M2;
  std::vector<float> row_scales(avx2 ? s.scale_cols : 0);
#endif
#if defined(HF2Q_FP8_AVX2)
  // The fused row kernels (fp8_avx2.cpp): decode, scale and write in one
  // pass, when no 16-element chunk straddles two scale blocks.
  if (avx2 && (s.block_cols % 16 == 0 || s.scale_cols == 1)) {
    const std::size_t nchunks = cols / 16 + (cols % 16 != 0);
    std::vector<float> chunk_scale(nchunks);
    const std::size_t out_bytes = out == DType::F32 ? 4 : 2;
    for (std::size_t r = row_begin; r < row_end; ++r) {
      const std::size_t lead = r / s.rows;
      const std::size_t row = r % s.rows;
      const std::uint8_t* srow = scale + ((lead * s.scale_rows + row / s.block_rows) * s.scale_cols) * sbytes;
      if (r == row_begin || row % s.block_rows == 0) {
        for (std::size_t k = 0; k < nchunks; ++k) {
          chunk_scale[k] = scale_value(s.scale, srow + (s.scale_cols == 1 ? 0 : k * 16 / s.block_cols) * sbytes);
        }
      }
      std::uint8_t* drow = out == DType::Q8_0 ? dst + r * q8_blocks * kQ8BlockBytes : dst + r * cols * out_bytes;
      const std::size_t bad =
          fp8_avx2::scaled_row(w + (r - row_begin) * cols, chunk_scale.data(), cols, e5m2, table, out, drow, &result.inf_scales);
      if (bad != kNoIndex && result.first_nonfinite == kNoIndex) {
        result.first_nonfinite = r * cols + bad;
        if (out == DType::Q8_0) return result;  // the quantizer refuses non-finite input
      }
    }
    return result;
  }
#endif
  for (std::size_t r = row_begin; r < row_end; ++r) {
    const std::size_t lead = r / s.rows;
    const std::size_t row = r % s.rows;
    const std::uint8_t* srow = scale + ((lead * s.scale_rows + row / s.block_rows) * s.scale_cols) * sbytes;
    const std::uint8_t* wrow = w + (r - row_begin) * cols;
    float* y = out == DType::F32 ? reinterpret_cast<float*>(dst + r * cols * 4) : tmp;
    bool bad = false;
#if defined(HF2Q_FP8_AVX2)
    if (avx2) {
      for (std::size_t b = 0; b < s.scale_cols; ++b) row_scales[b] = scale_value(s.scale, srow + b * sbytes);
      bad = scale_row_avx2(wrow, y, cols, s.block_cols, row_scales.data(), e5m2);
    } else
#endif
    {
      std::size_t c = 0;
      for (std::size_t b = 0; c < cols; ++b) {
        const float sc = scale_value(s.scale, srow + b * sbytes);
        const std::size_t end = std::min(cols, c + s.block_cols);
        // One float32 multiply per element (no contraction: -ffp-contract=off).
        for (; c < end; ++c) y[c] = fp8_product(table[wrow[c]], sc);
      }
      bad = true;  // scanned below
    }
    if (bad && result.first_nonfinite == kNoIndex) {
      for (std::size_t j = 0; j < cols; ++j) {
        if (is_nonfinite_bits(f32_bits(y[j]))) {
          result.first_nonfinite = r * cols + j;
          break;
        }
      }
    }
    switch (out) {
      case DType::F32: break;
      case DType::BF16: {
        auto* o = reinterpret_cast<std::uint16_t*>(dst + r * cols * 2);
#if defined(HF2Q_FP8_AVX2)
        if (avx2) {
          f32_to_bf16_avx2(y, o, cols);
          break;
        }
#endif
        for (std::size_t j = 0; j < cols; ++j) o[j] = f32_to_bf16_rne(y[j]);
        break;
      }
      case DType::F16: {
        auto* o = reinterpret_cast<std::uint16_t*>(dst + r * cols * 2);
#if defined(HF2Q_FP8_AVX2)
        if (avx2) {
          f32_to_f16_avx2(y, o, cols);
          break;
        }
#endif
        for (std::size_t j = 0; j < cols; ++j) o[j] = f32_to_f16_rne_inline(y[j]);
        break;
      }
      case DType::Q8_0: {
        if (result.first_nonfinite != kNoIndex) return result;  // the quantizer refuses non-finite input
        const EncodeResult q = quantize_q8_0_range(DType::F32, y, dst + r * q8_blocks * kQ8BlockBytes, q8_blocks);
        result.inf_scales += q.inf_scales;
        break;
      }
      default: throw std::invalid_argument("scaled FP8 decodes to f32, bf16, f16 or q8_0");
    }
  }
  return result;
}

EncodeResult scaled_fp8_decode(const ScaledFp8& s, const std::uint8_t* w, const std::uint8_t* scale, DType out,
                               std::uint8_t* dst) {
  s.check();
  if (out == DType::Q8_0 && s.cols % kQ8BlockElems != 0) {
    throw std::invalid_argument("Q8_0 rows are whole blocks of 32: the FP8 tensor's rows are not");
  }
  if (out != DType::F32 && out != DType::BF16 && out != DType::F16 && out != DType::Q8_0) {
    throw std::invalid_argument("scaled FP8 decodes to f32, bf16, f16 or q8_0");
  }
  const std::size_t nrows = s.lead * s.rows;
  if (nrows == 0 || s.cols == 0) return EncodeResult{};
  // Rows per chunk: about 128 Ki elements, never fewer than one row.
  const std::size_t grain = std::max<std::size_t>(1, (std::size_t{1} << 17) / s.cols);
  std::atomic<std::size_t> first_bad{kNoIndex};
  std::atomic<std::size_t> inf_scales{0};
  parallel_for(nrows, grain, [&](std::size_t b, std::size_t e) {
    std::vector<float> tmp(out == DType::F32 ? 0 : s.cols);
    const EncodeResult r = scaled_fp8_rows(s, w + b * s.cols, scale, out, dst, b, e, tmp.data());
    inf_scales.fetch_add(r.inf_scales, std::memory_order_relaxed);
    if (r.first_nonfinite != kNoIndex) {
      std::size_t cur = first_bad.load();
      while (r.first_nonfinite < cur && !first_bad.compare_exchange_weak(cur, r.first_nonfinite)) {
      }
    }
  });
  EncodeResult res;
  res.first_nonfinite = first_bad.load();
  res.inf_scales = inf_scales.load();
  return res;
}

}  // namespace hf2q::kernels
