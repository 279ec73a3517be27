// ggml's 4/5/6-bit block formats: Q4_0 (32 values in 18 bytes), the
// k-quants Q4_K, Q5_K, Q6_K (256 values in 144, 176 and 210 bytes) and
// Q5_0 / Q5_1 (32 values in 22 / 24 bytes: llama-quantize's fallbacks).
//
// The row functions are byte-identical to ggml's reference quantizers
// without an importance matrix (quantize_row_<t>_ref in ggml-quants.c, what
// llama-quantize runs when no imatrix is given) and to its dequantizers, for
// every finite float32 input. They evaluate ggml's float arithmetic in the
// same order, one operation at a time: this translation unit is compiled
// with -ffp-contract=off and never with fast-math. docs/KQUANTS.md states
// the algorithms and the edge cases; tests/data/kquants holds ggml's bytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels.h"

namespace hf2q::kernels {

// The formats implemented here: DType::Q4_0 .. DType::Q5_1 (consecutive).
using BlockFormat = DType;

// One row of `n` float32 values (a multiple of the block) on the calling
// thread. Finite input only: callers check (quantize_blocks_range does).
void quantize_row_q4_0(const float* x, std::uint8_t* y, std::int64_t n);
void quantize_row_q4_K(const float* x, std::uint8_t* y, std::int64_t n);
void quantize_row_q5_K(const float* x, std::uint8_t* y, std::int64_t n);
void quantize_row_q6_K(const float* x, std::uint8_t* y, std::int64_t n);
void quantize_row_q5_0(const float* x, std::uint8_t* y, std::int64_t n);
void quantize_row_q5_1(const float* x, std::uint8_t* y, std::int64_t n);

void dequantize_row_q4_0(const std::uint8_t* x, float* y, std::int64_t n);
void dequantize_row_q4_K(const std::uint8_t* x, float* y, std::int64_t n);
void dequantize_row_q5_K(const std::uint8_t* x, float* y, std::int64_t n);
void dequantize_row_q6_K(const std::uint8_t* x, float* y, std::int64_t n);
void dequantize_row_q5_0(const std::uint8_t* x, float* y, std::int64_t n);
void dequantize_row_q5_1(const std::uint8_t* x, float* y, std::int64_t n);

// `nblocks` blocks of `type` elements at `src` into `f` blocks at `dst`, on
// the calling thread. Each block is widened to float32 and checked before it
// is quantized; on a NaN/Inf the result's first_nonfinite is that element's
// index relative to `src` and the rest of the range is left unwritten.
// `type` must be f32, f16 or bf16 (the rows' sources; else invalid_argument).
EncodeResult quantize_blocks_range(BlockFormat f, DType type, const void* src, std::uint8_t* dst,
                               std::size_t nblocks);
void dequantize_blocks_range(BlockFormat f, const std::uint8_t* src, float* dst, std::size_t nblocks);

// Thread-parallel use goes through the rows: kernels::encode / to_f32
// (kernels.h) split whole blocks over the pool.

}  // namespace hf2q::kernels
