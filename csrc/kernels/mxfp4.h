// MXFP4 (mxfp4.cpp): the repack of gpt-oss / compressed-tensors MXFP4 into
// ggml's 17-byte blocks. docs/FP8.md, "MXFP4".
#pragma once

#include <cstddef>
#include <cstdint>

namespace hf2q::kernels {

// `nblocks` blocks: `packed` 16 bytes each (element 2i in the low nibble of
// byte i, 2i + 1 in the high one), `scales` one E8M0 byte each, into
// nblocks * 17 bytes of ggml block_mxfp4 at `dst`. Thread-parallel; sizes
// are the caller's to check.
void mxfp4_repack(const std::uint8_t* packed, const std::uint8_t* scales, std::uint8_t* dst, std::size_t nblocks);

}  // namespace hf2q::kernels
