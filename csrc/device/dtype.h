// Buffer element types and overflow-checked byte lengths.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hf2q::device {

// q8_0 is u8 storage holding ggml Q8_0 blocks of a tensor whose logical
// (unquantized) shape the buffer keeps: byte_len = numel / 32 * 34.
enum class DType : int { F32 = 0, F16 = 1, BF16 = 2, U8 = 3, I32 = 4, Q8_0 = 5 };

const char* dtype_name(DType t);
// Throws std::invalid_argument for an unknown name.
DType dtype_from_name(const std::string& name);
// Size of one element of the logical tensor; 0 for q8_0 (block format).
std::size_t dtype_elem_size(DType t);

// Element count of `shape`: every dimension >= 0, product without overflow
// (std::invalid_argument / std::overflow_error otherwise).
std::size_t shape_numel(const std::vector<std::int64_t>& shape);
// Bytes a tensor of `shape` and `dtype` occupies; for q8_0 the last dimension
// must be a multiple of 32.
std::size_t tensor_byte_len(DType dtype, const std::vector<std::int64_t>& shape);
// Byte offset of flat element `elem` inside a buffer of `dtype` (q8_0: elem % 32 == 0).
std::size_t element_byte_offset(DType dtype, std::size_t elem);

}  // namespace hf2q::device
