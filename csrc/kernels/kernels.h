// Portable conversion kernels shared by every device backend.
//
// All entry points here are thread-parallel (see thread_pool.h), pick the best
// SIMD path available at run time, never allocate, and never touch memory
// outside [src, src + n) and [dst, dst + n). Callers (bindings, device
// backends) have already validated sizes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "format_kernels.h"
#include "formats.h"

namespace hf2q::kernels {

// Q8_0 block geometry comes from the format table (formats.h).
using hf2q::kQ8BlockBytes;
using hf2q::kQ8BlockElems;

enum class Isa { Scalar = 0, Avx2 = 1, Neon = 2 };

// The instruction set the kernels currently dispatch to.
Isa active_isa();
// The best instruction set this CPU offers (ignores set_simd_enabled).
Isa best_isa();
const char* isa_name(Isa isa);
// Testing hook: false forces the scalar path (process-wide).
void set_simd_enabled(bool enabled);
bool simd_enabled();

// The Q8_0 quantizer's result (first non-finite index, +Inf scales).
using Q8Result = EncodeResult;

void bf16_to_f32(const std::uint16_t* src, float* dst, std::size_t n);
void f16_to_f32(const std::uint16_t* src, float* dst, std::size_t n);

// Quantize `nblocks` blocks of 32 elements of `type` (a source of the q8_0
// row: f32, f16, bf16) at `src` into nblocks * 34 bytes at `dst`; another
// type throws std::invalid_argument. On a non-finite element the block
// holding it and everything after it in that worker's range may be left
// unwritten.
Q8Result quantize_q8_0(DType type, const void* src, std::uint8_t* dst, std::size_t nblocks);

void dequantize_q8_0(const std::uint8_t* src, float* dst, std::size_t nblocks);

// Scalar conversions, exposed for tests and for per-element use elsewhere.
std::uint16_t f32_to_f16_rne(float f);
float f16_bits_to_f32(std::uint16_t h);

// Single-threaded range versions (no dispatch to the pool). Used by the device
// backends that already run inside a worker, and by the arm64 test driver.
void bf16_to_f32_range(const std::uint16_t* src, float* dst, std::size_t n);
void f16_to_f32_range(const std::uint16_t* src, float* dst, std::size_t n);
Q8Result quantize_q8_0_range(DType type, const void* src, std::uint8_t* dst,
                             std::size_t nblocks);
void dequantize_q8_0_range(const std::uint8_t* src, float* dst, std::size_t nblocks);

// Any device format, through its row's kernels (format_kernels.h), thread-
// parallel: `n` elements of `type` to float32; `nblocks` blocks of
// `src_type` elements encoded into `dst_type`. std::invalid_argument for a
// format without that kernel or a source the row does not list.
void to_f32(DType type, const std::uint8_t* src, float* dst, std::size_t n);
EncodeResult encode(DType dst_type, DType src_type, const void* src, std::uint8_t* dst, std::size_t nblocks);
// The row's kernels, checked (std::invalid_argument naming what is missing).
using ToF32Fn = void (*)(const std::uint8_t*, float*, std::size_t);
using EncodeFn = EncodeResult (*)(DType, const void*, std::uint8_t*, std::size_t);
ToF32Fn to_f32_kernel(DType type);
EncodeFn encode_kernel(DType dst_type, DType src_type);

}  // namespace hf2q::kernels
