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

// ------------------------------------------------------------- Q4_0 / Q4_K / Q5_K / Q6_K / Q5_0 / Q5_1
// ggml's reference quantizers without an importance matrix (docs/KQUANTS.md),
// the steps of the CPU kernels (csrc/kernels/kquants.cpp), one IEEE float32
// operation at a time in the C code's order (NVRTC runs without fast math
// and with --fmad=false: no contraction). One thread per group fit: eight
// threads per Q4_K / Q5_K super-block (its groups of 32), sixteen per Q6_K
// super-block (groups of 16), one per 32-value block of Q4_0 / Q5_0 / Q5_1;
// the threads of a super-block are neighbouring lanes of one warp and share
// their fits through shared memory (__syncwarp on their lanes only, so a
// partial last grid step cannot deadlock). status as for Q8_0: [0] the
// smallest flat index of a NaN/Inf element (base added), [1] blocks with a
// scale that overflowed float16 to Inf.

// ggml's nearest_int: the low mantissa bits of v + 1.5 * 2^23 (half to even
// for |v| < 2^22; the same bits as the CPU for every float). A NaN is the one
// exception: the GPU's arithmetic returns the canonical NaN 0x7FFFFFFF for
// any NaN operand, where x86 and ARM keep the operand's payload. The NaNs
// met here come from invalid operations on an overflowed scale (inf * 0,
// inf - inf), which both CPUs produce as their default NaN (payload
// 0x400000), for which the formula gives 0: the GPU returns that.
__device__ __forceinline__ int kq_nearest_int(float v) {
  if (v != v) return 0;
  const float t = v + 12582912.0f;
  return (int)(__float_as_uint(t) & 0x007FFFFFu) - 0x00400000;
}

// ggml's float -> half: round to nearest even; NaN -> 0x7E00 with the sign.
__device__ __forceinline__ u16 kq_fp16(float f) {
  const u32 u = __float_as_uint(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (u16)(((u >> 16) & 0x8000u) | 0x7E00u);
  return f32_to_f16_rn(f);
}

__device__ __forceinline__ bool kq_inf_half(u16 h) { return (h & 0x7FFFu) == 0x7C00u; }

// C's (int)(float) as x86-64 compiles it (CVTTSS2SI): INT32_MIN for NaN and
// values outside int32 (the CPU kernels reproduce this on every machine).
__device__ __forceinline__ int kq_trunc_x86(float f) {
  return (f > -2147483904.0f && f < 2147483648.0f) ? (int)f : (int)0x80000000u;
}

__device__ __forceinline__ int kq_imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int kq_imax(int a, int b) { return a > b ? a : b; }

template <int kSrc>  // 0: f32, 1: f16, 2: bf16
__device__ __forceinline__ float kq_load(const void* __restrict__ src, u64 i) {
  if (kSrc == 0) return ((const float*)src)[i];
  const u16 h = ((const u16*)src)[i];
  return kSrc == 1 ? f16_to_f32(h) : bf16_to_f32(h);
}

// n values from element `first`; reports the first NaN/Inf (the bytes of its
// block do not matter: the upload fails).
template <int kSrc, int n>
__device__ __forceinline__ void kq_load_group(const void* __restrict__ src, u64 first, float* x, u64 base,
                                              u64* status) {
  int bad = -1;
#pragma unroll
  for (int i = 0; i < n; ++i) {
    x[i] = kq_load<kSrc>(src, first + i);
    if (bad < 0 && nonfinite_bits(__float_as_uint(x[i]))) bad = i;
  }
  if (bad >= 0) atomicMin(&status[0], base + first + (u64)bad);
}

// make_qkx2_quants(32, nmax, x, weights, L, &the_min, Laux, rmin, 0.1, nstep).
template <int nmax>
__device__ __forceinline__ float kq_make_qkx2(const float* x, const float* w, u8* L, float* the_min, float rmin,
                                              int nstep) {
  constexpr int n = 32;
  float min = x[0];
  float max = x[0];
  float sum_w = w[0];
  float sum_x = sum_w * x[0];
#pragma unroll
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
#pragma unroll
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.0f;
  }
  float iscale = (float)nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
#pragma unroll
  for (int i = 0; i < n; ++i) {
    const int l = kq_nearest_int(iscale * (x[i] - min));
    L[i] = (u8)kq_imax(0, kq_imin(nmax, l));
    float diff = scale * (float)L[i] + min - x[i];
    diff = diff * diff;
    best_error += w[i] * diff;
  }
  u8 Laux[n];
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + 0.1f * (float)is + (float)nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
#pragma unroll
    for (int i = 0; i < n; ++i) {
      const int l = kq_imax(0, kq_imin(nmax, kq_nearest_int(iscale * (x[i] - min))));
      Laux[i] = (u8)l;
      const float fl = (float)l;
      sum_l += w[i] * fl;
      sum_l2 += w[i] * fl * fl;
      sum_xl += w[i] * fl * x[i];
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
#pragma unroll
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * (float)Laux[i] + this_min - x[i];
        diff = diff * diff;
        cur_error += w[i] * diff;
      }
      if (cur_error < best_error) {
#pragma unroll
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

// ggml stores nearest_int's result in a uint8_t (modulo 256), then MIN(63, .).
__device__ __forceinline__ u32 kq_q6bit(float inv, float v) {
  const u32 q = (u32)(u8)kq_nearest_int(inv * v);
  return q < 63u ? q : 63u;
}

// Q4_K (nmax 15, 144 bytes) and Q5_K (nmax 31, 176 bytes).
template <int kSrc, int nmax>
__device__ __forceinline__ void quantize_qk_affine(const void* __restrict__ src, u8* __restrict__ dst, u64 nblocks,
                                                   u64 base, u64* status) {
  constexpr int kSb = 32;  // super-blocks per 256-thread CTA
  constexpr u32 kBytes = nmax == 15 ? 144u : 176u;
  const float rmin = nmax == 15 ? -1.0f : -0.5f;
  const int nstep = nmax == 15 ? 20 : 15;
  __shared__ float sh_scale[kSb][8];
  __shared__ float sh_min[kSb][8];
  __shared__ u8 sh_L[kSb][256];
  const u32 t = threadIdx.x, g = t & 7u, s = t >> 3, lane = t & 31u;
  const u32 mask = 0xFFu << (lane & 24u);
  for (u64 sb = (u64)blockIdx.x * kSb + s; sb < nblocks; sb += (u64)gridDim.x * kSb) {
    const u64 first = sb * 256u + g * 32u;
    float x[32], w[32];
    kq_load_group<kSrc, 32>(src, first, x, base, status);
    float sum_x2 = 0;
#pragma unroll
    for (int i = 0; i < 32; ++i) sum_x2 += x[i] * x[i];
    const float av_x = sqrtf(sum_x2 / 32);
#pragma unroll
    for (int i = 0; i < 32; ++i) w[i] = av_x + fabsf(x[i]);
    u8 L[32];
    float the_min;
    const float scale = kq_make_qkx2<nmax>(x, w, L, &the_min, rmin, nstep);
    sh_scale[s][g] = scale;
    sh_min[s][g] = the_min;
    __syncwarp(mask);
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
      if (sh_scale[s][j] > max_scale) max_scale = sh_scale[s][j];
      if (sh_min[s][j] > max_min) max_min = sh_min[s][j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    const u16 d16 = kq_fp16(max_scale / 63.f);
    const u16 m16 = kq_fp16(max_min / 63.f);
    const float d = f16_to_f32(d16) * (float)kq_q6bit(inv_scale, scale);
    if (d != 0) {  // a zero group scale keeps the levels of the fit
      const float dm = f16_to_f32(m16) * (float)kq_q6bit(inv_min, the_min);
#pragma unroll
      for (int i = 0; i < 32; ++i) L[i] = (u8)kq_imax(0, kq_imin(nmax, kq_nearest_int((x[i] + dm) / d)));
    }
#pragma unroll
    for (int i = 0; i < 32; ++i) sh_L[s][32u * g + i] = L[i];
    u8* out = dst + sb * kBytes;
    if (g == 0) {
      out[0] = (u8)d16;
      out[1] = (u8)(d16 >> 8);
      out[2] = (u8)m16;
      out[3] = (u8)(m16 >> 8);
      u8 sc[12];
      for (int j = 0; j < 12; ++j) sc[j] = 0;
      for (int j = 0; j < 8; ++j) {
        const u32 ls = kq_q6bit(inv_scale, sh_scale[s][j]);
        const u32 lm = kq_q6bit(inv_min, sh_min[s][j]);
        if (j < 4) {
          sc[j] = (u8)ls;
          sc[j + 4] = (u8)lm;
        } else {
          sc[j + 4] = (u8)((ls & 0xFu) | ((lm & 0xFu) << 4));
          sc[j - 4] = (u8)(sc[j - 4] | ((ls >> 4) << 6));
          sc[j] = (u8)(sc[j] | ((lm >> 4) << 6));
        }
      }
      for (int j = 0; j < 12; ++j) out[4 + j] = sc[j];
      if (kq_inf_half(d16) || kq_inf_half(m16)) atomicAdd(&status[1], 1ull);
    }
    __syncwarp(mask);
    const u8* Ls = sh_L[s];
    if (nmax == 15) {
      // byte b: chunk c = b / 32, l = b % 32: L[64c + l] | L[64c + 32 + l] << 4
      for (u32 b = 16u * g; b < 16u * g + 16u; ++b) {
        const u32 c = b >> 5, l = b & 31u;
        out[16 + b] = (u8)(Ls[64u * c + l] | (Ls[64u * c + 32u + l] << 4));
      }
    } else {
      for (u32 b = 16u * g; b < 16u * g + 16u; ++b) {
        const u32 c = b >> 5, l = b & 31u;
        out[48 + b] = (u8)((Ls[64u * c + l] & 0xFu) | ((Ls[64u * c + 32u + l] & 0xFu) << 4));
      }
      for (u32 l = 4u * g; l < 4u * g + 4u; ++l) {
        u32 h = 0;
        for (u32 c = 0; c < 4u; ++c) {
          h |= (Ls[64u * c + l] > 15u ? 1u : 0u) << (2u * c);
          h |= (Ls[64u * c + 32u + l] > 15u ? 1u : 0u) << (2u * c + 1u);
        }
        out[16 + l] = (u8)h;
      }
    }
    __syncwarp(mask);  // sh_* are reused by the next super-block of these lanes
  }
}

// make_qx_quants(16, 32, x, L, rmse_type = 1, no weights); L = level + 32.
__device__ __forceinline__ float kq_make_qx(const float* x, i8* L) {
  constexpr int n = 16, nmax = 32;
  float max = 0, amax = 0;
#pragma unroll
  for (int i = 0; i < n; ++i) {
    const float ax = fabsf(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < 1e-15f) {
#pragma unroll
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  float iscale = (float)(-nmax) / max;
  float sumlx = 0, suml2 = 0;
#pragma unroll
  for (int i = 0; i < n; ++i) {
    const int l = kq_imax(-nmax, kq_imin(nmax - 1, kq_nearest_int(iscale * x[i])));
    L[i] = (i8)(l + nmax);
    const float w = x[i] * x[i];
    const float fl = (float)l;
    sumlx += w * x[i] * fl;
    suml2 += w * fl * fl;
  }
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -((float)nmax + 0.1f * (float)is) / max;
    sumlx = suml2 = 0;
#pragma unroll
    for (int i = 0; i < n; ++i) {
      const int l = kq_imax(-nmax, kq_imin(nmax - 1, kq_nearest_int(iscale * x[i])));
      const float w = x[i] * x[i];
      const float fl = (float)l;
      sumlx += w * x[i] * fl;
      suml2 += w * fl * fl;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
#pragma unroll
      for (int i = 0; i < n; ++i) {
        L[i] = (i8)(nmax + kq_imax(-nmax, kq_imin(nmax - 1, kq_nearest_int(iscale * x[i]))));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Q6_K: 210 bytes (ql 128, qh 64, 16 int8 scales, f16 d).
template <int kSrc>
__device__ __forceinline__ void quantize_q6_k(const void* __restrict__ src, u8* __restrict__ dst, u64 nblocks,
                                              u64 base, u64* status) {
  constexpr int kSb = 16;  // super-blocks per 256-thread CTA
  __shared__ float sh_scale[kSb][16];
  __shared__ u8 sh_L[kSb][256];
  const u32 t = threadIdx.x, g = t & 15u, s = t >> 4, lane = t & 31u;
  const u32 mask = 0xFFFFu << (lane & 16u);
  for (u64 sb = (u64)blockIdx.x * kSb + s; sb < nblocks; sb += (u64)gridDim.x * kSb) {
    const u64 first = sb * 256u + g * 16u;
    float x[16];
    kq_load_group<kSrc, 16>(src, first, x, base, status);
    i8 L[16];
    const float scale = kq_make_qx(x, L);
    sh_scale[s][g] = scale;
    __syncwarp(mask);
    float max_scale = 0, max_abs_scale = 0;
    for (int j = 0; j < 16; ++j) {
      const float abs_scale = fabsf(sh_scale[s][j]);
      if (abs_scale > max_abs_scale) {
        max_abs_scale = abs_scale;
        max_scale = sh_scale[s][j];
      }
    }
    u8* out = dst + sb * 210u;
    if (max_abs_scale < 1e-15f) {  // an all-zero block (fp16(0) is 0x0000 too)
      for (u32 b = 14u * g; b < 14u * g + 14u && b < 210u; ++b) out[b] = 0;
      __syncwarp(mask);
      __syncwarp(mask);  // as many as the other path (the CPU emulation's barrier counts them)
      continue;
    }
    const float iscale = -128.f / max_scale;
    const u16 d16 = kq_fp16(1 / iscale);
    const i8 sc = (i8)kq_imin(127, kq_nearest_int(iscale * scale));  // int -> int8: modulo 256
    out[192 + g] = (u8)sc;
    const float d = f16_to_f32(d16) * (float)sc;
    if (d != 0) {
#pragma unroll
      for (int i = 0; i < 16; ++i) L[i] = (i8)(kq_imax(-32, kq_imin(31, kq_nearest_int(x[i] / d))) + 32);
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) sh_L[s][16u * g + i] = (u8)L[i];
    if (g == 0) {
      out[208] = (u8)d16;
      out[209] = (u8)(d16 >> 8);
      if (kq_inf_half(d16)) atomicAdd(&status[1], 1ull);
    }
    __syncwarp(mask);
    const u8* Ls = sh_L[s];
    // ql byte b (0..127): half h = b / 64, r = b % 64; r < 32: elements 128h + r and +64;
    // else 128h + r (= +32 + l) and +64. qh byte q (0..63): half h = q / 32, l = q % 32.
    for (u32 b = 8u * g; b < 8u * g + 8u; ++b) {
      const u32 h = b >> 6, r = b & 63u;
      const u32 e = 128u * h + r;
      out[b] = (u8)((Ls[e] & 0xFu) | ((Ls[e + 64u] & 0xFu) << 4));
    }
    for (u32 q = 4u * g; q < 4u * g + 4u; ++q) {
      const u32 h = q >> 5, l = q & 31u;
      const u32 e = 128u * h + l;
      out[128 + q] = (u8)((Ls[e] >> 4) | ((Ls[e + 32u] >> 4) << 2) | ((Ls[e + 64u] >> 4) << 4) |
                          ((Ls[e + 96u] >> 4) << 6));
    }
    __syncwarp(mask);
  }
}

// Q4_0 (18 bytes), Q5_0 (22) and Q5_1 (24): one 32-value block per thread.
template <int kSrc, int kFmt>  // 0: Q4_0, 1: Q5_0, 2: Q5_1
__device__ __forceinline__ void quantize_q32(const void* __restrict__ src, u8* __restrict__ dst, u64 nblocks,
                                             u64 base, u64* status) {
  constexpr u32 kBytes = kFmt == 0 ? 18u : kFmt == 1 ? 22u : 24u;
  for (u64 b = global_thread(); b < nblocks; b += grid_threads()) {
    float x[32];
    kq_load_group<kSrc, 32>(src, b * 32u, x, base, status);
    u8* out = dst + b * kBytes;
    u32 q[32];
    if (kFmt < 2) {
      float amax = 0, max = 0;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        if (amax < fabsf(x[j])) {
          amax = fabsf(x[j]);
          max = x[j];
        }
      }
      const float d = max / (kFmt == 0 ? -8.0f : -16.0f);
      const float id = d != 0 ? 1.0f / d : 0.0f;
      const u16 d16 = kq_fp16(d);
      out[0] = (u8)d16;
      out[1] = (u8)(d16 >> 8);
      if (kq_inf_half(d16)) atomicAdd(&status[1], 1ull);
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const int t = (int)(i8)(u8)(u32)kq_trunc_x86(x[j] * id + (kFmt == 0 ? 8.5f : 16.5f));  // C's (int8_t)
        q[j] = (u32)(u8)kq_imin(kFmt == 0 ? 15 : 31, t);
      }
    } else {
      float min = 3.40282347e+38f, max = -3.40282347e+38f;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        if (x[j] < min) min = x[j];
        if (x[j] > max) max = x[j];
      }
      const float d = (max - min) / 31.0f;
      const float id = d != 0 ? 1.0f / d : 0.0f;
      const u16 d16 = kq_fp16(d), m16 = kq_fp16(min);
      out[0] = (u8)d16;
      out[1] = (u8)(d16 >> 8);
      out[2] = (u8)m16;
      out[3] = (u8)(m16 >> 8);
      if (kq_inf_half(d16) || kq_inf_half(m16)) atomicAdd(&status[1], 1ull);
#pragma unroll
      for (int j = 0; j < 32; ++j) q[j] = (u32)kq_trunc_x86((x[j] - min) * id + 0.5f) & 0xFFu;  // C's (uint8_t)
    }
    u8* qs = out + (kFmt == 0 ? 2 : kFmt == 1 ? 6 : 8);
    u32 qh = 0;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      qs[j] = (u8)((q[j] & 0xFu) | ((q[16 + j] & 0xFu) << 4));
      qh |= ((q[j] & 0x10u) >> 4) << j;
      qh |= ((q[16 + j] & 0x10u) >> 4) << (j + 16);
    }
    if (kFmt > 0) {
      u8* h = out + (kFmt == 1 ? 2 : 4);
      h[0] = (u8)qh;
      h[1] = (u8)(qh >> 8);
      h[2] = (u8)(qh >> 16);
      h[3] = (u8)(qh >> 24);
    }
  }
}

#define HF2Q_KQ_ENCODERS(name, body)                                                                        \
  extern "C" __global__ void name##_f32(const void* src, u8* dst, u64 nblocks, u64 base, u64* status) {     \
    body(0)                                                                                                 \
  }                                                                                                         \
  extern "C" __global__ void name##_f16(const void* src, u8* dst, u64 nblocks, u64 base, u64* status) {     \
    body(1)                                                                                                 \
  }                                                                                                         \
  extern "C" __global__ void name##_bf16(const void* src, u8* dst, u64 nblocks, u64 base, u64* status) {    \
    body(2)                                                                                                 \
  }
#define HF2Q_KQ_Q4_0(S) quantize_q32<S, 0>(src, dst, nblocks, base, status);
#define HF2Q_KQ_Q5_0(S) quantize_q32<S, 1>(src, dst, nblocks, base, status);
#define HF2Q_KQ_Q5_1(S) quantize_q32<S, 2>(src, dst, nblocks, base, status);
#define HF2Q_KQ_Q4_K(S) quantize_qk_affine<S, 15>(src, dst, nblocks, base, status);
#define HF2Q_KQ_Q5_K(S) quantize_qk_affine<S, 31>(src, dst, nblocks, base, status);
#define HF2Q_KQ_Q6_K(S) quantize_q6_k<S>(src, dst, nblocks, base, status);
HF2Q_KQ_ENCODERS(hf2q_quantize_q4_0, HF2Q_KQ_Q4_0)
HF2Q_KQ_ENCODERS(hf2q_quantize_q5_0, HF2Q_KQ_Q5_0)
HF2Q_KQ_ENCODERS(hf2q_quantize_q5_1, HF2Q_KQ_Q5_1)
HF2Q_KQ_ENCODERS(hf2q_quantize_q4_k, HF2Q_KQ_Q4_K)
HF2Q_KQ_ENCODERS(hf2q_quantize_q5_k, HF2Q_KQ_Q5_K)
HF2Q_KQ_ENCODERS(hf2q_quantize_q6_k, HF2Q_KQ_Q6_K)

// Read-back of the 4/5/6-bit formats (the checksums above): the float32 bits
// the CPU's dequantizer gives (csrc/kernels/kquants.cpp), where a NaN follows
// the CPU's rules, decided on the bits: an operand NaN propagates (quieted,
// the first operand first), an invalid operation (0 * Inf, Inf - Inf) gives
// the host's default NaN. The GPU's own NaN results are canonical.
__device__ __forceinline__ bool kq_isnan_bits(u32 a) { return (a & 0x7FFFFFFFu) > 0x7F800000u; }
__device__ __forceinline__ u32 kq_mul(u32 a, u32 b, u32 dnan) {
  if (kq_isnan_bits(a)) return a | 0x00400000u;
  if (kq_isnan_bits(b)) return b | 0x00400000u;
  const u32 r = __float_as_uint(__uint_as_float(a) * __uint_as_float(b));
  return kq_isnan_bits(r) ? dnan : r;
}
__device__ __forceinline__ u32 kq_add(u32 a, u32 b, u32 dnan) {
  if (kq_isnan_bits(a)) return a | 0x00400000u;
  if (kq_isnan_bits(b)) return b | 0x00400000u;
  const u32 r = __float_as_uint(__uint_as_float(a) + __uint_as_float(b));
  return kq_isnan_bits(r) ? dnan : r;
}
__device__ __forceinline__ u32 kq_sub(u32 a, u32 b, u32 dnan) { return kq_add(a, b ^ 0x80000000u, dnan) ; }
__device__ __forceinline__ u32 kq_fbits(int v) { return __float_as_uint((float)v); }
__device__ __forceinline__ u32 kq_half_bits(const u8* p) { return f16_to_f32_bits((u32)p[0] | ((u32)p[1] << 8)); }

// Q4_K / Q5_K: group g's 6-bit scale and min (get_scale_min_k4).
__device__ __forceinline__ void kq_scale_min(u32 g, const u8* q, u32* s, u32* m) {
  if (g < 4u) {
    *s = q[g] & 63u;
    *m = q[g + 4u] & 63u;
  } else {
    *s = (q[g + 4u] & 0xFu) | ((q[g - 4u] >> 6) << 4);
    *m = (q[g + 4u] >> 4) | ((q[g] >> 6) << 4);
  }
}

struct BitsQ4_0 {
  static __device__ __forceinline__ u32 at(const u8* data, u64 k, u32 dnan) {
    const u8* blk = data + (k >> 5) * 18u;
    const u32 j = (u32)(k & 31u);
    const u32 q = j < 16u ? (blk[2 + j] & 0xFu) : (blk[2 + j - 16u] >> 4);
    return kq_mul(kq_fbits((int)q - 8), kq_half_bits(blk), dnan);
  }
};
template <bool kMin>
struct BitsQ5 {  // Q5_0: (q - 16) * d; Q5_1: q * d + m
  static __device__ __forceinline__ u32 at(const u8* data, u64 k, u32 dnan) {
    const u8* blk = data + (k >> 5) * (kMin ? 24u : 22u);
    const u8* hq = blk + (kMin ? 4 : 2);
    const u32 qh = (u32)hq[0] | ((u32)hq[1] << 8) | ((u32)hq[2] << 16) | ((u32)hq[3] << 24);
    const u32 j = (u32)(k & 31u);
    const u8* qs = hq + 4;
    const u32 q = (j < 16u ? (qs[j] & 0xFu) : (qs[j - 16u] >> 4)) | (((qh >> j) & 1u) << 4);
    if (!kMin) return kq_mul(kq_fbits((int)q - 16), kq_half_bits(blk), dnan);
    return kq_add(kq_mul(kq_fbits((int)q), kq_half_bits(blk), dnan), kq_half_bits(blk + 2), dnan);
  }
};
template <bool kQ5>
struct BitsQK {  // Q4_K / Q5_K: (d * s_g) * q - dmin * m_g
  static __device__ __forceinline__ u32 at(const u8* data, u64 k, u32 dnan) {
    const u8* blk = data + (k >> 8) * (kQ5 ? 176u : 144u);
    const u32 i = (u32)(k & 255u), c = i >> 6, j = i & 63u, l = j & 31u, hi = j >> 5, g = 2u * c + hi;
    const u8* ql = blk + (kQ5 ? 48 : 16) + 32u * c;
    u32 q = hi ? (ql[l] >> 4) : (ql[l] & 0xFu);
    if (kQ5) q += ((blk[16 + l] >> g) & 1u) ? 16u : 0u;
    u32 s, m;
    kq_scale_min(g, blk + 4, &s, &m);
    const u32 d1 = kq_mul(kq_half_bits(blk), kq_fbits((int)s), dnan);
    const u32 m1 = kq_mul(kq_half_bits(blk + 2), kq_fbits((int)m), dnan);
    return kq_sub(kq_mul(d1, kq_fbits((int)q), dnan), m1, dnan);
  }
};
struct BitsQ6_K {  // (d * sc) * (q - 32)
  static __device__ __forceinline__ u32 at(const u8* data, u64 k, u32 dnan) {
    const u8* blk = data + (k >> 8) * 210u;
    const u32 i = (u32)(k & 255u), h = i >> 7, r = i & 127u, quarter = r >> 5, l = r & 31u;
    const u8* ql = blk + 64u * h;
    const u32 qh = blk[128u + 32u * h + l];
    const u32 lo = quarter & 1u ? ql[l + 32u] : ql[l];
    const u32 q = (quarter < 2u ? (lo & 0xFu) : (lo >> 4)) | (((qh >> (2u * quarter)) & 3u) << 4);
    const int sc = (int)(i8)blk[192u + 8u * h + l / 16u + 2u * quarter];
    return kq_mul(kq_mul(kq_half_bits(blk + 208), kq_fbits(sc), dnan), kq_fbits((int)(i8)(u8)q - 32), dnan);
  }
};
HF2Q_CHECKSUMS(hf2q_checksums_q4_0, BitsQ4_0)
HF2Q_CHECKSUMS(hf2q_checksums_q5_0, BitsQ5<false>)
HF2Q_CHECKSUMS(hf2q_checksums_q5_1, BitsQ5<true>)
HF2Q_CHECKSUMS(hf2q_checksums_q4_k, BitsQK<false>)
HF2Q_CHECKSUMS(hf2q_checksums_q5_k, BitsQK<true>)
HF2Q_CHECKSUMS(hf2q_checksums_q6_k, BitsQ6_K)

// ------------------------------------------------------------- FP8 (docs/FP8.md)

// OCP E4M3FN byte -> float32 bits, exact: s eeee mmm, bias 7, no Inf,
// s 1111 111 NaN (torch's 0x7FF00000, sign kept) -- csrc/kernels/fp8.cpp's table.
__device__ __forceinline__ u32 f8_e4m3_bits(u32 b) {
  const u32 sign = (b & 0x80u) << 24;
  const u32 e = (b >> 3) & 0xFu;
  const u32 m = b & 0x7u;
  if (e == 0xFu && m == 0x7u) return sign | 0x7FF00000u;
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
  u64 wide;  // nonzero: 64-bit index arithmetic even where 32 bits would do (tests run both)
};

// The scale row (of the grid) that flat element i's row reads, and i's column.
// `narrow`: every index of the launch fits 32 bits (the caller checked), so
// the three divisions are 32-bit ones (a 64-bit division is a long
// emulated sequence; these dominated the decoders' time).
__device__ __forceinline__ const float* scale_row(const float* __restrict__ scale, const ScaledGeo& g, u64 i,
                                                  u64* col, bool narrow) {
  if (narrow) {
    const u32 i32 = (u32)i, cols = (u32)g.cols, rows = (u32)g.rows;
    const u32 row_all = i32 / cols;
    *col = i32 - row_all * cols;
    const u32 lead = row_all / rows, r = row_all - lead * rows;
    return scale + ((u64)lead * g.srows + r / (u32)g.br) * g.scols;
  }
  const u64 row_all = i / g.cols;
  *col = i - row_all * g.cols;
  const u64 lead = row_all / g.rows, r = row_all - lead * g.rows;
  return scale + (lead * g.srows + r / g.br) * g.scols;
}

// Whether stack indices below `end` and the geometry fit 32-bit arithmetic.
__device__ __forceinline__ bool scaled_narrow(const ScaledGeo& g, u64 end) {
  return g.wide == 0u && end <= 0xFFFFFFFFull && g.cols <= 0xFFFFFFFFull && g.rows <= 0xFFFFFFFFull && g.br <= 0xFFFFFFFFull &&
         g.bc <= 0xFFFFFFFFull;
}

// The scale block column of column c (scale_row's `col`).
__device__ __forceinline__ u64 scale_col(const ScaledGeo& g, u64 c, bool narrow) {
  return narrow ? (u64)((u32)c / (u32)g.bc) : c / g.bc;
}

// One FP8 byte times its block's scale, as the CPUs compute it.
template <int kFmt>  // 0: f8_e4m3, 1: f8_e5m2
__device__ __forceinline__ float scaled_product(u32 byte, float s) {
  const float x = __uint_as_float(kFmt == 0 ? f8_e4m3_bits(byte) : f8_e5m2_bits(byte));
  const float p = __fmul_rn(x, s);
  if (p == p) return p;
  // A NaN product with the CPUs' bits (fp8.cpp multiplies on x86 / ARM): the
  // first NaN operand, quieted; a NaN made by the multiply itself (0 x Inf) is
  // x86's default NaN. The GPU would give its canonical 0x7FFFFFFF.
  const u32 xb = __float_as_uint(x), sb = __float_as_uint(s);
  if ((xb & 0x7FFFFFFFu) > 0x7F800000u) return __uint_as_float(xb | 0x00400000u);
  if ((sb & 0x7FFFFFFFu) > 0x7F800000u) return __uint_as_float(sb | 0x00400000u);
  return __uint_as_float(0xFFC00000u);
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

// The scaled decoders read n weights (`w`) that are the elements first,
// first + 1, ... of a stack of matrices (the whole stack, or a staged chunk
// of it: first a multiple of 32), write them at their stack positions in
// `dst` (the stack's start) and report stack indices.
template <int kOut>  // 0: f32, 1: bf16, 2: f16
__device__ __forceinline__ void scaled_store(void* __restrict__ dst, u64 i, float y) {
  if (kOut == 0) ((float*)dst)[i] = y;
  if (kOut == 1) ((u16*)dst)[i] = f32_to_bf16_rne(y);
  if (kOut == 2) ((u16*)dst)[i] = f32_to_f16_cpu(y);
}

// Four weights per thread (one 4-byte load: `w` is 4-byte aligned), one scale
// for the four where no row or scale block boundary can fall among them, the
// four outputs in one 16- or 8-byte store where `dst` is aligned for it.
template <int kFmt, int kOut>  // kOut 0: f32, 1: bf16, 2: f16
__device__ __forceinline__ void scaled_fp8_elems(const u8* __restrict__ w, const float* __restrict__ scale,
                                                 void* __restrict__ dst, u64 n, ScaledGeo g, u64* status, u64 first) {
  const bool narrow = scaled_narrow(g, first + n);
  const bool quad_scale = g.cols % 4u == 0u && g.bc % 4u == 0u && first % 4u == 0u;
  const bool vec = quad_scale && ((unsigned long long)dst % 16u == 0u);
  const u64 quads = (n + 3u) / 4u;
  for (u64 q = global_thread(); q < quads; q += grid_threads()) {
    const u64 t0 = q * 4u, i0 = first + t0;
    if (quad_scale && t0 + 4u <= n) {
      u64 c;
      const float* srow = scale_row(scale, g, i0, &c, narrow);
      const float sc = srow[scale_col(g, c, narrow)];
      const u32 word = ((const u32*)w)[q];
      float y[4];
      for (int k = 0; k < 4; ++k) {
        y[k] = scaled_product<kFmt>((word >> (8 * k)) & 0xFFu, sc);
        if (nonfinite_bits(__float_as_uint(y[k]))) atomicMin(&status[0], i0 + (u64)k);
      }
      if (vec && kOut == 0) {
        ((float4*)dst)[i0 / 4u] = make_float4(y[0], y[1], y[2], y[3]);
      } else if (vec) {
        const u16 h[4] = {kOut == 1 ? f32_to_bf16_rne(y[0]) : f32_to_f16_cpu(y[0]),
                          kOut == 1 ? f32_to_bf16_rne(y[1]) : f32_to_f16_cpu(y[1]),
                          kOut == 1 ? f32_to_bf16_rne(y[2]) : f32_to_f16_cpu(y[2]),
                          kOut == 1 ? f32_to_bf16_rne(y[3]) : f32_to_f16_cpu(y[3])};
        ((uint2*)dst)[i0 / 4u] = make_uint2((u32)h[0] | ((u32)h[1] << 16), (u32)h[2] | ((u32)h[3] << 16));
      } else {
        for (int k = 0; k < 4; ++k) scaled_store<kOut>(dst, i0 + (u64)k, y[k]);
      }
      continue;
    }
    for (u64 t = t0; t < t0 + 4u && t < n; ++t) {  // a row or block edge among the four, or the tail
      const u64 i = first + t;
      u64 c;
      const float* srow = scale_row(scale, g, i, &c, narrow);
      const float y = scaled_product<kFmt>(w[t], srow[scale_col(g, c, narrow)]);
      if (nonfinite_bits(__float_as_uint(y))) atomicMin(&status[0], i);
      scaled_store<kOut>(dst, i, y);
    }
  }
}

// Q8_0 (cols a multiple of 32): as quantize_q8_0 above, each lane loads 16
// weights (one 16-byte load: `w` is 16-byte aligned, the backend checks a
// buffer's start; staging chunks are), so a warp reads 512 contiguous bytes
// per step and two neighbouring lanes hold a block, whose maximum is one
// exact fmaxf across them; each lane then writes its 16 quants and the
// block's first lane its scale, ggml's quantize_row_q8_0_ref steps. The
// index arithmetic runs once per lane (16 weights in one row), and where the
// scale blocks are a multiple of 16 wide one scale serves the lane. (One
// thread per block, 32 products in its registers, ran at 160 G weights/s on
// an H100 against 712 G values/s for the BF16 quantizer.)
template <int kFmt>
__device__ __forceinline__ void scaled_fp8_q8_0(const u8* __restrict__ w, const float* __restrict__ scale,
                                                u8* __restrict__ dst, u64 nblocks, ScaledGeo g, u64* status,
                                                u64 first) {
  constexpr int kE = 16, kL = 2, kBlocksPerStep = 16;
  const u32 lane = threadIdx.x & 31u;
  const u64 warp = global_thread() >> 5;
  const u64 warps = grid_threads() >> 5;
  const u64 steps = (nblocks + kBlocksPerStep - 1) / kBlocksPerStep;
  const u64 first_block = first / 32u;
  const bool narrow = scaled_narrow(g, first + nblocks * 32u);
  const bool lane_scale = g.bc % (u64)kE == 0u;
  const uint4* w16 = (const uint4*)w;
  for (u64 st = warp; st < steps; st += warps) {
    const u64 t = st * kBlocksPerStep + lane / kL;  // this lane's block in the chunk
    const bool live = t < nblocks;
    const u64 b = first_block + t;                  // ... in the stack
    const u64 i0 = b * 32u + (lane % kL) * kE;      // its first weight's stack index
    float x[kE];
    float amax = 0.0f;
    int bad = -1;
    if (live) {
      const uint4 v = w16[st * 32u + lane];
      const u32 words[4] = {v.x, v.y, v.z, v.w};  // little-endian: weight k is byte k % 4 of word k / 4
      u64 c0;
      const float* srow = scale_row(scale, g, i0, &c0, narrow);
      const float s0 = srow[scale_col(g, c0, narrow)];
      for (int k = 0; k < kE; ++k) {
        const u32 byte = (words[k >> 2] >> (8 * (k & 3))) & 0xFFu;
        x[k] = scaled_product<kFmt>(byte, lane_scale ? s0 : srow[scale_col(g, c0 + (u64)k, narrow)]);
        if (bad < 0 && nonfinite_bits(__float_as_uint(x[k]))) bad = k;
        amax = fmaxf(amax, fabsf(x[k]));
      }
      if (bad >= 0) atomicMin(&status[0], i0 + (u64)bad);  // the load fails; the block's bytes do not matter
    }
    amax = fmaxf(amax, __shfl_xor_sync(HF2Q_FULL_MASK, amax, 1));
    // A block with a non-finite product is left unwritten and uncounted (the
    // load fails), as the CPU decoder leaves it: either lane may have found it.
    const int block_bad = (bad >= 0) | __shfl_xor_sync(HF2Q_FULL_MASK, (int)(bad >= 0), 1);
    if (!live || block_bad) continue;
    const float d = amax / 127.0f;                 // one float32 division
    const float id = d != 0.0f ? 1.0f / d : 0.0f;  // reciprocal of the rounded d
    const bool zero_qs = (__float_as_uint(id) & 0x7FFFFFFFu) == 0x7F800000u;
    // 16-bit stores as quantize_q8_0 above (34 * b and the destination's
    // offset are even). Byte stores here left the scale's low byte 0 in every
    // block on the H200 (NVRTC 13): the quants were right, the scale's high byte too.
    u8* out = dst + b * 34u;
    if (lane % kL == 0) {
      const u16 d16 = f32_to_f16_rn(d);
      *(u16*)out = d16;
      if (d16 == 0x7C00u) atomicAdd(&status[1], 1ull);
    }
    u16* qs = (u16*)(out + 2 + (lane % kL) * kE);
    for (int k = 0; k < kE; k += 2) {
      const int q0 = zero_qs ? 0 : (int)round_half_away(x[k] * id);
      const int q1 = zero_qs ? 0 : (int)round_half_away(x[k + 1] * id);
      qs[k / 2] = (u16)((u32)(u8)(i8)q0 | ((u32)(u8)(i8)q1 << 8));
    }
  }
}

#define HF2Q_SCALED_FP8(fmt_name, kFmt)                                                                         \
  extern "C" __global__ void hf2q_scaled_##fmt_name##_f32(const u8* w, const float* s, void* dst, u64 n,        \
                                                          ScaledGeo g, u64* status, u64 first) {                \
    scaled_fp8_elems<kFmt, 0>(w, s, dst, n, g, status, first);                                                  \
  }                                                                                                             \
  extern "C" __global__ void hf2q_scaled_##fmt_name##_bf16(const u8* w, const float* s, void* dst, u64 n,       \
                                                           ScaledGeo g, u64* status, u64 first) {               \
    scaled_fp8_elems<kFmt, 1>(w, s, dst, n, g, status, first);                                                  \
  }                                                                                                             \
  extern "C" __global__ void hf2q_scaled_##fmt_name##_f16(const u8* w, const float* s, void* dst, u64 n,        \
                                                          ScaledGeo g, u64* status, u64 first) {                \
    scaled_fp8_elems<kFmt, 2>(w, s, dst, n, g, status, first);                                                  \
  }                                                                                                             \
  extern "C" __global__ void hf2q_scaled_##fmt_name##_q8_0(const u8* w, const float* s, void* dst, u64 nblocks, \
                                                           ScaledGeo g, u64* status, u64 first) {               \
    scaled_fp8_q8_0<kFmt>(w, s, (u8*)dst, nblocks, g, status, first);                                           \
  }
HF2Q_SCALED_FP8(f8_e4m3, 0)
HF2Q_SCALED_FP8(f8_e5m2, 1)

// The same decoders over a stack's pieces gathered from a shard's copy on
// the GPU (scaled_fp8_gather): one launch per stack, grid row y decoding
// piece y of `table` (its weights at byte w_off of `src`, 16-byte aligned;
// `first` its stack index; `items` its weights, or its Q8_0 blocks).
struct GatherItem {
  u64 w_off, first, items;
};

template <int kFmt, int kOut>  // kOut 0: f32, 1: bf16, 2: f16 (scaled_fp8_elems), 3: q8_0
__device__ __forceinline__ void scaled_gather_row(const u8* src, const GatherItem* table, const float* s, void* dst,
                                                  ScaledGeo g, u64* status) {
  const GatherItem it = table[blockIdx.y];
  if constexpr (kOut == 3) {
    scaled_fp8_q8_0<kFmt>(src + it.w_off, s, (u8*)dst, it.items, g, status, it.first);
  } else {
    scaled_fp8_elems<kFmt, kOut>(src + it.w_off, s, dst, it.items, g, status, it.first);
  }
}

#define HF2Q_SCALED_GATHER_TO(fmt_name, kFmt, out_name, kOut)                                                   \
  extern "C" __global__ void hf2q_gather_##fmt_name##_##out_name(const u8* src, const GatherItem* table,        \
                                                                 const float* s, void* dst, ScaledGeo g,        \
                                                                 u64* status) {                                 \
    scaled_gather_row<kFmt, kOut>(src, table, s, dst, g, status);                                               \
  }
#define HF2Q_SCALED_GATHER(fmt_name, kFmt)       \
  HF2Q_SCALED_GATHER_TO(fmt_name, kFmt, f32, 0)  \
  HF2Q_SCALED_GATHER_TO(fmt_name, kFmt, bf16, 1) \
  HF2Q_SCALED_GATHER_TO(fmt_name, kFmt, f16, 2)  \
  HF2Q_SCALED_GATHER_TO(fmt_name, kFmt, q8_0, 3)
HF2Q_SCALED_GATHER(f8_e4m3, 0)
HF2Q_SCALED_GATHER(f8_e5m2, 1)

// ------------------------------------------------------------- gathered scale grids
// Scale tensors that lie anywhere in a device copy of a shard (at any byte
// alignment: read a byte at a time) widened to float32 into their grids
// (the widenings above, exact): `table` holds n entries of (source byte
// offset, values, destination address); one warp per entry. kind 0: f32,
// 1: bf16, 2: f16.
extern "C" __global__ void hf2q_widen_gather(const u8* src, const u64* table, u64 n, u32 kind) {
  const u32 lane = threadIdx.x & 31u;
  const u64 warps = grid_threads() >> 5;
  for (u64 e = global_thread() >> 5; e < n; e += warps) {
    const u8* p = src + table[3 * e];
    const u64 count = table[3 * e + 1];
    float* dst = (float*)table[3 * e + 2];
    for (u64 j = lane; j < count; j += 32u) {
      if (kind == 0u) {
        const u8* q = p + 4u * j;
        dst[j] = __uint_as_float((u32)q[0] | ((u32)q[1] << 8) | ((u32)q[2] << 16) | ((u32)q[3] << 24));
      } else {
        const u8* q = p + 2u * j;
        const u16 h = (u16)((u32)q[0] | ((u32)q[1] << 8));
        dst[j] = kind == 1u ? bf16_to_f32(h) : f16_to_f32(h);
      }
    }
  }
}

// ------------------------------------------------------------- unit transpose
// csrc/kernels/unit_grid.h: in each of `outer` periods, the [a, b] grid of
// units that starts at `start` rewritten as its transpose [b, a] (the unit
// at position j * a + i receives unit i * b + j). `src` is a copy of the
// buffer taken before the kernel; sizes are in words of W.
struct UnitGeo {
  u64 outer, period, start, a, b, unit;
};

template <typename W>
__device__ __forceinline__ void transpose_units(const W* __restrict__ src, W* __restrict__ dst, UnitGeo g) {
  const u64 per = g.a * g.b * g.unit, n = g.outer * per;
  for (u64 t = global_thread(); t < n; t += grid_threads()) {
    const u64 o = t / per, r = t - o * per;
    const u64 p = r / g.unit, w = r - p * g.unit;
    const u64 j = p / g.a, i = p - j * g.a;
    const u64 base = o * g.period + g.start;
    dst[base + p * g.unit + w] = src[base + (i * g.b + j) * g.unit + w];
  }
}

extern "C" __global__ void hf2q_transpose_units_u32(const u32* src, u32* dst, UnitGeo g) { transpose_units<u32>(src, dst, g); }
extern "C" __global__ void hf2q_transpose_units_u8(const u8* src, u8* dst, UnitGeo g) { transpose_units<u8>(src, dst, g); }
