// Host backend: page-aligned anonymous memory; residency = mlock + prefault
// (docs/RESIDENCY.md). Runs everywhere; the backend CI exercises.
#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend.h"
#include "kernels/thread_pool.h"

#if defined(__linux__) && !defined(MADV_POPULATE_WRITE)
#define MADV_POPULATE_WRITE 23  // Linux 5.14+; older headers lack the constant
#endif

namespace hf2q::device {
namespace {

constexpr std::size_t kHugePage = 2u << 20;
constexpr std::size_t kWireChunk = 32u << 20;  // a multiple of kHugePage and of every page size

// Only where the advice exists (Linux): elsewhere (macOS) nothing calls
// these, and an unused function fails the -Werror Apple build.
#if defined(MADV_HUGEPAGE)
#if defined(__linux__)
// The bracketed choice of a sysfs setting ("always [madvise] never" ->
// "madvise"); empty when the file is missing or unreadable.
std::string sysfs_choice(const char* path) {
  std::FILE* f = std::fopen(path, "re");
  if (f == nullptr) return {};
  char line[256] = {0};
  const bool ok = std::fgets(line, sizeof line, f) != nullptr;
  std::fclose(f);
  if (!ok) return {};
  const char* open = std::strchr(line, '[');
  const char* close = open ? std::strchr(open, ']') : nullptr;
  return close ? std::string(open + 1, close) : std::string();
}

// Whether the kernel hands free memory back to a hypervisor in blocks a
// huge page fault would take (virtio free page reporting): the module
// parameter page_reporting_order is the smallest reported block's order
// once a reporting device registered (9, 2 MiB, on x86-64), and unset
// (-1, read as 4294967295) or absent otherwise. Blocks of that order that
// were free for a moment have been reported, and the host backs them again
// only when touched: a 2 MiB fault there took 2-9 ms (1-2 s of system time
// for 860 MB) on the CI machine, with no compaction (docs/RESIDENCY.md).
bool free_page_reporting_takes_huge_blocks() {
  std::FILE* f = std::fopen("/sys/module/page_reporting/parameters/page_reporting_order", "re");
  if (f == nullptr) return false;
  unsigned long order = 0;
  const bool ok = std::fscanf(f, "%lu", &order) == 1;
  std::fclose(f);
  return ok && order <= 9;  // a 2 MiB block (order 9 with 4 KiB pages) or smaller is reported
}
#endif  // __linux__

// Whether fresh buffers get MADV_HUGEPAGE (docs/RESIDENCY.md, "Huge
// pages"). The advice only changes anything where THP "enabled" is
// "madvise" (with "always" every large mapping may get huge pages anyway,
// with "never" none does), and it is only worth it where the kernel will
// not compact memory synchronously for advised regions: THP "defrag" "defer"
// or "never". With "madvise", "defer+madvise" or "always" (the common
// default is "madvise") a fault in an advised region stalls in direct
// compaction when no free 2 MiB block is at hand: populating 860 MB took
// 2.1-3.5 s with the advice against 0.45-0.57 s without on the CI machine.
// Nor where free page reporting gives 2 MiB blocks back to a hypervisor
// (free_page_reporting_takes_huge_blocks): a huge page fault then often
// waits for the host to back the block again.
// Read once per process; HF2Q_HUGEPAGES=1/0 overrides (benchmarks).
bool host_huge_page_advice() {
  static const bool advise = [] {
    const char* env = std::getenv("HF2Q_HUGEPAGES");
    if (env != nullptr && std::strcmp(env, "1") == 0) return true;
    if (env != nullptr && std::strcmp(env, "0") == 0) return false;
#if defined(__linux__)
    if (sysfs_choice("/sys/kernel/mm/transparent_hugepage/enabled") != "madvise") return false;
    const std::string defrag = sysfs_choice("/sys/kernel/mm/transparent_hugepage/defrag");
    if (defrag != "defer" && defrag != "never") return false;
    return !free_page_reporting_takes_huge_blocks();
#else
    return false;
#endif
  }();
  return advise;
}
#endif  // MADV_HUGEPAGE

class HostBackend final : public Backend {
 public:
  HostBackend() {
    info_.kind = "host";
    info_.name = "host memory";
    const long page = ::sysconf(_SC_PAGESIZE);
    info_.page_size = page > 0 ? static_cast<std::size_t>(page) : 4096;
    info_.unified_memory = true;
    info_.max_sets = 1;
    info_.wire_at_register = true;  // mlock populates before the loader writes (docs/RESIDENCY.md)
    info_.placement = true;         // every call uses the CPU pointer (Device::alloc_window)
  }

  const BackendInfo& info() const override { return info_; }

  ~HostBackend() override {
    for (const Kept& k : kept_) ::munmap(k.ptr, k.len);
  }

  void* allocate(std::size_t len, void** handle) override { return take(len, handle, true); }

  // A reused range keeps its old bytes (fresh memory is zero anyway).
  void* allocate_unzeroed(std::size_t len, void** handle) override { return take(len, handle, false); }

 private:
  void* take(std::size_t len, void** handle, bool zero) {
    if (reuse_limit_.load() == 0) return map(len, handle);
    std::uint8_t* p = nullptr;
    std::vector<Kept> drop;
    {
      std::lock_guard<std::mutex> lk(reuse_mu_);
      live_.reserve(live_.size() + 1);  // first: nothing below throws once a range is taken
      kept_.reserve(kept_.size() + live_.size() + 1);  // room for every range in use to come back (release does not allocate)
      drop.reserve(kept_.size());
      // The smallest kept range that holds `len`; what it has beyond `len`
      // stays kept (ranges are page multiples: any part can be unmapped or
      // handed out on its own).
      std::size_t best = kept_.size();
      for (std::size_t i = 0; i < kept_.size(); ++i) {
        if (kept_[i].len >= len && (best == kept_.size() || kept_[i].len < kept_[best].len)) best = i;
      }
      if (best != kept_.size()) {
        p = kept_[best].ptr;
        if (kept_[best].len > len) {
          kept_[best].ptr += len;
          kept_[best].len -= len;
        } else {
          kept_[best] = kept_.back();
          kept_.pop_back();
        }
        kept_bytes_ -= len;
      } else {
        // None holds it: give kept memory back (largest first) until this one fits under the limit.
        const std::size_t limit = reuse_limit_.load();
        while (!kept_.empty() && kept_bytes_ + live_bytes_ + len > limit) {
          std::size_t big = 0;
          for (std::size_t i = 1; i < kept_.size(); ++i) {
            if (kept_[i].len > kept_[big].len) big = i;
          }
          drop.push_back(kept_[big]);
          kept_bytes_ -= kept_[big].len;
          kept_[big] = kept_.back();
          kept_.pop_back();
        }
      }
    }
    for (const Kept& k : drop) ::munmap(k.ptr, k.len);
    if (p != nullptr && zero) {
      // Zero-filled as fresh memory is: its pages are present, so this is a
      // memset, not a page fault per page.
      try {
        parallel_for(len, kWireChunk, [&](std::size_t b, std::size_t e) { std::memset(p + b, 0, e - b); });
      } catch (...) {
        ::munmap(p, len);
        throw;
      }
    } else if (p == nullptr) {
      p = static_cast<std::uint8_t*>(map(len, handle));
      populate(p, len);  // before the loader writes it: one pass, not a fault per page inside its copy
    }
    std::lock_guard<std::mutex> lk(reuse_mu_);
    live_.emplace(p, len);  // reserved above: does not throw
    live_bytes_ += len;
    *handle = p;
    return p;
  }

 public:

  void release(void*, void* ptr, std::size_t len) noexcept override {
    if (reuse_ever_.load()) {  // (a buffer made while reuse was on may outlive it)
      std::unique_lock<std::mutex> lk(reuse_mu_);
      auto it = live_.find(ptr);
      if (it != live_.end()) {
        live_.erase(it);
        live_bytes_ -= len;
        // Kept while mapped memory stays within the limit (and a kept range
        // is never more than that: an address range the next batch can take).
        if (kept_bytes_ + live_bytes_ + len <= reuse_limit_.load() && kept_.size() < kept_.capacity()) {
          Kept k{static_cast<std::uint8_t*>(ptr), len};
          // Joined with the kept ranges right before and after it.
          for (std::size_t i = 0; i < kept_.size();) {
            if (kept_[i].ptr + kept_[i].len == k.ptr) {
              k.ptr = kept_[i].ptr;
              k.len += kept_[i].len;
            } else if (k.ptr + k.len == kept_[i].ptr) {
              k.len += kept_[i].len;
            } else {
              ++i;
              continue;
            }
            kept_[i] = kept_.back();
            kept_.pop_back();
          }
          kept_.push_back(k);  // within capacity: does not throw
          kept_bytes_ += len;
          return;
        }
        lk.unlock();
      }
    }
    ::munmap(ptr, len);
  }

  bool set_reuse(std::size_t bytes) override {
    if (bytes != 0) reuse_ever_.store(true);
    reuse_limit_.store(bytes);
    return bytes != 0;
  }

 private:
  void* map(std::size_t len, void** handle) {
    // Large buffers start on a 2 MiB boundary, where the kernel can map them
    // with transparent huge pages (512x fewer faults when populated: 512 MiB
    // mlock measured 0.05 s with huge pages against 0.16 s without); they
    // ask for them only where that cannot stall in compaction
    // (host_huge_page_advice).
    const bool huge = len >= kHugePage;
    std::size_t map_len = len;
    if (huge && __builtin_add_overflow(len, kHugePage, &map_len)) {
      throw DeviceError("cannot allocate " + std::to_string(len) + " bytes of host memory: size overflows");
    }
    void* raw = ::mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) {
      const int err = errno;
      throw DeviceError("cannot allocate " + std::to_string(len) + " bytes of host memory: " + std::strerror(err));
    }
    auto* p = static_cast<std::uint8_t*>(raw);
    if (huge) {
      const auto addr = reinterpret_cast<std::uintptr_t>(p);
      const std::size_t head = (kHugePage - addr % kHugePage) % kHugePage;
      if (head) ::munmap(p, head);
      const std::size_t tail = map_len - head - len;
      if (tail) ::munmap(p + head + len, tail);
      p += head;
#if defined(MADV_HUGEPAGE)
      if (host_huge_page_advice()) ::madvise(p, len, MADV_HUGEPAGE);
#endif
    }
    *handle = p;  // anonymous mappings are zero-filled
    return p;
  }


 public:

  // Residency sets: the default single bookkeeping set (mlock is per
  // buffer, nothing to stage or commit). Uploads, copy-out and checksums:
  // the defaults for CPU-visible memory.

  bool wire(void*, void* ptr, std::size_t len, bool populate) override {
    auto* p = static_cast<std::uint8_t*>(ptr);
#if defined(__linux__) && defined(MLOCK_ONFAULT)
    // Lock on fault (one call: it only marks the range, and its limit check
    // is mlock's), then populate over the pool: the pages are locked as they
    // are faulted in. Populating fresh memory (the kernel zeroes and maps
    // every page) is CPU work, and MADV_POPULATE_WRITE runs in parallel,
    // while concurrent mlock calls on one process serialize in the kernel:
    // 3.39 GB in 0.81-0.83 s against 1.1-1.2 s on 2 threads, the same CPU
    // time (docs/RESIDENCY.md). Not where file reads will write every byte
    // (!populate): a fault inside the kernel's copy zeroes a page just
    // before the copy fills it, where populating first zeroes all of them
    // in one pass and the copy writes them again (the 860 MB drafter: 0.45
    // s against 0.51-0.61 s).
    if (::mlock2(p, len, MLOCK_ONFAULT) == 0) {
      if (populate) prefault(p, len);
      return true;
    }
    if (errno != ENOSYS && errno != EINVAL) {  // refused (the limit); ENOSYS/EINVAL: no mlock2, mlock below
      note_refusal(errno ? errno : EPERM);
      if (populate) prefault(p, len);
      return false;
    }
#endif
    // mlock faults the pages in; split over the pool, since populating fresh
    // memory (the kernel zeroes every page) is CPU work, not I/O.
    std::atomic<int> failure{0};
    parallel_for(len, kWireChunk, [&](std::size_t b, std::size_t e) {
      if (failure.load() == 0 && ::mlock(p + b, e - b) != 0) failure.store(errno ? errno : EPERM);
    });
    if (failure.load() == 0) return true;
    ::munlock(p, len);  // undo the chunks that did lock
    note_refusal(failure.load());
    if (populate) prefault(p, len);
    return false;
  }

  void unwire(void*, void* ptr, std::size_t len) noexcept override { ::munlock(ptr, len); }

 private:
  // Fresh memory of a scratch device (set_reuse), populated before it is
  // written; where MADV_POPULATE_WRITE is missing, the write faults it in.
  void populate(std::uint8_t* p, std::size_t len) noexcept {
#if defined(__linux__)
    try {
      parallel_for(len, kWireChunk, [&](std::size_t b, std::size_t e) { ::madvise(p + b, e - b, MADV_POPULATE_WRITE); });
    } catch (...) {  // best effort: the pages fault in as they are written
    }
#else
    (void)p, (void)len;
#endif
  }

  void prefault(std::uint8_t* p, std::size_t len) {
    const std::size_t page = info_.page_size;
    parallel_for(len, kWireChunk, [&](std::size_t b, std::size_t e) {
#if defined(__linux__)
      if (::madvise(p + b, e - b, MADV_POPULATE_WRITE) == 0) return;
#endif
      // An atomic OR of zero: a write fault that changes nothing, even while
      // another thread writes the buffer (a read alone would map the shared
      // zero page; read-then-store could undo a concurrent write).
      for (std::size_t off = b; off < e; off += page) __atomic_fetch_or(p + off, 0, __ATOMIC_RELAXED);
    });
  }

  // The first refusal is kept for take_notice (an atomic flag, not
  // std::call_once: a once-flag a fork caught mid-call would leave the child
  // waiting forever).
  void note_refusal(int err) {
    if (refusal_seen_.exchange(true)) return;
    refusal_errno_.store(err);
    refusal_pending_.store(true);
  }

 public:
  std::string take_notice() override {
    if (!refusal_pending_.exchange(false)) return {};
    struct rlimit rl {};
    ::getrlimit(RLIMIT_MEMLOCK, &rl);
    const int err = refusal_errno_.load();
    return std::string("mlock refused (") + std::strerror(err) + "; RLIMIT_MEMLOCK soft limit " +
           std::to_string(static_cast<unsigned long long>(rl.rlim_cur)) +
           " bytes): buffers stay tracked and prefaulted but unlocked";
  }

 private:
  BackendInfo info_;
  // Reuse (set_reuse): mappings kept after release, and those handed out
  // while reuse was on (pointer -> mapped length, which may exceed the
  // buffer's: a kept mapping serves any request it holds).
  struct Kept {
    std::uint8_t* ptr;
    std::size_t len;
  };
  std::atomic<std::size_t> reuse_limit_{0};
  std::atomic<bool> reuse_ever_{false};
  std::mutex reuse_mu_;
  std::vector<Kept> kept_;
  std::unordered_map<void*, std::size_t> live_;
  std::size_t kept_bytes_ = 0, live_bytes_ = 0;
  std::atomic<bool> refusal_seen_{false};
  std::atomic<bool> refusal_pending_{false};
  std::atomic<int> refusal_errno_{0};
};

}  // namespace

std::unique_ptr<Backend> make_host_backend() { return std::make_unique<HostBackend>(); }

}  // namespace hf2q::device
