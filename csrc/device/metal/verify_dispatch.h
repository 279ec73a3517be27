// How the Metal backend dispatches the read-back kernels of
// shaders/verify.metal: which kernel reads which dtype (the format table's), the per-dispatch
// arguments and how a buffer is cut into dispatches. Plain C++ (no Metal,
// no Objective-C), shared by csrc/device/metal/metal_backend.mm and the CPU
// run of the shaders in tests/native/metal_verify_cpu.cpp, which compiles
// shaders/verify.metal itself as C++ and checks it against verify.cpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "device/backend.h"  // kVerifyGroup
#include "device/dtype.h"
#include "kernels/format_kernels.h"

namespace hf2q::device::metal_verify {

constexpr std::size_t kChunkGroups = 1u << 20;  // groups per dispatch: 32-bit indices in the shader
constexpr std::size_t kThreadsPerThreadgroup = 64;
constexpr int kNumDTypes = hf2q::kNumDTypes;  // the device rows of the format table (kernels/formats.h)

// Per-dispatch arguments, bound with setBytes at index 2; the same layout is
// declared in shaders/verify.metal.
struct VerifyParams {
  std::uint32_t numel;        // elements covered by this dispatch
  std::uint32_t ngroups;      // groups in this dispatch
  std::uint32_t default_nan;  // bits of 0 * Inf on this CPU
  std::uint32_t pad;
};
static_assert(sizeof(VerifyParams) == 16, "VerifyParams must match shaders/verify.metal");

// Kernel of shaders/verify.metal reading each dtype (its format row's
// metal_verify); nullptr for none.
inline const char* kernel_name(DType t) {
  const int k = static_cast<int>(t);
  return k >= 0 && k < kNumDTypes && hf2q::kFormats[k].kernels != nullptr ? hf2q::kFormats[k].kernels->metal_verify
                                                                          : nullptr;
}

// One dispatch: the source buffer is bound at src_offset bytes, the output at
// group first_group, and `threadgroups` groups of `threads_per_group` threads
// run (threads past params.ngroups return at once).
struct Dispatch {
  std::size_t src_offset;
  std::size_t first_group;
  VerifyParams params;
  std::size_t threadgroups;
  std::size_t threads_per_group;
};

// Calls f(const Dispatch&) for each dispatch covering `ngroups` groups of a
// buffer of `numel` elements; `tg` threads per threadgroup (>= 1), `chunk`
// groups per dispatch at most.
template <class F>
void for_each_dispatch(DType dtype, std::size_t numel, std::size_t ngroups, std::uint32_t default_nan,
                       std::size_t tg, F&& f, std::size_t chunk = kChunkGroups) {
  for (std::size_t g0 = 0; g0 < ngroups; g0 += chunk) {
    const std::size_t gn = std::min(chunk, ngroups - g0);
    const std::size_t e0 = g0 * kVerifyGroup;  // first element; a multiple of 256 (and of 32)
    Dispatch d{};
    d.src_offset = element_byte_offset(dtype, e0);
    d.first_group = g0;
    d.params.numel = static_cast<std::uint32_t>(std::min(numel - e0, gn * kVerifyGroup));
    d.params.ngroups = static_cast<std::uint32_t>(gn);
    d.params.default_nan = default_nan;
    d.threadgroups = (gn + tg - 1) / tg;
    d.threads_per_group = tg;
    f(static_cast<const Dispatch&>(d));
  }
}

}  // namespace hf2q::device::metal_verify
