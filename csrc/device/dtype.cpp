#include "dtype.h"

#include <stdexcept>

#include "kernels/checked_ops.h"

namespace hf2q::device {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::U8: return "u8";
    case DType::I32: return "i32";
    case DType::Q8_0: return "q8_0";
  }
  return "?";
}

DType dtype_from_name(const std::string& name) {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::U8, DType::I32, DType::Q8_0}) {
    if (name == dtype_name(t)) return t;
  }
  throw std::invalid_argument("unknown dtype '" + name + "' (expected f32, f16, bf16, u8, i32 or q8_0)");
}

std::size_t dtype_elem_size(DType t) {
  switch (t) {
    case DType::F32:
    case DType::I32: return 4;
    case DType::F16:
    case DType::BF16: return 2;
    case DType::U8: return 1;
    case DType::Q8_0: return 0;
  }
  return 0;
}

std::size_t shape_numel(const std::vector<std::int64_t>& shape) {
  std::size_t n = 1;
  for (std::int64_t d : shape) {
    if (d < 0) throw std::invalid_argument("negative dimension " + std::to_string(d) + " in shape");
    if (!ops::checked_mul(n, static_cast<std::size_t>(d), &n)) {
      throw std::overflow_error("shape's element count overflows 64 bits");
    }
  }
  return n;
}

std::size_t tensor_byte_len(DType dtype, const std::vector<std::int64_t>& shape) {
  const std::size_t numel = shape_numel(shape);
  if (dtype == DType::Q8_0) {
    if (shape.empty() || shape.back() % 32 != 0) {
      throw std::invalid_argument("q8_0 needs a last dimension that is a multiple of 32");
    }
    return ops::q8_0_bytes(numel);
  }
  std::size_t bytes = 0;
  if (!ops::checked_mul(numel, dtype_elem_size(dtype), &bytes)) {
    throw std::overflow_error("tensor byte length overflows 64 bits");
  }
  return bytes;
}

std::size_t element_byte_offset(DType dtype, std::size_t elem) {
  if (dtype == DType::Q8_0) {
    if (elem % 32 != 0) throw std::invalid_argument("q8_0 element offset must be a multiple of 32");
    return elem / 32 * 34;
  }
  std::size_t off = 0;
  if (!ops::checked_mul(elem, dtype_elem_size(dtype), &off)) throw std::overflow_error("offset overflows");
  return off;
}

}  // namespace hf2q::device
