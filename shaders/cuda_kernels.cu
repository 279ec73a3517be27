// hf2q CUDA kernels: conversions after a raw host-to-device copy, and the
// read-back checksums. Compiled at run time with NVRTC (no CUDA toolkit at
// build time) by csrc/device/cuda/cuda_backend.cpp, always without fast math
// (--fmad=false --ftz=false --prec-div=true --prec-sqrt=true): Q8_0 must be
// byte-identical to ggml's C reference and to the CPU kernels
// (csrc/kernels/kernels_internal.h), whose steps these follow.
//
// No headers: NVRTC ships none we may rely on, so the few types and the
// binary16 conversions are written here (the float -> half rounding is the
// hardware's cvt.rn.f16.f32, what __float2half_rn compiles to).
//
// This file is embedded into a C++ raw string literal at build time
// (csrc/device/cuda/kernel_source.h.in, through CMake configure_file with
// at-sign substitution): it must contain no at-sign, no dollar sign, and
// never the raw-string terminator (a closing parenthesis followed by HF2QCU).

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define HF2Q_FULL_MASK 0xFFFFFFFFu

// IEEE binary16 bits -> binary32, exact; NaN keeps its payload with the
// quiet bit set (as the CPU's f16_to_f32_inline and F16C do).
__device__ __forceinline__ u32 f16_to_f32_bits(u32 h) {
  const u32 sign = (h & 0x8000u) << 16;
  const u32 e = (h >> 10) & 0x1Fu;
  const u32 m = h & 0x3FFu;
  if (e == 31u) return sign | 0x7F800000u | (m << 13) | (m != 0u ? 0x00400000u : 0u);
  if (e != 0u) return sign | ((e + 112u) << 23) | (m << 13);
  if (m == 0u) return sign;
  // Subnormal half m * 2^-24: a normal float32 whose leading bit is bit `top` of m.
  const u32 top = 31u - (u32)__clz(m);
  return sign | ((top + 103u) << 23) | ((m << (23u - top)) & 0x007FFFFFu);
}

__device__ __forceinline__ float f16_to_f32(u16 h) { return __uint_as_float(f16_to_f32_bits(h)); }
__device__ __forceinline__ float bf16_to_f32(u16 b) { return __uint_as_float((u32)b << 16); }

// float32 -> binary16, round to nearest even, overflow to +-Inf (= __float2half_rn).
__device__ __forceinline__ u16 f32_to_f16_rn(float f) {
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

__device__ __forceinline__ bool nonfinite_bits(u32 u) { return (u & 0x7F800000u) == 0x7F800000u; }

// Round half away from zero, exactly (q8_0 section 2; equal to roundf).
__device__ __forceinline__ float round_half_away(float p) {
  const float t = truncf(p);
  return t + (fabsf(p - t) >= 0.5f ? copysignf(1.0f, p) : 0.0f);
}

__device__ __forceinline__ u64 global_thread() { return (u64)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ u64 grid_threads() { return (u64)gridDim.x * blockDim.x; }

// ------------------------------------------------------------- decoding

extern "C" __global__ void hf2q_bf16_to_f32(const u16* __restrict__ src, float* __restrict__ dst, u64 n) {
  for (u64 i = global_thread(); i < n; i += grid_threads()) dst[i] = bf16_to_f32(src[i]);
}

extern "C" __global__ void hf2q_f16_to_f32(const u16* __restrict__ src, float* __restrict__ dst, u64 n) {
  for (u64 i = global_thread(); i < n; i += grid_threads()) dst[i] = f16_to_f32(src[i]);
}

// ------------------------------------------------------------- Q8_0

// status[0]: smallest flat index (relative to the upload's source, `base`
// added) of a NaN/Inf element, atomically minimised; status[1]: blocks whose
// scale overflowed to +Inf in binary16.
template <int kSrc>
struct Q8Shape {
  static constexpr int kE = kSrc == 0 ? 4 : 8;     // elements per lane per step
  static constexpr int kL = 32 / kE;               // lanes per block
  static constexpr int kBlocksPerStep = 32 / kL;   // blocks per warp step
};

// One warp step: the 16 bytes `v` this lane loaded for step `st`.
template <int kSrc>
__device__ __forceinline__ void q8_step(uint4 v, bool loaded, u64 st, u32 lane, u8* __restrict__ dst, u64 nblocks,
                                        u64 base, u64* status) {
  constexpr int kE = Q8Shape<kSrc>::kE, kL = Q8Shape<kSrc>::kL, kBlocksPerStep = Q8Shape<kSrc>::kBlocksPerStep;
  const u64 b = st * kBlocksPerStep + lane / kL;  // this lane's block
  const bool live = loaded && b < nblocks;
  const u64 first = b * 32u + (lane % kL) * kE;   // its first element
  float x[kE];
  const u32 w[4] = {v.x, v.y, v.z, v.w};
  if (kSrc == 0) {
    for (int k = 0; k < 4; ++k) x[k] = live ? __uint_as_float(w[k]) : 0.0f;
  } else {
    for (int k = 0; k < 4; ++k) {
      const u16 lo = (u16)(w[k] & 0xFFFFu), hi = (u16)(w[k] >> 16);
      x[2 * k] = live ? (kSrc == 1 ? f16_to_f32(lo) : bf16_to_f32(lo)) : 0.0f;
      x[2 * k + 1] = live ? (kSrc == 1 ? f16_to_f32(hi) : bf16_to_f32(hi)) : 0.0f;
    }
  }
  float amax = 0.0f;
  int bad = -1;
  for (int k = 0; k < kE; ++k) {
    if (bad < 0 && nonfinite_bits(__float_as_uint(x[k]))) bad = k;
    amax = fmaxf(amax, fabsf(x[k]));
  }
  if (bad >= 0) atomicMin(&status[0], base + first + (u64)bad);  // the upload fails; bytes do not matter
  for (int off = kL / 2; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(HF2Q_FULL_MASK, amax, off));
  if (!live) return;
  const float d = amax / 127.0f;                 // one float32 division
  const float id = d != 0.0f ? 1.0f / d : 0.0f;  // reciprocal of the rounded d
  // 1/d overflowed: every product is +-Inf or NaN, which the C reference
  // stores as 0x00 on x86.
  const bool zero_qs = (__float_as_uint(id) & 0x7FFFFFFFu) == 0x7F800000u;
  u8* out = dst + b * 34u;
  if (lane % kL == 0) {
    const u16 d16 = f32_to_f16_rn(d);
    *(u16*)out = d16;  // little-endian, 2-byte aligned (34 * b)
    if (d16 == 0x7C00u) atomicAdd(&status[1], 1ull);
  }
  u16* qs = (u16*)(out + 2 + (lane % kL) * kE);
  for (int k = 0; k < kE; k += 2) {
    const int q0 = zero_qs ? 0 : (int)round_half_away(x[k] * id);
    const int q1 = zero_qs ? 0 : (int)round_half_away(x[k + 1] * id);
    qs[k / 2] = (u16)((u32)(u8)(i8)q0 | ((u32)(u8)(i8)q1 << 8));
  }
}

// Each lane loads 16 bytes (kE elements: 4 float32 or 8 16-bit values), so a
// warp reads 512 contiguous bytes per step, fully coalesced; a 32-element
// block spans kL = 32 / kE neighbouring lanes, whose maximum is a butterfly
// of exact fmaxf over those lanes. Each lane then writes its kE quants (an
// even byte offset: 2-byte stores) and the block's first lane its scale.
// (Loading two steps before processing either measured slower on an H200.)
// The source must be 16-byte aligned (device buffers and staging are).
template <int kSrc>  // 0: f32, 1: f16, 2: bf16
__device__ __forceinline__ void quantize_q8_0(const void* __restrict__ src, u8* __restrict__ dst, u64 nblocks,
                                              u64 base, u64* status) {
  constexpr int kBlocksPerStep = Q8Shape<kSrc>::kBlocksPerStep;
  const u32 lane = threadIdx.x & 31u;
  const u64 warp = global_thread() >> 5;
  const u64 warps = grid_threads() >> 5;
  const u64 steps = (nblocks + kBlocksPerStep - 1) / kBlocksPerStep;
  const uint4* src16 = (const uint4*)src;
  // 16-byte words in the source: lanes of a partial last step past it load nothing.
  const u64 words = nblocks * 32u * (kSrc == 0 ? 4u : 2u) / 16u;
  for (u64 st = warp; st < steps; st += warps) {
    const u64 i = st * 32u + lane;
    const bool loaded = i < words;
    const uint4 v = loaded ? src16[i] : make_uint4(0u, 0u, 0u, 0u);
    q8_step<kSrc>(v, loaded, st, lane, dst, nblocks, base, status);
  }
}

extern "C" __global__ void hf2q_quantize_q8_0_f32(const void* src, u8* dst, u64 nblocks, u64 base, u64* status) {
  quantize_q8_0<0>(src, dst, nblocks, base, status);
}
extern "C" __global__ void hf2q_quantize_q8_0_f16(const void* src, u8* dst, u64 nblocks, u64 base, u64* status) {
  quantize_q8_0<1>(src, dst, nblocks, base, status);
}
extern "C" __global__ void hf2q_quantize_q8_0_bf16(const void* src, u8* dst, u64 nblocks, u64 base, u64* status) {
  quantize_q8_0<2>(src, dst, nblocks, base, status);
}

// Q8_0 -> float32 (ggml's dequantize_row_q8_0: float(q) * float(half d)).
extern "C" __global__ void hf2q_dequantize_q8_0(const u8* __restrict__ src, float* __restrict__ dst, u64 n) {
  for (u64 i = global_thread(); i < n; i += grid_threads()) {
    const u8* blk = src + (i >> 5) * 34u;
    const float d = f16_to_f32((u16)(blk[0] | (blk[1] << 8)));
    dst[i] = (float)(i8)blk[2 + (i & 31u)] * d;
  }
}

// ------------------------------------------------------------- checksums

// Definition: csrc/device/verify.h. For group g of 256 elements,
// out[g] = sum_i bits(g*256 + i) * (2i + 1) mod 2^32, bits the float32 bits
// once decoded (integers: i32 its bits, u8 the byte value). One kernel per
// format, named by its row's cuda_verify (csrc/kernels/format_kernels.h);
// one thread block of 256 threads per group; the sum is integer, so its
// order does not matter.

// Bits of float(q) * d for d the float32 bits of a half scale, as the CPU's
// IEEE multiply gives them (NaN cases decided on the bits: the GPU's NaN
// results are canonical, the CPU's are not).
__device__ __forceinline__ u32 q8_value_bits(int q, u32 d, u32 default_nan) {
  const u32 qsign = q < 0 ? 0x80000000u : 0u;
  if ((d & 0x7F800000u) == 0x7F800000u) {
    if ((d & 0x007FFFFFu) != 0u) return d;       // NaN scale propagates (already quiet)
    return q == 0 ? default_nan : (d ^ qsign);  // 0 * Inf, or +-Inf
  }
  if (q == 0 || (d & 0x7FFFFFFFu) == 0u) return (d ^ qsign) & 0x80000000u;  // signed zero
  return __float_as_uint((float)q * __uint_as_float(d));  // exact: 8 x 11 significant bits
}

// Element k's read-back value, one struct per format.
struct BitsB32 {  // f32 and i32: the stored 32 bits
  static __device__ __forceinline__ u32 at(const u8* data, u64 k, u32) { return ((const u32*)data)[k]; }
};
struct BitsF16 {
  static __device__ __forceinline__ u32 at(const u8* data, u64 k, u32) { return f16_to_f32_bits(((const u16*)data)[k]); }
};
struct BitsBF16 {
  static __device__ __forceinline__ u32 at(const u8* data, u64 k, u32) { return (u32)((const u16*)data)[k] << 16; }
};
struct BitsU8 {
  static __device__ __forceinline__ u32 at(const u8* data, u64 k, u32) { return data[k]; }
};
struct BitsQ8_0 {
  static __device__ __forceinline__ u32 at(const u8* data, u64 k, u32 default_nan) {
    const u8* blk = data + (k >> 5) * 34u;
    const u32 d = f16_to_f32_bits((u32)blk[0] | ((u32)blk[1] << 8));
    return q8_value_bits((int)(i8)blk[2 + (k & 31u)], d, default_nan);
  }
};

template <class Bits>
__device__ __forceinline__ void checksums(const u8* __restrict__ data, u64 numel, u32* __restrict__ out, u64 ngroups,
                                          u32 default_nan) {
  __shared__ u32 partial[8];
  const u32 i = threadIdx.x;  // blockDim.x == 256
  for (u64 g = blockIdx.x; g < ngroups; g += gridDim.x) {
    const u64 k = g * 256u + i;
    u32 v = k < numel ? Bits::at(data, k, default_nan) * (2u * i + 1u) : 0u;
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(HF2Q_FULL_MASK, v, off);
    if ((i & 31u) == 0) partial[i >> 5] = v;
    __syncthreads();
    if (i == 0) {
      u32 sum = 0;
      for (int w = 0; w < 8; ++w) sum += partial[w];
      out[g] = sum;
    }
    __syncthreads();
  }
}

#define HF2Q_CHECKSUMS(name, bits)                                                                             \
  extern "C" __global__ void name(const u8* __restrict__ data, u64 numel, u32* __restrict__ out, u64 ngroups, \
                                  u32 default_nan) {                                                          \
    checksums<bits>(data, numel, out, ngroups, default_nan);                                                   \
  }
HF2Q_CHECKSUMS(hf2q_checksums_b32, BitsB32)
HF2Q_CHECKSUMS(hf2q_checksums_f16, BitsF16)
HF2Q_CHECKSUMS(hf2q_checksums_bf16, BitsBF16)
HF2Q_CHECKSUMS(hf2q_checksums_u8, BitsU8)
HF2Q_CHECKSUMS(hf2q_checksums_q8_0, BitsQ8_0)

// ------------------------------------------------------------- FP8 (docs/FP8.md)

// OCP E4M3FN byte -> float32 bits, exact: s eeee mmm, bias 7, no Inf,
// s 1111 111 NaN (quiet, sign kept) -- csrc/kernels/fp8.cpp's table.
__device__ __forceinline__ u32 f8_e4m3_bits(u32 b) {
  const u32 sign = (b & 0x80u) << 24;
  const u32 e = (b >> 3) & 0xFu;
  const u32 m = b & 0x7u;
  if (e == 0xFu && m == 0x7u) return sign | 0x7FC00000u;
  if (e != 0u) return sign | ((e + 120u) << 23) | (m << 20);
  if (m == 0u) return sign;
  const u32 top = 31u - (u32)__clz(m);  // subnormal m * 2^-9
  return sign | ((top + 118u) << 23) | ((m << (23u - top)) & 0x007FFFFFu);
}
// E5M2 byte: the top byte of a binary16.
__device__ __forceinline__ u32 f8_e5m2_bits(u32 b) { return f16_to_f32_bits(b << 8); }

extern "C" __global__ void hf2q_f8_e4m3_to_f32(const u8* __restrict__ src, float* __restrict__ dst, u64 n) {
  for (u64 i = global_thread(); i < n; i += grid_threads()) dst[i] = __uint_as_float(f8_e4m3_bits(src[i]));
}
extern "C" __global__ void hf2q_f8_e5m2_to_f32(const u8* __restrict__ src, float* __restrict__ dst, u64 n) {
  for (u64 i = global_thread(); i < n; i += grid_threads()) dst[i] = __uint_as_float(f8_e5m2_bits(src[i]));
}

struct BitsF8E4M3 {
  static __device__ __forceinline__ u32 at(const u8* data, u64 k, u32) { return f8_e4m3_bits(data[k]); }
};
struct BitsF8E5M2 {
  static __device__ __forceinline__ u32 at(const u8* data, u64 k, u32) { return f8_e5m2_bits(data[k]); }
};
HF2Q_CHECKSUMS(hf2q_checksums_f8_e4m3, BitsF8E4M3)
HF2Q_CHECKSUMS(hf2q_checksums_f8_e5m2, BitsF8E5M2)

// ggml MXFP4 read-back (csrc/kernels/mxfp4.cpp): the doubled E2M1 value of
// the code times half the block's E8M0 power of two, one exact product.
__device__ __forceinline__ u32 mxfp4_half_bits(u32 e) { return e < 2u ? (0x00200000u << e) : ((e - 1u) << 23); }
struct BitsMXFP4 {
  static __device__ __forceinline__ u32 at(const u8* data, u64 k, u32) {
    const u8* blk = data + (k >> 5) * 17u;
    const u32 j = (u32)(k & 31u);
    const u32 code = j < 16u ? (blk[1 + j] & 0x0Fu) : (blk[1 + j - 16u] >> 4);
    const int kv[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    return __float_as_uint((float)kv[code] * __uint_as_float(mxfp4_half_bits(blk[0])));
  }
};
HF2Q_CHECKSUMS(hf2q_checksums_mxfp4, BitsMXFP4)

// ------------------------------------------------------------- scaled FP8 (docs/FP8.md)

// A scaled FP8 tensor already on the GPU: `w` lead * rows * cols FP8 bytes,
// `scale` its grid as float32 (lead * srows * scols, one value per br x bc
// block, edge blocks partial), decoded into `dst` (which already points at
// the destination's first element). The product is one float32 multiply
// (compiled with --fmad=false), as csrc/kernels/fp8.cpp computes it.
// status[0]: smallest flat index of a NaN/Inf product (atomically
// minimised); status[1]: Q8_0 blocks whose binary16 scale overflowed.
struct ScaledGeo {
  u64 rows, cols, br, bc, srows, scols;
};

template <int kFmt>  // 0: f8_e4m3, 1: f8_e5m2
__device__ __forceinline__ float scaled_value(const u8* __restrict__ w, const float* __restrict__ scale,
                                              const ScaledGeo& g, u64 i) {
  const u64 row_all = i / g.cols, c = i - row_all * g.cols;
  const u64 lead = row_all / g.rows, r = row_all - lead * g.rows;
  const float s = scale[(lead * g.srows + r / g.br) * g.scols + c / g.bc];
  const float x = __uint_as_float(kFmt == 0 ? f8_e4m3_bits(w[i]) : f8_e5m2_bits(w[i]));
  return __fmul_rn(x, s);
}

// float32 -> bfloat16, round to nearest even; NaN quiet with its sign and top payload (fp8.cpp's f32_to_bf16_rne).
__device__ __forceinline__ u16 f32_to_bf16_rne(float f) {
  const u32 u = __float_as_uint(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (u16)((u >> 16) | 0x0040u);
  return (u16)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// float32 -> binary16 as the CPU's f32_to_f16_rne_inline (NaN: 0x7E00 | top payload, sign kept).
__device__ __forceinline__ u16 f32_to_f16_cpu(float f) {
  const u32 u = __float_as_uint(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (u16)(((u >> 16) & 0x8000u) | 0x7E00u | ((u >> 13) & 0x3FFu));
  return f32_to_f16_rn(f);
}

template <int kFmt, int kOut>  // kOut 0: f32, 1: bf16, 2: f16
__device__ __forceinline__ void scaled_fp8_elems(const u8* __restrict__ w, const float* __restrict__ scale,
                                                 void* __restrict__ dst, u64 n, ScaledGeo g, u64* status) {
  for (u64 i = global_thread(); i < n; i += grid_threads()) {
    const float y = scaled_value<kFmt>(w, scale, g, i);
    if (nonfinite_bits(__float_as_uint(y))) atomicMin(&status[0], i);
    if (kOut == 0) ((float*)dst)[i] = y;
    if (kOut == 1) ((u16*)dst)[i] = f32_to_bf16_rne(y);
    if (kOut == 2) ((u16*)dst)[i] = f32_to_f16_cpu(y);
  }
}

// Q8_0: one thread per 32-element block (cols a multiple of 32), the block's
// products computed once into registers, then ggml's quantize_row_q8_0_ref
// steps as quantize_q8_0 above.
template <int kFmt>
__device__ __forceinline__ void scaled_fp8_q8_0(const u8* __restrict__ w, const float* __restrict__ scale,
                                                u8* __restrict__ dst, u64 nblocks, ScaledGeo g, u64* status) {
  for (u64 b = global_thread(); b < nblocks; b += grid_threads()) {
    float x[32];
    float amax = 0.0f;
    bool bad = false;
    for (int k = 0; k < 32; ++k) {
      const u64 i = b * 32u + (u64)k;
      x[k] = scaled_value<kFmt>(w, scale, g, i);
      if (!bad && nonfinite_bits(__float_as_uint(x[k]))) {
        atomicMin(&status[0], i);
        bad = true;
      }
      amax = fmaxf(amax, fabsf(x[k]));
    }
    if (bad) continue;  // the load fails; the block's bytes do not matter
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const bool zero_qs = (__float_as_uint(id) & 0x7FFFFFFFu) == 0x7F800000u;
    u8* out = dst + b * 34u;
    const u16 d16 = f32_to_f16_rn(d);
    out[0] = (u8)(d16 & 0xFFu);
    out[1] = (u8)(d16 >> 8);
    if (d16 == 0x7C00u) atomicAdd(&status[1], 1ull);
    for (int k = 0; k < 32; ++k) out[2 + k] = (u8)(i8)(zero_qs ? 0 : (int)round_half_away(x[k] * id));
  }
}

#define HF2Q_SCALED_FP8(fmt_name, kFmt)                                                                            \
  extern "C" __global__ void hf2q_scaled_##fmt_name##_f32(const u8* w, const float* s, void* dst, u64 n,         \
                                                          ScaledGeo g, u64* status) {                            \
    scaled_fp8_elems<kFmt, 0>(w, s, dst, n, g, status);                                                         \
  }                                                                                                              \
  extern "C" __global__ void hf2q_scaled_##fmt_name##_bf16(const u8* w, const float* s, void* dst, u64 n,        \
                                                           ScaledGeo g, u64* status) {                           \
    scaled_fp8_elems<kFmt, 1>(w, s, dst, n, g, status);                                                         \
  }                                                                                                              \
  extern "C" __global__ void hf2q_scaled_##fmt_name##_f16(const u8* w, const float* s, void* dst, u64 n,         \
                                                          ScaledGeo g, u64* status) {                            \
    scaled_fp8_elems<kFmt, 2>(w, s, dst, n, g, status);                                                         \
  }                                                                                                              \
  extern "C" __global__ void hf2q_scaled_##fmt_name##_q8_0(const u8* w, const float* s, void* dst, u64 nblocks,  \
                                                           ScaledGeo g, u64* status) {                           \
    scaled_fp8_q8_0<kFmt>(w, s, (u8*)dst, nblocks, g, status);                                                  \
  }
HF2Q_SCALED_FP8(f8_e4m3, 0)
HF2Q_SCALED_FP8(f8_e5m2, 1)
