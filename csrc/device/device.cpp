#include "device.h"

#include <errno.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <numeric>
#include <stdexcept>

#include "kernels/checked_ops.h"
#include "kernels/kernels.h"
#include "kernels/thread_pool.h"
#include "reader.h"
#include "verify.h"

namespace hf2q::device {
namespace {

std::atomic<long> g_alloc_fail_countdown{0};

constexpr std::size_t kCopyChunk = kReadChunkBytes;  // bytes per parallel raw copy / pread
constexpr std::size_t kConvertChunkElems = 1u << 20;     // source elements per conversion chunk, at most
constexpr std::size_t kMinConvertChunkElems = 1u << 16;  // and at least (a multiple of 32)
constexpr std::size_t kMinChunkAlignElems = 32;          // conversion chunks are whole multiples of this
constexpr std::size_t kAutoCommitPending = 64;       // staged adds before an implicit commit
constexpr std::size_t kScanPiece = 512u << 10;       // check_finite: pread + scan unit (a multiple of 4)

std::string mib(std::size_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%zu bytes (%.1f MiB)", bytes, static_cast<double>(bytes) / (1 << 20));
  return buf;
}


// Per-thread staging memory for file conversions, reached through a pthread
// key rather than thread_local: glibc allocates a dlopen'ed module's
// thread_local storage lazily and aborts the process when that fails (an
// address-space limit); a failed allocation here is a std::bad_alloc.
pthread_key_t g_staging_key;
const bool g_staging_key_ready =
    pthread_key_create(&g_staging_key, [](void* p) { delete static_cast<std::vector<std::uint8_t>*>(p); }) == 0;

std::uint8_t* staging_buffer(std::size_t len) {
  if (!g_staging_key_ready) throw std::bad_alloc();
  auto* v = static_cast<std::vector<std::uint8_t>*>(pthread_getspecific(g_staging_key));
  if (v == nullptr) {
    v = new std::vector<std::uint8_t>();
    if (pthread_setspecific(g_staging_key, v) != 0) {
      delete v;
      throw std::bad_alloc();
    }
  }
  if (v->size() < len) v->resize(len);
  return v->data();
}

// Index of the first NaN/+-Inf among n elements of a float dtype (raw bits),
// or kNoIndex. A branch-free OR over the block first (vectorizes), the exact
// index only when something was found.
template <typename T>
std::size_t first_nonfinite_bits(const std::uint8_t* p, std::size_t n, T exp_mask) {
  constexpr std::size_t kBlock = 4096;
  for (std::size_t b = 0; b < n; b += kBlock) {
    const std::size_t e = std::min(n, b + kBlock);
    T any = 0;
    for (std::size_t i = b; i < e; ++i) {
      T v;
      std::memcpy(&v, p + i * sizeof(T), sizeof(T));
      any |= static_cast<T>((v & exp_mask) == exp_mask);
    }
    if (!any) continue;
    for (std::size_t i = b; i < e; ++i) {
      T v;
      std::memcpy(&v, p + i * sizeof(T), sizeof(T));
      if ((v & exp_mask) == exp_mask) return i;
    }
  }
  return kernels::kNoIndex;
}

// The row's nonfinite_mask on elements of its size; formats without one
// (integers, block formats) have no NaN.
std::size_t first_nonfinite(DType t, const std::uint8_t* p, std::size_t n) {
  const FormatRow& r = format_of(t);
  if (r.nonfinite_mask == 0) return kernels::kNoIndex;
  switch (r.block_bytes) {
    case 1: return first_nonfinite_bits<std::uint8_t>(p, n, static_cast<std::uint8_t>(r.nonfinite_mask));
    case 2: return first_nonfinite_bits<std::uint16_t>(p, n, static_cast<std::uint16_t>(r.nonfinite_mask));
    case 4: return first_nonfinite_bits<std::uint32_t>(p, n, r.nonfinite_mask);
    default: throw std::logic_error(std::string(r.name) + ": a NaN mask needs 1-, 2- or 4-byte elements");
  }
}

// Every live Device, for the fork handlers below. Leaked on purpose (never
// destroyed at exit while a daemon thread may still use a device).
struct DeviceRegistry {
  std::mutex mu;
  std::vector<Device*> devices;
};
DeviceRegistry& registry() {
  static DeviceRegistry* r = new DeviceRegistry();
  return *r;
}

using Op = UploadOp;
using Plan = UploadPlan;

Plan plan_write(const BufferImpl& buf, std::size_t elem_offset, std::size_t src_bytes, DType src) {
  const DType dst = buf.dtype();
  Plan p{};
  p.src_dtype = src;
  p.dst_dtype = dst;
  p.src_bytes = src_bytes;
  if (!can_convert(src, dst)) {
    throw std::invalid_argument(std::string("cannot convert ") + dtype_name(src) + " to " + dtype_name(dst) +
                                " (supported: " + conversions_text() + ")");
  }
  // Into float32 the source's to_f32 writes; into any other format, that
  // format's encode (format_kernels.h).
  p.op = src == dst ? Op::Raw : (dst == DType::F32 ? Op::Decode : Op::Encode);
  if (p.op != Op::Raw && dtype_block_elems(src) > 1) {
    throw std::invalid_argument(std::string("cannot convert ") + dtype_name(src) + " to " + dtype_name(dst) +
                                ": conversions read plain elements, not blocks");
  }
  if (dtype_block_elems(src) > 1) {
    const std::size_t bb = dtype_block_bytes(src);
    if (src_bytes % bb != 0) {
      throw std::invalid_argument(std::string(dtype_name(src)) + " source byte length must be a multiple of " +
                                  std::to_string(bb));
    }
    p.n_elems = src_bytes / bb * dtype_block_elems(src);
  } else {
    p.src_elem = dtype_elem_size(src);
    if (src_bytes % p.src_elem != 0) {
      throw std::invalid_argument("source holds " + std::to_string(src_bytes) + " bytes: not a multiple of the " +
                                  dtype_name(src) + " element size " + std::to_string(p.src_elem));
    }
    p.n_elems = src_bytes / p.src_elem;
  }
  std::size_t end = 0;
  if (!ops::checked_add(elem_offset, p.n_elems, &end) || end > buf.numel()) {
    throw std::invalid_argument("write of " + std::to_string(p.n_elems) + " elements at element " +
                                std::to_string(elem_offset) + " overruns the buffer's " +
                                std::to_string(buf.numel()) + " elements");
  }
  if (p.n_elems % dtype_block_elems(dst) != 0) {
    throw std::invalid_argument(std::string(dtype_name(dst)) + " writes need a multiple of " +
                                std::to_string(dtype_block_elems(dst)) + " elements, got " + std::to_string(p.n_elems));
  }
  p.dst_off = element_byte_offset(dst, elem_offset);
  p.dst_len = element_byte_offset(dst, p.n_elems);
  return p;
}

void atomic_min(std::atomic<std::size_t>& a, std::size_t v) {
  std::size_t cur = a.load();
  while (v < cur && !a.compare_exchange_weak(cur, v)) {
  }
}

}  // namespace

// pread_full (declared in backend.h) lives in reader.cpp, the one checkpoint reader.

bool residency_disabled_by_env() {
  static const bool disabled = [] {
    const char* v = std::getenv("HF2Q_NO_RESIDENCY");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return disabled;
}

void inject_alloc_failure(long n) { g_alloc_fail_countdown.store(n > 0 ? n : 0); }

// Fork safety. A child forked while another thread held a device's mutex
// would inherit it locked by a thread that does not exist there and hang at
// its first alloc/residency call. The prepare handler takes the registry lock
// and then every device's mutex (so the device state is consistent at the
// fork); parent and child both release them afterwards. Nothing that holds a
// device mutex waits for the registry or for the GIL, so this cannot deadlock;
// a fork waits at most for the residency call in progress.
void Device::lock_all_for_fork() {
  DeviceRegistry& r = registry();
  r.mu.lock();
  for (Device* d : r.devices) d->mu_.lock();
}

void Device::unlock_all_after_fork() {
  DeviceRegistry& r = registry();
  for (Device* d : r.devices) d->mu_.unlock();
  r.mu.unlock();
}

namespace {
void register_device(Device* d) {
  static const bool handlers = [] {
    return pthread_atfork(&Device::lock_all_for_fork, &Device::unlock_all_after_fork,
                          &Device::unlock_all_after_fork) == 0;
  }();
  (void)handlers;
  DeviceRegistry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  r.devices.push_back(d);
}

void unregister_device(Device* d) noexcept {
  DeviceRegistry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  r.devices.erase(std::remove(r.devices.begin(), r.devices.end(), d), r.devices.end());
}
}  // namespace

// ---------------------------------------------------------------- BufferImpl

BufferImpl::BufferImpl(std::shared_ptr<Device> dev, DType dtype, std::vector<std::int64_t> shape,
                       std::size_t byte_len, std::size_t alloc_len, void* ptr, void* handle,
                       std::shared_ptr<MemoryBlock> block)
    : dev_(std::move(dev)),
      dtype_(dtype),
      shape_(std::move(shape)),
      numel_(shape_numel(shape_)),
      byte_len_(byte_len),
      alloc_len_(alloc_len),
      ptr_(ptr),
      handle_(handle),
      block_(std::move(block)) {}

BufferImpl::~BufferImpl() { dev_->release(*this); }

MemoryBlock::~MemoryBlock() { dev_->release_block(handle_, ptr_, len_); }

// -------------------------------------------------------------------- Device

std::shared_ptr<Device> Device::open(const std::string& spec) {
  std::size_t count = 0;
  const BackendEntry* entries = backend_registry(&count);
  const std::size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  const BackendEntry* entry = nullptr;
  std::string known;
  for (std::size_t i = 0; i < count; ++i) {
    if (kind == entries[i].kind) entry = &entries[i];
    known += (i ? ", '" : "'") + std::string(entries[i].kind) + "'";
  }
  if (entry == nullptr) {
    throw std::invalid_argument("unknown device kind '" + spec + "' (expected one of " + known + ")");
  }
  int index = 0;
  if (colon != std::string::npos) {
    const std::string digits = spec.substr(colon + 1);
    const bool numeric = !digits.empty() && digits.size() <= 6 &&
                         digits.find_first_not_of("0123456789") == std::string::npos;
    if (!entry->indexed || !numeric) {
      throw std::invalid_argument("bad device '" + spec + "': " +
                                  (entry->indexed ? "expected '" + kind + ":N' with N a device number"
                                                  : "the " + kind + " device takes no index"));
    }
    index = std::stoi(digits);
  }
  std::string why;
  std::unique_ptr<Backend> backend = entry->open(index, &why);
  if (!backend) throw DeviceError(why);
  return std::shared_ptr<Device>(new Device(std::move(backend)));
}

Device::Device(std::unique_ptr<Backend> backend)
    : backend_(std::move(backend)), residency_enabled_(!residency_disabled_by_env()) {
  if (residency_enabled_) {
    sets_.resize(1);
    if (backend_->set_create(0, "hf2q weights 0", 64)) {
      sets_[0].created = true;
    } else {
      residency_enabled_ = false;
      sets_.clear();
    }
  }
  register_device(this);  // last: a constructor that threw must not stay registered
}

Device::~Device() {
  unregister_device(this);
  for (std::size_t i = 0; i < sets_.size(); ++i) {
    if (!sets_[i].created) continue;
    backend_->set_end(static_cast<int>(i));
    backend_->set_destroy(static_cast<int>(i));
  }
}

std::size_t Device::alloc_len_for(const std::vector<std::int64_t>& shape, DType dtype, std::size_t* byte_len) const {
  *byte_len = tensor_byte_len(dtype, shape);
  const std::size_t page = info().page_size;
  // A tensor with a 0 dimension (legal in safetensors) is an empty buffer; it still gets one page, so
  // that it has an address like every other buffer (DLPack, residency sets and backends never see 0).
  if (*byte_len == 0) return page;
  std::size_t padded = 0;
  if (!ops::checked_add(*byte_len, page - 1, &padded)) throw std::overflow_error("buffer size overflows");
  const std::size_t alloc_len = padded / page * page;
  if (info().max_buffer_len != 0 && alloc_len > info().max_buffer_len) {
    throw DeviceError("buffer of " + mib(alloc_len) + " exceeds the device's maximum buffer length of " +
                      mib(info().max_buffer_len));
  }
  return alloc_len;
}

void Device::count_injected_failure(std::size_t alloc_len) {
  long countdown = g_alloc_fail_countdown.load();
  while (countdown > 0 && !g_alloc_fail_countdown.compare_exchange_weak(countdown, countdown - 1)) {
  }
  if (countdown == 1) throw DeviceError("injected allocation failure (test hook) for " + mib(alloc_len));
}

std::shared_ptr<BufferImpl> Device::alloc(const std::vector<std::int64_t>& shape, DType dtype) {
  std::size_t byte_len = 0;
  const std::size_t alloc_len = alloc_len_for(shape, dtype, &byte_len);
  count_injected_failure(alloc_len);
  return alloc_sized(shape, dtype, byte_len, alloc_len);
}

std::shared_ptr<BufferImpl> Device::alloc_sized(const std::vector<std::int64_t>& shape, DType dtype,
                                                std::size_t byte_len, std::size_t alloc_len, bool populate) {
  void* handle = nullptr;
  void* ptr = backend_->allocate(alloc_len, &handle);
  std::shared_ptr<BufferImpl> buf;
  try {
    buf = std::make_shared<BufferImpl>(shared_from_this(), dtype, shape, byte_len, alloc_len, ptr, handle);
  } catch (...) {
    backend_->release(handle, ptr, alloc_len);
    throw;
  }
  if (residency_enabled_) register_buffer(*buf, populate);  // on failure ~BufferImpl releases
  return buf;
}

std::vector<std::shared_ptr<BufferImpl>> Device::alloc_many(const std::vector<AllocSpec>& specs) {
  std::vector<std::shared_ptr<BufferImpl>> out;
  out.reserve(specs.size());
  if (!info().suballocate || specs.size() < 2) {
    for (const AllocSpec& s : specs) {  // a throw frees those made
      std::size_t byte_len = 0;
      const std::size_t alloc_len = alloc_len_for(s.shape, s.dtype, &byte_len);
      count_injected_failure(alloc_len);
      out.push_back(alloc_sized(s.shape, s.dtype, byte_len, alloc_len, !s.filled_by_read));
    }
    return out;
  }
  // Every size is checked (and every injected failure counted) before the
  // one allocation; offsets are page multiples, so each buffer starts where
  // a buffer of its own would (alignment, DLPack consumers).
  std::vector<std::size_t> byte_lens(specs.size()), offsets(specs.size());
  std::size_t total = 0;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const std::size_t alloc_len = alloc_len_for(specs[i].shape, specs[i].dtype, &byte_lens[i]);
    count_injected_failure(alloc_len);
    offsets[i] = total;
    if (!ops::checked_add(total, alloc_len, &total)) throw std::overflow_error("total buffer size overflows");
  }
  // Each on its own (sizes checked, failures counted above) where one block
  // is too long for the device, or does not fit where the separate buffers
  // may (a nearly full or fragmented device): then with its own error.
  auto one_by_one = [&] {
    for (std::size_t i = 0; i < specs.size(); ++i) {
      out.push_back(alloc_sized(specs[i].shape, specs[i].dtype, byte_lens[i],
                                (i + 1 < specs.size() ? offsets[i + 1] : total) - offsets[i], !specs[i].filled_by_read));
    }
    return out;
  };
  if (info().max_buffer_len != 0 && total > info().max_buffer_len) return one_by_one();
  void* handle = nullptr;
  void* ptr = nullptr;
  try {
    ptr = backend_->allocate(total, &handle);
  } catch (const DeviceError&) {
    return one_by_one();
  }
  std::shared_ptr<MemoryBlock> block;
  try {
    block = std::make_shared<MemoryBlock>(shared_from_this(), ptr, handle, total);
  } catch (...) {
    backend_->release(handle, ptr, total);
    throw;
  }
  auto* base = static_cast<std::uint8_t*>(ptr);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const std::size_t next = i + 1 < specs.size() ? offsets[i + 1] : total;
    out.push_back(std::make_shared<BufferImpl>(shared_from_this(), specs[i].dtype, specs[i].shape, byte_lens[i],
                                               next - offsets[i], base + offsets[i], handle, block));
    if (residency_enabled_) register_buffer(*out.back(), !specs[i].filled_by_read);
  }
  return out;
}

std::vector<std::shared_ptr<BufferImpl>> Device::alloc_window(std::size_t len,
                                                             const std::vector<PlacedSpec>& specs, bool zero) {
  if (!info().placement) {
    throw DeviceError("alloc_window: the " + info().kind + " device cannot place buffers inside one allocation");
  }
  // Every spec checked before anything is allocated.
  std::vector<std::size_t> byte_lens(specs.size());
  for (std::size_t i = 0; i < specs.size(); ++i) {
    byte_lens[i] = tensor_byte_len(specs[i].dtype, specs[i].shape);
    std::size_t end = 0;
    if (!ops::checked_add(specs[i].byte_offset, byte_lens[i], &end) || end > len) {
      throw std::invalid_argument("alloc_window: buffer " + std::to_string(i) + " (" + std::to_string(byte_lens[i]) +
                                  " bytes at offset " + std::to_string(specs[i].byte_offset) +
                                  ") does not lie within the window of " + std::to_string(len) + " bytes");
    }
  }
  const std::size_t page = info().page_size;
  std::size_t padded = 0;
  if (!ops::checked_add(len == 0 ? std::size_t{1} : len, page - 1, &padded)) {
    throw std::overflow_error("window size overflows");
  }
  const std::size_t alloc_len = padded / page * page;
  if (info().max_buffer_len != 0 && alloc_len > info().max_buffer_len) {
    throw DeviceError("window of " + mib(alloc_len) + " exceeds the device's maximum buffer length of " +
                      mib(info().max_buffer_len));
  }
  count_injected_failure(alloc_len);
  void* handle = nullptr;
  void* ptr = zero ? backend_->allocate(alloc_len, &handle) : backend_->allocate_unzeroed(alloc_len, &handle);
  std::shared_ptr<MemoryBlock> block;
  try {
    block = std::make_shared<MemoryBlock>(shared_from_this(), ptr, handle, alloc_len);
  } catch (...) {
    backend_->release(handle, ptr, alloc_len);
    throw;
  }
  auto* base = static_cast<std::uint8_t*>(ptr);
  std::vector<std::shared_ptr<BufferImpl>> out;
  out.reserve(specs.size() + 1);
  out.push_back(std::make_shared<BufferImpl>(shared_from_this(), DType::U8,
                                             std::vector<std::int64_t>{static_cast<std::int64_t>(len)}, len,
                                             alloc_len, ptr, handle, block));
  for (std::size_t i = 0; i < specs.size(); ++i) {
    std::uint8_t* p = base + specs[i].byte_offset;
    out.push_back(std::make_shared<BufferImpl>(shared_from_this(), specs[i].dtype, specs[i].shape, byte_lens[i],
                                               byte_lens[i], p, p, block));
  }
  return out;
}

int Device::choose_set_locked(std::size_t len) {
  const std::size_t cap = info().set_cap_bytes;
  for (std::size_t i = 0; i < sets_.size(); ++i) {
    if (sets_[i].created && (cap == 0 || sets_[i].bytes + len <= cap || sets_[i].count == 0)) {
      return static_cast<int>(i);
    }
  }
  if (static_cast<int>(sets_.size()) < info().max_sets) {
    const int idx = static_cast<int>(sets_.size());
    sets_.emplace_back();
    if (backend_->set_create(idx, "hf2q weights " + std::to_string(idx), 64)) {
      sets_.back().created = true;
      return idx;
    }
    sets_.pop_back();
  }
  // All sets full: the least filled one takes it (caps are a soft target).
  int best = 0;
  for (std::size_t i = 1; i < sets_.size(); ++i) {
    if (sets_[i].bytes < sets_[static_cast<std::size_t>(best)].bytes) best = static_cast<int>(i);
  }
  return best;
}

bool Device::register_buffer(BufferImpl& buf, bool populate) {
  if (buf.device().get() != this) {
    throw DeviceError(std::string("buffer belongs to another device (") + buf.device()->info().kind +
                      "), not to this " + info().kind + " device");
  }
  if (!residency_enabled_) return false;
  std::lock_guard<std::mutex> lk(mu_);
  auto it = members_.find(&buf);
  if (it != members_.end()) return it->second.set >= 0;
  Member m;
  m.len = buf.alloc_len();
  const std::size_t budget = info().wired_budget_bytes;
  if (budget != 0 && wired_bytes_ + m.len > budget) {
    members_.emplace(&buf, m);  // tracked, usable, not wired
    return false;
  }
  // Reserve first: nothing below may throw once the backend holds the buffer.
  members_.reserve(members_.size() + 1);
  to_wire_.reserve(to_wire_.size() + 1);
  m.set = choose_set_locked(m.len);
  backend_->set_add(m.set, buf.handle());
  auto& s = sets_[static_cast<std::size_t>(m.set)];
  s.bytes += m.len;
  s.count += 1;
  s.dirty = true;
  // Host (wire_at_register): pinned now, before the loader writes it, and
  // populated in one pass over the pool -- unless `populate` is false (a
  // buffer that file reads fill: its pages fault in inside the kernel's
  // copy, locked as they come; docs/RESIDENCY.md). Elsewhere pinning waits
  // for the commit (Metal: a set is staged, then committed once per load
  // step).
  if (!ended_ && info().wire_at_register) {
    members_.emplace(&buf, m);
    wired_bytes_ += m.len;
    auto& mm = members_.find(&buf)->second;
    try {
      mm.locked = backend_->wire(buf.handle(), buf.data(), m.len, populate);
    } catch (...) {
      // Not pinned (a failed allocation of the pool's work): pinned at the
      // next commit like on any other backend.
      mm.wire_pending = true;
      to_wire_.push_back(&buf);
    }
    return true;
  }
  if (!ended_) {
    m.wire_pending = true;
    to_wire_.push_back(&buf);
  }
  wired_bytes_ += m.len;
  members_.emplace(&buf, m);
  if (++pending_ >= kAutoCommitPending) commit_locked();
  return true;
}

void Device::commit_locked() {
  std::vector<const BufferImpl*> to_wire;
  to_wire.swap(to_wire_);
  for (std::size_t i = 0; i < to_wire.size(); ++i) {
    const BufferImpl* b = to_wire[i];
    auto it = members_.find(b);
    if (it == members_.end() || !it->second.wire_pending) continue;  // freed or ended meanwhile
    try {
      it->second.locked = backend_->wire(b->handle(), b->data(), it->second.len, true);
    } catch (...) {
      // This buffer and the rest stay pending for the next commit.
      to_wire_.insert(to_wire_.end(), to_wire.begin() + static_cast<std::ptrdiff_t>(i), to_wire.end());
      throw;
    }
    it->second.wire_pending = false;
  }
  for (std::size_t i = 0; i < sets_.size(); ++i) {
    auto& s = sets_[i];
    if (!s.created) continue;
    if (s.dirty) {
      backend_->set_commit(static_cast<int>(i));
      s.dirty = false;
    }
    // One standing request per set, after its first commit.
    if (!s.requested && !ended_ && s.count > 0) {
      backend_->set_request(static_cast<int>(i));
      s.requested = true;
    }
  }
  pending_ = 0;
}

bool Device::use_as_scratch(std::size_t reuse_bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!members_.empty() || scratch_) {
    throw DeviceError("use_as_scratch: the " + info().kind + " device has buffers already, or is scratch already");
  }
  scratch_ = true;
  residency_enabled_ = false;
  return backend_->set_reuse(reuse_bytes);
}

void Device::commit() {
  std::lock_guard<std::mutex> lk(mu_);
  commit_locked();
}

void Device::request_residency() {
  std::lock_guard<std::mutex> lk(mu_);
  if (!residency_enabled_) return;
  ended_ = false;
  for (auto& [buf, m] : members_) {
    if (m.set >= 0 && !m.locked) m.locked = backend_->wire(buf->handle(), buf->data(), m.len, true);
  }
  for (auto& s : sets_) s.requested = false;
  commit_locked();
}

void Device::end_residency() {
  std::lock_guard<std::mutex> lk(mu_);
  to_wire_.clear();
  for (auto& [buf, m] : members_) {
    m.wire_pending = false;
    if (m.locked) {
      backend_->unwire(buf->handle(), buf->data(), m.len);
      m.locked = false;
    }
  }
  for (std::size_t i = 0; i < sets_.size(); ++i) {
    if (sets_[i].created && sets_[i].requested) backend_->set_end(static_cast<int>(i));
    sets_[i].requested = false;
  }
  ended_ = true;
}

void Device::attach_queue(std::uintptr_t queue) {
  if (queue == 0) throw std::invalid_argument("command queue pointer is null");
  std::lock_guard<std::mutex> lk(mu_);
  if (!backend_->attach_queue(reinterpret_cast<void*>(queue))) {
    throw DeviceError("the " + info().kind + " device cannot attach its residency sets to that command queue" +
                      (info().kind == "host" ? std::string(" (the host backend has no command queues)")
                                             : std::string(" (not an MTLCommandQueue of this device?)")));
  }
}

ResidencyStats Device::stats() {
  std::lock_guard<std::mutex> lk(mu_);
  if (pending_ > 0) commit_locked();
  ResidencyStats st;
  st.enabled = residency_enabled_;
  for (const auto& [buf, m] : members_) {
    if (m.set < 0) {
      st.unwired_bytes += m.len;
      continue;
    }
    st.count += 1;
    st.allocated_size += m.len;
    if (m.locked) st.locked_bytes += m.len;
  }
  for (const auto& s : sets_) {
    if (s.created && s.count > 0) st.sets += 1;
    st.requested = st.requested || s.requested;
  }
  st.pending = pending_;
  st.label = sets_.empty() ? "" : "hf2q weights";
  return st;
}

bool Device::is_registered(const BufferImpl& buf) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = members_.find(&buf);
  return it != members_.end() && it->second.set >= 0;
}

bool Device::is_locked(const BufferImpl& buf) {
  std::lock_guard<std::mutex> lk(mu_);
  if (pending_ > 0) commit_locked();
  auto it = members_.find(&buf);
  return it != members_.end() && it->second.locked;
}

void Device::release(BufferImpl& buf) noexcept {
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = members_.find(&buf);
    if (it != members_.end()) {
      const Member m = it->second;
      members_.erase(it);
      if (m.set >= 0) {
        // Out of the set, committed, before the memory goes (docs/RESIDENCY.md).
        auto& s = sets_[static_cast<std::size_t>(m.set)];
        backend_->set_remove(m.set, buf.handle());
        backend_->set_commit(m.set);
        s.bytes -= m.len;
        s.count -= 1;
        wired_bytes_ -= m.len;
        if (m.locked) backend_->unwire(buf.handle(), buf.data(), m.len);
      }
    }
  }
  if (!buf.block()) backend_->release(buf.handle(), buf.data(), buf.alloc_len());
}

void Device::release_block(void* handle, void* ptr, std::size_t len) noexcept { backend_->release(handle, ptr, len); }

UploadResult Device::write(BufferImpl& buf, std::size_t elem_offset, const void* src, std::size_t src_bytes,
                           DType src_dtype) {
  const Plan p = plan_write(buf, elem_offset, src_bytes, src_dtype);
  return backend_->write(UploadTarget{buf.handle(), buf.data()}, p, src);
}

namespace {
// check_finite is implemented by the CPU-visible default Backend::read_file_batch;
// a backend with its own file path (CUDA) refuses it instead of ignoring it.
void require_check_finite_support(const Device& d, bool check_finite) {
  if (check_finite && !d.info().cpu_visible) {
    throw DeviceError("check_finite is not supported on the " + d.info().kind +
                      " device yet (its memory is not CPU-visible)");
  }
}
}  // namespace

UploadResult Device::read_file(BufferImpl& buf, std::size_t elem_offset, int fd, std::uint64_t file_offset,
                               std::size_t nbytes, DType src_dtype, bool check_finite) {
  require_check_finite_support(*this, check_finite);
  Plan p = plan_write(buf, elem_offset, nbytes, src_dtype);
  p.check_finite = check_finite;
  std::uint64_t file_end = 0;
  if (__builtin_add_overflow(file_offset, static_cast<std::uint64_t>(nbytes), &file_end) ||
      file_end > static_cast<std::uint64_t>(INT64_MAX)) {
    throw std::invalid_argument("file range overflows");
  }
  return backend_->read_file(UploadTarget{buf.handle(), buf.data()}, p, fd, file_offset);
}

namespace {
// The planned segments of one buffer (sizes, conversion and bounds checked).
std::vector<FileSegment> plan_segments(const BufferImpl& buf, const std::vector<Device::SegmentSpec>& segments,
                                       DType src_dtype, bool check_finite) {
  std::vector<FileSegment> segs;
  segs.reserve(segments.size());
  for (const Device::SegmentSpec& s : segments) {
    std::uint64_t file_end = 0;
    if (__builtin_add_overflow(s.file_offset, static_cast<std::uint64_t>(s.nbytes), &file_end) ||
        file_end > static_cast<std::uint64_t>(INT64_MAX)) {
      throw std::invalid_argument("file range overflows");
    }
    segs.push_back(FileSegment{plan_write(buf, s.elem_offset, s.nbytes, src_dtype), s.fd, s.file_offset, s.elem_offset});
    segs.back().plan.check_finite = check_finite;
  }
  return segs;
}

// The planned segments of a block-scaled FP8 job (Device::BatchJob::scale)
// and its scales: the geometry checked as Device::scaled_fp8 checks it, each
// segment whole rows of the stack, inside the buffer and inside the rows the
// scale buffer's grids cover (every size overflow-checked).
std::vector<FileSegment> plan_scaled_segments(const Device::BatchJob& j, ScaledSource* out) {
  const BufferImpl& buf = *j.buf;
  const BufferImpl& scale = *j.scale;
  kernels::ScaledFp8 g;
  g.weight = j.src_dtype;
  g.scale = scale.dtype();
  g.rows = j.rows;
  g.cols = j.cols;
  g.block_rows = j.block_rows;
  g.block_cols = j.block_cols;
  if (g.scale != DType::F32) throw std::invalid_argument("scaled FP8 read: the scale buffer must be f32");
  if (g.block_rows == 0 || g.block_cols == 0) throw std::invalid_argument("scaled FP8 read: a block has no zero dimension");
  g.scale_rows = g.rows / g.block_rows + (g.rows % g.block_rows != 0);
  g.scale_cols = g.cols / g.block_cols + (g.cols % g.block_cols != 0);
  std::size_t cells = 0, matrix = 0;
  if (!ops::checked_mul(g.scale_rows, g.scale_cols, &cells) || !ops::checked_mul(g.rows, g.cols, &matrix)) {
    throw std::invalid_argument("scaled FP8 read: size overflows");
  }
  if (cells != 0 && scale.numel() % cells != 0) {
    throw std::invalid_argument("scaled FP8 read: the scale buffer holds " + std::to_string(scale.numel()) +
                                " values, not a whole number of " + std::to_string(cells) + "-value grids");
  }
  g.lead = cells == 0 ? 0 : scale.numel() / cells;  // the matrices whose grids the scale buffer holds
  g.check();  // formats, grid, overflow of lead x rows x cols
  const DType dst = buf.dtype();
  if (dst != DType::F32 && dst != DType::BF16 && dst != DType::F16 && dst != DType::Q8_0) {
    throw std::invalid_argument(std::string("scaled FP8 read: decodes into f32, bf16, f16 or q8_0, not ") +
                                dtype_name(dst));
  }
  const std::size_t block = dtype_block_elems(dst);
  if (g.cols % block != 0 || j.base % block != 0) {
    throw std::invalid_argument(std::string("scaled FP8 read: ") + dtype_name(dst) + " rows are whole blocks of " +
                                std::to_string(block));
  }
  std::size_t covered = 0, stack_end = 0;  // elements of the stack the grids cover; where they end in the buffer
  if (!ops::checked_mul(g.lead, matrix, &covered) || !ops::checked_add(j.base, covered, &stack_end)) {
    throw std::invalid_argument("scaled FP8 read: size overflows");
  }
  std::vector<FileSegment> segs;
  segs.reserve(j.segments.size());
  for (const Device::SegmentSpec& sp : j.segments) {
    std::uint64_t file_end = 0;
    if (__builtin_add_overflow(sp.file_offset, static_cast<std::uint64_t>(sp.nbytes), &file_end) ||
        file_end > static_cast<std::uint64_t>(INT64_MAX)) {
      throw std::invalid_argument("file range overflows");
    }
    std::size_t end = 0;  // one byte per FP8 element
    if (sp.elem_offset < j.base || !ops::checked_add(sp.elem_offset, sp.nbytes, &end) || end > stack_end ||
        end > buf.numel()) {
      throw std::invalid_argument("scaled FP8 read: " + std::to_string(sp.nbytes) + " elements at element " +
                                  std::to_string(sp.elem_offset) + " lie outside the stack of " +
                                  std::to_string(g.lead) + " matrices at element " + std::to_string(j.base) +
                                  " that the scale grids cover, or outside the buffer's " +
                                  std::to_string(buf.numel()) + " elements");
    }
    if (g.cols == 0 || (sp.elem_offset - j.base) % g.cols != 0 || sp.nbytes % g.cols != 0) {
      throw std::invalid_argument("scaled FP8 read: a segment must be whole rows of " + std::to_string(g.cols) +
                                  " elements");
    }
    Plan p{};
    p.op = Op::Scaled;
    p.src_dtype = j.src_dtype;
    p.dst_dtype = dst;
    p.n_elems = p.src_bytes = sp.nbytes;
    p.src_elem = 1;
    p.dst_off = element_byte_offset(dst, sp.elem_offset);
    p.dst_len = element_byte_offset(dst, sp.nbytes);
    segs.push_back(FileSegment{p, sp.fd, sp.file_offset, sp.elem_offset});
  }
  out->scale = scale.data();
  out->geo = g;
  out->base = j.base;
  return segs;
}

// Segments of one call may not write the same bytes twice: a GPU writes them
// on different streams, in no defined order, so the result would depend on
// timing. Buffers never overlap in memory, so comparing addresses compares
// ranges within each buffer.
void refuse_overlaps(const std::vector<FileBatchItem>& items) {
  struct Range {
    std::uintptr_t begin, end;
    std::size_t item, off;
  };
  std::vector<Range> ranges;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const auto base = reinterpret_cast<std::uintptr_t>(items[i].dst.base);
    for (const FileSegment& s : items[i].segments) {
      if (s.plan.dst_len > 0) ranges.push_back(Range{base + s.plan.dst_off, base + s.plan.dst_off + s.plan.dst_len, i,
                                                     s.plan.dst_off});
    }
  }
  if (ranges.size() < 2) return;
  std::sort(ranges.begin(), ranges.end(), [](const Range& x, const Range& y) { return x.begin < y.begin; });
  for (std::size_t k = 1; k < ranges.size(); ++k) {
    if (ranges[k].begin < ranges[k - 1].end) {
      throw std::invalid_argument("segments overlap in the destination: bytes [" + std::to_string(ranges[k - 1].off) +
                                  ", " + std::to_string(ranges[k - 1].off + (ranges[k - 1].end - ranges[k - 1].begin)) +
                                  ") and [" + std::to_string(ranges[k].off) + ", " +
                                  std::to_string(ranges[k].off + (ranges[k].end - ranges[k].begin)) +
                                  ") of a buffer are both written");
    }
  }
}
}  // namespace

UploadResult Device::read_file_segments(BufferImpl& buf, const std::vector<SegmentSpec>& segments,
                                        DType src_dtype, bool check_finite) {
  require_check_finite_support(*this, check_finite);
  std::vector<FileBatchItem> one{{UploadTarget{buf.handle(), buf.data()}, plan_segments(buf, segments, src_dtype, check_finite), {}}};
  refuse_overlaps(one);
  return backend_->read_file_segments(one[0].dst, one[0].segments);
}

std::vector<UploadResult> Device::read_file_batch(const std::vector<BatchJob>& jobs) {
  return read_planned_file_batch(plan_file_batch(jobs));
}

std::vector<UploadResult> Device::read_planned_file_batch(const std::vector<FileBatchItem>& items) {
  return backend_->read_file_batch(items);
}

std::vector<FileBatchItem> Device::plan_file_batch(const std::vector<BatchJob>& jobs) {
  std::vector<FileBatchItem> items;
  items.reserve(jobs.size());
  // A scale buffer is read while the call writes: no job of it may write one.
  std::vector<const BufferImpl*> scales;
  for (const BatchJob& j : jobs) {
    if (j.scale != nullptr) scales.push_back(j.scale);
  }
  if (!scales.empty()) {
    std::sort(scales.begin(), scales.end());
    for (const BatchJob& j : jobs) {
      if (std::binary_search(scales.begin(), scales.end(), j.buf)) {
        throw std::invalid_argument("read_file_batch: a job's scale buffer is written by the same call");
      }
    }
  }
  for (const BatchJob& j : jobs) {
    if (j.buf == nullptr) throw std::invalid_argument("read_file_batch: a job has no buffer");
    if (j.buf->device().get() != this) {
      throw DeviceError("read_file_batch: a buffer belongs to another device (" + j.buf->device()->info().kind +
                        "), not to this " + info().kind + " device");
    }
    require_check_finite_support(*this, j.check_finite);
    if (j.scale != nullptr) {
      if (j.scale->device().get() != this) {
        throw DeviceError("read_file_batch: a scale buffer belongs to another device (" +
                          j.scale->device()->info().kind + "), not to this " + info().kind + " device");
      }
      FileBatchItem item{UploadTarget{j.buf->handle(), j.buf->data()}, {}, {}};
      item.segments = plan_scaled_segments(j, &item.scaled);
      items.push_back(std::move(item));
      continue;
    }
    items.push_back(FileBatchItem{UploadTarget{j.buf->handle(), j.buf->data()},
                                  plan_segments(*j.buf, j.segments, j.src_dtype, j.check_finite), {}});
  }
  refuse_overlaps(items);
  return items;
}

namespace {
// A backend whose memory the CPU cannot address must override every entry
// point that would otherwise go through the pointer: refuse, never write.
void require_cpu_visible(const Backend& b, const char* what) {
  if (!b.info().cpu_visible) {
    throw DeviceError(std::string("the ") + b.info().kind + " backend has no " + what +
                      " for its memory, which the CPU cannot address");
  }
}

// A file conversion's kernels (the rows' decode or encode), looked up and
// checked once per segment.
struct Converter {
  kernels::ToF32Fn decode = nullptr;
  kernels::EncodeFn encode = nullptr;
  std::size_t dst_block = 1;
  std::size_t align = kMinChunkAlignElems;  // chunks: whole destination blocks, and of 32 elements
};

Converter converter_of(const UploadPlan& p) {
  Converter c;
  if (p.op == Op::Decode) c.decode = kernels::to_f32_kernel(p.src_dtype);
  if (p.op == Op::Encode) c.encode = kernels::encode_kernel(p.dst_dtype, p.src_dtype);
  c.dst_block = dtype_block_elems(p.dst_dtype);
  c.align = std::lcm(kMinChunkAlignElems, c.dst_block);
  return c;
}

// Elements per chunk of a conversion of `elems` elements: enough chunks that
// every thread gets work even for one expert's slice (512 x 2048 elements),
// few enough that each pread stays large.
std::size_t convert_chunk(std::size_t elems, std::size_t align) {
  const std::size_t threads = static_cast<std::size_t>(get_num_threads());
  std::size_t chunk = (elems / (4 * threads) + align - 1) / align * align;
  return std::max(align, std::min(kConvertChunkElems, std::max(kMinConvertChunkElems, chunk)) / align * align);
}

// Elements [b, e) of the conversion `p` (into the buffer at `dst`, the
// segment's first byte): pread into this thread's staging chunk, then
// decoded or encoded in place. NaN/Inf are reported at `base + index`.
void convert_range(std::uint8_t* dst, const UploadPlan& p, const Converter& c, int fd, std::uint64_t file_offset,
                   std::size_t b, std::size_t e, std::size_t base, std::atomic<std::size_t>& first_bad,
                   std::atomic<std::size_t>& inf_scales) {
  const std::size_t len = (e - b) * p.src_elem;
  std::uint8_t* staging = staging_buffer(len);
  pread_full(fd, staging, len, file_offset + b * p.src_elem);
  if (p.op == Op::Decode) {
    if (p.check_finite) {
      const std::size_t i = first_nonfinite(p.src_dtype, staging, e - b);
      if (i != kernels::kNoIndex) atomic_min(first_bad, base + b + i);
    }
    c.decode(staging, reinterpret_cast<float*>(dst) + b, e - b);
  } else {
    const kernels::EncodeResult r =
        c.encode(p.src_dtype, staging, dst + element_byte_offset(p.dst_dtype, b), (e - b) / c.dst_block);
    if (r.inf_scales != 0) inf_scales.fetch_add(r.inf_scales);
    if (r.first_nonfinite != kernels::kNoIndex) atomic_min(first_bad, base + b + r.first_nonfinite);
  }
}

// Rows of a Scaled segment, elements [b, e) of it (whole rows): pread into
// this thread's staging chunk, decoded with the item's scale grids into the
// buffer (`base`: the buffer's first byte). Non-finite products at their
// buffer element index.
void scaled_range(std::uint8_t* base, const FileSegment& s, const ScaledSource& sc, std::size_t b, std::size_t e,
                  std::atomic<std::size_t>& first_bad, std::atomic<std::size_t>& inf_scales) {
  const std::size_t len = e - b, cols = sc.geo.cols;
  const std::size_t tmp_at = (len + 63) / 64 * 64;  // the row buffer after the weights, 64-byte aligned
  std::uint8_t* staging = staging_buffer(tmp_at + cols * sizeof(float));
  pread_full(s.fd, staging, len, s.file_offset + b);
  const std::size_t row0 = (s.elem_offset - sc.base + b) / cols;
  const kernels::EncodeResult r = kernels::scaled_fp8_rows(
      sc.geo, staging, static_cast<const std::uint8_t*>(sc.scale), s.plan.dst_dtype,
      base + element_byte_offset(s.plan.dst_dtype, sc.base), row0, row0 + len / cols,
      reinterpret_cast<float*>(staging + tmp_at));
  if (r.inf_scales != 0) inf_scales.fetch_add(r.inf_scales);
  if (r.first_nonfinite != kernels::kNoIndex) atomic_min(first_bad, sc.base + r.first_nonfinite);
}
}  // namespace

std::vector<UploadResult> Backend::read_file_batch(const std::vector<FileBatchItem>& items) {
  require_cpu_visible(*this, "file upload");
  // Every segment of every item, in pieces, on the thread pool in one loop:
  // copied ranges in pieces of at most kCopyChunk bytes, pread straight into
  // the buffer; conversions in chunks of whole destination blocks, each read
  // into a per-thread staging chunk and decoded or encoded from there. One
  // segment per expert (2 MiB in Qwen3.6) is below one piece: read (or
  // converted) a segment at a time they kept all but one thread idle, or
  // waited for the pool once per expert.
  struct Piece {
    std::size_t item;
    const FileSegment* seg;
    std::size_t conv;        // index into convs; npos for a copied range, kScaledPiece for scaled rows
    std::size_t begin, end;  // copied: bytes of the segment's source; converted: its elements
  };
  constexpr std::size_t npos = static_cast<std::size_t>(-1);
  constexpr std::size_t kScaledPiece = npos - 1;  // a Scaled segment's rows (scaled_range)
  std::vector<Converter> convs;
  std::vector<Piece> pieces;
  for (std::size_t i = 0; i < items.size(); ++i) {
    for (const FileSegment& s : items[i].segments) {
      if (s.plan.op == Op::Raw) {
        const std::size_t elem = s.plan.src_elem == 0 ? 1 : s.plan.src_elem;
        const std::size_t chunk = kCopyChunk / elem * elem;  // whole elements, for the scan
        for (std::size_t b = 0; b < s.plan.src_bytes; b += chunk) {
          pieces.push_back({i, &s, npos, b, std::min(s.plan.src_bytes, b + chunk)});
        }
        continue;
      }
      if (s.plan.op == Op::Scaled) {
        // Whole rows of the stack per piece (the decoder works by rows).
        const std::size_t chunk = convert_chunk(s.plan.n_elems, items[i].scaled.geo.cols);
        for (std::size_t b = 0; b < s.plan.n_elems; b += chunk) {
          pieces.push_back({i, &s, kScaledPiece, b, std::min(s.plan.n_elems, b + chunk)});
        }
        continue;
      }
      convs.push_back(converter_of(s.plan));
      // Chunked as one segment alone would be (the staging chunk per thread
      // stays as small as before); the batch's other pieces fill the pool.
      const std::size_t chunk = convert_chunk(s.plan.n_elems, convs.back().align);
      for (std::size_t b = 0; b < s.plan.n_elems; b += chunk) {
        pieces.push_back({i, &s, convs.size() - 1, b, std::min(s.plan.n_elems, b + chunk)});
      }
    }
  }
  std::vector<std::exception_ptr> failed(pieces.size());
  // The earliest item with a failed piece: later items' pieces are skipped
  // from then on (a truncated shard or a failing disk is not read on to the
  // end of the batch); earlier items' still run, so that the error named is
  // the one reading the items in order would have met.
  std::atomic<std::size_t> first_failed{npos};
  std::unique_ptr<std::atomic<std::size_t>[]> first_bad(new std::atomic<std::size_t>[items.size()]);
  std::unique_ptr<std::atomic<std::size_t>[]> inf_scales(new std::atomic<std::size_t>[items.size()]);
  for (std::size_t i = 0; i < items.size(); ++i) {
    first_bad[i].store(kernels::kNoIndex);
    inf_scales[i].store(0);
  }
  parallel_for(pieces.size(), 1, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t k = lo; k < hi; ++k) {
      const Piece& p = pieces[k];
      if (p.item > first_failed.load(std::memory_order_relaxed)) continue;
      const FileSegment& s = *p.seg;
      std::uint8_t* dst = items[p.item].dst.base + s.plan.dst_off;
      try {
        if (p.conv == kScaledPiece) {
          scaled_range(items[p.item].dst.base, s, items[p.item].scaled, p.begin, p.end, first_bad[p.item],
                       inf_scales[p.item]);
        } else if (p.conv != npos) {
          convert_range(dst, s.plan, convs[p.conv], s.fd, s.file_offset, p.begin, p.end, s.elem_offset,
                        first_bad[p.item], inf_scales[p.item]);
        } else if (!s.plan.check_finite) {
          pread_full(s.fd, dst + p.begin, p.end - p.begin, s.file_offset + p.begin);
        } else {
          // check_finite: read and scan in pieces that stay in the core's
          // cache (L2), each scanned right after its pread.
          const std::size_t elem = s.plan.src_elem == 0 ? 1 : s.plan.src_elem;
          for (std::size_t pb = p.begin; pb < p.end; pb += kScanPiece) {
            const std::size_t pe = std::min(p.end, pb + kScanPiece);
            pread_full(s.fd, dst + pb, pe - pb, s.file_offset + pb);
            const std::size_t i = first_nonfinite(s.plan.src_dtype, dst + pb, (pe - pb) / elem);
            if (i != kernels::kNoIndex) atomic_min(first_bad[p.item], s.elem_offset + pb / elem + i);
          }
        }
      } catch (...) {
        failed[k] = std::current_exception();  // each piece its own slot: no race
        atomic_min(first_failed, p.item);
      }
    }
  });
  // A failure is reported as reading the items in order would have met it:
  // the earliest item whose read failed (pieces are in item order).
  for (std::size_t k = 0; k < pieces.size(); ++k) {
    if (!failed[k]) continue;
    try {
      std::rethrow_exception(failed[k]);
    } catch (FileReadError& e) {
      if (e.job < 0) e.job = static_cast<long>(pieces[k].item);  // the job that failed, not the batch's first
      throw;
    }
  }
  std::vector<UploadResult> out(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    out[i].first_nonfinite = first_bad[i].load();
    out[i].inf_scales = inf_scales[i].load();
  }
  return out;
}

UploadResult Backend::read_file_segments(const UploadTarget& dst, const std::vector<FileSegment>& segments) {
  std::vector<FileBatchItem> one(1);
  one[0].dst = dst;
  one[0].segments = segments;
  try {
    return read_file_batch(one)[0];
  } catch (FileReadError& e) {
    e.job = -1;  // one buffer: there is no batch to name a job of
    throw;
  }
}

UploadResult Device::convert(BufferImpl& dst, BufferImpl& src) {
  if (src.device().get() != this || dst.device().get() != this) {
    throw DeviceError("convert: both buffers must belong to this " + info().kind + " device");
  }
  if (&src == &dst) throw std::invalid_argument("convert: source and destination are the same buffer");
  if (src.numel() != dst.numel()) {
    throw std::invalid_argument("convert: the source has " + std::to_string(src.numel()) +
                                " elements, the destination " + std::to_string(dst.numel()));
  }
  const Plan p = plan_write(dst, 0, src.byte_len(), src.dtype());
  backend_->synchronize();
  return backend_->convert(UploadTarget{dst.handle(), dst.data()}, p, src.handle(), src.data());
}

namespace {

// scaled_fp8's and scaled_fp8_gather's checks of the geometry and the
// destination: the stack's kernels::ScaledFp8 (f32 scales) and the byte
// offset of its element `elem_offset` in dst, or an error naming the rule.
kernels::ScaledFp8 scaled_geometry(const char* what, BufferImpl& dst, std::size_t elem_offset, DType weight,
                                   std::size_t lead, std::size_t rows, std::size_t cols, std::size_t block_rows,
                                   std::size_t block_cols, std::size_t* dst_off) {
  kernels::ScaledFp8 s;
  s.weight = weight;
  s.scale = DType::F32;
  s.lead = lead;
  s.rows = rows;
  s.cols = cols;
  s.block_rows = block_rows;
  s.block_cols = block_cols;
  if (block_rows == 0 || block_cols == 0) {
    throw std::invalid_argument(std::string(what) + ": a block has no zero dimension");
  }
  s.scale_rows = rows / block_rows + (rows % block_rows != 0);
  s.scale_cols = cols / block_cols + (cols % block_cols != 0);
  s.check();  // formats, grid, overflow
  const std::size_t n = s.numel();
  const DType out = dst.dtype();
  if (out != DType::F32 && out != DType::BF16 && out != DType::F16 && out != DType::Q8_0) {
    throw std::invalid_argument(std::string(what) + ": decodes into f32, bf16, f16 or q8_0");
  }
  std::size_t end = 0;
  if (!ops::checked_add(elem_offset, n, &end) || end > dst.numel()) {
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(n) + " elements at " +
                                std::to_string(elem_offset) + " overrun the destination's " +
                                std::to_string(dst.numel()));
  }
  const FormatRow& d = format_of(out);
  if (elem_offset % d.block_elems != 0 || cols % d.block_elems != 0) {
    throw std::invalid_argument(std::string(what) + ": " + d.name + " rows are whole blocks of " +
                                std::to_string(d.block_elems));
  }
  *dst_off = elem_offset / d.block_elems * d.block_bytes;
  return s;
}

// Values in the scale grids of `lead` matrices of geometry `s`.
std::size_t grid_values(const kernels::ScaledFp8& s, std::size_t lead, const char* what) {
  std::size_t grid = 0;
  if (!ops::checked_mul(lead, s.scale_rows, &grid) || !ops::checked_mul(grid, s.scale_cols, &grid)) {
    throw std::invalid_argument(std::string(what) + ": scale size overflows");
  }
  return grid;
}

}  // namespace

UploadResult Device::scaled_fp8(BufferImpl& dst, std::size_t elem_offset, BufferImpl& w, BufferImpl& scale,
                                std::size_t lead, std::size_t rows, std::size_t cols, std::size_t block_rows,
                                std::size_t block_cols) {
  for (BufferImpl* b : {&dst, &w, &scale}) {
    if (b->device().get() != this) throw DeviceError("scaled_fp8: every buffer must belong to this " + info().kind + " device");
  }
  if (&dst == &w || &dst == &scale) throw std::invalid_argument("scaled_fp8: the destination is a source");
  if (scale.dtype() != DType::F32) throw std::invalid_argument("scaled_fp8: the scale buffer must be f32");
  std::size_t dst_off = 0;
  const kernels::ScaledFp8 s =
      scaled_geometry("scaled_fp8", dst, elem_offset, w.dtype(), lead, rows, cols, block_rows, block_cols, &dst_off);
  const std::size_t n = s.numel();
  const std::size_t grid = grid_values(s, lead, "scaled_fp8");
  if (w.numel() != n) throw std::invalid_argument("scaled_fp8: the weight buffer holds " + std::to_string(w.numel()) +
                                                  " elements, the geometry " + std::to_string(n));
  if (scale.numel() != grid) throw std::invalid_argument("scaled_fp8: the scale buffer holds " +
                                                         std::to_string(scale.numel()) + " values, the grid " +
                                                         std::to_string(grid));
  backend_->synchronize();  // the weight and scale uploads are complete
  return backend_->scaled_fp8(UploadTarget{dst.handle(), dst.data()}, dst_off, w.data(), scale.data(), s,
                              dst.dtype());
}

std::vector<UploadResult> Device::scaled_fp8_gather(BufferImpl& src, DType weight,
                                                    const std::vector<GatherStack>& stacks) {
  const char* what = "scaled_fp8_gather";
  if (src.device().get() != this) {
    throw DeviceError(std::string(what) + ": every buffer must belong to this " + info().kind + " device");
  }
  std::vector<Backend::GatherStack> runs;
  runs.reserve(stacks.size());
  for (const GatherStack& st : stacks) {
    if (st.dst == nullptr || st.scale == nullptr) throw std::invalid_argument(std::string(what) + ": no buffer");
    BufferImpl& dst = *st.dst;
    BufferImpl& scale = *st.scale;
    for (BufferImpl* b : {&dst, &scale}) {
      if (b->device().get() != this) {
        throw DeviceError(std::string(what) + ": every buffer must belong to this " + info().kind + " device");
      }
    }
    if (&dst == &src || &dst == &scale) {
      throw std::invalid_argument(std::string(what) + ": the destination is a source");
    }
    if (&scale == &src) throw std::invalid_argument(std::string(what) + ": the scale buffer is the source");
    if (scale.dtype() != DType::F32) throw std::invalid_argument(std::string(what) + ": the scale buffer must be f32");
    std::size_t per = 0;  // elements (and bytes: one per FP8 weight) of one matrix
    if (!ops::checked_mul(st.rows, st.cols, &per)) {
      throw std::invalid_argument(std::string(what) + ": matrix size overflows");
    }
    if (per == 0) throw std::invalid_argument(std::string(what) + ": a matrix has no elements");
    Backend::GatherStack run;
    std::size_t lead = 0;
    for (const auto& [off, count] : st.pieces) {
      std::size_t first = 0, bytes = 0, end = 0;
      if (!ops::checked_mul(lead, per, &first) || !ops::checked_mul(count, per, &bytes) ||
          !ops::checked_add(off, bytes, &end) || end > src.byte_len()) {
        throw std::invalid_argument(std::string(what) + ": a piece of " + std::to_string(count) +
                                    " matrices at byte " + std::to_string(off) + " overruns the source's " +
                                    std::to_string(src.byte_len()) + " bytes");
      }
      if (count == 0) continue;
      run.pieces.push_back(Backend::GatherPiece{off, first, count});
      if (!ops::checked_add(lead, count, &lead)) throw std::invalid_argument(std::string(what) + ": too many matrices");
    }
    run.s = scaled_geometry(what, dst, st.elem_offset, weight, lead, st.rows, st.cols, st.block_rows, st.block_cols,
                            &run.dst_off);
    const std::size_t grid = grid_values(run.s, lead, what);
    if (scale.numel() < grid) {
      throw std::invalid_argument(std::string(what) + ": the scale buffer holds " + std::to_string(scale.numel()) +
                                  " values, the grids " + std::to_string(grid));
    }
    if (!st.scale_pieces.empty()) {
      if (st.scale_src != DType::F32 && st.scale_src != DType::BF16 && st.scale_src != DType::F16) {
        throw std::invalid_argument(std::string(what) + ": scale tensors are f32, bf16 or f16");
      }
      const std::size_t esize = format_of(st.scale_src).block_bytes;
      std::size_t values = 0;
      for (const auto& [off, count] : st.scale_pieces) {
        std::size_t bytes = 0, end = 0;
        if (!ops::checked_mul(count, esize, &bytes) || !ops::checked_add(off, bytes, &end) || end > src.byte_len()) {
          throw std::invalid_argument(std::string(what) + ": a scale tensor of " + std::to_string(count) +
                                      " values at byte " + std::to_string(off) + " overruns the source's " +
                                      std::to_string(src.byte_len()) + " bytes");
        }
        if (!ops::checked_add(values, count, &values)) {
          throw std::invalid_argument(std::string(what) + ": too many scale values");
        }
      }
      if (values != grid) {
        throw std::invalid_argument(std::string(what) + ": the scale tensors hold " + std::to_string(values) +
                                    " values, the grids " + std::to_string(grid));
      }
      run.scale_src = st.scale_src;
      run.scale_pieces = st.scale_pieces;
    }
    run.dst = UploadTarget{dst.handle(), dst.data()};
    run.scale = scale.data();
    run.out = dst.dtype();
    runs.push_back(std::move(run));
  }
  backend_->synchronize();  // the source and scale uploads are complete
  return backend_->scaled_fp8_gather(src.data(), runs);
}

UploadResult Backend::scaled_fp8(const UploadTarget& dst, std::size_t dst_off, const void* w, const void* scale,
                                 const kernels::ScaledFp8& s, DType out) {
  if (!info().cpu_visible) {
    throw DeviceError("the " + info().kind + " backend has no scaled FP8 decode for its memory, which the CPU "
                      "cannot address");
  }
  const kernels::EncodeResult r = kernels::scaled_fp8_decode(
      s, static_cast<const std::uint8_t*>(w), static_cast<const std::uint8_t*>(scale), out,
      static_cast<std::uint8_t*>(dst.base) + dst_off);
  UploadResult res;
  res.first_nonfinite = r.first_nonfinite;
  res.inf_scales = r.inf_scales;
  return res;
}

std::vector<UploadResult> Backend::scaled_fp8_gather(const void* src, const std::vector<GatherStack>& stacks) {
  if (!info().cpu_visible) {
    throw DeviceError("the " + info().kind + " backend has no scaled FP8 decode for its memory, which the CPU "
                      "cannot address");
  }
  std::vector<UploadResult> out(stacks.size());
  for (std::size_t k = 0; k < stacks.size(); ++k) {
    const GatherStack& st = stacks[k];
    // The grids from the scale tensors first (widened exactly; the source
    // may hold them at any alignment: copied to an aligned row first).
    const std::size_t esize = format_of(st.scale_src).block_bytes;
    std::vector<std::uint8_t> row;
    float* grid_at = static_cast<float*>(st.scale);
    for (const auto& [off, count] : st.scale_pieces) {
      const std::uint8_t* from = static_cast<const std::uint8_t*>(src) + off;
      if (st.scale_src == DType::F32) {
        std::memcpy(grid_at, from, count * sizeof(float));
      } else {
        row.assign(from, from + count * esize);
        ops::to_f32(st.scale_src, row.data(), row.size(), grid_at, count * sizeof(float));
      }
      grid_at += count;
    }
    // Each piece is a stack of its own: its grids and outputs start where
    // the matrices before it end (sizes checked by Device::scaled_fp8_gather).
    const FormatRow& d = format_of(st.out);
    const std::size_t per = st.s.rows * st.s.cols, grid = st.s.scale_rows * st.s.scale_cols;
    for (const GatherPiece& p : st.pieces) {
      kernels::ScaledFp8 one = st.s;
      one.lead = p.lead;
      const kernels::EncodeResult r = kernels::scaled_fp8_decode(
          one, static_cast<const std::uint8_t*>(src) + p.src_off,
          static_cast<const std::uint8_t*>(st.scale) + p.first / per * grid * sizeof(float), st.out,
          static_cast<std::uint8_t*>(st.dst.base) + st.dst_off + p.first / d.block_elems * d.block_bytes);
      if (r.first_nonfinite != static_cast<std::size_t>(-1) &&
          out[k].first_nonfinite == static_cast<std::size_t>(-1)) {
        out[k].first_nonfinite = p.first + r.first_nonfinite;  // pieces in stack order: the first found is the smallest
      }
      out[k].inf_scales += r.inf_scales;
    }
  }
  return out;
}

namespace {

// transpose_units' checks: the grids in bytes, or an error naming the rule.
kernels::UnitGrid unit_grid_of(const Device* self, BufferImpl& buf, std::size_t outer, std::size_t period,
                               std::size_t start, std::size_t a, std::size_t b, std::size_t unit) {
  if (buf.device().get() != self) throw DeviceError("transpose_units: the buffer belongs to another device");
  const FormatRow& f = format_of(buf.dtype());
  for (std::size_t n : {period, start, unit}) {
    if (n % f.block_elems != 0) {
      throw std::invalid_argument(std::string("transpose_units: ") + f.name + " moves whole blocks of " +
                                  std::to_string(f.block_elems) + " elements; " + std::to_string(n) + " is not");
    }
  }
  const auto bytes = [&](std::size_t elems) {
    std::size_t out = 0;
    if (!ops::checked_mul(elems / f.block_elems, f.block_bytes, &out)) {
      throw std::invalid_argument("transpose_units: size overflows");
    }
    return out;
  };
  kernels::UnitGrid g;
  g.outer = outer;
  g.period = bytes(period);
  g.start = bytes(start);
  g.a = a;
  g.b = b;
  g.unit = bytes(unit);
  const std::size_t extent = g.extent();
  if (extent > buf.byte_len()) {
    throw std::invalid_argument("transpose_units: the grids end at byte " + std::to_string(extent) +
                                " of a buffer of " + std::to_string(buf.byte_len()));
  }
  return g;
}

}  // namespace

void Device::transpose_units(BufferImpl& buf, std::size_t outer, std::size_t period, std::size_t start,
                             std::size_t a, std::size_t b, std::size_t unit) {
  transpose_units_many({UnitTransposeSpec{&buf, outer, period, start, a, b, unit}});
}

void Device::transpose_units_many(const std::vector<UnitTransposeSpec>& items) {
  std::vector<std::pair<UploadTarget, kernels::UnitGrid>> todo;
  todo.reserve(items.size());
  for (const UnitTransposeSpec& t : items) {
    if (t.buf == nullptr) throw std::invalid_argument("transpose_units: no buffer");
    const kernels::UnitGrid g = unit_grid_of(this, *t.buf, t.outer, t.period, t.start, t.a, t.b, t.unit);
    if (g.extent() != 0) todo.emplace_back(UploadTarget{t.buf->handle(), t.buf->data()}, g);
  }
  if (!todo.empty()) backend_->transpose_units_many(todo);
}

void Backend::transpose_units_many(const std::vector<std::pair<UploadTarget, kernels::UnitGrid>>& items) {
  for (const auto& [buf, g] : items) transpose_units(buf, g);
}

void Backend::transpose_units(const UploadTarget& buf, const kernels::UnitGrid& g) {
  if (!info().cpu_visible) {
    throw DeviceError("the " + info().kind + " backend has no unit transpose for its memory, which the CPU "
                      "cannot address");
  }
  synchronize();
  kernels::transpose_units(buf.base, g);
}

void Device::copy_out(BufferImpl& buf, std::size_t offset, void* out, std::size_t len) {
  std::size_t end = 0;
  if (!ops::checked_add(offset, len, &end) || end > buf.byte_len()) {
    throw std::invalid_argument("read of " + std::to_string(len) + " bytes at byte " + std::to_string(offset) +
                                " overruns the buffer's " + std::to_string(buf.byte_len()) + " bytes");
  }
  backend_->synchronize();
  if (len != 0) backend_->copy_out(buf.handle(), buf.data(), offset, out, len);
}

// ------------------------------------------- defaults for CPU-visible memory


UploadResult Backend::write(const UploadTarget& target, const UploadPlan& p, const void* src) {
  require_cpu_visible(*this, "upload");
  const DType src_dtype = p.src_dtype;
  const std::size_t src_bytes = p.src_bytes;
  UploadResult res;
  std::uint8_t* dst = target.base + p.dst_off;
  switch (p.op) {
    case Op::Raw: {
      const auto* s = static_cast<const std::uint8_t*>(src);
      const auto sa = reinterpret_cast<std::uintptr_t>(s), da = reinterpret_cast<std::uintptr_t>(dst);
      if (p.dst_len != 0 && sa < da + p.dst_len && da < sa + p.dst_len) {
        throw std::invalid_argument("source and destination overlap (the source lies inside the buffer)");
      }
      parallel_for(p.dst_len, kCopyChunk, [&](std::size_t b, std::size_t e) { std::memcpy(dst + b, s + b, e - b); });
      break;
    }
    case Op::Decode:
      ops::to_f32(src_dtype, src, src_bytes, dst, p.dst_len);
      break;
    case Op::Encode: {
      const kernels::EncodeResult r = ops::encode(p.dst_dtype, src_dtype, src, src_bytes, dst, p.dst_len);
      res.first_nonfinite = r.first_nonfinite;
      res.inf_scales = r.inf_scales;
      break;
    }
    case Op::Scaled:
      throw std::logic_error("scaled FP8 weights are read from files only (read_file_batch)");
  }
  return res;
}

UploadResult Backend::read_file(const UploadTarget& target, const UploadPlan& p, int fd,
                                std::uint64_t file_offset) {
  // One segment at element 0: first_nonfinite is relative to the source.
  return read_file_segments(target, {FileSegment{p, fd, file_offset, 0}});
}

void Backend::copy_out(void*, const void* ptr, std::size_t offset, void* out, std::size_t len) {
  require_cpu_visible(*this, "copy-out");
  const auto* s = static_cast<const std::uint8_t*>(ptr) + offset;
  auto* d = static_cast<std::uint8_t*>(out);
  parallel_for(len, kCopyChunk, [&](std::size_t b, std::size_t e) { std::memcpy(d + b, s + b, e - b); });
}

void Backend::checksums(DType dtype, void*, const void* ptr, std::size_t numel, std::uint32_t* out,
                        std::size_t ngroups) {
  require_cpu_visible(*this, "read-back");
  cpu_checksums(dtype, ptr, numel, out, ngroups);
}

std::vector<std::uint32_t> Device::device_checksums(BufferImpl& buf) {
  const std::size_t ngroups = (buf.numel() + kVerifyGroup - 1) / kVerifyGroup;
  std::vector<std::uint32_t> out(ngroups);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (pending_ > 0) commit_locked();  // a GPU read needs the set committed
  }
  backend_->synchronize();
  backend_->checksums(buf.dtype(), buf.handle(), buf.data(), buf.numel(), out.data(), ngroups);
  return out;
}

}  // namespace hf2q::device
