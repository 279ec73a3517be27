#include "verify.h"

#include <cstring>

#include "backend.h"
#include "kernels/kernels.h"
#include "kernels/thread_pool.h"

namespace hf2q::device {
namespace {

// Decoded float32 bits of elements [begin, begin + n) (n <= kVerifyGroup).
void decode_group(DType dtype, const std::uint8_t* data, std::size_t begin, std::size_t n,
                  std::uint32_t* bits) {
  float tmp[kVerifyGroup];
  switch (dtype) {
    case DType::F32:
      std::memcpy(bits, data + begin * 4, n * 4);
      return;
    case DType::I32:
      std::memcpy(bits, data + begin * 4, n * 4);
      return;
    case DType::BF16:
      kernels::bf16_to_f32_range(reinterpret_cast<const std::uint16_t*>(data) + begin, tmp, n);
      break;
    case DType::F16:
      kernels::f16_to_f32_range(reinterpret_cast<const std::uint16_t*>(data) + begin, tmp, n);
      break;
    case DType::U8:
      for (std::size_t i = 0; i < n; ++i) bits[i] = data[begin + i];
      return;
    case DType::Q8_0:
      // begin and n are multiples of 32 (kVerifyGroup is; numel is).
      kernels::dequantize_q8_0_range(data + element_byte_offset(DType::Q8_0, begin), tmp, n / kQ8BlockElems);
      break;
  }
  std::memcpy(bits, tmp, n * 4);
}

}  // namespace

void cpu_checksums(DType dtype, const void* data, std::size_t numel, std::uint32_t* out,
                   std::size_t ngroups) {
  const auto* bytes = static_cast<const std::uint8_t*>(data);
  parallel_for(ngroups, 1024, [&](std::size_t g0, std::size_t g1) {
    std::uint32_t bits[kVerifyGroup];
    for (std::size_t g = g0; g < g1; ++g) {
      const std::size_t begin = g * kVerifyGroup;
      const std::size_t n = begin < numel ? std::min(kVerifyGroup, numel - begin) : 0;
      decode_group(dtype, bytes, begin, n, bits);
      std::uint32_t sum = 0;
      for (std::size_t i = 0; i < n; ++i) sum += bits[i] * static_cast<std::uint32_t>(2 * i + 1);
      out[g] = sum;
    }
  });
}

}  // namespace hf2q::device
