// The few CUDA driver API and NVRTC declarations the CUDA backend uses,
// written here so that hf2q builds without a CUDA toolkit: both libraries are
// loaded at run time with dlopen (libcuda.so.1 comes with the NVIDIA driver;
// libnvrtc from the nvidia-cuda-nvrtc wheel of hf2q[cuda] or the system).
// Types and values follow the public ABI of the driver API (cuda.h) and
// NVRTC (nvrtc.h); entry points with a _v2 suffix are the ones cuda.h maps
// the plain names to.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace hf2q::device::cuda {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = struct CUctx_st*;
using CUstream = struct CUstream_st*;
using CUevent = struct CUevent_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;

constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
constexpr int CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
constexpr unsigned CU_STREAM_NON_BLOCKING = 1;
constexpr unsigned CU_EVENT_DISABLE_TIMING = 2;
constexpr unsigned CU_MEMHOSTALLOC_PORTABLE = 1;
constexpr unsigned CU_MEMHOSTREGISTER_PORTABLE = 1;

struct Driver {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDriverGetVersion)(int*);
  CUresult (*cuGetErrorName)(CUresult, const char**);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetName)(char*, int, CUdevice);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuDeviceTotalMem)(std::size_t*, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
  CUresult (*cuCtxPushCurrent)(CUcontext);
  CUresult (*cuCtxPopCurrent)(CUcontext*);
  CUresult (*cuMemGetInfo)(std::size_t*, std::size_t*);
  CUresult (*cuMemAlloc)(CUdeviceptr*, std::size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemHostAlloc)(void**, std::size_t, unsigned);
  CUresult (*cuMemFreeHost)(void*);
  CUresult (*cuMemHostRegister)(void*, std::size_t, unsigned);
  CUresult (*cuMemHostUnregister)(void*);
  CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, std::size_t, CUstream);
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, std::size_t, CUstream);
  CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, std::size_t, CUstream);
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, std::size_t, CUstream);
  CUresult (*cuStreamCreate)(CUstream*, unsigned);
  CUresult (*cuStreamDestroy)(CUstream);
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuEventCreate)(CUevent*, unsigned);
  CUresult (*cuEventDestroy)(CUevent);
  CUresult (*cuEventRecord)(CUevent, CUstream);
  CUresult (*cuEventSynchronize)(CUevent);
  CUresult (*cuEventElapsedTime)(float*, CUevent, CUevent);
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleUnload)(CUmodule);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void**, void**);
};

using nvrtcProgram = struct _nvrtcProgram*;

struct Nvrtc {
  int (*nvrtcVersion)(int*, int*);
  const char* (*nvrtcGetErrorString)(int);
  int (*nvrtcCreateProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*, const char* const*);
  int (*nvrtcDestroyProgram)(nvrtcProgram*);
  int (*nvrtcCompileProgram)(nvrtcProgram, int, const char* const*);
  int (*nvrtcGetProgramLogSize)(nvrtcProgram, std::size_t*);
  int (*nvrtcGetProgramLog)(nvrtcProgram, char*);
  int (*nvrtcGetCUBINSize)(nvrtcProgram, std::size_t*);
  int (*nvrtcGetCUBIN)(nvrtcProgram, char*);
  std::string path;  // the library that was loaded
};

// The driver, loaded and initialised (cuInit) once per process; nullptr with
// *why set when libcuda.so.1 or a usable driver is missing.
// Why a process forked after CUDA was initialised cannot use it: the
// driver's state (its threads, its mappings of the GPU) does not survive
// fork(), and its calls may fail or hang in the child.
inline constexpr const char* kForkedChild =
    "CUDA was initialised in the parent of this process before fork(), and a forked child cannot use it "
    "(the driver's state does not survive fork): start the child with multiprocessing's 'spawn' or "
    "'forkserver' method, or open CUDA devices only after forking";

const Driver* driver(std::string* why);
// NVRTC, loaded once per process from the configured candidates, then the
// system's sonames; nullptr with *why listing what was tried.
const Nvrtc* nvrtc(std::string* why);

// Set by the Python layer before the first CUDA device opens: NVRTC
// libraries to try first (the nvidia-cuda-nvrtc wheel's) and the directory of
// the on-disk kernel cache ("" disables it).
void configure(const std::vector<std::string>& nvrtc_candidates, const std::string& cache_dir);
std::string cache_dir();

// "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (out of memory)".
std::string describe(const Driver& d, const char* what, CUresult r);

}  // namespace hf2q::device::cuda
