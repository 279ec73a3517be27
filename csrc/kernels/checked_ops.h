// Size- and alignment-checked entry points over raw byte ranges: the layer
// the Python bindings (and later the device uploads) call. Every size is
// validated with overflow-safe arithmetic before any memory is touched;
// violations throw std::invalid_argument (ValueError in Python).
#pragma once

#include <cstddef>
#include <cstdint>

#include "fp8.h"
#include "kernels.h"

namespace hf2q::ops {

void bf16_to_f32(const void* src, std::size_t src_bytes, void* dst, std::size_t dst_bytes);
void f16_to_f32(const void* src, std::size_t src_bytes, void* dst, std::size_t dst_bytes);
kernels::Q8Result quantize_q8_0(DType type, const void* src, std::size_t src_bytes,
                                void* dst, std::size_t dst_bytes);
void dequantize_q8_0(const void* src, std::size_t src_bytes, void* dst, std::size_t dst_bytes);

// Any device format through its row's kernels (the device write path): the
// `src_bytes` of `src_type` data decoded to float32 into `dst_bytes`, or
// encoded into `dst_type`; sizes are checked to match exactly, `src`
// aligned to its element, the ranges disjoint.
void to_f32(DType src_type, const void* src, std::size_t src_bytes, void* dst, std::size_t dst_bytes);
kernels::EncodeResult encode(DType dst_type, DType src_type, const void* src, std::size_t src_bytes, void* dst,
                             std::size_t dst_bytes);

// A scaled FP8 tensor (kernels/fp8.h) decoded into `out_type` (f32, bf16,
// f16, q8_0): the weight's, the scale grid's and the output's byte lengths
// are checked to match the geometry exactly.
kernels::EncodeResult scaled_fp8(const kernels::ScaledFp8& s, const void* w, std::size_t w_bytes, const void* scale,
                                 std::size_t scale_bytes, DType out_type, void* dst, std::size_t dst_bytes);

// Overflow-checked helpers shared with the device layer.
bool checked_mul(std::size_t a, std::size_t b, std::size_t* out);
bool checked_add(std::size_t a, std::size_t b, std::size_t* out);
// Q8_0 byte length of `numel` elements; throws unless numel % 32 == 0.
std::size_t q8_0_bytes(std::size_t numel);

}  // namespace hf2q::ops
