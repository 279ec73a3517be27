// The interface every device backend implements: memory and residency
// primitives only. Bookkeeping, residency-set planning, size arithmetic and
// uploads live in device.cpp, shared by all backends (and so exercised by the
// host backend's tests on Linux).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "dtype.h"

namespace hf2q::device {

class DeviceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A file read that could not complete (I/O error, or EOF before the expected
// end because the file shrank or was rewritten).
class FileReadError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct BackendInfo {
  std::string kind;                  // "host", "metal"
  std::string name;                  // device name
  std::size_t page_size = 4096;      // allocation granularity
  std::size_t max_buffer_len = 0;    // 0: no limit beyond the OS
  std::size_t working_set_bytes = 0; // recommendedMaxWorkingSetSize; 0: unknown
  bool unified_memory = true;
  // Residency sets: at most this many; each capped at set_cap_bytes (0: no cap).
  int max_sets = 1;
  std::size_t set_cap_bytes = 0;
  // Bytes that may be made resident in total (0: no budget).
  std::size_t wired_budget_bytes = 0;
};

// Number of elements summarised by one verification checksum.
constexpr std::size_t kVerifyGroup = 256;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const BackendInfo& info() const = 0;

  // `len` bytes (a multiple of the page size), zero-filled, CPU-visible.
  // Returns the CPU pointer; `*handle` receives the backend object (MTLBuffer).
  // Throws DeviceError.
  virtual void* allocate(std::size_t len, void** handle) = 0;
  virtual void release(void* handle, void* ptr, std::size_t len) noexcept = 0;

  // Residency sets. create returns false when sets are unavailable (the
  // device then runs without residency; not an error).
  virtual bool set_create(int set, const std::string& label, std::size_t initial_capacity) = 0;
  virtual void set_add(int set, void* handle) = 0;
  virtual void set_remove(int set, void* handle) noexcept = 0;
  virtual void set_commit(int set) noexcept = 0;
  virtual void set_request(int set) noexcept = 0;
  virtual void set_end(int set) noexcept = 0;
  virtual void set_destroy(int set) noexcept = 0;

  // Per-buffer pinning of CPU memory (host: mlock + prefault). Returns
  // whether the pages are locked; unwire undoes a successful wire.
  virtual bool wire(void* handle, void* ptr, std::size_t len) = 0;
  virtual void unwire(void* handle, void* ptr, std::size_t len) noexcept = 0;

  // Attach the device's residency sets to a consumer's command queue (an
  // id<MTLCommandQueue> on Metal), now and for sets created later, so the
  // weights are resident for that queue's command buffers. Returns false
  // when the backend has no queues (host) or the queue is not usable.
  virtual bool attach_queue(void* queue) {
    (void)queue;
    return false;
  }

  // Read a buffer back through the device: the checksum of each group of
  // kVerifyGroup decoded float32 values (see verify.h).
  virtual void checksums(DType dtype, void* handle, const void* ptr, std::size_t numel,
                         std::uint32_t* out, std::size_t ngroups) = 0;
};

std::unique_ptr<Backend> make_host_backend();
#if defined(HF2Q_HAVE_METAL)
// nullptr (with *why set) when no Metal device can be created.
std::unique_ptr<Backend> make_metal_backend(std::string* why);
#endif

}  // namespace hf2q::device
