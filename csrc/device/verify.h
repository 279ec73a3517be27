// Verification checksums, computed identically by the CPU (here) and by the
// GPU read-back kernels (shaders/verify.metal):
//   for group g of kVerifyGroup consecutive elements,
//   sum_i bits(float32(x[g*256 + i])) * (2*i + 1)   (mod 2^32)
// Integer arithmetic makes it exact and independent of summation order, and
// the odd position weights make it sensitive to elements moving inside a group.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dtype.h"

namespace hf2q::device {

void cpu_checksums(DType dtype, const void* data, std::size_t numel, std::uint32_t* out,
                   std::size_t ngroups);

}  // namespace hf2q::device
