// A fast scan of a safetensors header that holds nothing unusual
// (docs/SAFETENSORS.md, "Reading the header fast"): one pass over the JSON
// bytes, no allocation per number. It accepts only a plain subset of JSON:
// a top-level object whose members are "__metadata__" (null, or an object of
// at most 1,024 strings) and tensor entries with exactly the fields dtype (a
// string), shape (an array of integers) and data_offsets (two integers);
// strings without escapes or control bytes; integers written as JSON writes
// them (no sign, no leading zero, no fraction or exponent) up to 2^64 - 1; no
// repeated key, except a repeated tensor name, which it keeps: check_layout
// refuses one, and a caller that does not run it must look (no hash set of
// every name that a crafted file's colliding names could make quadratic).
// Anything else, valid JSON or not, makes it return false, and the caller's
// careful parser decides with its exact errors.
// The layout rules (offsets, sizes, dtypes) are the caller's; check_layout
// below is a fast accept-path for them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace hf2q::device {

struct ScannedHeader {
  struct Tensor {
    std::string_view name, dtype;
    std::size_t dims_begin = 0, ndims = 0;  // into `dims`
    std::uint64_t begin = 0, end = 0;
  };
  std::vector<Tensor> tensors;  // in the order the header lists them
  std::vector<std::uint64_t> dims;
  std::vector<std::pair<std::string_view, std::string_view>> metadata;  // views into the scanned bytes
};

bool scan_header(const char* text, std::size_t len, ScannedHeader* out);

// Rules 7-11 of docs/SAFETENSORS.md over a scanned header whose tensors'
// data section is `data_bytes` long: every dtype is one of `dtype_bits`
// (name, bits per element), the offsets run contiguously from 0 to
// data_bytes in (begin, end, name) order, and each tensor's span is its
// element count times its bits, in whole bytes, with no product overflowing
// 64 bits, and no name is given twice. True: all hold, and `h->tensors` is
// then sorted by name (byte order, which for UTF-8 is code point order).
// False: some rule fails (or a dtype is unknown, or a name is repeated), the
// tensors left in the header's order; the caller's careful check finds and
// words it.
bool check_layout(ScannedHeader* h, std::uint64_t data_bytes,
                  const std::vector<std::pair<std::string_view, unsigned>>& dtype_bits);

// A model.safetensors.index.json of the same plain subset (docs/SAFETENSORS.md,
// "The index"): a top-level object of exactly "weight_map" (an object of
// tensor name -> shard file name, both strings) and optionally "metadata"
// (null, or an object of at most 1,024 members whose values are strings or
// u64 integers), strings and
// integers as scan_header takes them, no repeated key (the weight_map's
// tensor names excepted: the caller checks those as it maps them). Anything else
// (another top-level member, a float, an escape, ...) makes it return false
// and the caller's careful parser decides with its exact errors.
struct ScannedIndex {
  struct Meta {
    std::string_view key, text;  // text: the string's bytes, unless is_int
    bool is_int = false;
    std::uint64_t value = 0;
  };
  std::vector<std::pair<std::string_view, std::string_view>> weight_map;  // in file order
  std::vector<Meta> metadata;  // in file order (empty for null or absent)
};

bool scan_index(const char* text, std::size_t len, ScannedIndex* out);

}  // namespace hf2q::device
