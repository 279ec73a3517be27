#include "unit_grid.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "checked_ops.h"
#include "thread_pool.h"

namespace hf2q::kernels {

std::size_t UnitGrid::extent() const {
  std::size_t units = 0, grid = 0, end = 0, last = 0, total = 0;
  if (!ops::checked_mul(a, b, &units) || !ops::checked_mul(units, unit, &grid) ||
      !ops::checked_add(start, grid, &end)) {
    throw std::invalid_argument("unit transpose: the grid's size overflows");
  }
  if (outer == 0 || grid == 0) return 0;
  if (outer > 1 && end > period) {
    throw std::invalid_argument("unit transpose: a grid of " + std::to_string(grid) + " bytes at byte " +
                                std::to_string(start) + " does not fit its period of " + std::to_string(period));
  }
  if (!ops::checked_mul(outer - 1, period, &last) || !ops::checked_add(last, end, &total)) {
    throw std::invalid_argument("unit transpose: the extent overflows");
  }
  return total;
}

namespace {

// Source unit of destination position p: p = j * a + i receives i * b + j.
inline std::size_t source_of(std::size_t p, std::size_t a, std::size_t b) { return (p % a) * b + p / a; }

// Grids up to this size are transposed through a scratch copy (in cache).
constexpr std::size_t kScratchGrid = 1u << 20;

void by_scratch(std::uint8_t* grid, const UnitGrid& g, std::uint8_t* scratch) {
  const std::size_t n = g.a * g.b;
  std::memcpy(scratch, grid, n * g.unit);
  for (std::size_t p = 0; p < n; ++p) std::memcpy(grid + p * g.unit, scratch + source_of(p, g.a, g.b) * g.unit, g.unit);
}

void by_cycles(std::uint8_t* grid, const UnitGrid& g) {
  const std::size_t n = g.a * g.b;
  std::vector<bool> done(n, false);
  std::vector<std::uint8_t> first(g.unit);
  for (std::size_t start = 0; start < n; ++start) {
    if (done[start]) continue;
    done[start] = true;
    if (source_of(start, g.a, g.b) == start) continue;
    std::memcpy(first.data(), grid + start * g.unit, g.unit);
    std::size_t p = start;
    for (std::size_t s = source_of(p, g.a, g.b); s != start; s = source_of(p, g.a, g.b)) {
      std::memcpy(grid + p * g.unit, grid + s * g.unit, g.unit);
      p = s;
      done[p] = true;
    }
    std::memcpy(grid + p * g.unit, first.data(), g.unit);
  }
}

}  // namespace

void transpose_units(std::uint8_t* base, const UnitGrid& g) {
  if (g.extent() == 0 || g.a < 2 || g.b < 2) return;  // a 1-wide grid is its own transpose
  const std::size_t bytes = g.a * g.b * g.unit;
  if (bytes > kScratchGrid) {
    for (std::size_t o = 0; o < g.outer; ++o) by_cycles(base + o * g.period + g.start, g);
    return;
  }
  const std::size_t grain = std::max<std::size_t>(1, (256u << 10) / bytes);
  parallel_for(g.outer, grain, [&](std::size_t o0, std::size_t o1) {
    std::vector<std::uint8_t> scratch(bytes);
    for (std::size_t o = o0; o < o1; ++o) by_scratch(base + o * g.period + g.start, g, scratch.data());
  });
}

}  // namespace hf2q::kernels
