// hf2q read-back checksums on the GPU. Definition: csrc/device/verify.h; the
// CPU reference is csrc/device/verify.cpp, and both must agree bit for bit.
//
// For group g of 256 consecutive elements of a buffer, with bits(i) the
// float32 bits of element g*256 + i once decoded (u8: the byte value):
//   out[g] = sum over i of bits(i) * (2*i + 1)   (mod 2^32)
// The last group sums only the elements that exist.
//
// One thread per group, a sequential loop, integer arithmetic. Decoding is
// done on the bits, so the result does not depend on the compiler's math mode
// or on how the GPU treats NaN payloads.
//
// The host dispatches at most 2^20 groups at a time, binding the buffers at
// the byte offset of the first group, so every index here fits in 32 bits.
//
// This file is embedded into a C++ raw string literal at build time
// (csrc/device/metal/shader_source.h.in, through CMake configure_file with
// at-sign substitution): it must contain no at-sign, no dollar sign, and
// never the raw-string terminator (a closing parenthesis followed by HF2QMSL).

#include <metal_stdlib>
using namespace metal;

constant uint kGroup = 256;  // kVerifyGroup in csrc/device/backend.h

// Bound with setBytes at index 2; the same layout is declared in
// csrc/device/metal/verify_dispatch.h (four 32-bit fields, 16 bytes).
struct VerifyParams {
  uint numel;        // elements covered by this dispatch
  uint ngroups;      // groups in this dispatch (threads past it do nothing)
  uint default_nan;  // bits of 0 * Inf on the host CPU (q8_0 with an infinite scale)
  uint pad;
};

// Elements of group g present in this dispatch: 256, fewer in the tail group.
inline uint group_len(uint g, uint numel) {
  const uint begin = g * kGroup;
  if (begin >= numel) return 0u;
  const uint left = numel - begin;
  return left < kGroup ? left : kGroup;
}

// IEEE binary16 bits -> binary32 bits, exact. NaN: payload kept, quiet bit
// set (as f16_to_f32_inline in csrc/kernels/kernels_internal.h).
inline uint f16_to_f32_bits(uint h) {
  const uint sign = (h & 0x8000u) << 16;
  const uint e = (h >> 10) & 0x1Fu;
  const uint m = h & 0x3FFu;
  if (e == 31u) {
    return sign | 0x7F800000u | (m << 13) | (m != 0u ? 0x00400000u : 0u);
  }
  if (e != 0u) {
    return sign | ((e + 112u) << 23) | (m << 13);
  }
  if (m == 0u) {
    return sign;
  }
  // Subnormal half: m * 2^-24, a normal float32. Its leading bit is bit `top`
  // of m (0..9); the value is 2^(top - 24) * (m / 2^top).
  const uint top = 31u - clz(m);
  return sign | ((top + 103u) << 23) | ((m << (23u - top)) & 0x007FFFFFu);
}

// Bits of float(q) * d, q an int8 quant, d the float32 bits of a half scale,
// as the CPU's IEEE multiply produces them.
inline uint q8_value_bits(int q, uint d, uint default_nan) {
  const uint qsign = q < 0 ? 0x80000000u : 0u;
  if ((d & 0x7F800000u) == 0x7F800000u) {
    if ((d & 0x007FFFFFu) != 0u) {
      return d;  // NaN scale: propagated (already quiet)
    }
    return q == 0 ? default_nan : (d ^ qsign);  // 0 * Inf, or +-Inf
  }
  if (q == 0 || (d & 0x7FFFFFFFu) == 0u) {
    return (d ^ qsign) & 0x80000000u;  // signed zero
  }
  // Both nonzero and finite: at most 8 x 11 significant bits, a normal result,
  // so the product is exact whatever the rounding.
  return as_type<uint>(float(q) * as_type<float>(d));
}

// f32 and i32: the stored 32 bits are the checksum bits.
kernel void hf2q_verify_b32(device const uint* x [[buffer(0)]],
                            device uint* out [[buffer(1)]],
                            constant VerifyParams& p [[buffer(2)]],
                            uint g [[thread_position_in_grid]]) {
  if (g >= p.ngroups) return;
  const uint n = group_len(g, p.numel);
  device const uint* v = x + g * kGroup;
  uint sum = 0u;
  for (uint i = 0u; i < n; ++i) {
    sum += v[i] * (2u * i + 1u);
  }
  out[g] = sum;
}

kernel void hf2q_verify_f16(device const ushort* x [[buffer(0)]],
                            device uint* out [[buffer(1)]],
                            constant VerifyParams& p [[buffer(2)]],
                            uint g [[thread_position_in_grid]]) {
  if (g >= p.ngroups) return;
  const uint n = group_len(g, p.numel);
  device const ushort* v = x + g * kGroup;
  uint sum = 0u;
  for (uint i = 0u; i < n; ++i) {
    sum += f16_to_f32_bits(uint(v[i])) * (2u * i + 1u);
  }
  out[g] = sum;
}

kernel void hf2q_verify_bf16(device const ushort* x [[buffer(0)]],
                             device uint* out [[buffer(1)]],
                             constant VerifyParams& p [[buffer(2)]],
                             uint g [[thread_position_in_grid]]) {
  if (g >= p.ngroups) return;
  const uint n = group_len(g, p.numel);
  device const ushort* v = x + g * kGroup;
  uint sum = 0u;
  for (uint i = 0u; i < n; ++i) {
    sum += (uint(v[i]) << 16) * (2u * i + 1u);
  }
  out[g] = sum;
}

// u8: the byte value itself (not float bits), as verify.cpp does.
kernel void hf2q_verify_u8(device const uchar* x [[buffer(0)]],
                           device uint* out [[buffer(1)]],
                           constant VerifyParams& p [[buffer(2)]],
                           uint g [[thread_position_in_grid]]) {
  if (g >= p.ngroups) return;
  const uint n = group_len(g, p.numel);
  device const uchar* v = x + g * kGroup;
  uint sum = 0u;
  for (uint i = 0u; i < n; ++i) {
    sum += uint(v[i]) * (2u * i + 1u);
  }
  out[g] = sum;
}

// q8_0: blocks of 34 bytes, a little-endian half scale d and 32 int8 quants;
// element value float(q) * float(d). A group is 8 blocks (272 bytes).
kernel void hf2q_verify_q8_0(device const uchar* x [[buffer(0)]],
                             device uint* out [[buffer(1)]],
                             constant VerifyParams& p [[buffer(2)]],
                             uint g [[thread_position_in_grid]]) {
  if (g >= p.ngroups) return;
  const uint nblocks = group_len(g, p.numel) / 32u;
  device const uchar* blk = x + g * (kGroup / 32u * 34u);
  uint sum = 0u;
  for (uint b = 0u; b < nblocks; ++b, blk += 34u) {
    const uint d = f16_to_f32_bits(uint(blk[0]) | (uint(blk[1]) << 8));
    for (uint j = 0u; j < 32u; ++j) {
      const int q = int(uint(blk[2u + j]) ^ 0x80u) - 128;  // sign-extend the byte
      const uint i = b * 32u + j;
      sum += q8_value_bits(q, d, p.default_nan) * (2u * i + 1u);
    }
  }
  out[g] = sum;
}
