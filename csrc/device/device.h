// A device (one backend instance) and its buffers, with the residency
// bookkeeping and the upload paths shared by every backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend.h"
#include "dtype.h"

namespace hf2q::device {

class Device;

// One backend allocation shared by several buffers (Device::alloc_many on a
// backend that sub-allocates): released once its last buffer is gone.
class MemoryBlock {
 public:
  MemoryBlock(std::shared_ptr<Device> dev, void* ptr, void* handle, std::size_t len)
      : dev_(std::move(dev)), ptr_(ptr), handle_(handle), len_(len) {}
  ~MemoryBlock();
  MemoryBlock(const MemoryBlock&) = delete;
  MemoryBlock& operator=(const MemoryBlock&) = delete;

 private:
  std::shared_ptr<Device> dev_;
  void* ptr_;
  void* handle_;
  std::size_t len_;
};

// One allocation holding a tensor (or a part of a shared MemoryBlock). Owned through shared_ptr: Python Buffer
// objects and every numpy/DLPack view hold a reference, so the memory lives
// until the last of them is gone. Removed from its residency set before free.
class BufferImpl : public std::enable_shared_from_this<BufferImpl> {
 public:
  BufferImpl(std::shared_ptr<Device> dev, DType dtype, std::vector<std::int64_t> shape,
             std::size_t byte_len, std::size_t alloc_len, void* ptr, void* handle,
             std::shared_ptr<MemoryBlock> block = nullptr);
  ~BufferImpl();
  BufferImpl(const BufferImpl&) = delete;
  BufferImpl& operator=(const BufferImpl&) = delete;

  const std::shared_ptr<Device>& device() const { return dev_; }
  DType dtype() const { return dtype_; }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  std::size_t numel() const { return numel_; }
  std::size_t byte_len() const { return byte_len_; }
  std::size_t alloc_len() const { return alloc_len_; }
  std::uint8_t* data() const { return static_cast<std::uint8_t*>(ptr_); }
  void* handle() const { return handle_; }
  // The shared allocation this buffer is part of; null: its own allocation.
  const std::shared_ptr<MemoryBlock>& block() const { return block_; }

 private:
  std::shared_ptr<Device> dev_;
  DType dtype_;
  std::vector<std::int64_t> shape_;
  std::size_t numel_;
  std::size_t byte_len_;
  std::size_t alloc_len_;
  void* ptr_;
  void* handle_;
  std::shared_ptr<MemoryBlock> block_;  // after dev_: destroyed first
};

struct ResidencyStats {
  bool enabled = false;
  std::size_t count = 0;           // buffers in the device's residency sets
  std::size_t allocated_size = 0;  // their page-rounded bytes
  std::size_t locked_bytes = 0;    // host: bytes actually mlock'ed
  std::size_t unwired_bytes = 0;   // buffers over the wired budget (tracked, not added)
  std::size_t sets = 0;            // residency sets in use
  std::size_t pending = 0;         // staged changes not yet committed
  bool requested = false;          // residency requested (not ended)
  std::string label;
};

class Device : public std::enable_shared_from_this<Device> {
 public:
  // spec: a registered kind ("host", "metal", "cuda") or "kind:N" for an
  // indexed kind. Throws std::invalid_argument for an unknown kind or a bad
  // index, DeviceError when the kind is known but unavailable (naming why).
  static std::shared_ptr<Device> open(const std::string& spec);
  ~Device();

  const BackendInfo& info() const { return backend_->info(); }
  bool residency_enabled() const { return residency_enabled_; }
  // A scratch device (hf2q convert): no residency (buffers live for one
  // batch; pinning them would be pure cost) and up to `reuse_bytes` of freed
  // memory kept for the next allocations (Backend::set_reuse). Only before
  // the first buffer is made (DeviceError otherwise). Returns whether the
  // backend reuses memory.
  bool use_as_scratch(std::size_t reuse_bytes);

  // Zero-filled buffer of `shape` and `dtype`, registered for residency
  // unless residency is disabled. Throws std::invalid_argument for bad
  // shapes, DeviceError when memory cannot be had.
  std::shared_ptr<BufferImpl> alloc(const std::vector<std::int64_t>& shape, DType dtype);
  // Several buffers at once (a loader's run of tensors), each as alloc()
  // makes it. Where the backend sub-allocates (BackendInfo::suballocate)
  // they share one allocation, each at a page-aligned offset, which is
  // released when the last of them is freed; elsewhere each is alloc()'d.
  // All or nothing: on a throw none is left allocated.
  struct AllocSpec {
    std::vector<std::int64_t> shape;
    DType dtype;
    // Every byte will be written by file reads (the loader's raw copies):
    // pinned without populating it first (Backend::wire).
    bool filled_by_read = false;
  };
  std::vector<std::shared_ptr<BufferImpl>> alloc_many(const std::vector<AllocSpec>& specs);
  // One allocation of `len` bytes (a converter's output window,
  // laid out as the file region it becomes) and buffers placed in it at
  // the given byte offsets, so that the loader writes each tensor where
  // the file has it and the window is written out as it is (hf2q convert,
  // docs/CONVERT.md). Returns the window itself as a u8 buffer of `len`
  // bytes first, then one buffer per spec; the memory is released when the
  // last of them is freed. Placed buffers may overlap only where the caller
  // means them to (nothing here checks); each must lie within the window.
  // Only where BackendInfo::placement holds (DeviceError elsewhere); none
  // is registered for residency (a window lives for one batch). `zero`:
  // zero-filled as alloc() makes buffers; false: it may hold anything (a
  // reused range's old bytes), for a caller that writes every byte it
  // keeps (Backend::allocate_unzeroed).
  struct PlacedSpec {
    std::size_t byte_offset;
    std::vector<std::int64_t> shape;
    DType dtype;
  };
  std::vector<std::shared_ptr<BufferImpl>> alloc_window(std::size_t len, const std::vector<PlacedSpec>& specs,
                                                        bool zero = true);

  // Residency. register_buffer is idempotent; returns whether the buffer is
  // (now) in a set.
  bool register_buffer(BufferImpl& buf, bool populate = true);
  void commit();
  void request_residency();
  void end_residency();
  ResidencyStats stats();
  // Attach the residency sets to a consumer's command queue (Metal); throws
  // DeviceError where the backend has no queues or refuses this one.
  void attach_queue(std::uintptr_t queue);
  bool is_registered(const BufferImpl& buf);
  bool is_locked(const BufferImpl& buf);

  // Write `src_bytes` bytes of `src_dtype` data into `buf` from element
  // `elem_offset` on, converting when the dtypes differ (bf16/f16 -> f32,
  // f32/f16/bf16 -> q8_0). Memory source.
  UploadResult write(BufferImpl& buf, std::size_t elem_offset, const void* src, std::size_t src_bytes,
                     DType src_dtype);
  // The same from a file: pread straight into the buffer for raw copies,
  // through small per-thread chunks for conversions, in parallel.
  // check_finite: raw copies and decodes of a float dtype report the first
  // NaN/Inf element in first_nonfinite too (quantization always does);
  // DeviceError on a device whose memory is not CPU-visible.
  UploadResult read_file(BufferImpl& buf, std::size_t elem_offset, int fd, std::uint64_t file_offset,
                         std::size_t nbytes, DType src_dtype, bool check_finite = false);

  // The backend's pending notice for the user, once (Backend::take_notice).
  std::string take_notice() { return backend_->take_notice(); }

  // Every upload so far complete in device memory (see Backend::synchronize).
  void synchronize() { backend_->synchronize(); }
  bool memory(std::size_t* free_bytes, std::size_t* total_bytes) { return backend_->memory(free_bytes, total_bytes); }

  // Convert all of `src` (a buffer of this device) into `dst` on the device
  // (GPU kernels on CUDA, the CPU kernels on host and Metal); the same
  // conversions and element counts as write().
  UploadResult convert(BufferImpl& dst, BufferImpl& src);

  // A scaled FP8 tensor on this device: `w` (an f8_e4m3 / f8_e5m2 buffer of
  // lead * rows * cols elements) times `scale` (an f32 buffer holding the
  // grid, one value per block_rows x block_cols block, edge blocks partial),
  // decoded into `dst` (f32, bf16, f16, q8_0) from element `elem_offset` on
  // (docs/FP8.md): GPU kernels on CUDA, the CPU kernels elsewhere.
  UploadResult scaled_fp8(BufferImpl& dst, std::size_t elem_offset, BufferImpl& w, BufferImpl& scale,
                          std::size_t lead, std::size_t rows, std::size_t cols, std::size_t block_rows,
                          std::size_t block_cols);

  // Stacks of scaled FP8 matrices that lie in `src` (raw bytes on this
  // device, of any format: a prefetched shard's data) rather than in a
  // buffer of their own, decoded as scaled_fp8 decodes them, one call for
  // many (one wait for the uploads before). Each stack: its `pieces`,
  // (byte offset in src, matrices), laid end to end in `dst` from
  // `elem_offset` on, their grids end to end in `scale` (f32). `weight` is
  // their format (f8_e4m3 / f8_e5m2). Every piece must lie in src; on a
  // GPU a piece that is not 16-byte aligned goes through a scratch copy.
  // One result per stack, its first non-finite index counted from
  // `elem_offset`.
  // `scale_pieces` (where not empty): the grids' values are scale tensors
  // of `scale_src` format (f32, bf16, f16) in src too, (byte offset,
  // values) end to end, exactly the stack's grids: widened into `scale`
  // first (exact), on the device.
  struct GatherStack {
    BufferImpl* dst;
    std::size_t elem_offset;
    BufferImpl* scale;
    std::size_t rows, cols, block_rows, block_cols;
    std::vector<std::pair<std::size_t, std::size_t>> pieces;
    DType scale_src = DType::F32;
    std::vector<std::pair<std::size_t, std::size_t>> scale_pieces;
  };
  std::vector<UploadResult> scaled_fp8_gather(BufferImpl& src, DType weight, const std::vector<GatherStack>& stacks);

  // Reorder `buf` in place (kernels/unit_grid.h): in each of `outer` periods
  // of `period` elements, the [a, b] grid of units of `unit` elements that
  // starts at element `start` becomes its transpose [b, a]. Every count must
  // be whole blocks of the buffer's format; the grids must lie in the buffer.
  // Runs after the uploads so far (GPU kernel on CUDA, the CPU elsewhere).
  void transpose_units(BufferImpl& buf, std::size_t outer, std::size_t period, std::size_t start, std::size_t a,
                       std::size_t b, std::size_t unit);
  // Several buffers' unit transposes, each as transpose_units: every one is
  // checked before any runs, and a GPU waits for the uploads once and
  // reuses one scratch for all of them (a loader's batch has a hundred).
  struct UnitTransposeSpec {
    BufferImpl* buf;
    std::size_t outer, period, start, a, b, unit;
  };
  void transpose_units_many(const std::vector<UnitTransposeSpec>& items);

  // Copy `len` bytes at byte `offset` of the buffer's storage into CPU
  // memory (a device copy where the memory is not CPU-visible).
  void copy_out(BufferImpl& buf, std::size_t offset, void* out, std::size_t len);

  // Several file ranges of `src_dtype` data into one buffer, each at its own
  // element offset; first_nonfinite is a buffer element index.
  struct SegmentSpec {
    std::size_t elem_offset;
    int fd;
    std::uint64_t file_offset;
    std::size_t nbytes;
  };
  UploadResult read_file_segments(BufferImpl& buf, const std::vector<SegmentSpec>& segments, DType src_dtype,
                                  bool check_finite = false);

  // Many buffers' file segments in one call (Backend::read_file_batch): one
  // result per job, first_nonfinite a buffer element index of that job's
  // buffer. Every job is planned and checked before any byte is read.
  // A job with `scale` set reads block-scaled FP8 weights (src_dtype
  // f8_e4m3 / f8_e5m2) and decodes them as they arrive into its buffer (f32,
  // bf16, f16 or q8_0): a stack of rows x cols matrices starting at buffer
  // element `base`, whose scale grids (blocks of block_rows x block_cols,
  // partial at the edges) lie end to end in `scale` (f32, written before
  // this call); each segment is whole rows of the stack. Its result reports
  // non-finite products whatever check_finite says (docs/FP8.md).
  struct BatchJob {
    BufferImpl* buf;
    std::vector<SegmentSpec> segments;
    DType src_dtype;
    bool check_finite = false;
    BufferImpl* scale = nullptr;
    std::size_t rows = 0, cols = 0, block_rows = 0, block_cols = 0, base = 0;
  };
  std::vector<UploadResult> read_file_batch(const std::vector<BatchJob>& jobs);
  // read_file_batch in two halves (FileBatchQueue): every job planned and
  // checked, no byte read; then the planned items read. The items hold the
  // buffers' addresses: the buffers must outlive the read.
  std::vector<FileBatchItem> plan_file_batch(const std::vector<BatchJob>& jobs);
  std::vector<UploadResult> read_planned_file_batch(const std::vector<FileBatchItem>& items);

  std::vector<std::uint32_t> device_checksums(BufferImpl& buf);

  // Called by ~BufferImpl (and by ~MemoryBlock for the shared allocation).
  void release(BufferImpl& buf) noexcept;
  void release_block(void* handle, void* ptr, std::size_t len) noexcept;

  // pthread_atfork handlers (device.cpp): every device's mutex is held across fork().
  static void lock_all_for_fork();
  static void unlock_all_after_fork();

 private:
  explicit Device(std::unique_ptr<Backend> backend);
  std::size_t alloc_len_for(const std::vector<std::int64_t>& shape, DType dtype, std::size_t* byte_len) const;
  std::shared_ptr<BufferImpl> alloc_sized(const std::vector<std::int64_t>& shape, DType dtype, std::size_t byte_len,
                                          std::size_t alloc_len, bool populate = true);
  static void count_injected_failure(std::size_t alloc_len);
  struct Member {
    int set = -1;  // -1: tracked but over the wired budget
    bool locked = false;
    bool wire_pending = false;  // pinned at the next commit, once its data is written
    std::size_t len = 0;
  };
  struct SetState {
    bool created = false;
    bool requested = false;
    bool dirty = false;
    std::size_t bytes = 0;
    std::size_t count = 0;
  };
  int choose_set_locked(std::size_t len);
  void commit_locked();

  std::unique_ptr<Backend> backend_;
  bool residency_enabled_;
  bool scratch_ = false;  // use_as_scratch was called
  std::mutex mu_;
  std::unordered_map<const BufferImpl*, Member> members_;
  std::vector<SetState> sets_;
  std::size_t pending_ = 0;
  std::vector<const BufferImpl*> to_wire_;
  std::size_t wired_bytes_ = 0;
  bool ended_ = false;
};

// Environment switch HF2Q_NO_RESIDENCY: exactly "1" disables residency. Read
// once per process.
bool residency_disabled_by_env();

// Testing hook: make the n-th allocation from now fail (n >= 1); 0 disables.
void inject_alloc_failure(long n);

}  // namespace hf2q::device
