// Run-time loading of the CUDA driver API and NVRTC (see cuda_api.h).
#include "cuda_api.h"

#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <mutex>

namespace hf2q::device::cuda {
namespace {

std::mutex g_config_mu;
std::vector<std::string> g_nvrtc_candidates;
std::string g_cache_dir;

// Held while the driver is loaded and initialised (driver()'s one-time
// load: dlopen and cuInit, tens of milliseconds), and with g_config_mu
// across fork(): a device may be opened on a helper thread while a load
// plans (hf2q.device.DeviceOpening), and a child forked in the middle would
// otherwise inherit a one-time initialisation or a lock that no thread of
// it will ever finish or release. The fork waits for them instead; the
// child then finds the driver loaded by its parent (kForkedChild) or not
// loaded at all.
std::mutex g_driver_init_mu;

void lock_for_fork() {
  g_config_mu.lock();
  g_driver_init_mu.lock();
}
void unlock_after_fork() {
  g_driver_init_mu.unlock();
  g_config_mu.unlock();
}
[[maybe_unused]] const bool g_fork_handlers = pthread_atfork(&lock_for_fork, &unlock_after_fork, &unlock_after_fork) == 0;

template <typename Fn>
bool bind(void* lib, const char* name, Fn* out, std::string* missing) {
  void* sym = ::dlsym(lib, name);
  if (sym == nullptr) {
    if (!missing->empty()) *missing += ", ";
    *missing += name;
    return false;
  }
  *out = reinterpret_cast<Fn>(sym);
  return true;
}

struct DriverState {
  Driver api{};
  bool ok = false;
  std::string why;
  pid_t pid = 0;  // the process that ran cuInit
};

DriverState g_driver;          // guarded by g_driver_init_mu until loaded, then read-only
bool g_driver_loaded = false;  // guarded by g_driver_init_mu

DriverState load_driver() {
  DriverState st;
  // Never unloaded: the driver stays mapped for the life of the process, as
  // the CUDA runtime keeps it.
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = ::dlerror();
    st.why = std::string("the NVIDIA driver library libcuda.so.1 cannot be loaded (") + (err ? err : "not found") +
             "): no NVIDIA driver on this machine?";
    return st;
  }
  Driver& d = st.api;
  std::string missing;
  bind(lib, "cuInit", &d.cuInit, &missing);
  bind(lib, "cuDriverGetVersion", &d.cuDriverGetVersion, &missing);
  bind(lib, "cuGetErrorName", &d.cuGetErrorName, &missing);
  bind(lib, "cuGetErrorString", &d.cuGetErrorString, &missing);
  bind(lib, "cuDeviceGetCount", &d.cuDeviceGetCount, &missing);
  bind(lib, "cuDeviceGet", &d.cuDeviceGet, &missing);
  bind(lib, "cuDeviceGetName", &d.cuDeviceGetName, &missing);
  bind(lib, "cuDeviceGetAttribute", &d.cuDeviceGetAttribute, &missing);
  bind(lib, "cuDeviceTotalMem_v2", &d.cuDeviceTotalMem, &missing);
  bind(lib, "cuDevicePrimaryCtxRetain", &d.cuDevicePrimaryCtxRetain, &missing);
  bind(lib, "cuDevicePrimaryCtxRelease_v2", &d.cuDevicePrimaryCtxRelease, &missing);
  bind(lib, "cuCtxPushCurrent_v2", &d.cuCtxPushCurrent, &missing);
  bind(lib, "cuCtxPopCurrent_v2", &d.cuCtxPopCurrent, &missing);
  bind(lib, "cuMemGetInfo_v2", &d.cuMemGetInfo, &missing);
  bind(lib, "cuMemAlloc_v2", &d.cuMemAlloc, &missing);
  bind(lib, "cuMemFree_v2", &d.cuMemFree, &missing);
  bind(lib, "cuMemHostAlloc", &d.cuMemHostAlloc, &missing);
  bind(lib, "cuMemFreeHost", &d.cuMemFreeHost, &missing);
  bind(lib, "cuMemHostRegister_v2", &d.cuMemHostRegister, &missing);
  bind(lib, "cuMemHostUnregister", &d.cuMemHostUnregister, &missing);
  bind(lib, "cuMemsetD8Async", &d.cuMemsetD8Async, &missing);
  bind(lib, "cuMemcpyHtoDAsync_v2", &d.cuMemcpyHtoDAsync, &missing);
  bind(lib, "cuMemcpyDtoHAsync_v2", &d.cuMemcpyDtoHAsync, &missing);
  bind(lib, "cuMemcpyDtoDAsync_v2", &d.cuMemcpyDtoDAsync, &missing);
  bind(lib, "cuStreamCreate", &d.cuStreamCreate, &missing);
  bind(lib, "cuStreamDestroy_v2", &d.cuStreamDestroy, &missing);
  bind(lib, "cuStreamSynchronize", &d.cuStreamSynchronize, &missing);
  bind(lib, "cuEventCreate", &d.cuEventCreate, &missing);
  bind(lib, "cuEventDestroy_v2", &d.cuEventDestroy, &missing);
  bind(lib, "cuEventRecord", &d.cuEventRecord, &missing);
  bind(lib, "cuEventSynchronize", &d.cuEventSynchronize, &missing);
  bind(lib, "cuEventElapsedTime", &d.cuEventElapsedTime, &missing);
  bind(lib, "cuModuleLoadData", &d.cuModuleLoadData, &missing);
  bind(lib, "cuModuleUnload", &d.cuModuleUnload, &missing);
  bind(lib, "cuModuleGetFunction", &d.cuModuleGetFunction, &missing);
  bind(lib, "cuLaunchKernel", &d.cuLaunchKernel, &missing);
  if (!missing.empty()) {
    st.why = "the NVIDIA driver library libcuda.so.1 lacks " + missing + " (driver too old?)";
    return st;
  }
  const CUresult r = d.cuInit(0);
  if (r != CUDA_SUCCESS) {
    st.why = r == CUDA_ERROR_NO_DEVICE ? std::string("the NVIDIA driver reports no CUDA GPU (cuInit: CUDA_ERROR_NO_DEVICE)")
                                       : "the NVIDIA driver did not initialise: " + describe(d, "cuInit", r);
    return st;
  }
  st.ok = true;
  st.pid = ::getpid();
  return st;
}

struct NvrtcState {
  Nvrtc api{};
  bool ok = false;
  std::string why;
};

NvrtcState load_nvrtc() {
  NvrtcState st;
  std::vector<std::string> tries;
  {
    std::lock_guard<std::mutex> lk(g_config_mu);
    tries = g_nvrtc_candidates;
  }
  for (const char* soname : {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so"}) {
    tries.emplace_back(soname);
  }
  std::string tried;
  for (const std::string& path : tries) {
    void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      tried += (tried.empty() ? "" : ", ") + path;
      continue;
    }
    Nvrtc& n = st.api;
    std::string missing;
    bind(lib, "nvrtcVersion", &n.nvrtcVersion, &missing);
    bind(lib, "nvrtcGetErrorString", &n.nvrtcGetErrorString, &missing);
    bind(lib, "nvrtcCreateProgram", &n.nvrtcCreateProgram, &missing);
    bind(lib, "nvrtcDestroyProgram", &n.nvrtcDestroyProgram, &missing);
    bind(lib, "nvrtcCompileProgram", &n.nvrtcCompileProgram, &missing);
    bind(lib, "nvrtcGetProgramLogSize", &n.nvrtcGetProgramLogSize, &missing);
    bind(lib, "nvrtcGetProgramLog", &n.nvrtcGetProgramLog, &missing);
    bind(lib, "nvrtcGetCUBINSize", &n.nvrtcGetCUBINSize, &missing);
    bind(lib, "nvrtcGetCUBIN", &n.nvrtcGetCUBIN, &missing);
    if (!missing.empty()) {
      tried += (tried.empty() ? "" : ", ") + path + " (lacks " + missing + ")";
      ::dlclose(lib);
      continue;
    }
    n.path = path;
    st.ok = true;
    return st;
  }
  st.why = "NVRTC (the CUDA run-time compiler) was not found: install hf2q[cuda] (the nvidia-cuda-nvrtc wheel) "
           "or the CUDA toolkit's libnvrtc (tried " + tried + ")";
  return st;
}

}  // namespace

std::string describe(const Driver& d, const char* what, CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (d.cuGetErrorName == nullptr || d.cuGetErrorName(r, &name) != CUDA_SUCCESS) name = nullptr;
  if (d.cuGetErrorString == nullptr || d.cuGetErrorString(r, &text) != CUDA_SUCCESS) text = nullptr;
  return std::string(what) + ": " + (name ? name : "CUDA error " + std::to_string(r)) +
         (text ? std::string(" (") + text + ")" : std::string());
}

const Driver* driver(std::string* why) {
  // Loaded once, under g_driver_init_mu (not into a function-local static:
  // a child forked between the end of its initialiser and the release of
  // its guard would wait for that guard forever).
  {
    std::lock_guard<std::mutex> lk(g_driver_init_mu);
    if (!g_driver_loaded) {
      g_driver = load_driver();
      g_driver_loaded = true;
    }
  }
  const DriverState& st = g_driver;
  if (!st.ok) {
    *why = st.why;
    return nullptr;
  }
  if (::getpid() != st.pid) {
    *why = kForkedChild;
    return nullptr;
  }
  return &st.api;
}

const Nvrtc* nvrtc(std::string* why) {
  // Loaded on first need, so that configure() has run; a failure is not
  // remembered (a later configure may name the library).
  static std::mutex mu;
  static NvrtcState st;
  std::lock_guard<std::mutex> lk(mu);
  if (!st.ok) st = load_nvrtc();
  if (!st.ok) {
    *why = st.why;
    return nullptr;
  }
  return &st.api;
}

void configure(const std::vector<std::string>& nvrtc_candidates, const std::string& dir) {
  std::lock_guard<std::mutex> lk(g_config_mu);
  g_nvrtc_candidates = nvrtc_candidates;
  g_cache_dir = dir;
}

std::string cache_dir() {
  std::lock_guard<std::mutex> lk(g_config_mu);
  return g_cache_dir;
}

}  // namespace hf2q::device::cuda
