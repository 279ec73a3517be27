// A transposed grid of units inside a buffer (unit_grid.cpp): the in-place
// reorder the loader applies after a tensor's bytes are written, for
// reorders that move whole blocks of storage (Qwen3.5's V-head reorders,
// docs/QWEN35MOE.md, step 7; docs/CUDA.md, "Uploads").
//
// The storage is `outer` periods of `period` bytes. In each period, the
// a * b units of `unit` bytes that start at byte `start` are an [a, b] grid
// (unit i * b + j) and are rewritten as its transpose [b, a]: the unit at
// position j * a + i receives source unit i * b + j. Bytes outside the grids
// are untouched.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hf2q::kernels {

struct UnitGrid {
  std::size_t outer = 0, period = 0, start = 0, a = 0, b = 0, unit = 0;

  // Bytes from the first period's start to the end of the last grid; throws
  // std::invalid_argument on overflow or a grid that does not fit its period.
  std::size_t extent() const;
};

// The transposition in CPU memory at `base` (extent() bytes). Small grids go
// through a scratch copy per period (periods in parallel), large ones follow
// the permutation's cycles with one unit of scratch (no second copy of a
// large tensor).
void transpose_units(std::uint8_t* base, const UnitGrid& g);

}  // namespace hf2q::kernels
