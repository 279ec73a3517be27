// The CUDA k-quant encoders and block-scaled FP8 decoders of
// shaders/cuda_kernels.cu run on the CPU: a minimal emulation of the CUDA
// built-ins they use (one CTA of 256 threads as std::threads, __syncwarp as a
// barrier over all of them, __shfl_xor_sync as an exchange among a warp's 32
// threads, shared memory as statics), so that CI without a GPU checks their
// bytes against the CPU kernels (tests/test_kquants_cuda.py,
// tests/test_fp8_stream.py). Host float32 arithmetic is IEEE like the GPU's
// without fast math; built with -ffp-contract=off.
//
//   cuda_kquants_emu IN.f32 OUT_PREFIX      (IN: float32 values, a multiple of 256 * 32)
// writes OUT_PREFIX.<fmt>.<src> for fmt in q4_0 q5_0 q5_1 q4_k q5_k q6_k and
// src in f32 f16 bf16 (the f16 / bf16 sources: IN rounded to them here),
// OUT_PREFIX.<src>.in (the rounded inputs, for the comparison), and
// OUT_PREFIX.<fmt>.bits: the read-back value (u32 bits, x86's default NaN)
// the CUDA checksum kernels give each element of the f32 source's output.
//
//   cuda_kquants_emu fp8 W.u8 S.f32 ROWS COLS BR BC FIRST WIDE OUT_PREFIX
// decodes the FP8 bytes W (a chunk of a stack of ROWS x COLS matrices whose
// first weight is stack element FIRST, a multiple of 32) with the f32 scale
// grids S (BR x BC blocks) by each hf2q_scaled_<f8_e4m3|f8_e5m2>_<out>
// kernel (q8_0 where COLS is a multiple of 32), WIDE nonzero: their 64-bit
// index path; writes OUT_PREFIX.<fmt>.<out> (the chunk's outputs) and
// OUT_PREFIX.<fmt>.<out>.status (two u64: first non-finite stack index or
// all ones, overflowed Q8_0 scales).
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

struct dim3_ {
  unsigned x = 0, y = 0, z = 0;
};
thread_local dim3_ threadIdx;
dim3_ blockIdx, blockDim, gridDim;
std::barrier<>* g_barrier = nullptr;
std::mutex g_atomic;

#define __device__
#define __forceinline__ inline
#define __global__
#define __shared__ static
#define __restrict__

inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline int __clz(unsigned v) { return v ? __builtin_clz(v) : 32; }
// One IEEE float32 multiply, round to nearest (the FP8 scaled decode; -ffp-contract=off here).
inline float __fmul_rn(float a, float b) { return a * b; }
inline void __syncwarp(unsigned = 0xFFFFFFFFu) { g_barrier->arrive_and_wait(); }
inline void __syncthreads() { g_barrier->arrive_and_wait(); }
// Lane t of a warp gets lane t ^ off's value: every lane of the warp calls it
// (the kernels' loops are warp-uniform), each warp with a barrier of its own.
std::barrier<>* g_warp_barrier[8] = {};
unsigned long long g_shfl[256];
template <class T>
inline T __shfl_xor_sync(unsigned, T v, int off) {
  static_assert(sizeof(T) <= sizeof(unsigned long long), "a lane's value fits a slot");
  const unsigned t = threadIdx.x, warp = t / 32u;
  std::memcpy(&g_shfl[t], &v, sizeof(T));
  g_warp_barrier[warp]->arrive_and_wait();
  T r;
  std::memcpy(&r, &g_shfl[(t & ~31u) | ((t & 31u) ^ static_cast<unsigned>(off))], sizeof(T));
  g_warp_barrier[warp]->arrive_and_wait();
  return r;
}
inline unsigned long long atomicMin(unsigned long long* p, unsigned long long v) {
  std::lock_guard<std::mutex> l(g_atomic);
  const unsigned long long old = *p;
  if (v < old) *p = v;
  return old;
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  std::lock_guard<std::mutex> l(g_atomic);
  const unsigned long long old = *p;
  *p = old + v;
  return old;
}
struct uint4 {
  unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
struct uint2 {
  unsigned x, y;
};
inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
struct float4 {
  float x, y, z, w;
};
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }

// float32 -> binary16, round to nearest even (cvt.rn.f16.f32 on the GPU).
inline unsigned short emu_f32_to_f16(float f) {
  const unsigned u = __float_as_uint(f);
  const unsigned sign = (u >> 16) & 0x8000u;
  const unsigned a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<unsigned short>(sign | 0x7FFFu);  // the GPU's canonical NaN
  if (a >= 0x477FF000u) return static_cast<unsigned short>(sign | 0x7C00u);  // rounds to >= 65520: Inf
  if (a < 0x38800000u) {  // below 2^-14: subnormal half (or zero)
    const float s = __uint_as_float(a) * 16777216.0f;  // exact scaling by 2^24
    const float r = std::nearbyint(s);                  // ties to even (default rounding mode)
    return static_cast<unsigned short>(sign | static_cast<unsigned>(r));
  }
  const unsigned mant = a & 0x7FFFFFu, exp = (a >> 23) - 112u;
  unsigned h = (exp << 10) | (mant >> 13);
  const unsigned rest = mant & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<unsigned short>(sign | h);
}
#define asm(...) h = emu_f32_to_f16(f)

#include "../../shaders/cuda_kernels.cu"

#undef asm

namespace {

using Kernel = void (*)(const void*, u8*, u64, u64, u64*);
using BitsFn = u32 (*)(const u8*, u64, u32);

// `body(t)` as thread t of one CTA of 256 threads (grid-stride from block 0).
void run_cta(const std::function<void()>& body) {
  blockIdx.x = 0;
  blockDim.x = 256;
  gridDim.x = 1;
  std::barrier<> bar(256);
  g_barrier = &bar;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  for (int w = 0; w < 8; ++w) {
    warps.push_back(std::make_unique<std::barrier<>>(32));
    g_warp_barrier[w] = warps.back().get();
  }
  std::vector<std::thread> ts;
  for (unsigned t = 0; t < 256; ++t) {
    ts.emplace_back([=, &body] {
      threadIdx.x = t;
      body();
    });
  }
  for (auto& t : ts) t.join();
}

std::vector<unsigned char> run(Kernel k, const void* src, u64 nblocks, std::size_t bytes) {
  std::vector<unsigned char> out(nblocks * bytes, 0xA5);
  u64 status[2] = {~0ull, 0};
  run_cta([&] { k(src, out.data(), nblocks, 0, status); });
  return out;
}

std::vector<unsigned char> read_file(const std::string& path) {
  std::vector<unsigned char> v;
  if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
    unsigned char buf[65536];
    std::size_t got;
    while ((got = std::fread(buf, 1, sizeof buf, f)) > 0) v.insert(v.end(), buf, buf + got);
    std::fclose(f);
  }
  return v;
}

bool write_file(const std::string& path, const void* p, std::size_t n) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  const bool ok = std::fwrite(p, 1, n, f) == n;
  return std::fclose(f) == 0 && ok;
}

unsigned short to_bf16(float f) {  // round to nearest even (finite input)
  const unsigned u = __float_as_uint(f);
  return static_cast<unsigned short>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace

using ScaledKernel = void (*)(const u8*, const float*, void*, u64, ScaledGeo, u64*, u64);

int fp8_main(int argc, char** argv) {
  if (argc != 11) {
    std::fprintf(stderr, "usage: %s fp8 W.u8 S.f32 ROWS COLS BR BC FIRST WIDE OUT_PREFIX\n", argv[0]);
    return 2;
  }
  const std::vector<unsigned char> w = read_file(argv[2]), sraw = read_file(argv[3]);
  std::vector<float> scale(sraw.size() / 4);
  std::memcpy(scale.data(), sraw.data(), scale.size() * 4);
  const u64 rows = std::stoull(argv[4]), cols = std::stoull(argv[5]), br = std::stoull(argv[6]),
            bc = std::stoull(argv[7]), first = std::stoull(argv[8]), wide = std::stoull(argv[9]);
  const std::string prefix = argv[10];
  const ScaledGeo g{rows, cols, br, bc, (rows + br - 1) / br, (cols + bc - 1) / bc, wide};
  const u64 n = w.size(), end = first + n;
  struct Out {
    const char* name;
    std::size_t elem_bytes;  // 0: q8_0
    ScaledKernel k[2];
  } outs[] = {{"f32", 4, {hf2q_scaled_f8_e4m3_f32, hf2q_scaled_f8_e5m2_f32}},
              {"bf16", 2, {hf2q_scaled_f8_e4m3_bf16, hf2q_scaled_f8_e5m2_bf16}},
              {"f16", 2, {hf2q_scaled_f8_e4m3_f16, hf2q_scaled_f8_e5m2_f16}},
              {"q8_0", 0, {hf2q_scaled_f8_e4m3_q8_0, hf2q_scaled_f8_e5m2_q8_0}}};
  const char* fmts[2] = {"f8_e4m3", "f8_e5m2"};
  // The weights 16-byte aligned, as a staging chunk is.
  std::vector<uint4> wbuf((n + 15) / 16 + 1);
  std::memcpy(wbuf.data(), w.data(), n);
  for (const Out& o : outs) {
    if (o.elem_bytes == 0 && (cols % 32 != 0 || first % 32 != 0 || n % 32 != 0)) continue;
    const std::size_t lo = o.elem_bytes ? first * o.elem_bytes : first / 32 * 34;
    const std::size_t hi = o.elem_bytes ? end * o.elem_bytes : end / 32 * 34;
    for (int f = 0; f < 2; ++f) {
      // The stack's output from element 0 (the kernel writes at stack positions), 16-byte aligned.
      std::vector<uint4> dst(hi / 16 + 2);
      std::memset(dst.data(), 0xA5, dst.size() * 16);
      u64 status[2] = {~0ull, 0};
      const u64 items = o.elem_bytes ? n : n / 32;
      run_cta([&] { o.k[f](reinterpret_cast<const u8*>(wbuf.data()), scale.data(), dst.data(), items, g, status, first); });
      const std::string path = prefix + "." + fmts[f] + "." + o.name;
      if (!write_file(path, reinterpret_cast<const unsigned char*>(dst.data()) + lo, hi - lo) ||
          !write_file(path + ".status", status, sizeof status)) {
        return 2;
      }
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "fp8") return fp8_main(argc, argv);
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s IN.f32 OUT_PREFIX\n", argv[0]);
    return 2;
  }
  std::vector<float> x;
  if (std::FILE* f = std::fopen(argv[1], "rb")) {
    float buf[4096];
    std::size_t got;
    while ((got = std::fread(buf, 4, 4096, f)) > 0) x.insert(x.end(), buf, buf + got);
    std::fclose(f);
  }
  if (x.empty() || x.size() % (256 * 32) != 0) {
    std::fprintf(stderr, "%s: expected a multiple of 8192 float32 values\n", argv[1]);
    return 2;
  }
  const std::string prefix = argv[2];
  std::vector<unsigned short> h16(x.size()), b16(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    h16[i] = emu_f32_to_f16(x[i]);
    b16[i] = to_bf16(x[i]);
  }
  struct Src {
    const char* name;
    const void* p;
    std::size_t bytes;
  } srcs[] = {{"f32", x.data(), 4 * x.size()}, {"f16", h16.data(), 2 * x.size()}, {"bf16", b16.data(), 2 * x.size()}};
  struct Fmt {
    const char* name;
    std::size_t elems, bytes;
    Kernel k[3];
    BitsFn bits;
  } fmts[] = {
      {"q4_0", 32, 18, {hf2q_quantize_q4_0_f32, hf2q_quantize_q4_0_f16, hf2q_quantize_q4_0_bf16}, BitsQ4_0::at},
      {"q5_0", 32, 22, {hf2q_quantize_q5_0_f32, hf2q_quantize_q5_0_f16, hf2q_quantize_q5_0_bf16}, BitsQ5<false>::at},
      {"q5_1", 32, 24, {hf2q_quantize_q5_1_f32, hf2q_quantize_q5_1_f16, hf2q_quantize_q5_1_bf16}, BitsQ5<true>::at},
      {"q4_k", 256, 144, {hf2q_quantize_q4_k_f32, hf2q_quantize_q4_k_f16, hf2q_quantize_q4_k_bf16}, BitsQK<false>::at},
      {"q5_k", 256, 176, {hf2q_quantize_q5_k_f32, hf2q_quantize_q5_k_f16, hf2q_quantize_q5_k_bf16}, BitsQK<true>::at},
      {"q6_k", 256, 210, {hf2q_quantize_q6_k_f32, hf2q_quantize_q6_k_f16, hf2q_quantize_q6_k_bf16}, BitsQ6_K::at},
  };
  for (int s = 0; s < 3; ++s) {
    if (!write_file(prefix + "." + srcs[s].name + ".in", srcs[s].p, srcs[s].bytes)) return 2;
    for (const Fmt& f : fmts) {
      const u64 nb = x.size() / f.elems;
      const auto out = run(f.k[s], srcs[s].p, nb, f.bytes);
      if (!write_file(prefix + "." + f.name + "." + srcs[s].name, out.data(), out.size())) return 2;
      if (s == 0) {
        std::vector<u32> bits(x.size());
        for (u64 i = 0; i < x.size(); ++i) bits[i] = f.bits(out.data(), i, 0xFFC00000u);
        if (!write_file(prefix + "." + f.name + ".bits", bits.data(), 4 * bits.size())) return 2;
      }
    }
  }
  std::printf("cuda_kquants_emu: %zu values, 6 formats x 3 sources\n", x.size());
  return 0;
}
