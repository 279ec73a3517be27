#include "batch_queue.h"

#include <stdexcept>
#include <string>

#include <unistd.h>

namespace hf2q::device {

FileBatchQueue::FileBatchQueue(Device& device) : device_(device), owner_pid_(::getpid()), st_(new State) {
  try {
    st_->worker = std::thread([this] { run(); });
  } catch (...) {
    delete st_;
    throw;
  }
}

FileBatchQueue::~FileBatchQueue() {
  if (::getpid() != owner_pid_) return;  // a forked child: the state is leaked (class comment)
  close();
  delete st_;
}

void FileBatchQueue::check_owner() const {
  if (::getpid() != owner_pid_) {
    throw std::runtime_error("a file batch queue cannot be used in a child forked while it existed (its reader thread "
                             "exists only in the parent)");
  }
}

std::uint64_t FileBatchQueue::submit(const std::vector<Device::BatchJob>& jobs,
                                     std::vector<std::shared_ptr<BufferImpl>> keep, std::uint64_t after,
                                     std::vector<Device::UnitTransposeSpec> transposes) {
  check_owner();
  std::vector<FileBatchItem> items = device_.plan_file_batch(jobs);  // refused here, before it is queued
  for (const Device::UnitTransposeSpec& t : transposes) {
    if (t.buf == nullptr) throw std::invalid_argument("submit: a unit transpose has no buffer");
    keep.push_back(t.buf->shared_from_this());
  }
  std::lock_guard<std::mutex> lk(st_->mu);
  if (st_->closing) throw std::runtime_error("the file batch queue is closed");
  if (after >= st_->next_ticket) throw std::invalid_argument("submit: 'after' is not a ticket of this queue");
  const std::uint64_t ticket = st_->next_ticket++;
  st_->pending.push_back(Item{ticket, after, std::move(items), std::move(keep), std::move(transposes)});
  st_->work_cv.notify_one();
  return ticket;
}

std::optional<std::pair<std::vector<UploadResult>, double>> FileBatchQueue::wait(std::uint64_t ticket,
                                                                                 double timeout_s) {
  check_owner();
  State& s = *st_;
  std::unique_lock<std::mutex> lk(s.mu);
  auto known = [&] {
    if (s.done.count(ticket) != 0 || s.running == ticket) return true;
    for (const Item& it : s.pending) {
      if (it.ticket == ticket) return true;
    }
    return false;
  };
  if (!known()) throw std::invalid_argument("wait: " + std::to_string(ticket) + " is not a pending ticket of this queue");
  const auto limit = std::chrono::duration<double>(timeout_s > 0 ? timeout_s : 0.0);
  if (!s.done_cv.wait_for(lk, limit, [&] { return s.done.count(ticket) != 0; })) return std::nullopt;
  auto node = s.done.extract(ticket);
  lk.unlock();
  Outcome& out = node.mapped();
  if (out.error) std::rethrow_exception(out.error);
  const double ago = std::chrono::duration<double>(std::chrono::steady_clock::now() - out.ended).count();
  return std::make_pair(std::move(out.results), ago);
}

void FileBatchQueue::cancel() {
  check_owner();
  std::deque<Item> dropped;
  {
    std::lock_guard<std::mutex> lk(st_->mu);
    dropped.swap(st_->pending);
    const auto now = std::chrono::steady_clock::now();
    for (const Item& it : dropped) {
      st_->failed.insert(it.ticket);
      st_->done.emplace(it.ticket, Outcome{{}, std::make_exception_ptr(std::runtime_error("not read: cancelled")), now});
    }
    st_->done_cv.notify_all();
  }
  // (their buffers let go here, outside the lock)
}

void FileBatchQueue::run() noexcept {
  State& s = *st_;
  std::unique_lock<std::mutex> lk(s.mu);
  for (;;) {
    s.work_cv.wait(lk, [&] { return !s.pending.empty() || s.closing; });
    if (s.pending.empty()) return;  // closing, nothing left
    Item item = std::move(s.pending.front());
    s.pending.pop_front();
    const bool skip = item.after != 0 && s.failed.count(item.after) != 0;
    s.running = item.ticket;
    lk.unlock();
    Outcome out;
    if (skip) {
      out.error = std::make_exception_ptr(std::runtime_error("not read: the batch it follows failed"));
    } else {
      try {
        out.results = device_.read_planned_file_batch(item.items);
        if (!item.transposes.empty()) device_.transpose_units_many(item.transposes);
      } catch (...) {
        out.error = std::current_exception();
      }
    }
    out.ended = std::chrono::steady_clock::now();
    item.items.clear();
    item.transposes.clear();
    item.keep.clear();  // the buffers' last owner may be this thread: freed here, outside the lock
    lk.lock();
    s.running = 0;
    if (out.error) s.failed.insert(item.ticket);
    s.done.emplace(item.ticket, std::move(out));
    s.done_cv.notify_all();
  }
}

void FileBatchQueue::close() noexcept {
  if (::getpid() != owner_pid_) return;  // the worker exists only in the parent
  std::thread worker;
  {
    std::lock_guard<std::mutex> lk(st_->mu);
    st_->closing = true;
    worker = std::move(st_->worker);  // one caller joins it
  }
  st_->work_cv.notify_all();
  if (worker.joinable()) {
    if (worker.get_id() == std::this_thread::get_id()) {
      worker.detach();  // (not reachable: the worker calls nothing that closes)
    } else {
      worker.join();
    }
  }
}

}  // namespace hf2q::device
