// CUDA backend: weights in device memory (cuMemAlloc, never managed memory),
// uploads that overlap disk, PCIe and GPU, conversions on the GPU, read-back
// checksums on the GPU. No CUDA toolkit at build time: the driver API and
// NVRTC are loaded at run time (cuda_api.h); the kernels (shaders/
// cuda_kernels.cu) are embedded at build time, compiled with NVRTC for the
// GPU's architecture on first use and cached on disk.
//
// Uploads. The source (a file, or CPU memory) is cut into chunks of at most
// kSlotBytes; worker threads each take a free slot of a ring of pinned
// staging buffers, fill it (pread, or memcpy), and queue an async H2D copy on
// the slot's stream: straight into the buffer for raw data, into the slot's
// device scratch followed by a conversion kernel otherwise. A slot is reused
// once its event says the copy finished (a kernel converting from the
// scratch stays ordered before the slot's next copy by the stream), so at most the ring is
// staged, never a whole tensor. Every upload waits for its copies before it
// returns: the data is on the GPU for any consumer stream.
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cuda_api.h"
#include "device/backend.h"
#include "hf2q_cuda_source.h"
#include "kernels/format_kernels.h"
#include "kernels/thread_pool.h"

namespace hf2q::device {
namespace {

using namespace cuda;

constexpr std::size_t kSlotBytes = 4u << 20;  // default; a multiple of 32 elements of every source dtype
constexpr int kStatusCells = 256;             // concurrent converting uploads before one waits
constexpr unsigned kBlock = 256;

std::uint32_t cpu_default_nan_bits() {
  volatile float zero = 0.0f;
  volatile float inf = std::numeric_limits<float>::infinity();
  const float nan = zero * inf;
  std::uint32_t bits = 0;
  std::memcpy(&bits, &nan, sizeof bits);
  return bits;
}

std::uint64_t fnv1a(std::uint64_t h, const std::string& s) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return (h ^ 0xFFu) * 1099511628211ull;
}

std::string mib(std::size_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%zu bytes (%.1f MiB)", bytes, static_cast<double>(bytes) / (1 << 20));
  return buf;
}

bool read_whole(const std::string& path, std::string* out) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  std::string data;
  char buf[1 << 16];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) data.append(buf, n);
  const bool ok = std::ferror(f) == 0;
  std::fclose(f);
  if (ok) out->swap(data);
  return ok && !out->empty();
}

// mkdir -p; best effort (the cache is an optimisation).
void make_dirs(const std::string& dir) {
  for (std::size_t i = 1; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') ::mkdir(dir.substr(0, i).c_str(), 0755);
  }
}

// Written to a temporary name and renamed, so concurrent processes never
// read a half-written cubin.
void write_atomically(const std::string& dir, const std::string& path, const std::string& data) {
  make_dirs(dir);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." +
                          std::to_string(reinterpret_cast<std::uintptr_t>(&data));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  std::size_t done = 0;
  bool ok = true;
  while (done < data.size()) {
    const ssize_t w = ::write(fd, data.data() + done, data.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      ok = false;
      break;
    }
    done += static_cast<std::size_t>(w);
  }
  ok = (::close(fd) == 0) && ok;
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) ::unlink(tmp.c_str());
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(const Driver* d, CUdevice dev, CUcontext ctx, BackendInfo info, int sm_count, int cc)
      : d_(d), dev_(dev), ctx_(ctx), info_(std::move(info)), sm_count_(sm_count), cc_(cc),
        default_nan_(cpu_default_nan_bits()), pid_(::getpid()) {}

  ~CudaBackend() override {
    // A forked child owns none of this: the driver's objects are the parent's.
    if (forked()) return;
    // Errors are ignored: at interpreter exit the driver may be shutting down.
    if (d_->cuCtxPushCurrent(ctx_) == CUDA_SUCCESS) {
      for (Slot& s : slots_) {
        if (s.stream) d_->cuStreamSynchronize(s.stream);
        if (s.done) d_->cuEventDestroy(s.done);
        if (s.stream) d_->cuStreamDestroy(s.stream);
        if (s.scratch) d_->cuMemFree(s.scratch);
      }
      free_ring_host(ring_len_);
      if (status_dev_) d_->cuMemFree(status_dev_);
      if (status_host_) d_->cuMemFreeHost(status_host_);
      if (misc_) {
        d_->cuStreamSynchronize(misc_);
        d_->cuStreamDestroy(misc_);
      }
      if (gather_) {
        d_->cuStreamSynchronize(gather_);
        d_->cuStreamDestroy(gather_);
      }
      if (module_) d_->cuModuleUnload(module_);
      CUcontext prev = nullptr;
      d_->cuCtxPopCurrent(&prev);
    }
    d_->cuDevicePrimaryCtxRelease(dev_);
  }

  const BackendInfo& info() const override { return info_; }

  // Compiles (or loads from the cache) the kernels and makes the streams.
  bool init(std::string* why) {
    try {
      Ctx c(*this);
      check(d_->cuStreamCreate(&misc_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
      check(d_->cuStreamCreate(&gather_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
      if (!load_kernels(why)) return false;
      void* host = nullptr;
      check(d_->cuMemHostAlloc(&host, sizeof(std::uint64_t) * 2 * kStatusCells, CU_MEMHOSTALLOC_PORTABLE),
            "cuMemHostAlloc");
      status_host_ = static_cast<std::uint64_t*>(host);
      check(d_->cuMemAlloc(&status_dev_, sizeof(std::uint64_t) * 2 * kStatusCells), "cuMemAlloc");
      for (int i = kStatusCells - 1; i >= 0; --i) free_status_.push_back(i);
      return true;
    } catch (const DeviceError& e) {
      *why = e.what();
      return false;
    }
  }

  // ------------------------------------------------------------ memory

  bool memory(std::size_t* free_bytes, std::size_t* total_bytes) override {
    Ctx c(*this);
    return d_->cuMemGetInfo(free_bytes, total_bytes) == CUDA_SUCCESS;
  }

  void* allocate(std::size_t len, void** handle) override {
    Ctx c(*this);
    CUdeviceptr p = 0;
    const CUresult r = d_->cuMemAlloc(&p, len);
    if (r != CUDA_SUCCESS) {
      std::size_t free_b = 0, total_b = 0;
      d_->cuMemGetInfo(&free_b, &total_b);
      throw DeviceError("cannot allocate " + mib(len) + " of CUDA device memory on " + info_.name + " (" +
                        mib(free_b) + " free of " + mib(total_b) + "): " + describe(*d_, "cuMemAlloc", r));
    }
    try {
      check(d_->cuMemsetD8Async(p, 0, len, misc_), "cuMemsetD8Async");  // zero-filled, as on every backend
      check(d_->cuStreamSynchronize(misc_), "cuStreamSynchronize");
    } catch (...) {
      d_->cuMemFree(p);
      throw;
    }
    *handle = reinterpret_cast<void*>(static_cast<std::uintptr_t>(p));
    return *handle;
  }

  void release(void*, void* ptr, std::size_t) noexcept override {
    if (ptr == nullptr || forked()) return;  // a forked child's copy of a buffer is the parent's memory
    if (d_->cuCtxPushCurrent(ctx_) != CUDA_SUCCESS) return;
    // No copy into this buffer may still be in flight when it is freed.
    wait_uploads();
    d_->cuMemFree(dptr(ptr));
    CUcontext prev = nullptr;
    d_->cuCtxPopCurrent(&prev);
  }

  // Device memory from cuMemAlloc is never paged out or migrated: every
  // buffer in the (bookkeeping) set is resident, so it counts as locked.
  bool wire(void*, void*, std::size_t, bool) override { return true; }

  // ------------------------------------------------------------ uploads

  UploadResult write(const UploadTarget& dst, const UploadPlan& p, const void* src) override {
    const Source one{&p, 0, -1, 0, static_cast<const std::uint8_t*>(src)};
    return upload(dst, &one, 1);
  }

  UploadResult read_file(const UploadTarget& dst, const UploadPlan& p, int fd, std::uint64_t file_offset) override {
    const Source one{&p, 0, fd, file_offset, nullptr};
    return upload(dst, &one, 1);
  }

  UploadResult read_file_segments(const UploadTarget& dst, const std::vector<FileSegment>& segments) override {
    if (segments.empty()) return {};
    const std::vector<Source> srcs = sources_of(segments);
    return upload(dst, srcs.data(), srcs.size());
  }

  void synchronize() override {
    Ctx c(*this);
    check(wait_uploads(), "cuStreamSynchronize (uploads in flight)");
  }

  // Waits for every upload left in flight before this call (the caller has
  // the context current). Generations, not a flag: a thread that finds
  // another one already waiting must still wait itself, and an upload that
  // goes in flight during the wait must not be marked done by it.
  CUresult wait_uploads() noexcept {
    const std::uint64_t want = issued_.load(std::memory_order_acquire);
    if (synced_.load(std::memory_order_acquire) >= want) return CUDA_SUCCESS;
    CUresult sync = CUDA_SUCCESS;
    for (Slot& s : slots_) {
      const CUresult r = d_->cuStreamSynchronize(s.stream);
      if (sync == CUDA_SUCCESS) sync = r;
    }
    if (sync != CUDA_SUCCESS) return sync;
    std::uint64_t seen = synced_.load(std::memory_order_relaxed);
    while (seen < want && !synced_.compare_exchange_weak(seen, want, std::memory_order_release)) {
    }
    return CUDA_SUCCESS;
  }

  // Both buffers on this GPU: the conversion kernel (or a device copy) alone.
  UploadResult convert(const UploadTarget& dst, const UploadPlan& p, void*, const void* src) override {
    UploadResult res;
    if (p.src_bytes == 0) return res;
    Ctx c(*this);
    const CUdeviceptr out = dptr(dst.base) + p.dst_off;
    CUdeviceptr from = dptr(src);
    if (p.op == UploadOp::Raw) {
      check(d_->cuMemcpyDtoDAsync(out, from, p.src_bytes, misc_), "cuMemcpyDtoDAsync");
      check(d_->cuStreamSynchronize(misc_), "cuStreamSynchronize");
      return res;
    }
    unsigned long long n = p.n_elems;
    if (p.op == UploadOp::Decode) {
      CUdeviceptr to = out;
      void* args[] = {&from, &to, &n};
      launch(kernel_for(p), grid_for(n, kBlock), misc_, args);
      check(d_->cuStreamSynchronize(misc_), "cuStreamSynchronize");
      return res;
    }
    const CUfunction kernel = kernel_for(p);
    return with_status_cell([&](CUdeviceptr status) {
      CUdeviceptr to = out;
      unsigned long long nblocks = n / dtype_block_elems(p.dst_dtype), base = 0;
      void* args[] = {&from, &to, &nblocks, &base, &status};
      launch(kernel, grid_for(nblocks, encode_blocks_per_cta(p)), misc_, args);
    });
  }

  // One kernel on misc_ that reports through a status cell ([0]: the first
  // NaN/Inf index, all ones for none; [1]: blocks whose scale overflowed),
  // waited for. `run(status)` launches it with the cell's device address.
  template <typename Run>
  UploadResult with_status_cell(Run&& run) {
    UploadResult res;
    const std::vector<int> cells = take_status_cells(1);
    try {
      CUdeviceptr status = status_dev_ + static_cast<std::size_t>(cells[0]) * 16;
      check(d_->cuMemsetD8Async(status, 0xFF, 8, misc_), "cuMemsetD8Async");
      check(d_->cuMemsetD8Async(status + 8, 0, 8, misc_), "cuMemsetD8Async");
      run(status);
      std::uint64_t* h = status_host_ + cells[0] * 2;
      check(d_->cuMemcpyDtoHAsync(h, status, 16, misc_), "cuMemcpyDtoHAsync");
      check(d_->cuStreamSynchronize(misc_), "cuStreamSynchronize");
      res.first_nonfinite = h[0] == ~0ull ? static_cast<std::size_t>(-1) : static_cast<std::size_t>(h[0]);
      res.inf_scales = static_cast<std::size_t>(h[1]);
    } catch (...) {
      put_status_cells(cells);
      throw;
    }
    put_status_cells(cells);
    return res;
  }

  void copy_out(void*, const void* ptr, std::size_t offset, void* out, std::size_t len) override {
    Ctx c(*this);
    check(d_->cuMemcpyDtoHAsync(out, dptr(ptr) + offset, len, misc_), "cuMemcpyDtoHAsync");
    check(d_->cuStreamSynchronize(misc_), "cuStreamSynchronize");
  }

  void checksums(DType dtype, void*, const void* ptr, std::size_t numel, std::uint32_t* out,
                 std::size_t ngroups) override {
    if (ngroups == 0) return;
    if (ngroups != (numel + kVerifyGroup - 1) / kVerifyGroup) throw DeviceError("GPU checksums: bad arguments");
    const int dt = static_cast<int>(dtype);
    const CUfunction fn = dt >= 0 && dt < kNumDTypes ? fn_verify_[dt] : nullptr;
    if (fn == nullptr) throw DeviceError("GPU checksums: no CUDA read-back kernel for dtype " + std::to_string(dt));
    Ctx c(*this);
    CUdeviceptr sums = 0;
    check(d_->cuMemAlloc(&sums, ngroups * sizeof(std::uint32_t)), "cuMemAlloc (checksums)");
    try {
      CUdeviceptr data = dptr(ptr);
      unsigned long long n = numel, g = ngroups;
      unsigned nan = default_nan_;
      void* args[] = {&data, &n, &sums, &g, &nan};
      launch(fn, grid_for(ngroups, 1), misc_, args);
      check(d_->cuMemcpyDtoHAsync(out, sums, ngroups * sizeof(std::uint32_t), misc_), "cuMemcpyDtoHAsync");
      check(d_->cuStreamSynchronize(misc_), "cuStreamSynchronize");
    } catch (...) {
      d_->cuMemFree(sums);
      throw;
    }
    d_->cuMemFree(sums);
  }

 private:
  struct Slot {
    void* host = nullptr;       // pinned staging, slot_bytes_ (a part of the ring's memory)
    CUdeviceptr scratch = 0;    // device copy of the staged source, for conversions
    CUstream stream = nullptr;
    CUevent done = nullptr;     // recorded after the slot's last copy (its host memory is free then)
    bool pending = false;
  };

  // Makes the primary context current for this thread's driver calls and
  // restores whatever was current before (we live inside others' processes).
  class Ctx {
   public:
    explicit Ctx(CudaBackend& b) : b_(b) {
      if (b_.forked()) throw DeviceError(std::string("cannot use ") + b_.info_.name + ": " + cuda::kForkedChild);
      b_.check(b_.d_->cuCtxPushCurrent(b_.ctx_), "cuCtxPushCurrent");
    }
    ~Ctx() {
      CUcontext prev = nullptr;
      b_.d_->cuCtxPopCurrent(&prev);
    }
    Ctx(const Ctx&) = delete;
    Ctx& operator=(const Ctx&) = delete;

   private:
    CudaBackend& b_;
  };

  void check(CUresult r, const char* what) const {
    if (r != CUDA_SUCCESS) throw DeviceError("CUDA error on " + info_.name + ": " + describe(*d_, what, r));
  }

  bool forked() const noexcept { return ::getpid() != pid_; }

  static CUdeviceptr dptr(const void* p) { return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p)); }

  unsigned grid_for(std::size_t items, std::size_t items_per_block) const {
    const std::size_t want = (items + items_per_block - 1) / items_per_block;
    const std::size_t cap = static_cast<std::size_t>(sm_count_) * 32;  // grid-stride beyond this
    return static_cast<unsigned>(std::max<std::size_t>(1, std::min(want, cap)));
  }

  void launch(CUfunction f, unsigned grid, CUstream stream, void** args) {
    check(d_->cuLaunchKernel(f, grid, 1, 1, kBlock, 1, 1, 0, stream, args, nullptr), "cuLaunchKernel");
  }

  bool load_kernels(std::string* why) {
    const int major = cc_ / 10, minor = cc_ % 10;
    const std::string arch = "sm_" + std::to_string(major) + std::to_string(minor);
    // No fast math of any kind: Q8_0 bytes depend on IEEE division,
    // multiplication and no contraction.
    const std::vector<std::string> opts = {"--gpu-architecture=" + arch, "--fmad=false", "--ftz=false",
                                           "--prec-div=true", "--prec-sqrt=true", "--std=c++17"};
    int drv = 0;
    d_->cuDriverGetVersion(&drv);
    std::uint64_t key = 1469598103934665603ull;
    key = fnv1a(key, kCudaKernelSource);
    for (const auto& o : opts) key = fnv1a(key, o);
    key = fnv1a(key, std::to_string(drv));
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(key));
    const std::string dir = cuda::cache_dir();
    const std::string path = dir.empty() ? std::string() : dir + "/kernels-" + arch + "-" + hex + ".cubin";

    std::string cubin;
    if (!path.empty() && read_whole(path, &cubin) && d_->cuModuleLoadData(&module_, cubin.data()) == CUDA_SUCCESS) {
      return bind_functions(why);
    }
    module_ = nullptr;

    std::string nvrtc_why;
    const Nvrtc* n = cuda::nvrtc(&nvrtc_why);
    if (n == nullptr) {
      *why = nvrtc_why;
      return false;
    }
    int vmaj = 0, vmin = 0;
    n->nvrtcVersion(&vmaj, &vmin);
    const std::string nv = "NVRTC " + std::to_string(vmaj) + "." + std::to_string(vmin) + " (" + n->path + ")";
    nvrtcProgram prog = nullptr;
    int r = n->nvrtcCreateProgram(&prog, kCudaKernelSource, "hf2q_cuda_kernels.cu", 0, nullptr, nullptr);
    if (r != 0) {
      *why = nv + " could not create a program: " + n->nvrtcGetErrorString(r);
      return false;
    }
    std::vector<const char*> argv;
    for (const auto& o : opts) argv.push_back(o.c_str());
    r = n->nvrtcCompileProgram(prog, static_cast<int>(argv.size()), argv.data());
    if (r != 0) {
      std::size_t log_len = 0;
      std::string log;
      if (n->nvrtcGetProgramLogSize(prog, &log_len) == 0 && log_len > 1) {
        log.resize(log_len);
        n->nvrtcGetProgramLog(prog, &log[0]);
        log.resize(std::min<std::size_t>(log_len - 1, 4000));
      }
      n->nvrtcDestroyProgram(&prog);
      *why = nv + " could not compile the kernels for " + arch + " (" + n->nvrtcGetErrorString(r) +
             "; an NVRTC older than this GPU?): " + log;
      return false;
    }
    std::size_t size = 0;
    if (n->nvrtcGetCUBINSize(prog, &size) != 0 || size == 0) {
      n->nvrtcDestroyProgram(&prog);
      *why = nv + " produced no cubin for " + arch;
      return false;
    }
    cubin.assign(size, '\0');
    n->nvrtcGetCUBIN(prog, &cubin[0]);
    n->nvrtcDestroyProgram(&prog);
    const CUresult lr = d_->cuModuleLoadData(&module_, cubin.data());
    if (lr != CUDA_SUCCESS) {
      module_ = nullptr;
      *why = "the NVIDIA driver (CUDA " + std::to_string(drv / 1000) + "." + std::to_string(drv % 1000 / 10) +
             ") cannot load the kernels " + nv + " built for " + arch + ": " +
             describe(*d_, "cuModuleLoadData", lr) + " (an NVRTC newer than the driver?)";
      return false;
    }
    if (!path.empty()) write_atomically(dir, path, cubin);
    return bind_functions(why);
  }

  // The kernels the format table names (format_kernels.h), for the
  // conversions it allows: each source's decode into f32, each format's
  // encode from each of its sources, each format's read-back.
  bool bind_functions(std::string* why) {
    auto bind = [&](const std::string& name, CUfunction* fn) {
      const CUresult r = d_->cuModuleGetFunction(fn, module_, name.c_str());
      if (r != CUDA_SUCCESS) {
        *why = "the compiled kernels lack " + name + ": " + describe(*d_, "cuModuleGetFunction", r);
        return false;
      }
      return true;
    };
    for (int d = 0; d < kNumDTypes; ++d) {
      const FormatRow& row = kFormats[d];
      if (row.kernels == nullptr) continue;  // no kernels: every conversion and read-back is refused
      const kernels::FormatKernels& k = *row.kernels;
      if (k.cuda_verify != nullptr && !bind(k.cuda_verify, &fn_verify_[d])) return false;
      for (int s = 0; s < kNumDTypes; ++s) {
        if ((row.sources & dtype_bit(static_cast<DType>(s))) == 0 || kFormats[s].kernels == nullptr) continue;
        const kernels::FormatKernels& from = *kFormats[s].kernels;
        if (d == static_cast<int>(DType::F32)) {
          if (from.cuda_to_f32 != nullptr && !bind(from.cuda_to_f32, &fn_to_f32_[s])) return false;
        } else if (k.cuda_encode != nullptr) {
          if (!bind(std::string(k.cuda_encode) + "_" + kFormats[s].name, &fn_encode_[d][s])) return false;
        }
      }
    }
    // The scaled FP8 decoders (shaders/cuda_kernels.cu, hf2q_scaled_<weight>_<out>).
    const char* weights[2] = {"f8_e4m3", "f8_e5m2"};
    const char* outs[4] = {"f32", "bf16", "f16", "q8_0"};
    for (int wi = 0; wi < 2; ++wi) {
      for (int oi = 0; oi < 4; ++oi) {
        if (!bind(std::string("hf2q_scaled_") + weights[wi] + "_" + outs[oi], &fn_scaled_fp8_[wi][oi])) return false;
        if (!bind(std::string("hf2q_gather_") + weights[wi] + "_" + outs[oi], &fn_gather_fp8_[wi][oi])) return false;
      }
    }
    return bind("hf2q_transpose_units_u32", &fn_transpose_u32_) && bind("hf2q_transpose_units_u8", &fn_transpose_u8_) &&
           bind("hf2q_widen_gather", &fn_widen_gather_);
  }

  // A buffer's unit grids transposed on this GPU: the region is copied to a
  // scratch allocation, then one kernel writes each grid back transposed
  // (4-byte words when every size allows, else bytes). Several buffers (a
  // loader's batch) wait for the uploads once and share one scratch, as
  // large as the largest region, their copies and kernels in order on one
  // stream; one wait at the end, before the scratch is freed.
  void transpose_units(const UploadTarget& buf, const kernels::UnitGrid& g) override {
    transpose_units_many({{buf, g}});
  }

  void transpose_units_many(const std::vector<std::pair<UploadTarget, kernels::UnitGrid>>& items) override {
    std::size_t most = 0;
    for (const auto& item : items) most = std::max(most, item.second.extent());
    if (most == 0) return;
    Ctx c(*this);
    check(wait_uploads(), "cuStreamSynchronize (uploads in flight)");
    CUdeviceptr scratch = 0;
    check(d_->cuMemAlloc(&scratch, most), "cuMemAlloc (transpose scratch)");
    CUresult r = CUDA_SUCCESS;
    for (const auto& [buf, g] : items) {
      const std::size_t len = g.extent();
      if (len == 0) continue;
      const bool words = g.period % 4 == 0 && g.start % 4 == 0 && g.unit % 4 == 0 && dptr(buf.base) % 4 == 0;
      const unsigned long long w = words ? 4 : 1;
      struct Geo {
        unsigned long long outer, period, start, a, b, unit;
      } geo{g.outer, g.period / w, g.start / w, g.a, g.b, g.unit / w};
      r = d_->cuMemcpyDtoDAsync(scratch, dptr(buf.base), len, misc_);
      if (r != CUDA_SUCCESS) break;
      CUdeviceptr from = scratch, to = dptr(buf.base);
      void* args[] = {&from, &to, &geo};
      const std::size_t units = g.outer * g.a * g.b * (g.unit / w);
      r = d_->cuLaunchKernel(words ? fn_transpose_u32_ : fn_transpose_u8_, grid_for(units, kBlock), 1, 1, kBlock, 1,
                             1, 0, misc_, args, nullptr);
      if (r != CUDA_SUCCESS) break;
    }
    const CUresult sync = d_->cuStreamSynchronize(misc_);  // before the scratch is freed
    d_->cuMemFree(scratch);
    check(r, "unit transpose");
    check(sync, "cuStreamSynchronize (unit transpose)");
  }

  // A scaled FP8 tensor on this GPU decoded by its kernel (one thread per
  // element; Q8_0 one per block), NaN/Inf and overflowed scales reported
  // through a status cell as the Q8_0 uploads report them.
  UploadResult scaled_fp8(const UploadTarget& dst, std::size_t dst_off, const void* w, const void* scale,
                          const kernels::ScaledFp8& g, DType out) override {
    const std::size_t n = g.numel();
    if (n == 0) return {};
    if (g.scale != DType::F32) throw DeviceError("GPU scaled FP8: the scales must be f32");
    const CUfunction fn = scaled_kernel(g.weight, out);
    if (fn == nullptr) throw DeviceError("GPU scaled FP8: no kernel for these formats");
    // The Q8_0 decoder reads each block's 32 bytes as two 16-byte words; a
    // buffer starts at a page multiple of its allocation on this backend.
    if (dptr(w) % 16 != 0) throw DeviceError("GPU scaled FP8: the weights do not start 16-byte aligned");
    ScaledGeoArg geo = scaled_geo(g);
    Ctx c(*this);
    // The weight and scale buffers were just uploaded: their raw copies may
    // still be in flight on the staging streams, and this kernel runs on
    // misc_ (a GPU run read the first bytes of a weight before they landed).
    check(wait_uploads(), "cuStreamSynchronize (uploads in flight)");
    return with_status_cell([&](CUdeviceptr status) {
      CUdeviceptr wp = dptr(w), sp = dptr(scale), to = dptr(dst.base) + dst_off;
      unsigned long long items = out == DType::Q8_0 ? n / 32 : n, first = 0;
      void* args[] = {&wp, &sp, &to, &items, &geo, &status, &first};
      launch(fn, grid_for(items, kBlock), misc_, args);
    });
  }

  // Stacks gathered from this GPU's memory (a prefetched shard's bytes), on
  // a stream of their own: first every stack's scale tensors widened into
  // its float32 grid (one launch per scale format, from a table of (offset,
  // values, grid address) entries), then one launch per stack of the
  // gathered scaled decoder, grid row y decoding piece y of the stack's
  // table (its weights at their offset in the copy, its `first` the stack
  // index), all of a stack's pieces reporting into one status cell (a stack
  // index, as the staged decodes give it); one wait per 64 stacks. The
  // decoders read 16-byte words: a piece that does not start 16-byte
  // aligned in the copy (a shard whose tensor sizes are not multiples of
  // 16) is copied to a scratch buffer of the call's and decoded there by
  // the one-piece decoder, each such copy after the launch before it.
  std::vector<UploadResult> scaled_fp8_gather(const void* src, const std::vector<GatherStack>& stacks) override {
    constexpr unsigned kRowsPerLaunch = 65535;  // a grid's y extent
    std::size_t scratch_bytes = 0;
    std::vector<std::uint64_t> blob;  // the tables: scale entries by format, then each stack's aligned pieces
    std::size_t scale_at[3] = {0, 0, 0}, scale_n[3] = {0, 0, 0};
    std::vector<std::size_t> items_at(stacks.size()), items_n(stacks.size());
    for (unsigned kind = 0; kind < 3; ++kind) {
      scale_at[kind] = blob.size();
      for (const GatherStack& st : stacks) {
        const unsigned k = st.scale_src == DType::F32 ? 0 : st.scale_src == DType::BF16 ? 1 : 2;
        if (k != kind) continue;
        std::uint64_t at = dptr(st.scale);
        for (const auto& [off, count] : st.scale_pieces) {
          blob.insert(blob.end(), {static_cast<std::uint64_t>(off), static_cast<std::uint64_t>(count), at});
          at += count * sizeof(float);
          ++scale_n[kind];
        }
      }
    }
    for (std::size_t k = 0; k < stacks.size(); ++k) {
      const GatherStack& st = stacks[k];
      if (st.s.scale != DType::F32) throw DeviceError("GPU scaled FP8: the scales must be f32");
      if (scaled_kernel(st.s.weight, st.out) == nullptr || gather_kernel(st.s.weight, st.out) == nullptr) {
        throw DeviceError("GPU scaled FP8: no kernel for these formats");
      }
      items_at[k] = blob.size();
      const std::size_t per = st.s.rows * st.s.cols;  // sizes checked by Device::scaled_fp8_gather
      for (const GatherPiece& p : st.pieces) {
        const std::size_t n = p.lead * per;
        if ((dptr(src) + p.src_off) % 16 != 0) {
          scratch_bytes = std::max(scratch_bytes, n);
          continue;
        }
        blob.insert(blob.end(), {static_cast<std::uint64_t>(p.src_off), static_cast<std::uint64_t>(p.first),
                                 static_cast<std::uint64_t>(st.out == DType::Q8_0 ? n / 32 : n)});
        ++items_n[k];
      }
    }
    std::vector<UploadResult> out(stacks.size());
    Ctx c(*this);
    check(wait_uploads(), "cuStreamSynchronize (uploads in flight)");
    CUdeviceptr scratch = 0, table = 0;
    struct FreeAfter {  // (after an error too: the launches reading them are done first)
      CudaBackend* b;
      CUdeviceptr* p[2];
      ~FreeAfter() {
        b->d_->cuStreamSynchronize(b->gather_);
        for (CUdeviceptr* q : p) {
          if (*q != 0) b->d_->cuMemFree(*q);
        }
      }
    } free_after{this, {&scratch, &table}};
    if (scratch_bytes > 0) check(d_->cuMemAlloc(&scratch, scratch_bytes), "cuMemAlloc (gather scratch)");
    if (!blob.empty()) {
      check(d_->cuMemAlloc(&table, blob.size() * sizeof(std::uint64_t)), "cuMemAlloc (gather tables)");
      // (pageable: the call returns once the bytes are taken)
      check(d_->cuMemcpyHtoDAsync(table, blob.data(), blob.size() * sizeof(std::uint64_t), gather_),
            "cuMemcpyHtoDAsync (gather tables)");
    }
    CUdeviceptr from = dptr(src);
    for (unsigned kind = 0; kind < 3; ++kind) {
      if (scale_n[kind] == 0) continue;
      CUdeviceptr part = table + scale_at[kind] * sizeof(std::uint64_t);
      unsigned long long n = scale_n[kind];
      unsigned k = kind;
      void* args[] = {&from, &part, &n, &k};
      launch(fn_widen_gather_, grid_for(n * 32u, kBlock), gather_, args);
    }
    constexpr std::size_t kPerWait = kStatusCells / 4;  // leaves cells to a batch running beside it
    for (std::size_t begin = 0; begin < stacks.size(); begin += kPerWait) {
      const std::size_t end = std::min(stacks.size(), begin + kPerWait);
      const std::vector<int> cells = take_status_cells(end - begin);
      try {
        for (std::size_t k = begin; k < end; ++k) {
          const GatherStack& st = stacks[k];
          CUdeviceptr status = status_dev_ + static_cast<std::size_t>(cells[k - begin]) * 16;
          check(d_->cuMemsetD8Async(status, 0xFF, 8, gather_), "cuMemsetD8Async");
          check(d_->cuMemsetD8Async(status + 8, 0, 8, gather_), "cuMemsetD8Async");
          ScaledGeoArg geo = scaled_geo(st.s);
          const std::size_t per = st.s.rows * st.s.cols;
          CUdeviceptr sp = dptr(st.scale), to = dptr(st.dst.base) + st.dst_off;
          // The aligned pieces: one launch (per 65535 of them); the grid's x
          // extent sized for the largest piece.
          std::size_t most = 0;
          for (const GatherPiece& p : st.pieces) most = std::max(most, p.lead * per);
          const unsigned long long most_items = st.out == DType::Q8_0 ? most / 32 : most;
          for (std::size_t r = 0; r < items_n[k]; r += kRowsPerLaunch) {
            CUdeviceptr rows_at = table + (items_at[k] + 3 * r) * sizeof(std::uint64_t);
            const unsigned rows = static_cast<unsigned>(std::min<std::size_t>(kRowsPerLaunch, items_n[k] - r));
            void* args[] = {&from, &rows_at, &sp, &to, &geo, &status};
            check(d_->cuLaunchKernel(gather_kernel(st.s.weight, st.out), grid_for(most_items, kBlock), rows, 1, kBlock,
                                     1, 1, 0, gather_, args, nullptr),
                  "cuLaunchKernel");
          }
          // The others one at a time through the scratch.
          for (const GatherPiece& p : st.pieces) {
            CUdeviceptr wp = from + p.src_off;
            if (wp % 16 == 0) continue;
            const std::size_t n = p.lead * per;
            check(d_->cuMemcpyDtoDAsync(scratch, wp, n, gather_), "cuMemcpyDtoDAsync (gather scratch)");
            wp = scratch;
            unsigned long long items = st.out == DType::Q8_0 ? n / 32 : n, first = p.first;
            void* args[] = {&wp, &sp, &to, &items, &geo, &status, &first};
            launch(scaled_kernel(st.s.weight, st.out), grid_for(items, kBlock), gather_, args);
          }
          check(d_->cuMemcpyDtoHAsync(status_host_ + cells[k - begin] * 2, status, 16, gather_), "cuMemcpyDtoHAsync");
        }
        check(d_->cuStreamSynchronize(gather_), "cuStreamSynchronize");
        for (std::size_t k = begin; k < end; ++k) {
          const std::uint64_t* h = status_host_ + cells[k - begin] * 2;
          out[k].first_nonfinite = h[0] == ~0ull ? static_cast<std::size_t>(-1) : static_cast<std::size_t>(h[0]);
          out[k].inf_scales = static_cast<std::size_t>(h[1]);
        }
      } catch (...) {
        d_->cuStreamSynchronize(gather_);  // the launches done before the cells go back
        put_status_cells(cells);
        throw;
      }
      put_status_cells(cells);
    }
    return out;
  }

  // The gathered scaled decoder for these formats (null where none is loaded).
  CUfunction gather_kernel(DType weight, DType out) const {
    const int wi = weight == DType::F8_E4M3 ? 0 : weight == DType::F8_E5M2 ? 1 : -1;
    const int oi = out == DType::F32 ? 0 : out == DType::BF16 ? 1 : out == DType::F16 ? 2 : out == DType::Q8_0 ? 3 : -1;
    return wi < 0 || oi < 0 ? nullptr : fn_gather_fp8_[wi][oi];
  }

  // ---------------------------------------------------------- staging ring

  // The staging ring (docs/CUDA.md, "Uploads"): 32 slots of 4 MiB (128
  // MiB of pinned memory), fewer where that would pass 1/64 of the host's
  // memory. On the H200 machine (16 threads) 128 MiB loaded a 71 GB
  // checkpoint faster than 256 MiB, 512 MiB or 1 GiB, and 4 MiB slots 2%
  // faster than 8 MiB (1.63-1.64 s against 1.67 s, alternating runs): a
  // thread waits less for a free slot while the others' copies drain. HF2Q_CUDA_STAGING_MIB
  // sets the ring's size and HF2Q_CUDA_SLOT_MIB (1, 2, 4, 8, 16 or 32) the slots'
  // (benchmarks).
  static long env_long(const char* name) {
    const char* env = std::getenv(name);
    if (env == nullptr || *env == '\0') return 0;
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    return *end == '\0' && v > 0 ? v : 0;
  }

  static std::size_t slot_bytes_from_env() {
    const long mib = env_long("HF2Q_CUDA_SLOT_MIB");
    return mib == 1 || mib == 2 || mib == 4 || mib == 8 || mib == 16 || mib == 32 ? static_cast<std::size_t>(mib) << 20
                                                                                   : kSlotBytes;
  }

  static int ring_slots(std::size_t slot_bytes) {
    if (const long mib = env_long("HF2Q_CUDA_STAGING_MIB")) {
      // Clamped before shifting: a huge value must not overflow (1 TiB is
      // past the 1024-slot cap for every slot size).
      const long n = (std::min<long>(mib, 1L << 20) << 20) / static_cast<long>(slot_bytes);
      return static_cast<int>(std::min<long>(1024, std::max<long>(2, n)));
    }
    std::size_t n = (128u << 20) / slot_bytes;
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) {
      const std::size_t host = static_cast<std::size_t>(pages) * static_cast<std::size_t>(page);
      n = std::min(n, std::max<std::size_t>(4, host / 64 / slot_bytes));
    }
    return static_cast<int>(n);
  }

  void ensure_ring() {
    std::lock_guard<std::mutex> lk(ring_mu_);
    if (!slots_.empty()) return;
    const std::size_t slot_bytes = slot_bytes_from_env();
    const int n = ring_slots(slot_bytes);
    std::vector<Slot> slots(static_cast<std::size_t>(n));
    const std::size_t len = static_cast<std::size_t>(n) * slot_bytes;
    try {
      // The slots' memory is one mapping of transparent huge pages, pinned
      // by cuMemHostRegister: on the H200 machine 18 ms for 128 MiB (28 ms
      // when not 2 MiB-aligned), against 62-83 ms for cuMemHostAlloc (one
      // block or one per slot), with the same copy rate; the first upload of
      // a process pays it. Where registering fails, one cuMemHostAlloc block.
      void* p = map_aligned(len);
      if (p != nullptr) {
        ::madvise(p, len, MADV_HUGEPAGE);  // advice: a kernel without THP ignores it
        // Not inherited by a forked child (which cannot use CUDA: kForkedChild):
        // a fork would otherwise copy the pinned pages at once.
        ::madvise(p, len, MADV_DONTFORK);
        if (d_->cuMemHostRegister(p, len, CU_MEMHOSTREGISTER_PORTABLE) == CUDA_SUCCESS) {
          ring_host_ = p;
          ring_mapped_ = true;
        } else {
          ::munmap(p, len);
        }
      }
      if (ring_host_ == nullptr) {
        check(d_->cuMemHostAlloc(&ring_host_, len, CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc (staging)");
      }
      for (std::size_t i = 0; i < slots.size(); ++i) {
        Slot& s = slots[i];
        s.host = static_cast<std::uint8_t*>(ring_host_) + i * slot_bytes;
        check(d_->cuStreamCreate(&s.stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
        check(d_->cuEventCreate(&s.done, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
      }
    } catch (...) {
      for (Slot& s : slots) {
        if (s.done) d_->cuEventDestroy(s.done);
        if (s.stream) d_->cuStreamDestroy(s.stream);
      }
      free_ring_host(len);
      throw;
    }
    slots_ = std::move(slots);
    ring_len_ = len;
    slot_bytes_ = slot_bytes;
    for (int i = 0; i < n; ++i) free_slots_.push_back(i);
  }

  // `len` bytes of anonymous memory at a 2 MiB boundary (so that all of it
  // can be huge pages): mapped 2 MiB larger, the slack unmapped.
  static void* map_aligned(std::size_t len) {
    constexpr std::size_t kHuge = 2u << 20;
    void* raw = ::mmap(nullptr, len + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return nullptr;
    const auto base = reinterpret_cast<std::uintptr_t>(raw);
    const std::uintptr_t aligned = (base + kHuge - 1) / kHuge * kHuge;
    if (aligned > base) ::munmap(raw, aligned - base);
    const std::uintptr_t end = aligned + len, raw_end = base + len + kHuge;
    if (raw_end > end) ::munmap(reinterpret_cast<void*>(end), raw_end - end);
    return reinterpret_cast<void*>(aligned);
  }

  void free_ring_host(std::size_t len) noexcept {
    if (ring_host_ == nullptr) return;
    if (ring_mapped_) {
      d_->cuMemHostUnregister(ring_host_);
      ::munmap(ring_host_, len);
    } else {
      d_->cuMemFreeHost(ring_host_);
    }
    ring_host_ = nullptr;
    ring_mapped_ = false;
  }

  // One slot, exclusively, until the lease ends; its previous work is done.
  class Lease {
   public:
    explicit Lease(CudaBackend& b) : b_(b) {
      std::unique_lock<std::mutex> lk(b_.ring_mu_);
      b_.ring_cv_.wait(lk, [&] { return !b_.free_slots_.empty(); });
      // The longest-free slot: its copy is the likeliest to have finished
      // (the one just given back has its copy queued behind all the others).
      idx_ = b_.free_slots_.front();
      b_.free_slots_.pop_front();
      lk.unlock();
      Slot& s = slot();
      if (s.pending) {
        try {
          b_.check(b_.d_->cuEventSynchronize(s.done), "cuEventSynchronize");
        } catch (...) {
          give_back();
          throw;
        }
        s.pending = false;
      }
    }
    ~Lease() { give_back(); }
    Slot& slot() { return b_.slots_[static_cast<std::size_t>(idx_)]; }

   private:
    void give_back() {
      if (idx_ < 0) return;
      {
        std::lock_guard<std::mutex> lk(b_.ring_mu_);
        b_.free_slots_.push_back(idx_);
      }
      b_.ring_cv_.notify_one();
      idx_ = -1;
    }
    CudaBackend& b_;
    int idx_ = -1;
  };

  // Where one planned piece of an upload comes from: CPU memory `mem`, or
  // `fd` at `file_offset`. `base_elem` is added to non-finite indices.
  struct Source {
    const UploadPlan* plan;
    std::size_t base_elem;
    int fd;
    std::uint64_t file_offset;
    const std::uint8_t* mem;
  };

  // One buffer's part of an upload: its sources (one conversion for all of
  // them), the kernel that conversion runs and, for quantization, the status
  // cell its kernels report non-finite input and overflowing scales into.
  struct Job {
    UploadTarget dst;
    const Source* srcs;
    std::size_t nsrcs;
    const ScaledSource* scaled = nullptr;  // UploadOp::Scaled: the stack's scales and geometry
    CUfunction kernel = nullptr;
    int cell = -1;
  };

  // The scaled FP8 decoder for these formats (null where none is loaded).
  CUfunction scaled_kernel(DType weight, DType out) const {
    const int wi = weight == DType::F8_E4M3 ? 0 : weight == DType::F8_E5M2 ? 1 : -1;
    const int oi = out == DType::F32 ? 0 : out == DType::BF16 ? 1 : out == DType::F16 ? 2 : out == DType::Q8_0 ? 3 : -1;
    return wi < 0 || oi < 0 ? nullptr : fn_scaled_fp8_[wi][oi];
  }

  // The geometry argument of the scaled FP8 kernels (cuda_kernels.cu's ScaledGeo).
  struct ScaledGeoArg {
    unsigned long long rows, cols, br, bc, srows, scols, wide;
  };
  ScaledGeoArg scaled_geo(const kernels::ScaledFp8& g) const {
    return {g.rows, g.cols, g.block_rows, g.block_cols, g.scale_rows, g.scale_cols, wide_index_ ? 1ull : 0ull};
  }

  // The sources of one buffer's segments, which must share their conversion.
  static std::vector<Source> sources_of(const std::vector<FileSegment>& segments) {
    std::vector<Source> srcs;
    srcs.reserve(segments.size());
    for (const FileSegment& s : segments) {
      if (s.plan.op != segments[0].plan.op || s.plan.src_dtype != segments[0].plan.src_dtype) {
        throw std::invalid_argument("segments of one upload must share their conversion");
      }
      srcs.push_back(Source{&s.plan, s.elem_offset, s.fd, s.file_offset, nullptr});
    }
    return srcs;
  }

  // Uploads whose kernels report through a status cell: quantization, and
  // scaled FP8 decodes (a non-finite product is always reported).
  static bool reports(UploadOp op) { return op == UploadOp::Encode || op == UploadOp::Scaled; }

  // The conversion kernel of a planned upload (null for raw copies); a
  // conversion the table allows but this backend has no kernel for is
  // refused, never run as another.
  CUfunction kernel_for(const UploadPlan& p) const {
    if (p.op == UploadOp::Raw) return nullptr;
    if (p.op == UploadOp::Scaled) {
      const CUfunction fn = scaled_kernel(p.src_dtype, p.dst_dtype);
      if (fn == nullptr) {
        throw DeviceError(std::string("the CUDA backend has no kernel decoding scaled ") + dtype_name(p.src_dtype) +
                          " to " + dtype_name(p.dst_dtype));
      }
      return fn;
    }
    const int s = static_cast<int>(p.src_dtype), d = static_cast<int>(p.dst_dtype);
    CUfunction fn = nullptr;
    if (s >= 0 && s < kNumDTypes && d >= 0 && d < kNumDTypes) {
      fn = p.op == UploadOp::Decode ? fn_to_f32_[s] : fn_encode_[d][s];
    }
    if (fn == nullptr) {
      throw DeviceError(std::string("the CUDA backend has no kernel converting ") + dtype_name(p.src_dtype) + " to " +
                        dtype_name(p.dst_dtype));
    }
    return fn;
  }

  static unsigned encode_blocks_per_cta(const UploadPlan& p) {
    return std::max(1u, format_of(p.dst_dtype).kernels->cuda_encode_blocks_per_cta);
  }

  UploadResult upload(const UploadTarget& dst, const Source* srcs, std::size_t nsrcs) {
    Job job{dst, srcs, nsrcs};
    UploadResult res;
    upload_jobs(&job, 1, &res);
    return res;
  }

  // Status cells for `n` quantizing jobs, all at once (a thread that took
  // some and waited for the rest could starve another doing the same).
  std::vector<int> take_status_cells(std::size_t n) {
    std::vector<int> cells;
    if (n == 0) return cells;
    std::unique_lock<std::mutex> lk(status_mu_);
    status_cv_.wait(lk, [&] { return free_status_.size() >= n; });
    cells.assign(free_status_.end() - static_cast<std::ptrdiff_t>(n), free_status_.end());
    free_status_.resize(free_status_.size() - n);
    return cells;
  }
  void put_status_cells(const std::vector<int>& cells) {
    if (cells.empty()) return;
    {
      std::lock_guard<std::mutex> lk(status_mu_);
      free_status_.insert(free_status_.end(), cells.begin(), cells.end());
    }
    status_cv_.notify_all();
  }

 public:
  std::vector<UploadResult> read_file_batch(const std::vector<FileBatchItem>& items) override {
    std::vector<UploadResult> out(items.size());
    // Reporting jobs (quantizing, scaled FP8) per pipeline, each holding a
    // status cell: two batches at once (a loader's helper thread and its
    // loading thread) stay under kStatusCells, so that neither waits for the
    // other. Each pipeline ends waiting for the device (the status is read):
    // a 4 GiB batch of a MoE's FP8 layers (about 50 stacks and matrices) is
    // one; a batch of more small matrices (up to the loader's GPU_BATCH_ENTRIES,
    // more where they span files) is several.
    constexpr std::size_t kQuantizeJobsPerRun = 120;
    std::size_t begin = 0;
    while (begin < items.size()) {
      std::vector<std::vector<Source>> srcs;
      std::size_t end = begin, quantizing = 0;
      for (; end < items.size(); ++end) {
        const auto& segs = items[end].segments;
        if (segs.empty()) continue;
        if (reports(segs[0].plan.op)) {
          if (quantizing == kQuantizeJobsPerRun) break;
          ++quantizing;
        }
      }
      srcs.reserve(end - begin);
      std::vector<Job> jobs;
      std::vector<std::size_t> where;
      jobs.reserve(end - begin);
      for (std::size_t i = begin; i < end; ++i) {
        if (items[i].segments.empty()) continue;
        srcs.push_back(sources_of(items[i].segments));
        jobs.push_back(Job{items[i].dst, srcs.back().data(), srcs.back().size(),
                           items[i].scaled.scale != nullptr ? &items[i].scaled : nullptr});
        where.push_back(i);
      }
      std::vector<UploadResult> res(jobs.size());
      if (!jobs.empty()) {
        try {
          upload_jobs(jobs.data(), jobs.size(), res.data(), WhenBusy::kWait);
        } catch (FileReadError& e) {
          // The job whose read failed, as an index into `items` (as the host's batch says it).
          e.job = e.job >= 0 && static_cast<std::size_t>(e.job) < where.size() ? static_cast<long>(where[e.job]) : -1;
          throw;
        }
      }
      for (std::size_t k = 0; k < jobs.size(); ++k) out[where[k]] = res[k];
      begin = end;
    }
    return out;
  }

 private:
  // The chunked pipeline over every source of every job: each chunk is
  // staged in a slot's pinned buffer (memcpy or pread), then its copy (and
  // conversion) queued on the slot's stream. Chunks are small enough that a
  // mid-sized upload still spreads over every thread, large enough to keep
  // copies efficient; a batch of jobs is one pipeline, so the ring and the
  // copy engine stay busy from one tensor to the next. Raw copies and
  // widening may still be in flight when it returns (synchronize() waits);
  // quantization and failures wait for everything, since the status words
  // are needed or a buffer may be freed next. `when_busy`: a batch (a
  // loader's run of tensors, gigabytes, on its helper thread) waits for the
  // thread pool where another thread holds it (the loading thread filling a
  // small tensor), instead of running every read on one thread; a single
  // upload runs inline then.
  void upload_jobs(Job* jobs, std::size_t njobs, UploadResult* results, WhenBusy when_busy = WhenBusy::kInline) {
    std::size_t total = 0;
    std::size_t quantizing = 0;
    bool scaled = false;
    for (std::size_t j = 0; j < njobs; ++j) {
      for (std::size_t i = 0; i < jobs[j].nsrcs; ++i) total += jobs[j].srcs[i].plan->src_bytes;
      if (jobs[j].nsrcs > 0 && reports(jobs[j].srcs[0].plan->op)) ++quantizing;
      if (jobs[j].nsrcs > 0 && jobs[j].srcs[0].plan->op == UploadOp::Scaled) scaled = true;
    }
    if (total == 0) return;
    Ctx c(*this);
    ensure_ring();
    // A scaled job's grids were uploaded just before (their copies may still
    // be in flight on the staging streams): landed before its decodes run.
    if (scaled) check(wait_uploads(), "cuStreamSynchronize (scales in flight)");

    // 64 KiB granules: a multiple of 32 elements of every source dtype.
    constexpr std::size_t kGranule = 64u << 10;
    const std::size_t threads = static_cast<std::size_t>(get_num_threads());
    std::size_t chunk = (total / (2 * threads) + kGranule - 1) / kGranule * kGranule;
    chunk = std::min(slot_bytes_, std::max<std::size_t>(std::min<std::size_t>(1u << 20, slot_bytes_), chunk));
    // A piece is one staging slot's worth: a part of a large source, or a
    // run of whole small sources that lie back to back in the buffer (an
    // expert stack gathered from per-expert tensors), read one after another
    // into the slot and copied (and converted) as one. At most kMaxGathered
    // sources: one thread reads a piece, and a run of 4,000 FP8 scale grids
    // (256 bytes each) read by one thread took 6-10 ms of a batch.
    constexpr std::uint32_t kMaxGathered = 64;
    struct Piece {
      std::uint32_t job;
      std::uint32_t src;    // first source
      std::uint32_t count;  // sources gathered (1 for a part of one)
      std::size_t off;      // byte offset into the first source
      std::size_t len;      // source bytes
    };
    if (njobs > UINT32_MAX) throw std::invalid_argument("too many buffers in one upload");
    std::vector<Piece> pieces;
    for (std::size_t j = 0; j < njobs; ++j) {
      Job& job = jobs[j];
      if (job.nsrcs > UINT32_MAX) throw std::invalid_argument("too many segments in one upload");
      if (job.nsrcs == 0) continue;
      job.kernel = kernel_for(*job.srcs[0].plan);
      Piece run{static_cast<std::uint32_t>(j), 0, 0, 0, 0};
      std::size_t run_end = 0;  // byte offset in the buffer where the run ends
      auto flush = [&] {
        if (run.count > 0) pieces.push_back(run);
        run.count = 0;
        run.len = 0;
      };
      for (std::size_t i = 0; i < job.nsrcs; ++i) {
        const UploadPlan& p = *job.srcs[i].plan;
        const std::size_t n = p.src_bytes;
        if (n == 0) {  // nothing to stage; a run is a range of consecutive sources, so it ends here
          flush();
          continue;
        }
        if (n >= chunk) {
          flush();
          for (std::size_t off = 0; off < n; off += chunk) {
            pieces.push_back(Piece{static_cast<std::uint32_t>(j), static_cast<std::uint32_t>(i), 1, off,
                                   std::min(chunk, n - off)});
          }
          continue;
        }
        if (run.count > 0 && (run.len + n > chunk || run.count == kMaxGathered || p.dst_off != run_end ||
                              job.srcs[i].base_elem != job.srcs[i - 1].base_elem + job.srcs[i - 1].plan->n_elems)) {
          flush();
        }
        if (run.count == 0) run.src = static_cast<std::uint32_t>(i);
        run.count += 1;
        run.len += n;
        run_end = p.dst_off + p.dst_len;
      }
      flush();
    }

    std::vector<int> cells = take_status_cells(quantizing);
    {
      std::size_t k = 0;
      for (std::size_t j = 0; j < njobs; ++j) {
        if (jobs[j].nsrcs > 0 && reports(jobs[j].srcs[0].plan->op)) jobs[j].cell = cells[k++];
      }
    }
    if (!cells.empty()) {
      try {
        for (int cell : cells) {
          const CUdeviceptr status = status_dev_ + static_cast<std::size_t>(cell) * 16;
          check(d_->cuMemsetD8Async(status, 0xFF, 8, misc_), "cuMemsetD8Async");
          check(d_->cuMemsetD8Async(status + 8, 0, 8, misc_), "cuMemsetD8Async");
        }
        check(d_->cuStreamSynchronize(misc_), "cuStreamSynchronize");
      } catch (...) {
        put_status_cells(cells);
        throw;
      }
    }

    // HF2Q_CUDA_TRACE: nanoseconds summed over the threads (slot waits, reads, queueing).
    using TraceClock = std::chrono::steady_clock;
    std::atomic<long long> t_lease{0}, t_read{0}, t_queue{0};
    std::mutex trace_mu;
    std::vector<std::thread::id> trace_threads;  // the threads that staged pieces
    const TraceClock::time_point t_begin = TraceClock::now();
    auto ns_since = [](TraceClock::time_point a) {
      return static_cast<long long>(std::chrono::duration_cast<std::chrono::nanoseconds>(TraceClock::now() - a).count());
    };
    // One piece: staged in a slot (read or copied), its copy and kernel queued.
    auto stage = [&](std::size_t ci) {
      const Piece& pc = pieces[ci];
      const Job& job = jobs[pc.job];
      const Source& src = job.srcs[pc.src];
      const UploadPlan& p = *src.plan;
      const CUdeviceptr out = dptr(job.dst.base) + p.dst_off;
      TraceClock::time_point t0{};
      if (trace_) {
        t0 = TraceClock::now();
        std::lock_guard<std::mutex> lk(trace_mu);
        const std::thread::id me = std::this_thread::get_id();
        if (std::find(trace_threads.begin(), trace_threads.end(), me) == trace_threads.end()) trace_threads.push_back(me);
      }
      Lease lease(*this);
      Slot& s = lease.slot();
      if (trace_) {
        t_lease.fetch_add(ns_since(t0), std::memory_order_relaxed);
        t0 = TraceClock::now();
      }
      auto* host = static_cast<std::uint8_t*>(s.host);
      std::size_t at = 0;
      for (std::uint32_t k = 0; k < pc.count; ++k) {
        const Source& sk = job.srcs[pc.src + k];
        const std::size_t off = k == 0 ? pc.off : 0;
        const std::size_t len = pc.count == 1 ? pc.len : sk.plan->src_bytes;
        if (sk.mem != nullptr) {
          std::memcpy(host + at, sk.mem + off, len);
        } else {
          try {
            pread_full(sk.fd, host + at, len, sk.file_offset + off);
          } catch (FileReadError& e) {
            e.job = static_cast<long>(pc.job);  // this pipeline's job; read_file_batch maps it to the batch's
            throw;
          }
        }
        at += len;
      }
      if (trace_) {
        t_read.fetch_add(ns_since(t0), std::memory_order_relaxed);
        t0 = TraceClock::now();
      }
      if (p.op == UploadOp::Raw) {
        check(d_->cuMemcpyHtoDAsync(out + pc.off, s.host, pc.len, s.stream), "cuMemcpyHtoDAsync");
        check(d_->cuEventRecord(s.done, s.stream), "cuEventRecord");
        s.pending = true;
      } else {
        if (s.scratch == 0) check(d_->cuMemAlloc(&s.scratch, slot_bytes_), "cuMemAlloc (scratch)");
        check(d_->cuMemcpyHtoDAsync(s.scratch, s.host, pc.len, s.stream), "cuMemcpyHtoDAsync");
        // The slot's host memory is free once this copy has read it: the
        // event goes here, not after the kernel, so the next reader of the
        // slot does not also wait for the conversion. The scratch it
        // converts from is safe without a wait: the slot's next copy is
        // queued on the same stream, behind this kernel. Pending from here:
        // a launch that fails below leaves the copy to be waited for.
        check(d_->cuEventRecord(s.done, s.stream), "cuEventRecord");
        s.pending = true;
        CUdeviceptr from = s.scratch;
        const unsigned long long elems = pc.len / p.src_elem, first = pc.off / p.src_elem;
        if (p.op == UploadOp::Scaled) {
          // Decoded with the stack's scales: the kernel indexes the stack
          // (its element `stack_first` is the chunk's first weight).
          const ScaledSource& sc = *job.scaled;
          CUdeviceptr sp = dptr(sc.scale), to = dptr(job.dst.base) + element_byte_offset(p.dst_dtype, sc.base);
          CUdeviceptr status = status_dev_ + static_cast<std::size_t>(job.cell) * 16;
          ScaledGeoArg geo = scaled_geo(sc.geo);
          unsigned long long stack_first = src.base_elem - sc.base + first;
          unsigned long long items = p.dst_dtype == DType::Q8_0 ? elems / 32 : elems;
          void* args[] = {&from, &sp, &to, &items, &geo, &status, &stack_first};
          launch(job.kernel, grid_for(items, kBlock), s.stream, args);
        } else if (p.op == UploadOp::Decode) {
          CUdeviceptr to = out + element_byte_offset(p.dst_dtype, first);
          unsigned long long n = elems;
          void* args[] = {&from, &to, &n};
          launch(job.kernel, grid_for(elems, kBlock), s.stream, args);
        } else {
          CUdeviceptr to = out + element_byte_offset(p.dst_dtype, first);
          CUdeviceptr status = status_dev_ + static_cast<std::size_t>(job.cell) * 16;
          unsigned long long nblocks = elems / dtype_block_elems(p.dst_dtype), base = src.base_elem + first;
          void* args[] = {&from, &to, &nblocks, &base, &status};
          launch(job.kernel, grid_for(nblocks, encode_blocks_per_cta(p)), s.stream, args);
        }
      }
      if (trace_) t_queue.fetch_add(ns_since(t0), std::memory_order_relaxed);
    };
    // Once a piece fails, later jobs' pieces are skipped, and the failure
    // reported is the earliest job's (reading the jobs in order would have
    // met it first; the host's rule), not whichever thread failed first.
    std::vector<std::exception_ptr> failed(pieces.size());
    std::atomic<std::uint32_t> first_failed{UINT32_MAX};
    std::exception_ptr failure;
    try {
      parallel_for(pieces.size(), 1, [&](std::size_t c0, std::size_t c1) {
        Ctx tc(*this);
        for (std::size_t ci = c0; ci < c1; ++ci) {
          const std::uint32_t job = pieces[ci].job;
          if (job > first_failed.load(std::memory_order_relaxed)) continue;
          try {
            stage(ci);
          } catch (...) {
            failed[ci] = std::current_exception();  // each piece its own slot: no race
            std::uint32_t cur = first_failed.load();
            while (job < cur && !first_failed.compare_exchange_weak(cur, job)) {
            }
          }
        }
      }, when_busy);
    } catch (...) {
      failure = std::current_exception();
    }
    for (std::size_t k = 0; k < pieces.size() && !failure; ++k) {
      if (failed[k] && pieces[k].job == first_failed.load()) failure = failed[k];
    }
    if (trace_) {
      const long long issued_ns = std::max<long long>(1, ns_since(t_begin));
      std::size_t gathered = 0;
      for (const Piece& pc : pieces) gathered += pc.count;
      const double ran = double(std::max<std::size_t>(1, trace_threads.size()));
      std::fprintf(stderr,
                   "hf2q cuda pipeline: %zu jobs, %zu pieces (%.2f sources each), %.1f MB, chunk %zu KiB, "
                   "%zu threads: issued in %.4f s (%.1f GB/s) from %.4f (monotonic s); average per thread: slot "
                   "wait %.4f s, read %.4f s, queue %.4f s\n",
                   njobs, pieces.size(), pieces.empty() ? 0.0 : double(gathered) / double(pieces.size()),
                   double(total) / 1e6, chunk >> 10, trace_threads.size(), double(issued_ns) / 1e9,
                   double(total) / double(issued_ns),
                   std::chrono::duration<double>(t_begin.time_since_epoch()).count(),  // steady_clock: CLOCK_MONOTONIC
                   double(t_lease.load()) / 1e9 / ran,
                   double(t_read.load()) / 1e9 / ran, double(t_queue.load()) / 1e9 / ran);
    }
    // Nothing is asked of the device (raw copies, widening): the copies stay
    // in flight, overlapping the next upload's reads; synchronize() (called
    // before any read of device memory and before a free) waits for them.
    // The source was staged already, so the caller may reuse it.
    if (!failure && cells.empty()) {
      issued_.fetch_add(1, std::memory_order_release);  // after every copy of it was queued
      return;
    }
    // Otherwise nothing of this upload may still be in flight when it
    // returns (the caller may free the buffer, or needs the status).
    CUresult sync = CUDA_SUCCESS;
    for (Slot& s : slots_) {
      const CUresult r = d_->cuStreamSynchronize(s.stream);
      if (sync == CUDA_SUCCESS) sync = r;
    }
    if (!cells.empty()) {
      if (!failure && sync == CUDA_SUCCESS) {
        // Every cell's two words, read back in one copy per cell.
        for (std::size_t j = 0; j < njobs && sync == CUDA_SUCCESS; ++j) {
          if (jobs[j].cell < 0) continue;
          const std::size_t cell = static_cast<std::size_t>(jobs[j].cell);
          sync = d_->cuMemcpyDtoHAsync(status_host_ + cell * 2, status_dev_ + cell * 16, 16, misc_);
        }
        if (sync == CUDA_SUCCESS) sync = d_->cuStreamSynchronize(misc_);
        for (std::size_t j = 0; j < njobs && sync == CUDA_SUCCESS; ++j) {
          if (jobs[j].cell < 0) continue;
          const std::uint64_t* h = status_host_ + static_cast<std::size_t>(jobs[j].cell) * 2;
          // A scaled decode reports a stack index: made the buffer's, as the others report.
          const std::size_t shift = jobs[j].scaled != nullptr ? jobs[j].scaled->base : 0;
          results[j].first_nonfinite = h[0] == ~0ull ? static_cast<std::size_t>(-1) : static_cast<std::size_t>(h[0]) + shift;
          results[j].inf_scales = static_cast<std::size_t>(h[1]);
        }
      }
      put_status_cells(cells);
    }
    if (failure) std::rethrow_exception(failure);
    check(sync, "cuStreamSynchronize (upload)");
  }

  const Driver* d_;
  CUdevice dev_;
  CUcontext ctx_;
  BackendInfo info_;
  int sm_count_;
  int cc_;
  std::uint32_t default_nan_;
  // HF2Q_CUDA_WIDE_INDEX=1 (tests): the scaled FP8 decoders' 64-bit index
  // arithmetic even where every index fits 32 bits, so both paths are checked.
  bool wide_index_ = env_long("HF2Q_CUDA_WIDE_INDEX") != 0;
  // HF2Q_CUDA_TRACE=1 (benchmarks; exactly "1", as the other switches):
  // one line on stderr per upload pipeline, where its threads' time went
  // (reading, waiting for a slot, queueing).
  bool trace_ = [] {
    const char* v = std::getenv("HF2Q_CUDA_TRACE");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  pid_t pid_;  // the process that opened the device (fork: see cuda::kForkedChild)
  CUstream misc_ = nullptr;  // allocation zeroing, status words, read-back
  CUmodule module_ = nullptr;
  // Bound from the format table by bind_functions; null where it names none.
  CUfunction fn_to_f32_[kNumDTypes] = {};             // by source dtype
  CUfunction fn_encode_[kNumDTypes][kNumDTypes] = {};  // by destination, source
  CUfunction fn_verify_[kNumDTypes] = {};             // by buffer dtype
  CUfunction fn_transpose_u32_ = nullptr, fn_transpose_u8_ = nullptr;  // unit transposes (kernels/unit_grid.h)
  CUfunction fn_widen_gather_ = nullptr;  // scale tensors widened into grids (scaled_fp8_gather)
  CUfunction fn_gather_fp8_[2][4] = {};   // the scaled decoders over a gathered stack's pieces
  CUstream gather_ = nullptr;             // scaled_fp8_gather's work (not behind misc_'s waits, nor they behind it)
  CUfunction fn_scaled_fp8_[2][4] = {};               // [e4m3, e5m2][f32, bf16, f16, q8_0] (docs/FP8.md)

  // Uploads left in flight (raw, widening) and how many of them a
  // wait_uploads() has seen finish: equal when nothing is in flight.
  std::atomic<std::uint64_t> issued_{0};
  std::atomic<std::uint64_t> synced_{0};

  std::mutex ring_mu_;
  std::condition_variable ring_cv_;
  std::vector<Slot> slots_;
  std::deque<int> free_slots_;  // FIFO
  void* ring_host_ = nullptr;   // the slots' pinned memory
  std::size_t ring_len_ = 0;
  std::size_t slot_bytes_ = kSlotBytes;  // set with the ring, before any upload reads it
  bool ring_mapped_ = false;    // mmap'ed and registered (else cuMemHostAlloc)

  std::mutex status_mu_;
  std::condition_variable status_cv_;
  std::vector<int> free_status_;
  std::uint64_t* status_host_ = nullptr;  // pinned, 2 words per cell
  CUdeviceptr status_dev_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int index, std::string* why) {
  const Driver* d = cuda::driver(why);
  if (d == nullptr) return nullptr;
  int count = 0;
  CUresult r = d->cuDeviceGetCount(&count);
  if (r != CUDA_SUCCESS || count == 0) {
    *why = r != CUDA_SUCCESS ? "the NVIDIA driver cannot count GPUs: " + describe(*d, "cuDeviceGetCount", r)
                             : std::string("the NVIDIA driver reports no CUDA GPU");
    return nullptr;
  }
  if (index < 0 || index >= count) {
    *why = "there is no CUDA GPU " + std::to_string(index) + ": this machine has " + std::to_string(count) +
           (count == 1 ? " (cuda:0)" : " (cuda:0 to cuda:" + std::to_string(count - 1) + ")");
    return nullptr;
  }
  CUdevice dev = 0;
  char name[256] = {0};
  int major = 0, minor = 0, sms = 0;
  std::size_t total = 0;
  if ((r = d->cuDeviceGet(&dev, index)) != CUDA_SUCCESS ||
      (r = d->cuDeviceGetName(name, sizeof name - 1, dev)) != CUDA_SUCCESS ||
      (r = d->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)) != CUDA_SUCCESS ||
      (r = d->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)) != CUDA_SUCCESS ||
      (r = d->cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)) != CUDA_SUCCESS ||
      (r = d->cuDeviceTotalMem(&total, dev)) != CUDA_SUCCESS) {
    *why = "cannot query CUDA GPU " + std::to_string(index) + ": " + describe(*d, "cuDeviceGet*", r);
    return nullptr;
  }
  CUcontext ctx = nullptr;
  if ((r = d->cuDevicePrimaryCtxRetain(&ctx, dev)) != CUDA_SUCCESS) {
    *why = "cannot use CUDA GPU " + std::to_string(index) + " (" + name + "): " +
           describe(*d, "cuDevicePrimaryCtxRetain", r);
    return nullptr;
  }
  BackendInfo info;
  info.kind = "cuda";
  info.name = name;
  info.page_size = 4096;
  info.working_set_bytes = total;
  info.unified_memory = false;
  info.cpu_visible = false;
  info.dlpack_device_type = kDLCUDA;
  info.device_index = index;
  info.max_sets = 1;
  info.suballocate = true;  // cuMemAlloc costs tens of microseconds, and more while copies are in flight
  auto b = std::make_unique<CudaBackend>(d, dev, ctx, std::move(info), sms, major * 10 + minor);
  if (!b->init(why)) return nullptr;  // ~CudaBackend releases the context
  return b;
}

}  // namespace hf2q::device
