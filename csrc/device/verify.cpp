#include "verify.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "backend.h"
#include "kernels/kernels.h"
#include "kernels/thread_pool.h"

namespace hf2q::device {
namespace {

// Read-back values of elements [begin, begin + n) (n <= kVerifyGroup; begin
// and n whole blocks: kVerifyGroup is a multiple of every block and numel of
// the buffer's): the row's to_u32 where it has one (integers), otherwise the
// float32 bits of its to_f32.
void decode_group(const kernels::FormatKernels& k, DType dtype, const std::uint8_t* data, std::size_t begin,
                  std::size_t n, std::uint32_t* bits) {
  const std::uint8_t* at = data + element_byte_offset(dtype, begin);
  if (k.to_u32 != nullptr) {
    k.to_u32(at, bits, n);
    return;
  }
  float tmp[kVerifyGroup];
  k.to_f32(at, tmp, n);
  std::memcpy(bits, tmp, n * 4);
}

}  // namespace

void cpu_checksums(DType dtype, const void* data, std::size_t numel, std::uint32_t* out,
                   std::size_t ngroups) {
  const auto* bytes = static_cast<const std::uint8_t*>(data);
  const int t = static_cast<int>(dtype);
  const kernels::FormatKernels* k = t >= 0 && t < kNumDTypes ? kFormats[t].kernels : nullptr;
  if (k == nullptr || (k->to_u32 == nullptr && k->to_f32 == nullptr) || kVerifyGroup % dtype_block_elems(dtype) != 0) {
    throw std::invalid_argument("no read-back decode for dtype " + std::to_string(t));
  }
  parallel_for(ngroups, 1024, [&](std::size_t g0, std::size_t g1) {
    std::uint32_t bits[kVerifyGroup];
    for (std::size_t g = g0; g < g1; ++g) {
      const std::size_t begin = g * kVerifyGroup;
      const std::size_t n = begin < numel ? std::min(kVerifyGroup, numel - begin) : 0;
      decode_group(*k, dtype, bytes, begin, n, bits);
      std::uint32_t sum = 0;
      for (std::size_t i = 0; i < n; ++i) sum += bits[i] * static_cast<std::uint32_t>(2 * i + 1);
      out[g] = sum;
    }
  });
}

}  // namespace hf2q::device
