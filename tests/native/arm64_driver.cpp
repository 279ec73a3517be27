// arm64 test driver for the portable kernels (csrc/kernels/), NEON path.
//
// Cross-compiled for aarch64 Linux and run under qemu-aarch64 by
// scripts/run_arm64_tests.sh (see there for how to run it by hand).
//
//   arm64_driver VECTORS.bin
//
// 1. For every record of VECTORS.bin (written on x86 by
//    tests/native/gen_arm64_vectors.py from hf2q.reference; the format is
//    described there) it runs the NEON path (set_simd_enabled(true)) and the
//    scalar path (set_simd_enabled(false)) through the single-threaded *_range
//    entry points and through the pooled entry points, and checks byte
//    identity with the x86 reference output, NEON == scalar, first_nonfinite,
//    inf_scales, and that nothing past the output was written.
// 2. Self-contained checks: decoder tails/misalignment, the half-away rounding
//    of the Q8_0 path against roundf around every k and k + 0.5 in [-127, 127],
//    f32_to_f16_rne against the arm64 hardware conversion (FCVT), and
//    multi-threaded quantize/dequantize/decode == single-threaded, including
//    the smallest first_nonfinite over chunks.
//
// Prints "arm64 driver: N passed, M failed"; exits 0 only when M == 0
// (1 on a mismatch, 2 on a usage or vector-file error, 3 when the watchdog
// fires: no result after HF2Q_ARM64_DRIVER_TIMEOUT seconds, default 120,
// and at most 60 s for the threading checks).
#include <arm_neon.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <csignal>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/formats.h"
#include "kernels/kernels.h"
#include "kernels/thread_pool.h"

#if !defined(__aarch64__)
#error "arm64_driver.cpp tests the NEON path: build it for aarch64"
#endif

namespace k = hf2q::kernels;

namespace {

constexpr std::uint32_t kBf16F32 = 1, kF16F32 = 2, kQ8F32 = 3, kQ8Bf16 = 4, kQ8F16 = 5, kDeqQ8 = 6;
// ggml's 4/5/6-bit formats from F32 (docs/KQUANTS.md): the format's DType id in
// flags bits 8..15, the expected bytes ggml's own (tests/data/kquants).
constexpr std::uint32_t kKQuantF32 = 7;
hf2q::DType kq_format(std::uint32_t flags) { return static_cast<hf2q::DType>((flags >> 8) & 0xFF); }
std::size_t kq_block_elems(std::uint32_t flags) { return hf2q::format_of(kq_format(flags)).block_elems; }
std::size_t kq_block_bytes(std::uint32_t flags) { return hf2q::format_of(kq_format(flags)).block_bytes; }
constexpr std::uint32_t kFlagNanAny = 1;
constexpr std::uint8_t kSentinel = 0xA5;
constexpr std::size_t kGuard = 64;  // sentinel bytes after every output buffer

int g_passed = 0;
int g_failed = 0;
// Phases, for the summary and for the watchdog's message.
constexpr int kPhaseVectors = 0, kPhaseSelf = 1, kPhaseThreads = 2;
const char* const kPhaseNames[] = {"vectors vs x86 reference", "self checks (tails, rounding, f32->f16)",
                                   "threading (thread pool)"};
int g_phase = kPhaseVectors;
int g_phase_failed[3] = {0, 0, 0};
int g_phase_passed[3] = {0, 0, 0};
int g_fail_details = 0;  // detail lines printed so far (capped)
std::size_t g_nan_sign_only = 0;  // NaN outputs that differ from the x86 reference only in NaN bits

void fail_detail(const char* fmt, ...) {
  if (g_fail_details >= 200) return;
  ++g_fail_details;
  va_list ap;
  va_start(ap, fmt);
  std::fputs("    ", stderr);
  std::vfprintf(stderr, fmt, ap);
  std::fputc('\n', stderr);
  va_end(ap);
}

bool check(bool ok, const std::string& what) {
  if (ok) {
    ++g_passed;
    ++g_phase_passed[g_phase];
  } else {
    ++g_failed;
    ++g_phase_failed[g_phase];
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  }
  return ok;
}

std::uint32_t f32_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float bits_f32(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---- buffers with a guard zone
struct OutBuf {
  std::vector<std::uint8_t> mem;
  std::size_t len;
  explicit OutBuf(std::size_t n) : mem(n + kGuard, kSentinel), len(n) {}
  std::uint8_t* data() { return mem.data(); }
  const std::uint8_t* data() const { return mem.data(); }
  bool guard_intact() const {
    for (std::size_t i = len; i < mem.size(); ++i)
      if (mem[i] != kSentinel) return false;
    return true;
  }
};

// float32 arrays: exact bits, or NaN == any NaN when nan_any.
bool compare_f32(const std::string& what, const std::uint8_t* got, const std::uint8_t* want, std::size_t n,
                 bool nan_any, std::size_t* nan_only_out = nullptr) {
  std::size_t bad = 0, nan_only = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t g, w;
    std::memcpy(&g, got + 4 * i, 4);
    std::memcpy(&w, want + 4 * i, 4);
    if (g == w) continue;
    // Only difference accepted (nan_any): the default NaN of an invalid
    // operation (0 x Inf), 0xFFC00000 on x86 and 0x7FC00000 on arm64.
    if (nan_any && g == 0x7FC00000u && w == 0xFFC00000u) {
      if (nan_only_out && nan_only < 3)
        std::printf("note: %s: element %zu: NaN 0x%08" PRIx32 ", x86 reference NaN 0x%08" PRIx32 "\n", what.c_str(), i,
                    g, w);
      ++nan_only;
      continue;
    }
    if (bad < 5)
      fail_detail("%s: element %zu: got 0x%08" PRIx32 " (%.9g), want 0x%08" PRIx32 " (%.9g)", what.c_str(), i, g,
                  static_cast<double>(bits_f32(g)), w, static_cast<double>(bits_f32(w)));
    ++bad;
  }
  if (bad) fail_detail("%s: %zu of %zu float32 values differ", what.c_str(), bad, n);
  if (nan_only_out) *nan_only_out += nan_only;
  return check(bad == 0, what);
}

void dump_block_input(std::uint32_t kind, const std::uint8_t* src, std::size_t block) {
  std::string s;
  char tmp[48];
  for (std::size_t j = 0; j < k::kQ8BlockElems; ++j) {
    const std::size_t e = block * k::kQ8BlockElems + j;
    float v;
    if (kind == kQ8F32) {
      std::memcpy(&v, src + 4 * e, 4);
    } else {
      std::uint16_t h;
      std::memcpy(&h, src + 2 * e, 2);
      v = kind == kQ8Bf16 ? bits_f32(static_cast<std::uint32_t>(h) << 16) : k::f16_bits_to_f32(h);
    }
    std::snprintf(tmp, sizeof tmp, "%s%.9g", j ? " " : "", static_cast<double>(v));
    s += tmp;
  }
  fail_detail("  input block %zu: %s", block, s.c_str());
}

bool compare_q8(const std::string& what, std::uint32_t kind, const std::uint8_t* src, const std::uint8_t* got,
                const std::uint8_t* want, std::size_t nblocks) {
  std::size_t bad = 0;
  for (std::size_t b = 0; b < nblocks; ++b) {
    const std::uint8_t* g = got + b * k::kQ8BlockBytes;
    const std::uint8_t* w = want + b * k::kQ8BlockBytes;
    if (std::memcmp(g, w, k::kQ8BlockBytes) == 0) continue;
    if (bad < 3) {
      std::string line;
      char tmp[32];
      for (std::size_t j = 0; j < k::kQ8BlockElems; ++j) {
        const int gq = static_cast<std::int8_t>(g[2 + j]), wq = static_cast<std::int8_t>(w[2 + j]);
        if (gq != wq) {
          std::snprintf(tmp, sizeof tmp, " q[%zu] %d!=%d", j, gq, wq);
          line += tmp;
        }
      }
      fail_detail("%s: block %zu: d16 got 0x%04x want 0x%04x; q got!=want:%s", what.c_str(), b, g[0] | (g[1] << 8),
                  w[0] | (w[1] << 8), line.empty() ? " none (changed while compared?)" : line.c_str());
      if (src) dump_block_input(kind, src, b);
    }
    ++bad;
  }
  if (bad) fail_detail("%s: %zu of %zu Q8_0 blocks differ", what.c_str(), bad, nblocks);
  return check(bad == 0, what);
}

// Block-by-block byte comparison; reports the first differing blocks.
bool compare_bytes(const std::string& what, const std::uint8_t* got, const std::uint8_t* want, std::size_t len,
                   std::size_t block) {
  std::size_t bad = 0;
  for (std::size_t b = 0; b * block < len; ++b) {
    if (std::memcmp(got + b * block, want + b * block, block) != 0) {
      if (bad < 3) std::printf("    %s: block %zu differs\n", what.c_str(), b);
      ++bad;
    }
  }
  return check(bad == 0, what);
}

// ---- vector file
struct Record {
  std::uint32_t kind = 0, flags = 0;
  std::uint64_t n = 0;
  std::int64_t first_bad = -1;
  std::string label;
  std::vector<std::uint8_t> in, out;
};

struct Reader {
  std::vector<std::uint8_t> buf;
  std::size_t pos = 0;
  bool ok = true;
  void take(void* p, std::size_t len) {
    if (!ok || buf.size() - pos < len) {
      ok = false;
      return;
    }
    std::memcpy(p, buf.data() + pos, len);
    pos += len;
  }
  template <typename T>
  T get() {
    T v{};
    take(&v, sizeof v);  // little-endian host, as the file
    return v;
  }
  std::vector<std::uint8_t> bytes(std::uint64_t len) {
    if (!ok || buf.size() - pos < len) {
      ok = false;
      return {};
    }
    std::vector<std::uint8_t> v(buf.begin() + static_cast<std::ptrdiff_t>(pos),
                                buf.begin() + static_cast<std::ptrdiff_t>(pos + len));
    pos += len;
    return v;
  }
};

bool load_vectors(const char* path, std::vector<Record>& recs) {
  std::FILE* f = std::fopen(path, "rb");
  if (!f) {
    std::fprintf(stderr, "arm64 driver: cannot open vector file %s: %s\n", path, std::strerror(errno));
    return false;
  }
  Reader r;
  std::uint8_t chunk[1 << 16];
  std::size_t got;
  while ((got = std::fread(chunk, 1, sizeof chunk, f)) > 0) r.buf.insert(r.buf.end(), chunk, chunk + got);
  std::fclose(f);
  char magic[8];
  r.take(magic, 8);
  const auto version = r.get<std::uint32_t>();
  const auto count = r.get<std::uint32_t>();
  if (!r.ok || std::memcmp(magic, "HF2QARM1", 8) != 0 || version != 1) {
    std::fprintf(stderr, "arm64 driver: %s is not an HF2QARM1 v1 vector file\n", path);
    return false;
  }
  for (std::uint32_t i = 0; i < count && r.ok; ++i) {
    Record rec;
    rec.kind = r.get<std::uint32_t>();
    rec.flags = r.get<std::uint32_t>();
    rec.n = r.get<std::uint64_t>();
    rec.first_bad = r.get<std::int64_t>();
    const auto lab = r.bytes(r.get<std::uint32_t>());
    rec.label.assign(lab.begin(), lab.end());
    rec.in = r.bytes(r.get<std::uint64_t>());
    rec.out = r.bytes(r.get<std::uint64_t>());
    recs.push_back(std::move(rec));
  }
  r.take(magic, 8);
  if (!r.ok || std::memcmp(magic, "HF2QEND!", 8) != 0 || r.pos != r.buf.size()) {
    std::fprintf(stderr, "arm64 driver: %s is truncated or malformed (after %zu records)\n", path, recs.size());
    return false;
  }
  return true;
}

// Validates sizes of one record; a bad record is a generator bug (exit 2).
bool record_sizes_ok(const Record& r) {
  switch (r.kind) {
    case kBf16F32:
    case kF16F32:
      return r.in.size() == 2 * r.n && r.out.size() == 4 * r.n && r.first_bad == -1;
    case kQ8F32:
    case kQ8Bf16:
    case kQ8F16: {
      const std::size_t es = r.kind == kQ8F32 ? 4 : 2;
      if (r.n % k::kQ8BlockElems != 0 || r.in.size() != es * r.n) return false;
      const std::size_t nb = r.n / k::kQ8BlockElems;
      if (r.first_bad < 0) return r.out.size() == nb * k::kQ8BlockBytes;
      return static_cast<std::uint64_t>(r.first_bad) < r.n &&
             r.out.size() == static_cast<std::size_t>(r.first_bad) / k::kQ8BlockElems * k::kQ8BlockBytes;
    }
    case kDeqQ8:
      return r.in.size() == r.n * k::kQ8BlockBytes && r.out.size() == r.n * k::kQ8BlockElems * 4 &&
             r.first_bad == -1;
    case kKQuantF32: {
      const int id = static_cast<int>(kq_format(r.flags));
      if (id < static_cast<int>(hf2q::DType::Q4_0) || id >= hf2q::kNumDTypes || id == static_cast<int>(hf2q::DType::Q8_0))
        return false;
      const std::size_t be = kq_block_elems(r.flags);
      return be > 1 && r.n % be == 0 && r.in.size() == 4 * r.n && r.first_bad == -1 &&
             r.out.size() == r.n / be * kq_block_bytes(r.flags);
    }
    default:
      return false;
  }
}

enum class Path { NeonRange, ScalarRange, NeonPool, ScalarPool };
const char* path_name(Path p) {
  switch (p) {
    case Path::NeonRange: return "neon";
    case Path::ScalarRange: return "scalar";
    case Path::NeonPool: return "neon pool";
    case Path::ScalarPool: return "scalar pool";
  }
  return "?";
}
bool path_simd(Path p) { return p == Path::NeonRange || p == Path::NeonPool; }
bool path_pool(Path p) { return p == Path::NeonPool || p == Path::ScalarPool; }

hf2q::DType src_type(std::uint32_t kind) {
  return kind == kQ8F32 ? hf2q::DType::F32 : kind == kQ8Bf16 ? hf2q::DType::BF16 : hf2q::DType::F16;
}

// Runs one record on one path; returns the output buffer and the Q8Result.
OutBuf run_record(const Record& r, Path p, k::Q8Result* res) {
  k::set_simd_enabled(path_simd(p));
  const bool pool = path_pool(p);
  const std::size_t n = r.n;
  switch (r.kind) {
    case kBf16F32:
    case kF16F32: {
      OutBuf out(4 * n);
      std::vector<std::uint16_t> src(n);
      if (n) std::memcpy(src.data(), r.in.data(), 2 * n);
      auto* dst = reinterpret_cast<float*>(out.data());
      if (r.kind == kBf16F32)
        pool ? k::bf16_to_f32(src.data(), dst, n) : k::bf16_to_f32_range(src.data(), dst, n);
      else
        pool ? k::f16_to_f32(src.data(), dst, n) : k::f16_to_f32_range(src.data(), dst, n);
      return out;
    }
    case kDeqQ8: {
      OutBuf out(4 * k::kQ8BlockElems * n);
      auto* dst = reinterpret_cast<float*>(out.data());
      pool ? k::dequantize_q8_0(r.in.data(), dst, n) : k::dequantize_q8_0_range(r.in.data(), dst, n);
      return out;
    }
    case kKQuantF32: {
      const std::size_t nb = n / kq_block_elems(r.flags);
      OutBuf out(nb * kq_block_bytes(r.flags));
      std::vector<float> src(n);
      std::memcpy(src.data(), r.in.data(), r.in.size());
      *res = pool ? k::encode(kq_format(r.flags), hf2q::DType::F32, src.data(), out.data(), nb)
                  : k::encode_kernel(kq_format(r.flags), hf2q::DType::F32)(hf2q::DType::F32, src.data(), out.data(), nb);
      return out;
    }
    default: {
      const std::size_t nb = n / k::kQ8BlockElems;
      OutBuf out(nb * k::kQ8BlockBytes);
      // aligned copy of the input (the file buffer has arbitrary alignment)
      std::vector<float> src((r.in.size() + 3) / 4);
      std::memcpy(src.data(), r.in.data(), r.in.size());
      *res = pool ? k::quantize_q8_0(src_type(r.kind), src.data(), out.data(), nb)
                  : k::quantize_q8_0_range(src_type(r.kind), src.data(), out.data(), nb);
      return out;
    }
  }
}

std::size_t check_record(const Record& r) {
  const std::string base = "[" + r.label + "] ";
  const bool is_q8 = r.kind == kQ8F32 || r.kind == kQ8Bf16 || r.kind == kQ8F16;
  std::vector<OutBuf> outs;
  std::vector<k::Q8Result> results;
  const Path paths[] = {Path::NeonRange, Path::ScalarRange, Path::NeonPool, Path::ScalarPool};
  for (Path p : paths) {
    k::Q8Result res;
    outs.push_back(run_record(r, p, &res));
    results.push_back(res);
    const std::string what = base + path_name(p);
    check(outs.back().guard_intact(), what + ": nothing written past the output");
    if (is_q8) {
      const std::size_t want_bad = r.first_bad < 0 ? k::kNoIndex : static_cast<std::size_t>(r.first_bad);
      if (!check(res.first_nonfinite == want_bad, what + ": first_nonfinite"))
        fail_detail("got %zd, want %" PRId64, static_cast<std::ptrdiff_t>(res.first_nonfinite), r.first_bad);
      if (r.first_bad < 0) {
        std::size_t want_inf = 0;
        for (std::size_t b = 0; b < r.out.size() / k::kQ8BlockBytes; ++b)
          want_inf += (r.out[b * k::kQ8BlockBytes] | (r.out[b * k::kQ8BlockBytes + 1] << 8)) == 0x7C00;
        if (!check(res.inf_scales == want_inf, what + ": inf_scales"))
          fail_detail("got %zu, want %zu", res.inf_scales, want_inf);
      }
      // with a non-finite input only the blocks before the bad one are defined
      compare_q8(what + " vs x86 reference", r.kind, r.in.data(), outs.back().data(), r.out.data(),
                 r.out.size() / k::kQ8BlockBytes);
    } else if (r.kind == kKQuantF32) {
      check(res.first_nonfinite == k::kNoIndex, what + ": no non-finite value");
      compare_bytes(what + " vs ggml", outs.back().data(), r.out.data(), r.out.size(), kq_block_bytes(r.flags));
    } else if (r.kind == kDeqQ8) {
      compare_f32(what + " vs x86 reference", outs.back().data(), r.out.data(), r.out.size() / 4,
                  (r.flags & kFlagNanAny) != 0, p == Path::NeonRange ? &g_nan_sign_only : nullptr);
    } else {
      compare_f32(what + " vs x86 reference", outs.back().data(), r.out.data(), r.out.size() / 4, false);
    }
  }
  // NEON and scalar: bit identical, NaN bits included
  const std::size_t defined = r.out.size();
  if (is_q8)
    compare_q8(base + "neon == scalar", r.kind, r.in.data(), outs[0].data(), outs[1].data(), defined / k::kQ8BlockBytes);
  else if (r.kind == kKQuantF32)
    compare_bytes(base + "neon == scalar", outs[0].data(), outs[1].data(), defined, kq_block_bytes(r.flags));
  else
    compare_f32(base + "neon == scalar", outs[0].data(), outs[1].data(), defined / 4, false);
  return r.kind == kDeqQ8 ? r.n * k::kQ8BlockElems : r.n;
}

// ---- self-contained checks

void check_isa() {
  check(k::best_isa() == k::Isa::Neon, "best_isa() is neon on aarch64");
  k::set_simd_enabled(true);
  check(k::active_isa() == k::Isa::Neon && std::strcmp(k::isa_name(k::active_isa()), "neon") == 0,
        "active_isa() is neon with SIMD enabled");
  k::set_simd_enabled(false);
  check(k::active_isa() == k::Isa::Scalar && !k::simd_enabled(), "set_simd_enabled(false) forces scalar");
  k::set_simd_enabled(true);
}

// Decoders on every misalignment and on lengths around the 8-wide vector body.
void check_decoder_tails() {
  std::vector<std::uint16_t> all(65536 + 16);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint16_t>(i * 40503u);  // all patterns
  const std::size_t lens[] = {0, 1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 63, 100, 65536};
  int bad = 0, total = 0;
  for (int which = 0; which < 2; ++which) {
    for (std::size_t off = 0; off < 9; ++off) {
      for (std::size_t len : lens) {
        OutBuf a(4 * len), b(4 * len);
        k::set_simd_enabled(true);
        (which ? k::f16_to_f32_range : k::bf16_to_f32_range)(all.data() + off, reinterpret_cast<float*>(a.data()), len);
        k::set_simd_enabled(false);
        (which ? k::f16_to_f32_range : k::bf16_to_f32_range)(all.data() + off, reinterpret_cast<float*>(b.data()), len);
        ++total;
        if (std::memcmp(a.data(), b.data(), 4 * len) != 0 || !a.guard_intact() || !b.guard_intact()) {
          ++bad;
          fail_detail("%s decode: offset %zu length %zu: neon != scalar or guard overwritten", which ? "f16" : "bf16",
                      off, len);
        }
      }
    }
  }
  k::set_simd_enabled(true);
  check(bad == 0, "decoder tails/misalignment: neon == scalar (" + std::to_string(total) + " cases)");
}

// With one element equal to 127, d = 1 and id = 1 exactly, so q = round(x):
// checks the NEON rounding (FCVTAS) and the scalar one against roundf on every
// float within +-512 ulp of every integer and half-integer in [-127, 127], and
// on a stride through all floats in [-127, 127].
std::size_t check_rounding() {
  std::vector<float> vals;
  for (int kk = 0; kk <= 254; ++kk) {
    const float c = 0.5f * static_cast<float>(kk);
    const std::uint32_t cb = f32_bits(c);
    for (int d = -512; d <= 512; ++d) {
      if (c == 0.0f && d < 0) continue;
      const float v = bits_f32(static_cast<std::uint32_t>(static_cast<std::int64_t>(cb) + d));
      if (v <= 127.0f) vals.push_back(v);
    }
  }
  for (std::uint32_t b = 0; b <= f32_bits(127.0f); b += 1021) vals.push_back(bits_f32(b));
  const std::size_t npos = vals.size();
  for (std::size_t i = 0; i < npos; ++i) vals.push_back(-vals[i]);
  // blocks of 31 values + one 127 (alternating position and sign)
  const std::size_t nb = (vals.size() + 30) / 31;
  std::vector<float> x(nb * 32, 0.0f);
  std::vector<int> want(nb * 32, 0);
  for (std::size_t b = 0, v = 0; b < nb; ++b) {
    const std::size_t anchor = b % 32;
    for (std::size_t j = 0; j < 32; ++j) {
      float val;
      if (j == anchor) {
        val = (b & 1) ? -127.0f : 127.0f;
      } else {
        val = v < vals.size() ? vals[v++] : 0.0f;
      }
      x[b * 32 + j] = val;
      want[b * 32 + j] = static_cast<int>(std::roundf(val));
    }
  }
  for (int simd = 1; simd >= 0; --simd) {
    k::set_simd_enabled(simd != 0);
    std::vector<std::uint8_t> out(nb * k::kQ8BlockBytes);
    const k::Q8Result r = k::quantize_q8_0_range(hf2q::DType::F32, x.data(), out.data(), nb);
    std::size_t bad = 0;
    for (std::size_t b = 0; b < nb; ++b) {
      const std::uint8_t* blk = out.data() + b * k::kQ8BlockBytes;
      if ((blk[0] | (blk[1] << 8)) != 0x3C00) {  // d = 1.0
        if (bad++ < 5) fail_detail("rounding sweep block %zu: d16 0x%04x, want 0x3c00", b, blk[0] | (blk[1] << 8));
        continue;
      }
      for (std::size_t j = 0; j < 32; ++j) {
        const int q = static_cast<std::int8_t>(blk[2 + j]);
        if (q != want[b * 32 + j]) {
          if (bad++ < 5)
            fail_detail("%s rounding: x = %.9g (0x%08" PRIx32 "): q = %d, roundf gives %d", simd ? "neon" : "scalar",
                        static_cast<double>(x[b * 32 + j]), f32_bits(x[b * 32 + j]), q, want[b * 32 + j]);
        }
      }
    }
    check(bad == 0 && r.first_nonfinite == k::kNoIndex,
          std::string(simd ? "neon" : "scalar") + " Q8_0 rounding == roundf on " + std::to_string(vals.size()) +
              " floats in [-127, 127] (ties around every k + 0.5)");
  }
  k::set_simd_enabled(true);
  return vals.size();
}

// The kernels' software f32 -> f16 (round to nearest even) against the arm64
// hardware conversion FCVT (vcvt_f16_f32) on a stride through all float32
// bit patterns plus every pattern near the fp16 range limits.
std::size_t check_f32_to_f16() {
  std::vector<std::uint32_t> bits;
  for (std::uint64_t b = 0; b <= 0xFFFFFFFFull; b += 4099) bits.push_back(static_cast<std::uint32_t>(b));
  const std::uint32_t edges[] = {0x33000000u /*2^-25*/, 0x33800000u, 0x387FC000u /*2^-14*/, 0x38800000u,
                                 0x477FE000u /*65504*/, 0x477FF000u /*65520*/, 0x47800000u, 0x7F800000u};
  for (std::uint32_t e : edges)
    for (std::uint32_t d = 0; d < 8192; ++d) {
      bits.push_back(e - 4096 + d);
      bits.push_back((e - 4096 + d) | 0x80000000u);
    }
  std::size_t bad = 0, nan_diff = 0;
  for (std::size_t i = 0; i + 4 <= bits.size(); i += 4) {
    const float32x4_t v = vreinterpretq_f32_u32(vld1q_u32(bits.data() + i));
    std::uint16_t hw[4];
    vst1_u16(hw, vreinterpret_u16_f16(vcvt_f16_f32(v)));
    for (int j = 0; j < 4; ++j) {
      const float f = bits_f32(bits[i + j]);
      const std::uint16_t sw = k::f32_to_f16_rne(f);
      if (sw == hw[j]) continue;
      if (std::isnan(f)) {
        ++nan_diff;  // NaN never reaches the scale conversion (input is rejected)
        continue;
      }
      if (bad++ < 5)
        fail_detail("f32_to_f16_rne(0x%08" PRIx32 " = %.9g) = 0x%04x, FCVT gives 0x%04x", bits[i + j],
                    static_cast<double>(f), sw, hw[j]);
    }
  }
  check(bad == 0, "f32_to_f16_rne == arm64 FCVT on " + std::to_string(bits.size()) + " float32 patterns");
  if (nan_diff) std::printf("note: f32_to_f16_rne differs from FCVT on %zu NaN inputs (unused)\n", nan_diff);
  return bits.size();
}

// Data for the threading checks: ordinary, tied, zero, subnormal and
// scale-overflow blocks.
std::vector<float> thread_test_data(std::size_t nblocks, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> half(-253, 253);
  std::vector<float> x(nblocks * 32);
  for (std::size_t b = 0; b < nblocks; ++b) {
    float* p = x.data() + b * 32;
    switch (b % 7) {
      case 0:
        for (int j = 0; j < 32; ++j) p[j] = nd(rng) * 0.02f;
        break;
      case 1:
        for (int j = 0; j < 32; ++j) p[j] = 0.5f * static_cast<float>(half(rng));
        p[b % 32] = 127.0f;
        break;
      case 2:
        for (int j = 0; j < 32; ++j) p[j] = (j % 2) ? -0.0f : 0.0f;
        break;
      case 3:
        for (int j = 0; j < 32; ++j) p[j] = bits_f32(rng() & 0x807FFFFFu);  // subnormals
        break;
      case 4:
        for (int j = 0; j < 32; ++j) p[j] = nd(rng) * 1e7f;  // d16 = +Inf for most
        break;
      default:
        for (int j = 0; j < 32; ++j) p[j] = nd(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 200) - 100);
    }
  }
  return x;
}

std::size_t check_threads() {
  // kQuantGrain is 4096 blocks and kDecodeGrain 131072 elements (dispatch.cpp):
  // these sizes give several chunks and a short last one.
  const std::size_t nb = 5 * 4096 + 123;
  std::size_t checked = 0;
  const std::vector<float> xf = thread_test_data(nb, 1234);
  std::vector<std::uint16_t> xb(xf.size()), xh(xf.size());
  for (std::size_t i = 0; i < xf.size(); ++i) {
    xb[i] = static_cast<std::uint16_t>(f32_bits(xf[i]) >> 16);
    xh[i] = k::f32_to_f16_rne(xf[i]);
    if ((xh[i] & 0x7FFFu) == 0x7C00u) xh[i] = static_cast<std::uint16_t>(xh[i] - 1);  // +-Inf -> +-65504
  }
  const struct {
    hf2q::DType t;
    const void* p;
    const char* name;
  } srcs[] = {{hf2q::DType::F32, xf.data(), "f32"}, {hf2q::DType::BF16, xb.data(), "bf16"}, {hf2q::DType::F16, xh.data(), "f16"}};
  const int thread_counts[] = {1, 2, 3, 4, 8};
  for (const auto& s : srcs) {
    k::set_simd_enabled(true);
    hf2q::set_num_threads(1);
    std::vector<std::uint8_t> ref(nb * k::kQ8BlockBytes);
    const k::Q8Result r1 = k::quantize_q8_0_range(s.t, s.p, ref.data(), nb);
    check(r1.first_nonfinite == k::kNoIndex && (s.t == hf2q::DType::F16 || r1.inf_scales > 0),
          std::string("threads ") + s.name + ": single-threaded run is finite (f32/bf16: with some +Inf scales)");
    for (int simd = 1; simd >= 0; --simd) {
      k::set_simd_enabled(simd != 0);
      for (int t : thread_counts) {
        hf2q::set_num_threads(t);
        OutBuf out(nb * k::kQ8BlockBytes);
        const k::Q8Result r = k::quantize_q8_0(s.t, s.p, out.data(), nb);
        const std::string what = std::string("threads ") + s.name + " quantize (" + (simd ? "neon" : "scalar") + ", " +
                                 std::to_string(t) + " threads) == neon single-threaded";
        compare_q8(what, kQ8F32, nullptr, out.data(), ref.data(), nb);
        check(r.first_nonfinite == k::kNoIndex && r.inf_scales == r1.inf_scales && out.guard_intact(),
              what + ": result and guard");
        checked += nb * 32;
      }
    }
  }

  // Smallest first_nonfinite over chunks, for any thread count (repeated: races).
  {
    std::vector<float> x = xf;
    const std::size_t idx_late = (3 * 4096 + 10) * 32 + 7;   // chunk 3
    const std::size_t idx_early = (4096 + 2000) * 32 + 31;   // chunk 1
    x[idx_late] = bits_f32(0x7FC00000u);
    x[idx_early] = bits_f32(0xFF800000u);
    x[nb * 32 - 1] = bits_f32(0x7F800000u);  // last (short) chunk
    std::vector<std::uint8_t> ref(nb * k::kQ8BlockBytes);
    k::set_simd_enabled(true);
    hf2q::set_num_threads(1);
    (void)k::quantize_q8_0_range(hf2q::DType::F32, xf.data(), ref.data(), nb);
    for (int simd = 1; simd >= 0; --simd) {
      k::set_simd_enabled(simd != 0);
      for (int t : thread_counts) {
        hf2q::set_num_threads(t);
        bool ok = true;
        for (int rep = 0; rep < 4; ++rep) {
          OutBuf out(nb * k::kQ8BlockBytes);
          const k::Q8Result r = k::quantize_q8_0(hf2q::DType::F32, x.data(), out.data(), nb);
          if (r.first_nonfinite != idx_early) {
            ok = false;
            fail_detail("first_nonfinite with %d threads: got %zu, want %zu", t, r.first_nonfinite, idx_early);
          }
          // chunk 0 precedes every bad element: fully written
          if (std::memcmp(out.data(), ref.data(), 4096 * k::kQ8BlockBytes) != 0 || !out.guard_intact()) ok = false;
        }
        check(ok, std::string("threads: smallest first_nonfinite over chunks (") + (simd ? "neon" : "scalar") + ", " +
                      std::to_string(t) + " threads)");
      }
    }
  }

  // dequantize and decoders: pool == range
  {
    k::set_simd_enabled(true);
    hf2q::set_num_threads(1);
    std::vector<std::uint8_t> q(nb * k::kQ8BlockBytes);
    (void)k::quantize_q8_0_range(hf2q::DType::F32, xf.data(), q.data(), nb);
    OutBuf ref(nb * 32 * 4);
    k::dequantize_q8_0_range(q.data(), reinterpret_cast<float*>(ref.data()), nb);
    const std::size_t n16 = 3 * 131072 + 77;
    std::vector<std::uint16_t> h(n16);
    for (std::size_t i = 0; i < n16; ++i) h[i] = static_cast<std::uint16_t>(i * 40503u + 7u);
    OutBuf rb(n16 * 4), rh(n16 * 4);
    k::bf16_to_f32_range(h.data(), reinterpret_cast<float*>(rb.data()), n16);
    k::f16_to_f32_range(h.data(), reinterpret_cast<float*>(rh.data()), n16);
    for (int t : thread_counts) {
      hf2q::set_num_threads(t);
      const std::string ts = " (" + std::to_string(t) + " threads) == single-threaded";
      OutBuf out(nb * 32 * 4);
      k::dequantize_q8_0(q.data(), reinterpret_cast<float*>(out.data()), nb);
      compare_f32("threads: dequantize" + ts, out.data(), ref.data(), nb * 32, false);
      OutBuf ob(n16 * 4), oh(n16 * 4);
      k::bf16_to_f32(h.data(), reinterpret_cast<float*>(ob.data()), n16);
      k::f16_to_f32(h.data(), reinterpret_cast<float*>(oh.data()), n16);
      compare_f32("threads: bf16_to_f32" + ts, ob.data(), rb.data(), n16, false);
      compare_f32("threads: f16_to_f32" + ts, oh.data(), rh.data(), n16, false);
      check(out.guard_intact() && ob.guard_intact() && oh.guard_intact(), "threads: guards intact" + ts);
      checked += nb * 32 + 2 * n16;
    }
  }
  hf2q::set_num_threads(1);
  k::set_simd_enabled(true);
  return checked;
}

// Many short pooled jobs right after the workers were (re)started, each
// checked for completeness when parallel_for returns: a pool that lets
// parallel_for return before every chunk has run (or hangs) fails here.
void check_pool_stress(int iterations) {
  const std::size_t nb = 4 * 256 + 7, grain = 256;  // 5 chunks
  std::vector<float> x(nb * 32);
  std::mt19937 rng(99);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : x) v = nd(rng);
  std::vector<std::uint8_t> ref(nb * k::kQ8BlockBytes), out(nb * k::kQ8BlockBytes);
  k::set_simd_enabled(true);
  (void)k::quantize_q8_0_range(hf2q::DType::F32, x.data(), ref.data(), nb);
  int bad = 0;
  for (int i = 0; i < iterations; ++i) {
    const int t = 2 + i % 3;
    if (i % 2 == 0) hf2q::set_num_threads(t);  // restart the workers every other job
    std::memset(out.data(), 0, out.size());
    std::atomic<std::size_t> done{0};
    hf2q::parallel_for(nb, grain, [&](std::size_t b, std::size_t e) {
      (void)k::quantize_q8_0_range(hf2q::DType::F32, x.data() + b * 32, out.data() + b * k::kQ8BlockBytes, e - b);
      done.fetch_add(e - b);
    });
    const std::size_t got = done.load();
    if (got != nb || std::memcmp(out.data(), ref.data(), out.size()) != 0) {
      if (bad++ < 5)
        fail_detail("pool stress iteration %d (%d threads): parallel_for returned after %zu of %zu blocks%s", i, t,
                    got, nb, got == nb ? " with wrong output" : "");
    }
  }
  check(bad == 0, "threads: parallel_for returns only after every chunk ran (" + std::to_string(iterations) +
                      " jobs, workers restarted every other job): " + std::to_string(bad) + " bad");
  hf2q::set_num_threads(1);
}

void on_watchdog(int) {
  char msg[256];
  const int len = std::snprintf(msg, sizeof msg,
                                "\narm64 driver: TIMEOUT during %s: no progress (a deadlock?); %d passed, %d failed "
                                "so far\n",
                                kPhaseNames[g_phase], g_passed, g_failed);
  if (len > 0) (void)!write(2, msg, static_cast<std::size_t>(len));
  _exit(3);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s VECTORS.bin\n", argv[0]);
    return 2;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  // Watchdog: a normal run takes seconds even under emulation.
  int timeout_s = 120;
  if (const char* env = std::getenv("HF2Q_ARM64_DRIVER_TIMEOUT")) timeout_s = std::atoi(env);
  if (timeout_s > 0) {
    std::signal(SIGALRM, on_watchdog);
    alarm(static_cast<unsigned>(timeout_s));
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Record> recs;
  if (!load_vectors(argv[1], recs)) return 2;
  for (const Record& r : recs) {
    if (!record_sizes_ok(r)) {
      std::fprintf(stderr, "arm64 driver: record '%s' (kind %u) has inconsistent sizes\n", r.label.c_str(), r.kind);
      return 2;
    }
  }
  std::printf("arm64 driver: isa %s (best %s), %d default threads, %zu vector records\n",
              k::isa_name(k::active_isa()), k::isa_name(k::best_isa()), hf2q::get_num_threads(), recs.size());

  check_isa();
  std::size_t per_kind[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::size_t nonfinite_records = 0;
  for (const Record& r : recs) {
    per_kind[r.kind] += check_record(r);
    nonfinite_records += r.first_bad >= 0;
  }
  std::printf("vectors vs x86 hf2q.reference (neon, scalar, pooled): bf16->f32 %zu, f16->f32 %zu values; "
              "q8_0 from f32 %zu, bf16 %zu, f16 %zu elements (%zu non-finite rejection records); "
              "dequantized %zu values\n",
              per_kind[kBf16F32], per_kind[kF16F32], per_kind[kQ8F32], per_kind[kQ8Bf16], per_kind[kQ8F16],
              nonfinite_records, per_kind[kDeqQ8]);
  std::printf("k-quants from f32 vs ggml's bytes (neon, scalar, pooled): %zu elements\n", per_kind[kKQuantF32]);
  if (g_nan_sign_only)
    std::printf("note: %zu dequantized NaNs (0 x +-Inf scale) differ from the x86 reference only as the "
                "default NaN does (x86 0xFFC00000, arm64 0x7FC00000); accepted\n",
                g_nan_sign_only);
  g_phase = kPhaseSelf;
  check_decoder_tails();
  const std::size_t nround = check_rounding();
  const std::size_t nf16 = check_f32_to_f16();
  std::printf("self checks: rounding %zu floats vs roundf, f32->f16 %zu patterns vs FCVT\n", nround, nf16);
  g_phase = kPhaseThreads;
  // The threading checks take a few seconds under emulation: a pool that
  // deadlocks is reported after at most a minute.
  if (timeout_s > 0) {
    const unsigned left = alarm(0);
    alarm(left == 0 || left > 60 ? 60u : left);
  }
  const std::size_t nthr = check_threads();
  const int stress = 300;
  check_pool_stress(stress);
  std::printf("threading: %zu elements through the pool (1..8 threads), %d pool stress jobs\n", nthr, stress);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int ph = 0; ph < 3; ++ph)
    std::printf("  %-42s %4d passed, %d failed\n", kPhaseNames[ph], g_phase_passed[ph], g_phase_failed[ph]);
  std::printf("arm64 driver: %d passed, %d failed (%.1f s)\n", g_passed, g_failed, secs);
  if (g_failed) {
    const bool kernels_ok = g_phase_failed[kPhaseVectors] == 0 && g_phase_failed[kPhaseSelf] == 0;
    std::fprintf(stderr, "arm64 driver: %d check(s) FAILED (details above): %s\n", g_failed,
                 kernels_ok ? "single-threaded NEON and scalar kernels matched; the failures are in the "
                              "multi-threaded (thread pool) checks"
                            : "NEON/scalar output differs from the x86 reference or from each other");
    return 1;
  }
  return 0;
}
