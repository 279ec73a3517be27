// The interface every device backend implements: memory, residency, upload
// and read-back primitives. Bookkeeping, residency-set planning, size
// arithmetic and upload planning live in device.cpp, shared by all backends
// (and so exercised by the host backend's tests on Linux).
//
// Defaults describe a device whose memory the CPU can address (host, Metal
// shared storage): uploads and read-back run the CPU kernels through the
// buffer's CPU pointer, residency is bookkeeping only. A device with its own
// memory (CUDA) overrides the upload, copy-out and checksum entry points and
// sets BackendInfo::cpu_visible = false; nothing then writes through the
// pointer, which is a device address.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "../kernels/fp8.h"
#include "../kernels/unit_grid.h"
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
  // Which job of a batched read failed (Backend::read_file_batch), -1 when
  // not known: the error then names that job's tensor, not the batch's first.
  long job = -1;
  // The errno of a failed read (EIO ...), 0 when none: the caller tells a
  // failing machine (exit 1) from a bad file.
  int sys_errno = 0;
};

// DLPack device types (DLDeviceType in dlpack.h) that backends report.
constexpr int kDLCPU = 1;
constexpr int kDLCUDA = 2;

struct BackendInfo {
  std::string kind;                  // "host", "metal", "cuda"
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
  // Whether the CPU can read and write the buffers' memory through their
  // pointer. False: the pointer is a device address (CUDA).
  bool cpu_visible = true;
  // What __dlpack_device__ reports: (dlpack_device_type, device_index).
  int dlpack_device_type = kDLCPU;
  int device_index = 0;
  // Whether buffers allocated together (Device::alloc_many) may share one
  // backend allocation. True where an allocation has a large fixed cost and
  // buffers are addressed by pointer alone (CUDA); false where each buffer
  // is its own object to consumers (Metal's MTLBuffer) or is pinned one by
  // one (host mlock).
  bool suballocate = false;
  // Whether a buffer is pinned (Backend::wire) as it is registered, before
  // anything is written to it, rather than at the next commit. True on the
  // host: mlock populates fresh memory in one pass of the kernel's
  // get_user_pages, measured 1.5-2x cheaper in system time than letting the
  // loader's pread fault each page from inside its copy and locking after
  // (docs/RESIDENCY.md). False where a set is staged and committed (Metal).
  bool wire_at_register = false;
  // Whether buffers may be placed at any byte offset of one allocation
  // (Device::alloc_window): every backend call on such a buffer uses its
  // CPU pointer, none the allocation's handle (host memory; not a Metal
  // MTLBuffer, whose GPU work addresses the buffer object).
  bool placement = false;
};

// How an upload turns source elements into buffer bytes (planned and checked
// by device.cpp before any backend sees it): a copy; into an f32 buffer, the
// source format's to_f32; into any other format, that format's encode from
// the source (kernels/format_kernels.h); block-scaled FP8 weights decoded
// with their scale grid as they arrive (FileBatchItem::scaled, docs/FP8.md).
enum class UploadOp { Raw, Decode, Encode, Scaled };

struct UploadPlan {
  UploadOp op;
  std::size_t n_elems;   // source elements
  std::size_t src_bytes; // source bytes
  std::size_t dst_off;   // byte offset into the buffer
  std::size_t dst_len;   // bytes written
  std::size_t src_elem;  // bytes per source element (block-format source: 0)
  DType src_dtype;
  DType dst_dtype;
  bool check_finite = false;  // file reads: report NaN/Inf of raw copies and decodes too
};

// Where an upload lands: the buffer's backend object and base pointer (a CPU
// pointer, or a device address where the memory is not CPU-visible).
struct UploadTarget {
  void* handle;
  std::uint8_t* base;
};

// One piece of a batched file upload: `plan` (planned at `elem_offset` of
// the buffer) from `fd` at `file_offset`.
struct FileSegment {
  UploadPlan plan;
  int fd;
  std::uint64_t file_offset;
  std::size_t elem_offset;
};

struct UploadResult {
  std::size_t first_nonfinite = static_cast<std::size_t>(-1);  // element index relative to the source
  std::size_t inf_scales = 0;
};

// The scales of an item whose segments are UploadOp::Scaled: the weights
// are a stack of `geo.lead` matrices (`geo.rows` x `geo.cols`, the stack's
// element 0 at buffer element `base`), their scale grids float32, end to end
// at `scale` (this backend's memory: a CPU pointer or a device address). A
// segment is whole rows of the stack (Device::read_file_batch checks it).
struct ScaledSource {
  const void* scale = nullptr;
  kernels::ScaledFp8 geo;
  std::size_t base = 0;
};

// One buffer's part of a batched file upload (Backend::read_file_batch):
// its segments, which share one conversion (and, for Scaled, one stack).
struct FileBatchItem {
  UploadTarget dst;
  std::vector<FileSegment> segments;
  ScaledSource scaled;
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
  // The same where the caller writes every byte it reads (a converter's
  // output window): the memory may hold anything, e.g. a reused range's old
  // bytes, which spares zeroing it. Default: allocate (zero-filled).
  virtual void* allocate_unzeroed(std::size_t len, void** handle) { return allocate(len, handle); }
  virtual void release(void* handle, void* ptr, std::size_t len) noexcept = 0;
  // Keep up to `bytes` of released memory for later allocations (a
  // converter's short-lived buffers, freed and made again every batch), and
  // populate fresh allocations before anyone writes them. Memory handed out
  // again is zero-filled like fresh memory. Mapped memory (handed out plus
  // kept) stays within `bytes` where the buffers in use allow. Returns
  // whether the backend does it (default: no, nothing changes).
  virtual bool set_reuse(std::size_t bytes) {
    (void)bytes;
    return false;
  }

  // Residency sets. create returns false when sets are unavailable (the
  // device then runs without residency; not an error). Default: one logical
  // set that is bookkeeping only (device.cpp counts its members), with
  // nothing to stage, commit or request.
  virtual bool set_create(int set, const std::string& label, std::size_t initial_capacity) {
    (void)set, (void)label, (void)initial_capacity;
    return true;
  }
  virtual void set_add(int set, void* handle) { (void)set, (void)handle; }
  virtual void set_remove(int set, void* handle) noexcept { (void)set, (void)handle; }
  virtual void set_commit(int set) noexcept { (void)set; }
  virtual void set_request(int set) noexcept { (void)set; }
  virtual void set_end(int set) noexcept { (void)set; }
  virtual void set_destroy(int set) noexcept { (void)set; }

  // Per-buffer pinning (host: mlock + prefault). Returns whether the memory
  // is locked; unwire undoes a successful wire. `populate`: false where the
  // caller will write every byte with file reads (the loader's raw copies),
  // whose page faults inside the kernel's copy cost less than populating
  // the memory first (host: the pages are locked as they fault in).
  // Default: no per-buffer pinning (Metal: residency comes from the sets).
  virtual bool wire(void* handle, void* ptr, std::size_t len, bool populate) {
    (void)handle, (void)ptr, (void)len, (void)populate;
    return false;
  }
  virtual void unwire(void* handle, void* ptr, std::size_t len) noexcept { (void)handle, (void)ptr, (void)len; }

  // A message for the user about something that is not an error (host:
  // mlock refused, so buffers stay unlocked), returned once and then empty.
  // Native code prints nothing; the Python layer turns it into a warning.
  virtual std::string take_notice() { return {}; }

  // Attach the device's residency sets to a consumer's command queue (an
  // id<MTLCommandQueue> on Metal), now and for sets created later, so the
  // weights are resident for that queue's command buffers. Returns false
  // when the backend has no queues (host) or the queue is not usable.
  virtual bool attach_queue(void* queue) {
    (void)queue;
    return false;
  }

  // Uploads, planned and bounds-checked by device.cpp. `src` is CPU memory;
  // a file source is `plan` source bytes at `file_offset` of `fd`. Defaults
  // (device.cpp): the CPU kernels writing through `dst.base`, in parallel;
  // raw file data is pread straight into the buffer. The file defaults
  // chain read_file -> read_file_segments -> read_file_batch (virtual
  // calls): a backend with its own file path overrides read_file_batch, or
  // all three (CUDA), never read_file alone. Throw FileReadError
  // for a short or failed read, DeviceError for device failures.
  virtual UploadResult write(const UploadTarget& dst, const UploadPlan& plan, const void* src);
  virtual UploadResult read_file(const UploadTarget& dst, const UploadPlan& plan, int fd,
                                 std::uint64_t file_offset);
  // Many segments of one buffer, same dtypes (an expert stack gathered from
  // per-expert tensors): one pipeline and one wait instead of one per piece.
  // first_nonfinite is a buffer element index here. Default:
  // read_file_batch with this one item.
  virtual UploadResult read_file_segments(const UploadTarget& dst, const std::vector<FileSegment>& segments);
  // Many buffers' segments in one call (a loader's run of tensors): a GPU
  // runs one pipeline over all of them, so that neither the staging ring
  // nor the copy engine drains between tensors. One result per item, as
  // read_file_segments gives it; on a throw, nothing of the batch is in
  // flight any more; a FileReadError's `job` is the earliest item whose
  // read failed. Default (CPU-visible memory): all items' segments in
  // pieces on the thread pool in one loop, raw ones pread straight into the
  // buffer, conversions through a per-thread staging chunk; once a piece
  // fails, later items' pieces are skipped. The batch holds the thread pool
  // while it runs: a batch started meanwhile on another thread runs inline
  // on that thread. A Scaled item's scale grid must be written before the
  // call (an earlier upload); its result's first_nonfinite is the first
  // non-finite product (always reported), inf_scales its Q8_0 blocks whose
  // scale overflowed.
  virtual std::vector<UploadResult> read_file_batch(const std::vector<FileBatchItem>& items);

  // Convert a whole buffer of the same device (`src`, CPU pointer or device
  // address) into `dst` as planned. Default: the memory upload from `src`.
  virtual UploadResult convert(const UploadTarget& dst, const UploadPlan& plan, void* src_handle,
                               const void* src) {
    (void)src_handle;
    return write(dst, plan, src);
  }

  // Wait until every upload queued so far is complete in device memory.
  // Uploads may return with copies still in flight (CUDA, for those that
  // need no result from the device); readers of device memory call this
  // first. Default: uploads complete before they return.
  virtual void synchronize() {}

  // The device memory free and in all (bytes), where the backend can say
  // (a GPU); false elsewhere. A loader sizes its transients by it.
  virtual bool memory(std::size_t* free_bytes, std::size_t* total_bytes) {
    (void)free_bytes;
    (void)total_bytes;
    return false;
  }

  // Copy `len` bytes at byte `offset` of a buffer into CPU memory `out`
  // (bounds already checked). Default: memcpy from the CPU pointer.
  virtual void copy_out(void* handle, const void* ptr, std::size_t offset, void* out, std::size_t len);

  // Read a buffer back through the device: the checksum of each group of
  // kVerifyGroup decoded float32 values (see verify.h). Default: the CPU
  // kernels over the CPU pointer.
  virtual void checksums(DType dtype, void* handle, const void* ptr, std::size_t numel,
                         std::uint32_t* out, std::size_t ngroups);

  // A scaled FP8 tensor already in this device's memory (`w`: its bytes;
  // `scale`: its scale grid as float32, geometry `s` with s.scale == F32;
  // CPU pointers or device addresses) decoded into `out` (f32, bf16, f16,
  // q8_0) at byte `dst_off` of `dst` (docs/FP8.md). Checked by the caller
  // (Device::scaled_fp8). Default: the CPU kernels through the pointers.
  virtual UploadResult scaled_fp8(const UploadTarget& dst, std::size_t dst_off, const void* w, const void* scale,
                                  const kernels::ScaledFp8& s, DType out);

  // One matrix run of a scaled FP8 stack gathered from device memory
  // (scaled_fp8_gather): its weights at byte `src_off` of the source, its
  // first element the stack's element `first`, `lead` matrices.
  struct GatherPiece {
    std::size_t src_off, first, lead;
  };
  // One stack of `s.lead` matrices decoded into `out` at byte `dst_off` of
  // `dst` (the stack's element 0), its grids end to end at `scale` (f32).
  struct GatherStack {
    UploadTarget dst;
    std::size_t dst_off;
    void* scale;
    kernels::ScaledFp8 s;
    DType out;
    std::vector<GatherPiece> pieces;
    // Where the grids come from: none (already in `scale`), or these scale
    // tensors of `scale_src` format in the source (byte offset, values),
    // widened end to end into `scale` first.
    DType scale_src = DType::F32;
    std::vector<std::pair<std::size_t, std::size_t>> scale_pieces;
  };
  // Stacks whose pieces lie anywhere in `src` (this device's memory: raw
  // file bytes landed there, e.g. a prefetched shard), each piece decoded
  // as scaled_fp8 decodes it, after its scale tensors (where given) were
  // widened into its grids. One result per stack, its first_nonfinite a
  // stack index. Checked by the caller (Device::scaled_fp8_gather), after
  // the uploads so far. Default: the CPU kernels through the pointers.
  virtual std::vector<UploadResult> scaled_fp8_gather(const void* src, const std::vector<GatherStack>& stacks);

  // The unit grids `g` (kernels/unit_grid.h, in bytes) of a buffer
  // transposed in place, after its uploads (Device::transpose_units checks
  // the geometry against the buffer). Default: the CPU through the pointer.
  virtual void transpose_units(const UploadTarget& buf, const kernels::UnitGrid& g);
  // Several of them, in order. Default: one transpose_units each.
  virtual void transpose_units_many(const std::vector<std::pair<UploadTarget, kernels::UnitGrid>>& items);
};

// Reads exactly `len` bytes at `off` of `fd` into CPU memory; retries EINTR
// and short reads. Throws FileReadError (I/O error, or end of file first).
void pread_full(int fd, std::uint8_t* dst, std::size_t len, std::uint64_t off);

// The backend registry (registry.cpp): Device::open("kind" or "kind:N")
// finds its kind here. open returns nullptr with *why set when the kind
// exists but no device can be had (no GPU, missing driver or library).
struct BackendEntry {
  const char* kind;
  bool indexed;      // accepts "kind:N" ("kind" is "kind:0")
  int default_rank;  // Device.default() tries kinds by rising rank; -1: never chosen by default
  bool prepare;      // Python configures it before the first open: hf2q._<kind>.prepare()
  std::unique_ptr<Backend> (*open)(int index, std::string* why);
};
// Every kind this build knows, available or not; Device.default() (Python)
// chooses among them.
const BackendEntry* backend_registry(std::size_t* count);

std::unique_ptr<Backend> make_host_backend();
#if defined(HF2Q_HAVE_METAL)
// nullptr (with *why set) when no Metal device can be created.
std::unique_ptr<Backend> make_metal_backend(std::string* why);
#endif
#if defined(HF2Q_HAVE_CUDA)
// nullptr (with *why set) when the driver, a GPU or NVRTC is missing.
std::unique_ptr<Backend> make_cuda_backend(int index, std::string* why);
#endif

}  // namespace hf2q::device
