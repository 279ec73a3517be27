// Buffer element types and overflow-checked byte lengths.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/formats.h"

namespace hf2q::device {

// Buffer dtypes are the device rows of the format table (kernels/formats.h).
// A q8_0 buffer is u8 storage holding ggml Q8_0 blocks of a tensor whose
// logical (unquantized) shape the buffer keeps.
using hf2q::DType;

const char* dtype_name(DType t);
// Throws std::invalid_argument for an unknown name (or a file-only format).
DType dtype_from_name(const std::string& name);
// Size of one element of the logical tensor; 0 for block formats (q8_0).
std::size_t dtype_elem_size(DType t);
// Block geometry of `t` (plain dtypes: blocks of one element).
std::size_t dtype_block_elems(DType t);
std::size_t dtype_block_bytes(DType t);
// Bytes of storage for `n` logical elements (n % block_elems == 0; checked).
std::size_t dtype_storage_bytes(DType t, std::size_t n);
// Last dimension of the numpy storage view of a row of `last` elements: unchanged
// for plain dtypes, bytes for block formats (gguf-py's Q8_0 layout).
std::int64_t storage_last_dim(DType t, std::int64_t last);

// How numpy and DLPack see one stored element of `t`: its kind and width.
// Block formats and elements no array library types (float8) are unsigned
// bytes / integers of the element's width; Python re-views them with the
// format's numpy dtype.
enum class ElemKind { Float, BFloat, Int, UInt };
struct StorageElem {
  ElemKind kind;
  int bits;
};
StorageElem storage_elem(DType t);

// Whether a write can turn `src` data into a `dst` buffer natively: the same
// dtype (raw copy), or `src` among the `sources` of dst's row in the format
// table (f32: decoded by the source's to_f32; others: dst's encode).
bool can_convert(DType src, DType dst);
// The supported conversions, for error messages
// ("same dtype, f16/bf16 -> f32, f32/f16/bf16 -> q8_0").
std::string conversions_text();

// Element count of `shape`: every dimension >= 0, product without overflow
// (std::invalid_argument / std::overflow_error otherwise).
std::size_t shape_numel(const std::vector<std::int64_t>& shape);
// Bytes a tensor of `shape` and `dtype` occupies; for q8_0 the last dimension
// must be a multiple of its block size (32).
std::size_t tensor_byte_len(DType dtype, const std::vector<std::int64_t>& shape);
// Byte offset of flat element `elem` inside a buffer of `dtype` (block formats: elem on a block boundary).
std::size_t element_byte_offset(DType dtype, std::size_t elem);

}  // namespace hf2q::device
