// Run-time ISA selection and the thread-parallel entry points of kernels.h.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels_internal.h"
#include "thread_pool.h"

#if defined(HF2Q_HAVE_AVX2) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

namespace hf2q::kernels {
namespace {

#if defined(HF2Q_HAVE_AVX2) && (defined(__GNUC__) || defined(__clang__))
// CPUID.1:ECX.F16C[bit 29]. Read directly: clang before 15 rejects
// __builtin_cpu_supports("f16c").
bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & (1u << 29)) != 0;
}
#endif

Isa detect_isa() {
#if defined(HF2Q_HAVE_AVX2) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  // libgcc/compiler-rt also check that the OS saves YMM state (XGETBV).
  if (__builtin_cpu_supports("avx2") && cpu_has_f16c()) return Isa::Avx2;
  return Isa::Scalar;
#elif defined(__aarch64__)
  return Isa::Neon;
#else
  return Isa::Scalar;
#endif
}

bool env_forces_scalar() {
  const char* v = std::getenv("HF2Q_FORCE_SCALAR");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

const Isa g_best_isa = detect_isa();
std::atomic<bool> g_simd_enabled{!env_forces_scalar()};

// Work split: enough items per chunk that waking a thread (~10 us) is noise,
// small enough that two threads balance on a few-MiB tensor.
constexpr std::size_t kDecodeGrain = 1u << 17;          // elements (512 KiB of f32 out)
constexpr std::size_t kQuantGrain = (1u << 17) / kQ8BlockElems;  // blocks

}  // namespace

Isa best_isa() { return g_best_isa; }
Isa active_isa() { return g_simd_enabled.load(std::memory_order_relaxed) ? g_best_isa : Isa::Scalar; }
void set_simd_enabled(bool enabled) { g_simd_enabled.store(enabled); }
bool simd_enabled() { return g_simd_enabled.load(); }

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Avx2: return "avx2";
    case Isa::Neon: return "neon";
    case Isa::Scalar: break;
  }
  return "scalar";
}

void bf16_to_f32_range(const std::uint16_t* src, float* dst, std::size_t n) {
  switch (active_isa()) {
#if defined(HF2Q_HAVE_AVX2)
    case Isa::Avx2: return avx2::bf16_to_f32(src, dst, n);
#endif
#if defined(__aarch64__)
    case Isa::Neon: return neon::bf16_to_f32(src, dst, n);
#endif
    default: return scalar::bf16_to_f32(src, dst, n);
  }
}

void f16_to_f32_range(const std::uint16_t* src, float* dst, std::size_t n) {
  switch (active_isa()) {
#if defined(HF2Q_HAVE_AVX2)
    case Isa::Avx2: return avx2::f16_to_f32(src, dst, n);
#endif
#if defined(__aarch64__)
    case Isa::Neon: return neon::f16_to_f32(src, dst, n);
#endif
    default: return scalar::f16_to_f32(src, dst, n);
  }
}

Q8Result quantize_q8_0_range(DType type, const void* src, std::uint8_t* dst, std::size_t nblocks) {
  switch (active_isa()) {
#if defined(HF2Q_HAVE_AVX2)
    case Isa::Avx2: return avx2::quantize_q8_0(type, src, dst, nblocks);
#endif
#if defined(__aarch64__)
    case Isa::Neon: return neon::quantize_q8_0(type, src, dst, nblocks);
#endif
    default: return scalar::quantize_q8_0(type, src, dst, nblocks);
  }
}

void dequantize_q8_0_range(const std::uint8_t* src, float* dst, std::size_t nblocks) {
  switch (active_isa()) {
#if defined(HF2Q_HAVE_AVX2)
    case Isa::Avx2: return avx2::dequantize_q8_0(src, dst, nblocks);
#endif
#if defined(__aarch64__)
    case Isa::Neon: return neon::dequantize_q8_0(src, dst, nblocks);
#endif
    default: return scalar::dequantize_q8_0(src, dst, nblocks);
  }
}

void bf16_to_f32(const std::uint16_t* src, float* dst, std::size_t n) {
  parallel_for(n, kDecodeGrain, [&](std::size_t b, std::size_t e) { bf16_to_f32_range(src + b, dst + b, e - b); });
}

void f16_to_f32(const std::uint16_t* src, float* dst, std::size_t n) {
  parallel_for(n, kDecodeGrain, [&](std::size_t b, std::size_t e) { f16_to_f32_range(src + b, dst + b, e - b); });
}

namespace {

// The blocks of `src_type` elements at `src` encoded by `fn` into `dst`, in
// parallel chunks; the first non-finite index is the smallest over all
// chunks (deterministic for any thread count).
EncodeResult encode_parallel(EncodeFn fn, DType dst_type, DType src_type, const void* src, std::uint8_t* dst,
                             std::size_t nblocks) {
  const FormatRow& d = kFormats[static_cast<int>(dst_type)];
  const std::size_t in_block = d.block_elems * kFormats[static_cast<int>(src_type)].block_bytes;
  const std::size_t grain = std::max<std::size_t>(1, kDecodeGrain / d.block_elems);
  const auto* base = static_cast<const std::uint8_t*>(src);
  std::atomic<std::size_t> first_bad{kNoIndex};
  std::atomic<std::size_t> inf_scales{0};
  parallel_for(nblocks, grain, [&](std::size_t b, std::size_t e) {
    const EncodeResult r = fn(src_type, base + b * in_block, dst + b * d.block_bytes, e - b);
    inf_scales.fetch_add(r.inf_scales, std::memory_order_relaxed);
    if (r.first_nonfinite != kNoIndex) {
      const std::size_t idx = b * d.block_elems + r.first_nonfinite;
      std::size_t cur = first_bad.load();
      while (idx < cur && !first_bad.compare_exchange_weak(cur, idx)) {
      }
    }
  });
  EncodeResult out;
  out.first_nonfinite = first_bad.load();
  out.inf_scales = inf_scales.load();
  return out;
}

}  // namespace

Q8Result quantize_q8_0(DType type, const void* src, std::uint8_t* dst, std::size_t nblocks) {
  return encode_parallel(encode_kernel(DType::Q8_0, type), DType::Q8_0, type, src, dst, nblocks);
}

void to_f32(DType type, const std::uint8_t* src, float* dst, std::size_t n) {
  const ToF32Fn fn = to_f32_kernel(type);
  const FormatRow& r = kFormats[static_cast<int>(type)];
  if (n % r.block_elems != 0) {
    throw std::invalid_argument(std::string(r.name) + " decodes whole blocks of " + std::to_string(r.block_elems));
  }
  // Chunks of whole blocks, kDecodeGrain elements or more.
  const std::size_t nblocks = n / r.block_elems;
  const std::size_t grain = std::max<std::size_t>(1, kDecodeGrain / r.block_elems);
  parallel_for(nblocks, grain, [&](std::size_t b, std::size_t e) {
    fn(src + b * r.block_bytes, dst + b * r.block_elems, (e - b) * r.block_elems);
  });
}

EncodeResult encode(DType dst_type, DType src_type, const void* src, std::uint8_t* dst, std::size_t nblocks) {
  return encode_parallel(encode_kernel(dst_type, src_type), dst_type, src_type, src, dst, nblocks);
}

void dequantize_q8_0(const std::uint8_t* src, float* dst, std::size_t nblocks) {
  parallel_for(nblocks, kQuantGrain, [&](std::size_t b, std::size_t e) {
    dequantize_q8_0_range(src + b * kQ8BlockBytes, dst + b * kQ8BlockElems, e - b);
  });
}

}  // namespace hf2q::kernels
