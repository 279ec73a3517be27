// The kernels rows (format_kernels.h) of the device formats that existed
// before the table carried them: f32, f16, bf16, u8, i32 and q8_0. A new
// format defines its row in its own kernel source file instead.
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels.h"

namespace hf2q::kernels {
namespace {

void f32_to_f32(const std::uint8_t* src, float* dst, std::size_t n) { std::memcpy(dst, src, n * sizeof(float)); }

void f16_range(const std::uint8_t* src, float* dst, std::size_t n) {
  f16_to_f32_range(reinterpret_cast<const std::uint16_t*>(src), dst, n);
}

void bf16_range(const std::uint8_t* src, float* dst, std::size_t n) {
  bf16_to_f32_range(reinterpret_cast<const std::uint16_t*>(src), dst, n);
}

// i32: the stored 32 bits; u8: the byte's value (verify.h).
void b32_bits(const std::uint8_t* src, std::uint32_t* dst, std::size_t n) { std::memcpy(dst, src, n * 4); }

void u8_value(const std::uint8_t* src, std::uint32_t* dst, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = src[i];
}

void q8_0_to_f32(const std::uint8_t* src, float* dst, std::size_t n) {
  dequantize_q8_0_range(src, dst, n / kQ8BlockElems);
}

const FormatRow& device_row(DType t) {
  const int i = static_cast<int>(t);
  if (i < 0 || i >= kNumDTypes) throw std::invalid_argument("unknown dtype id " + std::to_string(i));
  if (kFormats[i].kernels == nullptr) throw std::logic_error(std::string(kFormats[i].name) + " has no kernels row");
  return kFormats[i];
}

}  // namespace

//                               to_f32       to_u32    encode               metal                 cuda verify             cuda to_f32              cuda encode         per CTA
const FormatKernels kF32Kernels{f32_to_f32, nullptr, nullptr, "hf2q_verify_b32", "hf2q_checksums_b32", nullptr, nullptr, 0};
const FormatKernels kF16Kernels{f16_range, nullptr, nullptr, "hf2q_verify_f16", "hf2q_checksums_f16", "hf2q_f16_to_f32",
                                nullptr, 0};
const FormatKernels kBF16Kernels{bf16_range, nullptr, nullptr, "hf2q_verify_bf16", "hf2q_checksums_bf16",
                                 "hf2q_bf16_to_f32", nullptr, 0};
const FormatKernels kU8Kernels{nullptr, u8_value, nullptr, "hf2q_verify_u8", "hf2q_checksums_u8", nullptr, nullptr, 0};
const FormatKernels kI32Kernels{nullptr, b32_bits, nullptr, "hf2q_verify_b32", "hf2q_checksums_b32", nullptr, nullptr, 0};
// CUDA: 32 Q8_0 blocks per thread block of 256 threads (8 warps, each 4
// (f32) or 8 (16-bit) blocks per step: shaders/cuda_kernels.cu).
const FormatKernels kQ8_0Kernels{q8_0_to_f32, nullptr, quantize_q8_0_range, "hf2q_verify_q8_0", "hf2q_checksums_q8_0",
                                 "hf2q_dequantize_q8_0", "hf2q_quantize_q8_0", 32};

ToF32Fn to_f32_kernel(DType type) {
  const FormatRow& r = device_row(type);
  if (r.kernels->to_f32 == nullptr) {
    throw std::invalid_argument(std::string(r.name) + " holds no real numbers: it has no decode to f32");
  }
  return r.kernels->to_f32;
}

EncodeFn encode_kernel(DType dst_type, DType src_type) {
  const FormatRow& d = device_row(dst_type);
  const FormatRow& s = device_row(src_type);
  if (d.kernels->encode == nullptr || (d.sources & dtype_bit(src_type)) == 0) {
    throw std::invalid_argument(std::string("no kernel encodes ") + s.name + " into " + d.name);
  }
  return d.kernels->encode;
}

}  // namespace hf2q::kernels
