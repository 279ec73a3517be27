// Portable conversion kernels shared by every device backend.
//
// All entry points here are thread-parallel (see thread_pool.h), pick the best
// SIMD path available at run time, never allocate, and never touch memory
// outside [src, src + n) and [dst, dst + n). Callers (bindings, device
// backends) have already validated sizes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "formats.h"

namespace hf2q::kernels {

// Q8_0 block geometry comes from the format table (formats.h).
using hf2q::kQ8BlockBytes;
using hf2q::kQ8BlockElems;
// Returned by the quantizers when every element was finite.
constexpr std::size_t kNoIndex = static_cast<std::size_t>(-1);

enum class Isa { Scalar = 0, Avx2 = 1, Neon = 2 };

// The instruction set the kernels currently dispatch to.
Isa active_isa();
// The best instruction set this CPU offers (ignores set_simd_enabled).
Isa best_isa();
const char* isa_name(Isa isa);
// Testing hook: false forces the scalar path (process-wide).
void set_simd_enabled(bool enabled);
bool simd_enabled();

struct Q8Result {
  // Smallest flat element index of a NaN/Inf input, or kNoIndex.
  std::size_t first_nonfinite = kNoIndex;
  // Blocks whose f16 scale overflowed to +Inf (amax >= 8,321,040).
  std::size_t inf_scales = 0;
};

// Source element types of the quantizers and decoders.
enum class SrcType { F32 = 0, F16 = 1, BF16 = 2 };

void bf16_to_f32(const std::uint16_t* src, float* dst, std::size_t n);
void f16_to_f32(const std::uint16_t* src, float* dst, std::size_t n);

// Quantize `nblocks` blocks of 32 elements of type `type` at `src` into
// nblocks * 34 bytes at `dst`. On a non-finite element the block holding it
// and everything after it in that worker's range may be left unwritten.
Q8Result quantize_q8_0(SrcType type, const void* src, std::uint8_t* dst, std::size_t nblocks);

void dequantize_q8_0(const std::uint8_t* src, float* dst, std::size_t nblocks);

// Scalar conversions, exposed for tests and for per-element use elsewhere.
std::uint16_t f32_to_f16_rne(float f);
float f16_bits_to_f32(std::uint16_t h);

// Single-threaded range versions (no dispatch to the pool). Used by the device
// backends that already run inside a worker, and by the arm64 test driver.
void bf16_to_f32_range(const std::uint16_t* src, float* dst, std::size_t n);
void f16_to_f32_range(const std::uint16_t* src, float* dst, std::size_t n);
Q8Result quantize_q8_0_range(SrcType type, const void* src, std::uint8_t* dst,
                             std::size_t nblocks);
void dequantize_q8_0_range(const std::uint8_t* src, float* dst, std::size_t nblocks);

}  // namespace hf2q::kernels
