// The format table: the one place that says what each storage format is.
//
// A format stores `block_elems` logical elements in `block_bytes` bytes
// (plain dtypes are blocks of one element; ggml Q8_0 is 32 elements in 34
// bytes; safetensors' sub-byte codes F4 / F6 are 2-in-1 and 4-in-3). A
// tensor's byte length is numel / block_elems * block_bytes, and a block
// format needs its last dimension to be a multiple of block_elems (blocks
// never span rows). `id` is the native DType of formats a device buffer can
// hold, -1 for formats that only appear in checkpoint files. Python reads the
// table through hf2q._core.format_table() (hf2q/formats.py); nothing else
// states these numbers. Facts: docs/Q8_0.md, docs/SAFETENSORS.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace hf2q {

// Native ids of the formats a device buffer can hold: the one enum of
// element types (stable: Python and the kernels' callers use them). The
// kernels take these too (a quantizer's source type is a DType).
enum class DType : int {
  F32 = 0, F16 = 1, BF16 = 2, U8 = 3, I32 = 4, Q8_0 = 5, Q4_0 = 6, Q4_K = 7, Q5_K = 8, Q6_K = 9,
  Q5_0 = 10, Q5_1 = 11, F8_E4M3 = 12, F8_E5M2 = 13, MXFP4 = 14
};
inline constexpr int kNumDTypes = 15;

// Bit of `t` in a set of dtypes (FormatRow::sources).
constexpr std::uint32_t dtype_bit(DType t) { return 1u << static_cast<int>(t); }

namespace kernels {
// What the code does with a device format (kernels/format_kernels.h): its
// CPU kernels and the names of its GPU kernels. Each is defined next to the
// format's kernels; the existing formats' in kernels/format_kernels.cpp.
struct FormatKernels;
extern const FormatKernels kF32Kernels, kF16Kernels, kBF16Kernels, kU8Kernels, kI32Kernels, kQ8_0Kernels;
// kquants.cpp
extern const FormatKernels kQ4_0Kernels, kQ4_KKernels, kQ5_KKernels, kQ6_KKernels, kQ5_0Kernels, kQ5_1Kernels;
// fp8.cpp
extern const FormatKernels kF8E4M3Kernels, kF8E5M2Kernels;
// mxfp4.cpp
extern const FormatKernels kMXFP4Kernels;
}  // namespace kernels

struct FormatRow {
  const char* name;         // hf2q's name ("bf16", "q8_0")
  int id;                   // DType value, or -1 (file-only)
  std::size_t block_elems;  // logical elements per block
  std::size_t block_bytes;  // bytes per block
  const char* numpy;        // numpy / ml_dtypes storage dtype name of one element ("" for block formats)
  const char* safetensors;  // safetensors dtype code, "" if the format is not a file dtype
  int gguf_type;            // ggml type id, -1 if GGUF has none
  // Device formats only (file-only rows leave them 0 / null):
  // An element whose stored bits b have (b & nonfinite_mask) == nonfinite_mask
  // is NaN or Inf (IEEE: the exponent field); 0: no element is (integers,
  // block formats, whose quantizers check their input instead).
  std::uint32_t nonfinite_mask = 0;
  // The dtypes (dtype_bit) a device write converts into this format besides
  // itself: into f32 by the source's to_f32, into any other format by this
  // format's encode (format_kernels.h). can_convert reads nothing else.
  std::uint32_t sources = 0;
  const kernels::FormatKernels* kernels = nullptr;
};

inline constexpr std::uint32_t kHalfSources = dtype_bit(DType::F16) | dtype_bit(DType::BF16);
// FP8 elements decode exactly to f32 (other conversions stage through it). (A
// scaled FP8 tensor is not one of these conversions: its weight and scale
// meet in the scaled decoder, kernels/fp8.h.)
inline constexpr std::uint32_t kF8Sources = dtype_bit(DType::F8_E4M3) | dtype_bit(DType::F8_E5M2);

// Device formats first, in DType order (kFormats[id] is the row of id).
inline constexpr FormatRow kFormats[] = {
    {"f32", 0, 1, 4, "float32", "F32", 0, 0x7F800000u, kHalfSources | kF8Sources, &kernels::kF32Kernels},
    {"f16", 1, 1, 2, "float16", "F16", 1, 0x7C00u, 0, &kernels::kF16Kernels},
    {"bf16", 2, 1, 2, "bfloat16", "BF16", 30, 0x7F80u, 0, &kernels::kBF16Kernels},
    {"u8", 3, 1, 1, "uint8", "U8", -1, 0, 0, &kernels::kU8Kernels},
    {"i32", 4, 1, 4, "int32", "I32", 26, 0, 0, &kernels::kI32Kernels},
    {"q8_0", 5, 32, 34, "", "", 8, 0, dtype_bit(DType::F32) | kHalfSources, &kernels::kQ8_0Kernels},
    // ggml's 4/5/6-bit block formats (docs/KQUANTS.md).
    {"q4_0", 6, 32, 18, "", "", 2, 0, dtype_bit(DType::F32) | kHalfSources, &kernels::kQ4_0Kernels},
    {"q4_k", 7, 256, 144, "", "", 12, 0, dtype_bit(DType::F32) | kHalfSources, &kernels::kQ4_KKernels},
    {"q5_k", 8, 256, 176, "", "", 13, 0, dtype_bit(DType::F32) | kHalfSources, &kernels::kQ5_KKernels},
    {"q6_k", 9, 256, 210, "", "", 14, 0, dtype_bit(DType::F32) | kHalfSources, &kernels::kQ6_KKernels},
    // llama-quantize's fallbacks for Q4_K / Q5_K rows of whole 32-blocks only.
    {"q5_0", 10, 32, 22, "", "", 6, 0, dtype_bit(DType::F32) | kHalfSources, &kernels::kQ5_0Kernels},
    {"q5_1", 11, 32, 24, "", "", 7, 0, dtype_bit(DType::F32) | kHalfSources, &kernels::kQ5_1Kernels},
    // FP8 elements (OCP E4M3FN: NaN is s.1111.111, no Inf; E5M2: IEEE-like,
    // exponent 11111 is Inf/NaN). GGUF has no FP8 type. docs/FP8.md.
    {"f8_e4m3", 12, 1, 1, "float8_e4m3fn", "F8_E4M3", -1, 0x7Fu, 0, &kernels::kF8E4M3Kernels},
    {"f8_e5m2", 13, 1, 1, "float8_e5m2", "F8_E5M2", -1, 0x7Cu, 0, &kernels::kF8E5M2Kernels},
    // ggml MXFP4: E8M0 exponent + 32 E2M1 codes in 16 bytes (docs/FP8.md). Written
    // as repacked from a checkpoint's MXFP4 (kernels/mxfp4.h); nothing encodes into it.
    {"mxfp4", 14, 32, 17, "", "", 39, 0, 0, &kernels::kMXFP4Kernels},
    // Checkpoint-only dtypes (read and validated, never a device buffer).
    {"bool", -1, 1, 1, "bool", "BOOL", -1},
    {"i8", -1, 1, 1, "int8", "I8", 24},
    {"i16", -1, 1, 2, "int16", "I16", 25},
    {"u16", -1, 1, 2, "uint16", "U16", -1},
    {"u32", -1, 1, 4, "uint32", "U32", -1},
    {"i64", -1, 1, 8, "int64", "I64", 27},
    {"u64", -1, 1, 8, "uint64", "U64", -1},
    {"f64", -1, 1, 8, "float64", "F64", 28},
    {"c64", -1, 1, 8, "complex64", "C64", -1},
    {"f8_e8m0", -1, 1, 1, "float8_e8m0fnu", "F8_E8M0", -1},
    {"f8_e4m3fnuz", -1, 1, 1, "float8_e4m3fnuz", "F8_E4M3FNUZ", -1},
    {"f8_e5m2fnuz", -1, 1, 1, "float8_e5m2fnuz", "F8_E5M2FNUZ", -1},
    {"f4", -1, 2, 1, "", "F4", -1},
    {"f6_e2m3", -1, 4, 3, "", "F6_E2M3", -1},
    {"f6_e3m2", -1, 4, 3, "", "F6_E3M2", -1},
};
inline constexpr std::size_t kNumFormats = sizeof(kFormats) / sizeof(kFormats[0]);

constexpr const FormatRow& format_of(DType t) { return kFormats[static_cast<int>(t)]; }

// The row called `name` (compile time; kFormats[0] if there is none).
constexpr const FormatRow& format_named(std::string_view name) {
  for (const FormatRow& r : kFormats) {
    if (name == r.name) return r;
  }
  return kFormats[0];
}

// Block constants of Q8_0 for the kernels, read from the table.
inline constexpr std::size_t kQ8BlockElems = format_of(DType::Q8_0).block_elems;
inline constexpr std::size_t kQ8BlockBytes = format_of(DType::Q8_0).block_bytes;

static_assert(kQ8BlockElems == 32 && kQ8BlockBytes == 34, "ggml block_q8_0: fp16 scale + 32 int8");
static_assert(format_of(DType::Q8_0).id == static_cast<int>(DType::Q8_0), "device rows in DType order");
static_assert(format_of(DType::I32).id == static_cast<int>(DType::I32), "device rows in DType order");

// Every device row: in DType order, converting only from device formats.
// (That each points at its kernels is checked where they are used, at run
// time: comparing an extern object's address with null is not a constant
// expression for every compiler, e.g. GCC under ASan.)
constexpr bool device_rows_complete() {
  for (int i = 0; i < kNumDTypes; ++i) {
    const FormatRow& r = kFormats[i];
    if (r.id != i || (r.sources >> kNumDTypes) != 0) return false;
  }
  return kNumDTypes < static_cast<int>(kNumFormats) ? kFormats[kNumDTypes].id == -1 : true;
}
static_assert(device_rows_complete(), "kFormats[0, kNumDTypes) are the device rows, in DType order");

}  // namespace hf2q
