#include "checked_ops.h"

#include <stdexcept>
#include <string>

namespace hf2q::ops {
namespace {

using kernels::kQ8BlockBytes;
using kernels::kQ8BlockElems;

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

void require_aligned(const void* p, std::size_t align, const char* what) {
  if (reinterpret_cast<std::uintptr_t>(p) % align != 0) {
    fail(std::string(what) + " must be " + std::to_string(align) + "-byte aligned");
  }
}

void require_disjoint(const void* a, std::size_t an, const void* b, std::size_t bn) {
  const auto pa = reinterpret_cast<std::uintptr_t>(a);
  const auto pb = reinterpret_cast<std::uintptr_t>(b);
  if (an != 0 && bn != 0 && pa < pb + bn && pb < pa + an) fail("src and out must not overlap");
}

void decode_checks(const void* src, std::size_t src_bytes, void* dst, std::size_t dst_bytes) {
  if (src_bytes % 2 != 0) {
    fail("src holds " + std::to_string(src_bytes) + " bytes: 16-bit input needs an even byte length");
  }
  std::size_t need = 0;
  if (!checked_mul(src_bytes, 2, &need)) fail("output size overflows");
  if (dst_bytes != need) {
    fail("out holds " + std::to_string(dst_bytes / 4) + " float32 elements, expected " +
         std::to_string(src_bytes / 2));
  }
  require_aligned(src, 2, "src");
  require_aligned(dst, 4, "out");
  require_disjoint(src, src_bytes, dst, dst_bytes);
}

}  // namespace

bool checked_mul(std::size_t a, std::size_t b, std::size_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

bool checked_add(std::size_t a, std::size_t b, std::size_t* out) {
  return !__builtin_add_overflow(a, b, out);
}

std::size_t q8_0_bytes(std::size_t numel) {
  if (numel % kQ8BlockElems != 0) {
    fail("Q8_0 needs a multiple of 32 elements, got " + std::to_string(numel));
  }
  return numel / kQ8BlockElems * kQ8BlockBytes;  // < numel * 2: cannot overflow
}

void bf16_to_f32(const void* src, std::size_t src_bytes, void* dst, std::size_t dst_bytes) {
  decode_checks(src, src_bytes, dst, dst_bytes);
  kernels::bf16_to_f32(static_cast<const std::uint16_t*>(src), static_cast<float*>(dst), src_bytes / 2);
}

void f16_to_f32(const void* src, std::size_t src_bytes, void* dst, std::size_t dst_bytes) {
  decode_checks(src, src_bytes, dst, dst_bytes);
  kernels::f16_to_f32(static_cast<const std::uint16_t*>(src), static_cast<float*>(dst), src_bytes / 2);
}

kernels::Q8Result quantize_q8_0(DType type, const void* src, std::size_t src_bytes,
                                void* dst, std::size_t dst_bytes) {
  const int t = static_cast<int>(type);
  if (t < 0 || t >= kNumDTypes || (format_of(DType::Q8_0).sources & dtype_bit(type)) == 0) {
    fail("unknown source type");
  }
  const std::size_t elem = kFormats[t].block_bytes;
  if (src_bytes % elem != 0) fail("src byte length is not a multiple of the element size");
  const std::size_t numel = src_bytes / elem;
  const std::size_t need = q8_0_bytes(numel);
  if (dst_bytes != need) {
    fail("out holds " + std::to_string(dst_bytes) + " bytes, expected " + std::to_string(need) +
         " (numel / 32 * 34)");
  }
  require_aligned(src, elem, "src");
  require_disjoint(src, src_bytes, dst, dst_bytes);
  return kernels::quantize_q8_0(type, src, static_cast<std::uint8_t*>(dst), numel / kQ8BlockElems);
}

void dequantize_q8_0(const void* src, std::size_t src_bytes, void* dst, std::size_t dst_bytes) {
  if (src_bytes % kQ8BlockBytes != 0) {
    fail("Q8_0 data holds " + std::to_string(src_bytes) + " bytes: not a multiple of 34");
  }
  const std::size_t nblocks = src_bytes / kQ8BlockBytes;
  std::size_t need = 0;
  if (!checked_mul(nblocks, kQ8BlockElems * sizeof(float), &need)) fail("output size overflows");
  if (dst_bytes != need) {
    fail("out holds " + std::to_string(dst_bytes / 4) + " float32 elements, expected " +
         std::to_string(nblocks * kQ8BlockElems));
  }
  require_aligned(dst, 4, "out");
  require_disjoint(src, src_bytes, dst, dst_bytes);
  kernels::dequantize_q8_0(static_cast<const std::uint8_t*>(src), static_cast<float*>(dst), nblocks);
}

namespace {

const FormatRow& device_row(DType t) {
  const int i = static_cast<int>(t);
  if (i < 0 || i >= kNumDTypes) fail("unknown dtype id " + std::to_string(i));
  return kFormats[i];
}

// Elements in `bytes` of format `r` (whole blocks, checked).
std::size_t elems_in(const FormatRow& r, std::size_t bytes, const char* what) {
  if (bytes % r.block_bytes != 0) {
    fail(std::string(what) + " holds " + std::to_string(bytes) + " bytes: not a whole number of " + r.name +
         " blocks of " + std::to_string(r.block_bytes));
  }
  std::size_t n = 0;
  if (!checked_mul(bytes / r.block_bytes, r.block_elems, &n)) fail("element count overflows");
  return n;
}

// Alignment the kernels read `r`'s data at: its element (plain formats), or 1.
std::size_t read_align(const FormatRow& r) { return r.block_elems == 1 ? r.block_bytes : 1; }

}  // namespace

void to_f32(DType src_type, const void* src, std::size_t src_bytes, void* dst, std::size_t dst_bytes) {
  const FormatRow& s = device_row(src_type);
  const std::size_t n = elems_in(s, src_bytes, "src");
  std::size_t need = 0;
  if (!checked_mul(n, sizeof(float), &need)) fail("output size overflows");
  if (dst_bytes != need) {
    fail("out holds " + std::to_string(dst_bytes / 4) + " float32 elements, expected " + std::to_string(n));
  }
  require_aligned(src, read_align(s), "src");
  require_aligned(dst, 4, "out");
  require_disjoint(src, src_bytes, dst, dst_bytes);
  kernels::to_f32(src_type, static_cast<const std::uint8_t*>(src), static_cast<float*>(dst), n);
}

kernels::EncodeResult encode(DType dst_type, DType src_type, const void* src, std::size_t src_bytes, void* dst,
                             std::size_t dst_bytes) {
  const FormatRow& s = device_row(src_type);
  const FormatRow& d = device_row(dst_type);
  const std::size_t n = elems_in(s, src_bytes, "src");
  if (n % d.block_elems != 0) {
    fail(std::string(d.name) + " needs a multiple of " + std::to_string(d.block_elems) + " elements, got " +
         std::to_string(n));
  }
  const std::size_t need = n / d.block_elems * d.block_bytes;  // checked below against dst_bytes
  if (n / d.block_elems != 0 && need / d.block_bytes != n / d.block_elems) fail("output size overflows");
  if (dst_bytes != need) {
    fail("out holds " + std::to_string(dst_bytes) + " bytes, expected " + std::to_string(need));
  }
  require_aligned(src, read_align(s), "src");
  require_disjoint(src, src_bytes, dst, dst_bytes);
  return kernels::encode(dst_type, src_type, src, static_cast<std::uint8_t*>(dst), n / d.block_elems);
}

kernels::EncodeResult scaled_fp8(const kernels::ScaledFp8& s, const void* w, std::size_t w_bytes, const void* scale,
                                 std::size_t scale_bytes, DType out_type, void* dst, std::size_t dst_bytes) {
  s.check();
  const std::size_t n = s.numel();
  if (w_bytes != n) fail("weight holds " + std::to_string(w_bytes) + " bytes, expected " + std::to_string(n));
  std::size_t grid = 0, sbytes = 0;
  if (!checked_mul(s.lead, s.scale_rows, &grid) || !checked_mul(grid, s.scale_cols, &grid) ||
      !checked_mul(grid, device_row(s.scale).block_bytes, &sbytes)) {
    fail("scale size overflows");
  }
  if (scale_bytes != sbytes) {
    fail("scale holds " + std::to_string(scale_bytes) + " bytes, expected " + std::to_string(sbytes));
  }
  const FormatRow& d = device_row(out_type);
  if (n % d.block_elems != 0) fail(std::string(d.name) + " needs whole blocks");
  std::size_t need = 0;
  if (!checked_mul(n / d.block_elems, d.block_bytes, &need)) fail("output size overflows");
  if (dst_bytes != need) fail("out holds " + std::to_string(dst_bytes) + " bytes, expected " + std::to_string(need));
  require_aligned(dst, out_type == DType::Q8_0 ? 1 : d.block_bytes, "out");
  require_disjoint(w, w_bytes, dst, dst_bytes);
  require_disjoint(scale, scale_bytes, dst, dst_bytes);
  return kernels::scaled_fp8_decode(s, static_cast<const std::uint8_t*>(w), static_cast<const std::uint8_t*>(scale),
                                    out_type, static_cast<std::uint8_t*>(dst));
}

}  // namespace hf2q::ops
