#include "dtype.h"

#include <stdexcept>

#include "kernels/checked_ops.h"

namespace hf2q::device {

namespace {

const FormatRow& row(DType t) {
  const int i = static_cast<int>(t);
  if (i < 0 || i >= kNumDTypes) throw std::invalid_argument("unknown dtype id " + std::to_string(i));
  return kFormats[i];
}

std::string device_names() {
  std::string s;
  for (int i = 0; i < kNumDTypes; ++i) {
    if (i) s += (i + 1 == kNumDTypes) ? " or " : ", ";
    s += kFormats[i].name;
  }
  return s;
}

}  // namespace

const char* dtype_name(DType t) {
  const int i = static_cast<int>(t);
  return (i >= 0 && i < kNumDTypes) ? kFormats[i].name : "?";
}

DType dtype_from_name(const std::string& name) {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (name == kFormats[i].name) return static_cast<DType>(i);
  }
  throw std::invalid_argument("unknown dtype '" + name + "' (expected " + device_names() + ")");
}

std::size_t dtype_elem_size(DType t) {
  const FormatRow& r = row(t);
  return r.block_elems == 1 ? r.block_bytes : 0;
}

std::size_t dtype_block_elems(DType t) { return row(t).block_elems; }
std::size_t dtype_block_bytes(DType t) { return row(t).block_bytes; }

std::size_t dtype_storage_bytes(DType t, std::size_t n) {
  const FormatRow& r = row(t);
  if (n % r.block_elems != 0) {
    throw std::invalid_argument(std::string(r.name) + " needs a multiple of " + std::to_string(r.block_elems) +
                                " elements, got " + std::to_string(n));
  }
  std::size_t bytes = 0;
  if (!ops::checked_mul(n / r.block_elems, r.block_bytes, &bytes)) {
    throw std::overflow_error("tensor byte length overflows 64 bits");
  }
  return bytes;
}

std::int64_t storage_last_dim(DType t, std::int64_t last) {
  const FormatRow& r = row(t);
  if (r.block_elems == 1) return last;  // a numpy element is a whole element
  return last / static_cast<std::int64_t>(r.block_elems) * static_cast<std::int64_t>(r.block_bytes);
}

StorageElem storage_elem(DType t) {
  const FormatRow& r = row(t);
  if (r.block_elems != 1) return {ElemKind::UInt, 8};
  const std::string np = r.numpy;
  const int bits = static_cast<int>(r.block_bytes * 8);
  if (np == "float16" || np == "float32" || np == "float64") return {ElemKind::Float, bits};
  if (np == "bfloat16") return {ElemKind::BFloat, bits};
  if (np.rfind("int", 0) == 0) return {ElemKind::Int, bits};
  return {ElemKind::UInt, bits};
}

bool can_convert(DType src, DType dst) {
  row(src);
  return src == dst || (row(dst).sources & dtype_bit(src)) != 0;
}

std::string conversions_text() {
  std::string s = "same dtype";
  for (int i = 0; i < kNumDTypes; ++i) {
    const FormatRow& d = kFormats[i];
    if (d.sources == 0) continue;
    s += ", ";
    bool first = true;
    for (int j = 0; j < kNumDTypes; ++j) {
      if ((d.sources & dtype_bit(static_cast<DType>(j))) == 0) continue;
      if (!first) s += "/";
      s += kFormats[j].name;
      first = false;
    }
    s += std::string(" -> ") + d.name;
  }
  return s;
}

std::size_t shape_numel(const std::vector<std::int64_t>& shape) {
  bool empty = false;  // a 0 anywhere: 0 elements, whatever the other dimensions multiply to
  for (std::int64_t d : shape) {
    if (d < 0) throw std::invalid_argument("negative dimension " + std::to_string(d) + " in shape");
    empty = empty || d == 0;
  }
  if (empty) return 0;
  std::size_t n = 1;
  for (std::int64_t d : shape) {
    if (!ops::checked_mul(n, static_cast<std::size_t>(d), &n)) {
      throw std::overflow_error("shape's element count overflows 64 bits");
    }
  }
  return n;
}

std::size_t tensor_byte_len(DType dtype, const std::vector<std::int64_t>& shape) {
  const std::size_t numel = shape_numel(shape);
  const FormatRow& r = row(dtype);
  if (r.block_elems > 1 && (shape.empty() || shape.back() % static_cast<std::int64_t>(r.block_elems) != 0)) {
    throw std::invalid_argument(std::string(r.name) + " needs a last dimension that is a multiple of " +
                                std::to_string(r.block_elems));
  }
  return dtype_storage_bytes(dtype, numel);
}

std::size_t element_byte_offset(DType dtype, std::size_t elem) {
  const FormatRow& r = row(dtype);
  if (elem % r.block_elems != 0) {
    throw std::invalid_argument(std::string(r.name) + " element offset must be a multiple of " +
                                std::to_string(r.block_elems));
  }
  std::size_t off = 0;
  if (!ops::checked_mul(elem / r.block_elems, r.block_bytes, &off)) throw std::overflow_error("offset overflows");
  return off;
}

}  // namespace hf2q::device
