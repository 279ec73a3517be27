// ggml's MXFP4 as a device format (docs/FP8.md, "MXFP4"): blocks of 32 E2M1
// values sharing one E8M0 exponent, 17 bytes (the exponent byte, then 16
// bytes: byte j holds element j in its low nibble and element j + 16 in its
// high nibble). Decoded as ggml's dequantize_row_mxfp4: the code indexes the
// doubled E2M1 values, times half the exponent's power of two, one exact
// float32 product. Also the repack of gpt-oss / compressed-tensors MXFP4
// (element 2i in the low nibble of byte i, 2i + 1 in its high nibble; the
// exponents in a separate tensor) into ggml's blocks, a move of bits.
#include <cstring>
#include <stdexcept>

#include "kernels_internal.h"
#include "mxfp4.h"
#include "thread_pool.h"

namespace hf2q::kernels {
namespace {

constexpr std::int8_t kValues[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// 2^(e - 128) as ggml's ggml_e8m0_to_fp32_half: e = 0, 1 are the float32
// subnormals 2^-128, 2^-127; 255 is 2^127 (not NaN).
inline float e8m0_half(std::uint8_t e) {
  const std::uint32_t bits = e < 2 ? (0x00200000u << e) : (static_cast<std::uint32_t>(e - 1) << 23);
  return bits_f32(bits);
}

void mxfp4_to_f32(const std::uint8_t* src, float* dst, std::size_t n) {
  const std::size_t nblocks = n / 32;
  for (std::size_t b = 0; b < nblocks; ++b) {
    const std::uint8_t* blk = src + b * 17;
    const float d = e8m0_half(blk[0]);
    float* y = dst + b * 32;
    for (std::size_t j = 0; j < 16; ++j) {
      y[j] = static_cast<float>(kValues[blk[1 + j] & 0x0F]) * d;
      y[j + 16] = static_cast<float>(kValues[blk[1 + j] >> 4]) * d;
    }
  }
}

}  // namespace

//                                to_f32        to_u32   encode   metal    cuda verify            cuda to_f32  enc  per CTA
const FormatKernels kMXFP4Kernels{mxfp4_to_f32, nullptr, nullptr, nullptr, "hf2q_checksums_mxfp4", nullptr, nullptr, 0};

void mxfp4_repack(const std::uint8_t* packed, const std::uint8_t* scales, std::uint8_t* dst, std::size_t nblocks) {
  parallel_for(nblocks, 1u << 14, [&](std::size_t b0, std::size_t b1) {
    for (std::size_t b = b0; b < b1; ++b) {
      const std::uint8_t* p = packed + b * 16;
      std::uint8_t* o = dst + b * 17;
      o[0] = scales[b];
      for (std::size_t j = 0; j < 16; ++j) {
        // element j: byte j / 2, nibble j % 2; element j + 16: byte 8 + j / 2.
        const unsigned lo = (p[j >> 1] >> ((j & 1) * 4)) & 0x0F;
        const unsigned hi = (p[8 + (j >> 1)] >> ((j & 1) * 4)) & 0x0F;
        o[1 + j] = static_cast<std::uint8_t>(lo | (hi << 4));
      }
    }
  });
}

}  // namespace hf2q::kernels
