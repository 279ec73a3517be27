#include "checked_ops.h"

#include "kquants.h"

#include <cstring>
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

kernels::BlockFormat block_format(const char* name) {
  for (int i = 0; i < kernels::kNumBlockFormats; ++i) {
    const auto f = static_cast<kernels::BlockFormat>(i);
    if (std::strcmp(kernels::block_geometry(f).name, name) == 0) return f;
  }
  fail(std::string("no quantizer for format '") + name + "'");
}

std::size_t src_elem_size(kernels::SrcType type) {
  switch (type) {
    case kernels::SrcType::F32: return 4;
    case kernels::SrcType::F16:
    case kernels::SrcType::BF16: return 2;
  }
  fail("unknown source type");
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

kernels::Q8Result quantize_q8_0(kernels::SrcType type, const void* src, std::size_t src_bytes,
                                void* dst, std::size_t dst_bytes) {
  const std::size_t elem = src_elem_size(type);
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

kernels::Q8Result quantize_blocks(const char* format, kernels::SrcType type, const void* src,
                                  std::size_t src_bytes, void* dst, std::size_t dst_bytes) {
  const kernels::BlockFormat f = block_format(format);
  const FormatRow& g = kernels::block_geometry(f);
  const std::size_t elem = src_elem_size(type);
  if (src_bytes % elem != 0) fail("src byte length is not a multiple of the element size");
  const std::size_t numel = src_bytes / elem;
  if (numel % g.block_elems != 0) {
    fail(std::string(g.name) + " needs a multiple of " + std::to_string(g.block_elems) + " elements, got " +
         std::to_string(numel));
  }
  const std::size_t nblocks = numel / g.block_elems;
  const std::size_t need = nblocks * g.block_bytes;  // < src_bytes: cannot overflow
  if (dst_bytes != need) {
    fail("out holds " + std::to_string(dst_bytes) + " bytes, expected " + std::to_string(need));
  }
  require_aligned(src, elem, "src");
  require_disjoint(src, src_bytes, dst, dst_bytes);
  return kernels::quantize_blocks(f, type, src, static_cast<std::uint8_t*>(dst), nblocks);
}

void dequantize_blocks(const char* format, const void* src, std::size_t src_bytes, void* dst,
                       std::size_t dst_bytes) {
  const kernels::BlockFormat f = block_format(format);
  const FormatRow& g = kernels::block_geometry(f);
  if (src_bytes % g.block_bytes != 0) {
    fail(std::string(g.name) + " data holds " + std::to_string(src_bytes) + " bytes: not a multiple of " +
         std::to_string(g.block_bytes));
  }
  const std::size_t nblocks = src_bytes / g.block_bytes;
  std::size_t need = 0;
  if (!checked_mul(nblocks, g.block_elems * sizeof(float), &need)) fail("output size overflows");
  if (dst_bytes != need) {
    fail("out holds " + std::to_string(dst_bytes / 4) + " float32 elements, expected " +
         std::to_string(nblocks * g.block_elems));
  }
  require_aligned(dst, 4, "out");
  require_disjoint(src, src_bytes, dst, dst_bytes);
  kernels::dequantize_blocks(f, static_cast<const std::uint8_t*>(src), static_cast<float*>(dst), nblocks);
}

}  // namespace hf2q::ops
