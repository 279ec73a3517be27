// The vector row kernels of the scaled FP8 decoder (fp8.cpp calls them after
// checking the CPU). One row of `cols` FP8 bytes; `chunk_scale[k]` is the
// scale (decoded to float32) of the 16 elements [16k, 16k + 16): the caller
// uses these kernels only when no 16-element chunk straddles two scale
// blocks. Every product is decode(w) * scale, one float32 multiply, written
// in the same pass as f32 / bf16 / f16 / Q8_0; the bytes equal the scalar
// path's (tests/test_fp8.py). Returns the column of the first NaN/Inf
// product, or kNoIndex (Q8_0: the row is then unfinished).
#pragma once

#include <cstddef>
#include <cstdint>

#include "formats.h"

namespace hf2q::kernels::fp8_avx2 {

// `table`: the format's 256 float32 values (the scalar decode, used for
// chunks holding a NaN/Inf byte or under a scale of 2^111 or more).
std::size_t scaled_row(const std::uint8_t* w, const float* chunk_scale, std::size_t cols, bool e5m2,
                       const float* table, DType out, std::uint8_t* dst, std::size_t* inf_scales);

}  // namespace hf2q::kernels::fp8_avx2
