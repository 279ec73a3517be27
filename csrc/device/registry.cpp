// The backend registry: every device kind this build knows, in one table.
// A new backend adds one row here and its folder under csrc/device/.
#include <string>

#include "backend.h"

namespace hf2q::device {
namespace {

std::unique_ptr<Backend> open_host(int, std::string*) { return make_host_backend(); }

std::unique_ptr<Backend> open_metal(int, std::string* why) {
#if defined(HF2Q_HAVE_METAL)
  std::string reason;
  std::unique_ptr<Backend> b = make_metal_backend(&reason);
  if (!b) *why = "Metal device unavailable: " + reason;
  return b;
#else
  *why = "Metal device unavailable: this build of hf2q has no Metal backend (Metal exists only on Apple platforms)";
  return nullptr;
#endif
}

std::unique_ptr<Backend> open_cuda(int index, std::string* why) {
#if defined(HF2Q_HAVE_CUDA)
  std::string reason;
  std::unique_ptr<Backend> b = make_cuda_backend(index, &reason);
  if (!b) *why = "CUDA device unavailable: " + reason;
  return b;
#else
  (void)index;
  *why = "CUDA device unavailable: this build of hf2q has no CUDA backend (it is built on Linux only)";
  return nullptr;
#endif
}

// Device.default() order: Metal (Apple), then CUDA (a GPU with its driver
// and NVRTC), then the host, which always opens. CUDA is told where NVRTC
// and its kernel cache are before it opens (hf2q/_cuda.py).
//  kind     indexed  default_rank  prepare  open
const BackendEntry kBackends[] = {
    {"host", false, 2, false, open_host},
    {"metal", false, 0, false, open_metal},
    {"cuda", true, 1, true, open_cuda},
};

}  // namespace

const BackendEntry* backend_registry(std::size_t* count) {
  *count = sizeof kBackends / sizeof kBackends[0];
  return kBackends;
}

}  // namespace hf2q::device
