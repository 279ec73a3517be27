// The GPU read-back kernels of shaders/verify.metal, run on the CPU.
//
// shaders/verify.metal is compiled here as C++ (its text, unchanged, through
// tests/native/metal_shim/metal_stdlib) and each kernel is called once per
// thread of every dispatch the Metal backend would encode
// (csrc/device/metal/verify_dispatch.h, shared with metal_backend.mm). Then
// the result is compared with the CPU checksums of csrc/device/verify.cpp
// (host backend). tests/test_metal_shaders_cpu.py builds and runs this.
//
//   metal_verify_cpu DTYPE NUMEL CHUNK_GROUPS THREADS_PER_GROUP IN OUT
// DTYPE is the DType number; IN holds the buffer's bytes; OUT receives the
// kernel's per-group uint32 checksums (little-endian). Exit 0 when they equal
// cpu_checksums, 1 when not (the first difference is printed), 2 on bad input.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "device/backend.h"
#include "device/dtype.h"
#include "device/metal/verify_dispatch.h"
#include "device/verify.h"

// The shim defines the MSL address-space words (device, constant, kernel) as
// macros: after every other header, and undefined again right after the shader.
#include <metal_stdlib>  // tests/native/metal_shim/metal_stdlib
namespace msl {
#include "verify.metal"  // shaders/verify.metal, unchanged
}  // namespace msl
#undef kernel
#undef device
#undef constant

namespace {

using hf2q::device::DType;
namespace mv = hf2q::device::metal_verify;
using Kernel = void (*)(const uchar*, uint*, const msl::VerifyParams&, uint);

// Each kernel behind one signature; the casts are the buffer's element type,
// as the GPU binds one byte buffer at the dispatch's offset.
void run_b32(const uchar* x, uint* out, const msl::VerifyParams& p, uint g) {
  msl::hf2q_verify_b32(reinterpret_cast<const uint*>(x), out, p, g);
}
void run_f16(const uchar* x, uint* out, const msl::VerifyParams& p, uint g) {
  msl::hf2q_verify_f16(reinterpret_cast<const ushort*>(x), out, p, g);
}
void run_bf16(const uchar* x, uint* out, const msl::VerifyParams& p, uint g) {
  msl::hf2q_verify_bf16(reinterpret_cast<const ushort*>(x), out, p, g);
}
void run_u8(const uchar* x, uint* out, const msl::VerifyParams& p, uint g) { msl::hf2q_verify_u8(x, out, p, g); }
void run_q8_0(const uchar* x, uint* out, const msl::VerifyParams& p, uint g) { msl::hf2q_verify_q8_0(x, out, p, g); }

Kernel kernel_for(const char* name) {
  struct Entry { const char* name; Kernel k; };
  static const Entry table[] = {{"hf2q_verify_b32", run_b32}, {"hf2q_verify_f16", run_f16},
                                {"hf2q_verify_bf16", run_bf16}, {"hf2q_verify_u8", run_u8},
                                {"hf2q_verify_q8_0", run_q8_0}};
  for (const Entry& e : table) {
    if (name != nullptr && std::strcmp(name, e.name) == 0) return e.k;
  }
  return nullptr;
}

// As metal_backend.mm's cpu_default_nan_bits: what this CPU gives for 0 * Inf.
std::uint32_t default_nan_bits() {
  volatile float zero = 0.0f;
  volatile float inf = std::numeric_limits<float>::infinity();
  const float nan = zero * inf;
  std::uint32_t bits = 0;
  std::memcpy(&bits, &nan, sizeof bits);
  return bits;
}

}  // namespace

int main(int argc, char** argv) {
  static_assert(sizeof(msl::VerifyParams) == sizeof(mv::VerifyParams), "VerifyParams layouts differ");
  static_assert(msl::kGroup == hf2q::device::kVerifyGroup, "kGroup differs from kVerifyGroup");
  if (argc != 7) {
    std::fprintf(stderr, "usage: %s DTYPE NUMEL CHUNK_GROUPS THREADS_PER_GROUP IN OUT\n", argv[0]);
    return 2;
  }
  const int k = std::atoi(argv[1]);
  const std::size_t numel = std::strtoull(argv[2], nullptr, 10);
  const std::size_t chunk = std::strtoull(argv[3], nullptr, 10);
  const std::size_t tg = std::strtoull(argv[4], nullptr, 10);
  if (k < 0 || k >= mv::kNumDTypes || chunk == 0 || tg == 0) return 2;
  const DType dtype = static_cast<DType>(k);
  const Kernel kern = kernel_for(mv::kernel_name(dtype));
  if (kern == nullptr) {
    std::fprintf(stderr, "no kernel for dtype %d\n", k);
    return 2;
  }
  std::FILE* in = std::fopen(argv[5], "rb");
  if (in == nullptr) return 2;
  std::vector<uchar> data;
  for (int c; (c = std::fgetc(in)) != EOF;) data.push_back(static_cast<uchar>(c));
  std::fclose(in);
  const std::size_t need = hf2q::device::element_byte_offset(dtype, numel);
  if (data.size() < need) {
    std::fprintf(stderr, "input holds %zu bytes, %zu needed\n", data.size(), need);
    return 2;
  }
  data.resize(need + 64);  // the GPU buffer is page-rounded; nothing past `need` may be read into a sum

  const std::size_t ngroups = (numel + hf2q::device::kVerifyGroup - 1) / hf2q::device::kVerifyGroup;
  std::vector<uint> gpu(ngroups, 0xDEADBEEFu);
  std::size_t dispatches = 0;
  mv::for_each_dispatch(dtype, numel, ngroups, default_nan_bits(), tg, [&](const mv::Dispatch& d) {
    ++dispatches;
    msl::VerifyParams p;
    std::memcpy(&p, &d.params, sizeof p);
    for (std::size_t t = 0; t < d.threadgroups * d.threads_per_group; ++t) {  // every thread, incl. the idle tail
      kern(data.data() + d.src_offset, gpu.data() + d.first_group, p, static_cast<uint>(t));
    }
  }, chunk);

  std::vector<std::uint32_t> cpu(ngroups, 0);
  hf2q::device::cpu_checksums(dtype, data.data(), numel, cpu.data(), ngroups);

  std::FILE* out = std::fopen(argv[6], "wb");
  if (out == nullptr || std::fwrite(gpu.data(), sizeof(uint), gpu.size(), out) != gpu.size()) return 2;
  std::fclose(out);
  for (std::size_t g = 0; g < ngroups; ++g) {
    if (gpu[g] != cpu[g]) {
      std::printf("group %zu: shader 0x%08x, verify.cpp 0x%08x (%zu dispatches)\n", g, gpu[g], cpu[g], dispatches);
      return 1;
    }
  }
  std::printf("%zu groups equal (%zu dispatches)\n", ngroups, dispatches);
  return 0;
}
