// The scaled FP8 decoder (fp8.cpp): an FP8 weight of `lead` x `rows` x
// `cols` elements times a grid of scales, one per `block_rows` x
// `block_cols` block of each [rows, cols] matrix (partial blocks at the
// right and bottom edges), into f32 / bf16 / f16 / Q8_0. A per-channel scale
// is the grid of blocks (1, cols), a per-tensor scale the grid of one block
// (rows, cols). docs/FP8.md.
#pragma once

#include <cstddef>
#include <cstdint>

#include "format_kernels.h"
#include "formats.h"

namespace hf2q::kernels {

struct ScaledFp8 {
  DType weight = DType::F8_E4M3;  // f8_e4m3 or f8_e5m2
  DType scale = DType::F32;       // f32, bf16 or f16
  std::size_t lead = 1, rows = 0, cols = 0;
  std::size_t block_rows = 1, block_cols = 1;
  std::size_t scale_rows = 0, scale_cols = 0;  // ceil(rows / block_rows), ceil(cols / block_cols)

  // std::invalid_argument for a format, block or grid the decoder cannot take
  // or a size that overflows.
  void check() const;
  std::size_t numel() const;
};

// Rows [row_begin, row_end) of the lead * rows rows, on the calling thread
// (`tmp`: cols floats, unused for f32): `w` holds those rows' weights (row
// row_begin first: a chunk read on its own), `scale` and `dst` the whole
// tensor's grid and output. first_nonfinite: the smallest flat index of a
// NaN/Inf product (Q8_0: the rows from there on are unwritten).
EncodeResult scaled_fp8_rows(const ScaledFp8& s, const std::uint8_t* w, const std::uint8_t* scale, DType out,
                             std::uint8_t* dst, std::size_t row_begin, std::size_t row_end, float* tmp);

// The whole tensor, thread-parallel by rows; `dst` holds the tensor in `out`
// (Q8_0: cols a multiple of 32). Sizes of `w`, `scale` and `dst` are the
// caller's to check (checked_ops: ops::scaled_fp8).
EncodeResult scaled_fp8_decode(const ScaledFp8& s, const std::uint8_t* w, const std::uint8_t* scale, DType out,
                               std::uint8_t* dst);

}  // namespace hf2q::kernels
