// Metal backend (docs/RESIDENCY.md): MTLBuffers in shared storage,
// MTLResidencySets, and the GPU read-back checksums (shaders/verify.metal).
// Primitives only: set planning, budgets, commit batching and
// remove-before-free are decided by the shared code in device.cpp.
//
// Objective-C++ with ARC (-fobjc-arc). MTLBuffers cross the C++ interface as
// void* handles: __bridge_retained when handed out, __bridge_transfer when
// released. Residency sets are kept in an array of plain `id`, and
// id<MTLResidencySet> is named only inside the SDK guard, so SDKs older than
// macOS 15 / iOS 18 still build (the device then runs without residency).
// Built with -Werror=unguarded-availability-new: every API newer than the
// deployment target sits under a positive `if (@available(...))`.
//
// Metal API used, with the OS version that introduced it (macOS / iOS):
//   MTLCreateSystemDefaultDevice                                10.11 / 8.0
//   MTLDevice.name                                              10.11 / 8.0
//   MTLDevice.hasUnifiedMemory                                  10.15 / 13.0
//   MTLDevice.maxBufferLength                                   10.14 / 12.0
//   MTLDevice.recommendedMaxWorkingSetSize                      10.12 / 16.0
//   -[MTLDevice supportsFamily:]                                10.15 / 13.0
//   MTLGPUFamilyMetal3                                          13.0  / 16.0
//   -[MTLDevice newCommandQueue]                                10.11 / 8.0
//   -[MTLDevice newBufferWithLength:options:]                   10.11 / 8.0
//   MTLResourceStorageModeShared                                10.11 / 9.0
//   MTLResourceHazardTrackingModeUntracked                      10.13 / 10.0
//   -[MTLBuffer contents], MTLBuffer.length                     10.11 / 8.0
//   MTLCompileOptions, .fastMathEnabled                         10.11 / 8.0  (deprecated 15.0 / 18.0)
//   MTLCompileOptions.mathMode, MTLMathModeSafe                 15.0  / 18.0
//   -[MTLDevice newLibraryWithSource:options:error:]            10.11 / 8.0
//   -[MTLLibrary newFunctionWithName:]                          10.11 / 8.0
//   -[MTLDevice newComputePipelineStateWithFunction:error:]     10.11 / 8.0
//   MTLComputePipelineState.maxTotalThreadsPerThreadgroup       10.11 / 8.0
//   -[MTLCommandQueue commandBuffer]                            10.11 / 8.0
//   -[MTLCommandBuffer computeCommandEncoder]                   10.11 / 8.0
//   -[MTLComputeCommandEncoder setComputePipelineState:]        10.11 / 8.0
//   -[MTLComputeCommandEncoder setBuffer:offset:atIndex:]       10.11 / 8.0
//   -[MTLComputeCommandEncoder setBytes:length:atIndex:]        10.11 / 8.3
//   -[MTLComputeCommandEncoder dispatchThreadgroups:threadsPerThreadgroup:]  10.11 / 8.0
//   MTLSizeMake                                                 10.11 / 8.0
//   -[MTLCommandEncoder endEncoding]                            10.11 / 8.0
//   -[MTLCommandBuffer commit], -waitUntilCompleted, .status, .error  10.11 / 8.0
//   MTLResidencySetDescriptor (.label, .initialCapacity)        15.0  / 18.0
//   -[MTLDevice newResidencySetWithDescriptor:error:]           15.0  / 18.0
//   -[MTLResidencySet addAllocation:], -removeAllocation:,
//     -removeAllAllocations, -commit, -requestResidency, -endResidency  15.0 / 18.0
//   -[MTLCommandQueue addResidencySet:], -removeResidencySet:   15.0  / 18.0
// The backend as a whole needs macOS 10.15 / iOS 13 (checked at run time in
// make_metal_backend, and the MetalBackend class is marked with it); residency sets additionally need macOS 15 / iOS 18,
// the selector, and a Metal 3 GPU (checked in set_create).

#import <Foundation/Foundation.h>
#import <Metal/Metal.h>
#include <mach/mach.h>  // vm_page_size

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <vector>
#include <string>

#include "device/backend.h"
#include "device/dtype.h"
#include "device/metal/verify_dispatch.h"  // kernels, arguments and dispatches (shared with the CPU test)
#include "hf2q_shader_source.h"  // kHf2qVerifyMetalSource (generated from shaders/verify.metal)

// SDK (compile-time) capabilities; run-time availability is checked separately.
#if (defined(__MAC_OS_X_VERSION_MAX_ALLOWED) && __MAC_OS_X_VERSION_MAX_ALLOWED >= 150000) || \
    (defined(__IPHONE_OS_VERSION_MAX_ALLOWED) && __IPHONE_OS_VERSION_MAX_ALLOWED >= 180000)
#define HF2Q_SDK_HAS_RESIDENCY_SETS 1  // also MTLCompileOptions.mathMode
#else
#define HF2Q_SDK_HAS_RESIDENCY_SETS 0
#endif

#if (defined(__MAC_OS_X_VERSION_MAX_ALLOWED) && __MAC_OS_X_VERSION_MAX_ALLOWED >= 130000) || \
    (defined(__IPHONE_OS_VERSION_MAX_ALLOWED) && __IPHONE_OS_VERSION_MAX_ALLOWED >= 160000)
#define HF2Q_SDK_HAS_METAL3_FAMILY 1
#else
#define HF2Q_SDK_HAS_METAL3_FAMILY 0
#endif

namespace hf2q::device {
namespace {

constexpr int kMaxSets = 32;                     // residency sets per command queue (Metal's limit)
constexpr std::size_t kMinSetCap = 64u << 20;    // 64 MiB
using metal_verify::kNumDTypes;
using metal_verify::kernel_name;

std::string to_std(NSString* s) {
  const char* c = s != nil ? [s UTF8String] : nullptr;
  return c != nullptr ? std::string(c) : std::string();
}

std::string describe(NSError* e) {
  return e != nil ? to_std([e localizedDescription]) : std::string("no error information");
}

// The NaN this CPU's multiplier returns for 0 * Inf (arm64: 0x7FC00000,
// x86-64: 0xFFC00000). The CPU reference dequantizer produces it for a q8_0
// zero under an infinite scale, so the GPU kernel writes the same bits.
std::uint32_t cpu_default_nan_bits() {
  volatile float zero = 0.0f;
  volatile float inf = std::numeric_limits<float>::infinity();
  const float nan = zero * inf;
  std::uint32_t bits = 0;
  std::memcpy(&bits, &nan, sizeof bits);
  return bits;
}

// Everything below up to make_metal_backend is marked as needing macOS 10.15 /
// iOS 13 (hasUnifiedMemory, supportsFamily:); make_metal_backend checks that
// at run time before it creates a MetalBackend, and the compiler checks that
// nothing here uses an API newer than that without its own @available guard.

// Options of every weight buffer (docs/RESIDENCY.md).
API_AVAILABLE(macos(10.15), ios(13.0))
MTLResourceOptions weight_buffer_options() {
  return MTLResourceStorageModeShared | MTLResourceHazardTrackingModeUntracked;
}

// Fast math must be off for the verification kernels (its default is on).
API_AVAILABLE(macos(10.15), ios(13.0))
void disable_fast_math(MTLCompileOptions* opts) {
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wdeprecated-declarations"
  opts.fastMathEnabled = NO;  // deprecated in macOS 15 / iOS 18 in favour of mathMode
#pragma clang diagnostic pop
#if HF2Q_SDK_HAS_RESIDENCY_SETS
  if (@available(macOS 15.0, iOS 18.0, *)) {
    opts.mathMode = MTLMathModeSafe;
  }
#endif
}

class API_AVAILABLE(macos(10.15), ios(13.0)) MetalBackend final : public Backend {
 public:
  MetalBackend(id<MTLDevice> device, id<MTLCommandQueue> queue, BackendInfo backend_info, bool sets_supported)
      : device_(device), queue_(queue), info_(std::move(backend_info)), default_nan_(cpu_default_nan_bits()) {
#if HF2Q_SDK_HAS_RESIDENCY_SETS
    sets_supported_ = sets_supported;
#else
    (void)sets_supported;
#endif
  }

  ~MetalBackend() override {
#if HF2Q_SDK_HAS_RESIDENCY_SETS
    // Device destroys its sets first; this only catches any left behind.
    for (int i = 0; i < kMaxSets; ++i) set_destroy(i);
#endif
  }

  const BackendInfo& info() const override { return info_; }

  void* allocate(std::size_t len, void** handle) override {
    void* ptr = nullptr;
    @autoreleasepool {
      id<MTLBuffer> buf = [device_ newBufferWithLength:static_cast<NSUInteger>(len)
                                               options:weight_buffer_options()];
      if (buf != nil) {
        ptr = [buf contents];
        if (ptr != nullptr) {
          std::memset(ptr, 0, len);  // zero-filled: the allocator is not relied on
          *handle = (__bridge_retained void*)buf;  // +1, owned by the caller until release()
        }
      }
    }  // on failure buf is released here
    if (ptr == nullptr) {
      throw DeviceError("Metal could not allocate a buffer of " + std::to_string(len) + " bytes (" +
                        std::to_string(len >> 20) + " MiB): newBufferWithLength:options: returned nil");
    }
    return ptr;
  }

  void release(void* handle, void*, std::size_t) noexcept override {
    if (handle == nullptr) return;
    @autoreleasepool {
      id<MTLBuffer> buf = (__bridge_transfer id<MTLBuffer>)handle;  // takes back the +1
      (void)buf;  // last reference, released at the end of this scope: the buffer is freed
    }
  }

#if HF2Q_SDK_HAS_RESIDENCY_SETS
  bool set_create(int set, const std::string& label, std::size_t initial_capacity) override {
    @autoreleasepool {
      std::lock_guard<std::mutex> lk(set_mu_);
      if (set < 0 || set >= kMaxSets) return false;
      if (sets_[set] != nil) return true;
      if (!sets_supported_) return false;  // no Metal 3, or a virtual machine
      if (@available(macOS 15.0, iOS 18.0, *)) {
        if (![device_ respondsToSelector:@selector(newResidencySetWithDescriptor:error:)]) return false;
        if (![queue_ respondsToSelector:@selector(addResidencySet:)]) return false;
        MTLResidencySetDescriptor* desc = [[MTLResidencySetDescriptor alloc] init];
        desc.label = [NSString stringWithUTF8String:label.c_str()];
        desc.initialCapacity = static_cast<NSUInteger>(initial_capacity);
        NSError* err = nil;
        id<MTLResidencySet> rs = nil;
        @try {
          rs = [device_ newResidencySetWithDescriptor:desc error:&err];
        } @catch (NSException* e) {
          std::fprintf(stderr, "hf2q: creating Metal residency set '%s' raised %s: %s; running without it\n",
                       label.c_str(), to_std([e name]).c_str(), to_std([e reason]).c_str());
          return false;
        }
        if (rs == nil) {
          std::fprintf(stderr, "hf2q: cannot create Metal residency set '%s': %s; running without it\n",
                       label.c_str(), describe(err).c_str());
          return false;
        }
        [queue_ addResidencySet:rs];  // before any command buffer reading the weights is committed
        for (id q : consumer_queues_) [(id<MTLCommandQueue>)q addResidencySet:rs];
        sets_[set] = rs;
        return true;
      }
      return false;
    }
  }

  void set_add(int set, void* handle) override {
    @autoreleasepool {
      std::lock_guard<std::mutex> lk(set_mu_);
      if (set < 0 || set >= kMaxSets || handle == nullptr) return;
      if (@available(macOS 15.0, iOS 18.0, *)) {
        id<MTLResidencySet> rs = sets_[set];
        if (rs != nil) [rs addAllocation:(__bridge id<MTLBuffer>)handle];  // staged until commit
      }
    }
  }

  void set_remove(int set, void* handle) noexcept override {
    @autoreleasepool {
      std::lock_guard<std::mutex> lk(set_mu_);
      if (set < 0 || set >= kMaxSets || handle == nullptr) return;
      if (@available(macOS 15.0, iOS 18.0, *)) {
        id<MTLResidencySet> rs = sets_[set];
        if (rs != nil) [rs removeAllocation:(__bridge id<MTLBuffer>)handle];  // staged until commit
      }
    }
  }

  void set_commit(int set) noexcept override {
    @autoreleasepool {
      std::lock_guard<std::mutex> lk(set_mu_);
      if (set < 0 || set >= kMaxSets) return;
      if (@available(macOS 15.0, iOS 18.0, *)) {
        id<MTLResidencySet> rs = sets_[set];
        if (rs != nil) [rs commit];
      }
    }
  }

  void set_request(int set) noexcept override {
    @autoreleasepool {
      std::lock_guard<std::mutex> lk(set_mu_);
      if (set < 0 || set >= kMaxSets) return;
      if (@available(macOS 15.0, iOS 18.0, *)) {
        id<MTLResidencySet> rs = sets_[set];
        if (rs != nil) [rs requestResidency];  // standing request; later commits need none
      }
    }
  }

  void set_end(int set) noexcept override {
    @autoreleasepool {
      std::lock_guard<std::mutex> lk(set_mu_);
      if (set < 0 || set >= kMaxSets) return;
      if (@available(macOS 15.0, iOS 18.0, *)) {
        id<MTLResidencySet> rs = sets_[set];
        if (rs != nil) [rs endResidency];
      }
    }
  }

  // Teardown (docs/RESIDENCY.md); idempotent.
  void set_destroy(int set) noexcept override {
    @autoreleasepool {
      std::lock_guard<std::mutex> lk(set_mu_);
      if (set < 0 || set >= kMaxSets || sets_[set] == nil) return;
      if (@available(macOS 15.0, iOS 18.0, *)) {
        id<MTLResidencySet> rs = sets_[set];
        [rs endResidency];
        [rs removeAllAllocations];
        [rs commit];
        [queue_ removeResidencySet:rs];
        for (id q : consumer_queues_) [(id<MTLCommandQueue>)q removeResidencySet:rs];
      }
      sets_[set] = nil;  // releases the set
    }
  }
  // A consumer's queue (docs/RESIDENCY.md): every existing set now, later sets at
  // creation; detached again when a set is destroyed. Kept strongly.
  bool attach_queue(void* queue) override {
    @autoreleasepool {
      std::lock_guard<std::mutex> lk(set_mu_);
      id obj = (__bridge id)queue;
      if (![obj conformsToProtocol:@protocol(MTLCommandQueue)]) return false;
      id<MTLCommandQueue> q = (id<MTLCommandQueue>)obj;
      if (q.device != device_) return false;
      for (id known : consumer_queues_) {
        if (known == obj) return true;  // idempotent
      }
      if (@available(macOS 15.0, iOS 18.0, *)) {
        if (![q respondsToSelector:@selector(addResidencySet:)]) return false;
        for (int i = 0; i < kMaxSets; ++i) {
          if (sets_[i] != nil) [q addResidencySet:(id<MTLResidencySet>)sets_[i]];
        }
        consumer_queues_.push_back(obj);
        return true;
      }
      return false;
    }
  }
#else
  // SDK older than macOS 15 / iOS 18: no residency sets; the device runs
  // without residency (not an error). The other set calls keep their
  // defaults, never reached without a set.
  bool set_create(int, const std::string&, std::size_t) override { return false; }
#endif

  // Residency comes from the sets: no per-buffer wiring (the default wire /
  // unwire). Shared storage is CPU-visible, so uploads and copy-out keep the
  // defaults too.

  void checksums(DType dtype, void* handle, const void*, std::size_t numel, std::uint32_t* out,
                 std::size_t ngroups) override {
    if (ngroups == 0) return;
    const int k = static_cast<int>(dtype);
    if (k < 0 || k >= kNumDTypes || kernel_name(dtype) == nullptr) {
      throw DeviceError("GPU checksums: unknown dtype " + std::to_string(k));
    }
    if (handle == nullptr || ngroups != (numel + kVerifyGroup - 1) / kVerifyGroup) {
      throw DeviceError("GPU checksums: bad arguments (" + std::to_string(numel) + " elements, " +
                        std::to_string(ngroups) + " groups)");
    }
    const std::size_t need = element_byte_offset(dtype, numel);  // bytes the kernel reads
    std::string err;
    @autoreleasepool {
      err = run_checksums(dtype, (__bridge id<MTLBuffer>)handle, need, numel, out, ngroups);
    }
    if (!err.empty()) throw DeviceError(err);
  }

 private:
  // Compiles shaders/verify.metal and builds one pipeline per dtype, once.
  // Returns an error message, empty on success. Call with gpu_mu_ held,
  // inside an autorelease pool.
  std::string build_pipelines_locked() {
    if (pipelines_ready_) return {};
    MTLCompileOptions* opts = [[MTLCompileOptions alloc] init];
    disable_fast_math(opts);
    NSString* src = [NSString stringWithUTF8String:kHf2qVerifyMetalSource];
    NSError* err = nil;
    id<MTLLibrary> lib = [device_ newLibraryWithSource:src options:opts error:&err];
    if (lib == nil) return "cannot compile the Metal verification shaders: " + describe(err);
    for (int k = 0; k < kNumDTypes; ++k) {
      const char* name = kernel_name(static_cast<DType>(k));
      if (name == nullptr) continue;  // a format without a Metal read-back: checksums() refuses it
      id<MTLFunction> fn = [lib newFunctionWithName:[NSString stringWithUTF8String:name]];
      if (fn == nil) return std::string("Metal verification kernel '") + name + "' not found in the library";
      err = nil;
      id<MTLComputePipelineState> pso = [device_ newComputePipelineStateWithFunction:fn error:&err];
      if (pso == nil) {
        return std::string("cannot build the Metal pipeline for '") + name + "': " + describe(err);
      }
      pipelines_[k] = pso;
    }
    pipelines_ready_ = true;
    return {};
  }

  // One command buffer on the backend's queue (the residency sets are
  // attached to it), the dispatches of metal_verify::for_each_dispatch (one
  // per kChunkGroups groups, each binding the buffer at the byte offset of its
  // first group). Returns an error message, empty on success.
  std::string run_checksums(DType dtype, id<MTLBuffer> src, std::size_t need, std::size_t numel,
                            std::uint32_t* out, std::size_t ngroups) {
    if (static_cast<std::size_t>([src length]) < need) {
      return "GPU checksums: the buffer holds " + std::to_string(static_cast<std::size_t>([src length])) +
             " bytes, " + std::to_string(need) + " needed";
    }
    id<MTLComputePipelineState> pso = nil;
    {
      std::lock_guard<std::mutex> lk(gpu_mu_);
      std::string err = build_pipelines_locked();
      if (!err.empty()) return err;
      pso = pipelines_[static_cast<int>(dtype)];
    }
    const std::size_t out_bytes = ngroups * sizeof(std::uint32_t);
    id<MTLBuffer> dst = [device_ newBufferWithLength:static_cast<NSUInteger>(out_bytes)
                                             options:MTLResourceStorageModeShared];
    if (dst == nil) return "GPU checksums: cannot allocate the " + std::to_string(out_bytes) + "-byte output buffer";
    id<MTLCommandBuffer> cb = [queue_ commandBuffer];
    id<MTLComputeCommandEncoder> enc = cb != nil ? [cb computeCommandEncoder] : nil;
    if (enc == nil) return "GPU checksums: cannot create a Metal command buffer or compute encoder";

    const std::size_t tg = std::max<std::size_t>(
        1, std::min<std::size_t>(metal_verify::kThreadsPerThreadgroup,
                                 static_cast<std::size_t>([pso maxTotalThreadsPerThreadgroup])));
    [enc setComputePipelineState:pso];
    metal_verify::for_each_dispatch(dtype, numel, ngroups, default_nan_, tg, [&](const metal_verify::Dispatch& d) {
      [enc setBuffer:src offset:static_cast<NSUInteger>(d.src_offset) atIndex:0];
      [enc setBuffer:dst offset:static_cast<NSUInteger>(d.first_group * sizeof(std::uint32_t)) atIndex:1];
      [enc setBytes:&d.params length:sizeof d.params atIndex:2];
      [enc dispatchThreadgroups:MTLSizeMake(static_cast<NSUInteger>(d.threadgroups), 1, 1)
          threadsPerThreadgroup:MTLSizeMake(static_cast<NSUInteger>(d.threads_per_group), 1, 1)];
    });
    [enc endEncoding];
    [cb commit];
    [cb waitUntilCompleted];
    if ([cb status] != MTLCommandBufferStatusCompleted) {
      return "GPU checksum kernel failed: " + describe([cb error]);
    }
    std::memcpy(out, [dst contents], out_bytes);
    return {};
  }

  id<MTLDevice> device_;
  id<MTLCommandQueue> queue_;  // hf2q's own GPU work; the residency sets are attached to it
  BackendInfo info_;
  std::uint32_t default_nan_;

  std::mutex gpu_mu_;  // guards the lazily built pipelines
  bool pipelines_ready_ = false;
  id<MTLComputePipelineState> pipelines_[kNumDTypes] = {};

#if HF2Q_SDK_HAS_RESIDENCY_SETS
  std::mutex set_mu_;  // Device serializes already; this keeps the backend safe on its own
  bool sets_supported_ = false;
  id sets_[kMaxSets] = {};  // id<MTLResidencySet>, typed id so older SDKs build
  std::vector<id> consumer_queues_;  // id<MTLCommandQueue> attached by attach_queue
#endif
};

}  // namespace

std::unique_ptr<Backend> make_metal_backend(std::string* why) {
  @autoreleasepool {
    if (@available(macOS 10.15, iOS 13.0, *)) {
      id<MTLDevice> device = MTLCreateSystemDefaultDevice();
      if (device == nil) {
        if (why != nullptr) {
          *why = "MTLCreateSystemDefaultDevice() returned nil (no Metal GPU: headless, sandboxed or "
                 "virtualised environment?)";
        }
        return nullptr;
      }
      id<MTLCommandQueue> queue = [device newCommandQueue];
      if (queue == nil) {
        if (why != nullptr) *why = "cannot create a Metal command queue on " + to_std([device name]);
        return nullptr;
      }

      std::uint64_t working_set = 0;
      if (@available(macOS 10.12, iOS 16.0, *)) {
        working_set = [device recommendedMaxWorkingSetSize];
      }
      BackendInfo info;
      info.kind = "metal";
      info.name = to_std([device name]);
      info.page_size = static_cast<std::size_t>(vm_page_size);  // 16 KiB on Apple silicon
      info.max_buffer_len = static_cast<std::size_t>([device maxBufferLength]);
      info.working_set_bytes = static_cast<std::size_t>(working_set);
      info.unified_memory = [device hasUnifiedMemory];
      info.max_sets = kMaxSets;
      info.set_cap_bytes = std::max<std::size_t>(kMinSetCap, static_cast<std::size_t>(working_set / 20));
      // Weights + 10 % headroom fit the working set; never wire all of it.
      info.wired_budget_bytes = static_cast<std::size_t>(working_set - working_set / 10);

      bool metal3 = false;
#if HF2Q_SDK_HAS_METAL3_FAMILY
      if (@available(macOS 13.0, iOS 16.0, *)) {
        metal3 = [device supportsFamily:MTLGPUFamilyMetal3];
      }
#endif
      // Residency-set creation fails or raises in virtual machines.
      const bool sets_supported = metal3 && info.name != "Apple Paravirtual device";
      return std::make_unique<MetalBackend>(device, queue, std::move(info), sets_supported);
    }
    if (why != nullptr) *why = "the Metal backend needs macOS 10.15 / iOS 13 or later";
    return nullptr;
  }
}

}  // namespace hf2q::device
