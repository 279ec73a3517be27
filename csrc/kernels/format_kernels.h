// What the code does with each device format: the second half of its row in
// the format table (formats.h points every device row at one of these).
//
// The shared code never names a format: a write into an f32 buffer runs the
// source's to_f32, a write into any other format that converts runs that
// format's encode, read-back runs the buffer's to_f32 (to_u32 for integers),
// and the GPU backends look their kernels up by the names given here. A new
// format is its row, the object below (defined next to its kernels) and its
// kernels; docs/ARCHITECTURE.md lists the files.
#pragma once

#include <cstddef>
#include <cstdint>

#include "formats.h"

namespace hf2q::kernels {

// Returned by the encoders when every element was finite.
constexpr std::size_t kNoIndex = static_cast<std::size_t>(-1);

struct EncodeResult {
  // Smallest flat element index of a NaN/Inf input, or kNoIndex.
  std::size_t first_nonfinite = kNoIndex;
  // Blocks whose scale overflowed to +Inf (Q8_0: amax >= 8,321,040).
  std::size_t inf_scales = 0;
};

struct FormatKernels {
  // `n` elements (a multiple of the block) from the start of `src` to
  // float32, on the calling thread. Null: the format holds no real numbers
  // (integers), so nothing decodes it.
  void (*to_f32)(const std::uint8_t* src, float* dst, std::size_t n);
  // Read-back value of each element where it is not its float32 bits
  // (integers: the element's own bits or value, csrc/device/verify.h). Null:
  // the float32 bits of to_f32.
  void (*to_u32)(const std::uint8_t* src, std::uint32_t* dst, std::size_t n);
  // `nblocks` blocks of `src_type` elements (a dtype of the row's `sources`)
  // into this format, on the calling thread; first_nonfinite relative to
  // `src`. Null: no source is encoded into it (f32 is written by the
  // source's to_f32). On a non-finite element the block holding it and the
  // rest of the range may be left unwritten.
  EncodeResult (*encode)(DType src_type, const void* src, std::uint8_t* dst, std::size_t nblocks);

  // GPU kernels, by name (null: the backend has none, and refuses the
  // format with DeviceError where it would need one).
  // shaders/verify.metal: read-back checksums of a buffer of this format.
  const char* metal_verify;
  // shaders/cuda_kernels.cu: read-back checksums; decode to f32 (args: src,
  // dst, n); encode from each source, named cuda_encode + "_" + the source's
  // name (args: src, dst, nblocks, base, status), launched with
  // cuda_encode_blocks_per_cta blocks per thread block.
  const char* cuda_verify;
  const char* cuda_to_f32;
  const char* cuda_encode;
  unsigned cuda_encode_blocks_per_cta;
};

}  // namespace hf2q::kernels
