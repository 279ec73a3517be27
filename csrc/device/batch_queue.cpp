#include "batch_queue.h"

#include <stdexcept>
#include <string>

#include <unistd.h>

namespace hf2q::device {

FileBatchQueue::FileBatchQueue(Device& device) : device_(device), owner_pid_(::getpid()) {
  worker_ = std::thread([this] { run(); });
}

FileBatchQueue::~FileBatchQueue() { close(); }

void FileBatchQueue::check_owner() const {
  if (::getpid() != owner_pid_) {
    throw std::runtime_error("a file batch queue cannot be used in a child forked while it existed (its reader thread "
                             "exists only in the parent)");
  }
}

std::uint64_t FileBatchQueue::submit(const std::vector<Device::BatchJob>& jobs, std::uint64_t after) {
  check_owner();
  std::vector<FileBatchItem> items = device_.plan_file_batch(jobs);  // refused here, before it is queued
  std::lock_guard<std::mutex> lk(mu_);
  if (closing_) throw std::runtime_error("the file batch queue is closed");
  if (after >= next_ticket_) throw std::invalid_argument("submit: 'after' is not a ticket of this queue");
  const std::uint64_t ticket = next_ticket_++;
  pending_.push_back(Item{ticket, after, std::move(items)});
  work_cv_.notify_one();
  return ticket;
}

std::optional<std::pair<std::vector<UploadResult>, double>> FileBatchQueue::wait(std::uint64_t ticket,
                                                                                 double timeout_s) {
  check_owner();
  std::unique_lock<std::mutex> lk(mu_);
  auto known = [&] {
    if (done_.count(ticket) != 0 || running_ == ticket) return true;
    for (const Item& it : pending_) {
      if (it.ticket == ticket) return true;
    }
    return false;
  };
  if (!known()) throw std::invalid_argument("wait: " + std::to_string(ticket) + " is not a pending ticket of this queue");
  const auto limit = std::chrono::duration<double>(timeout_s > 0 ? timeout_s : 0.0);
  if (!done_cv_.wait_for(lk, limit, [&] { return done_.count(ticket) != 0; })) return std::nullopt;
  auto node = done_.extract(ticket);
  lk.unlock();
  Outcome& out = node.mapped();
  if (out.error) std::rethrow_exception(out.error);
  const double ago = std::chrono::duration<double>(std::chrono::steady_clock::now() - out.ended).count();
  return std::make_pair(std::move(out.results), ago);
}

void FileBatchQueue::run() noexcept {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    work_cv_.wait(lk, [&] { return !pending_.empty() || closing_; });
    if (pending_.empty()) return;  // closing, nothing left
    Item item = std::move(pending_.front());
    pending_.pop_front();
    const bool skip = item.after != 0 && failed_.count(item.after) != 0;
    running_ = item.ticket;
    lk.unlock();
    Outcome out;
    if (skip) {
      out.error = std::make_exception_ptr(std::runtime_error("not read: the batch it follows failed"));
    } else {
      try {
        out.results = device_.read_planned_file_batch(item.items);
      } catch (...) {
        out.error = std::current_exception();
      }
    }
    out.ended = std::chrono::steady_clock::now();
    item.items.clear();
    lk.lock();
    running_ = 0;
    if (out.error) failed_.insert(item.ticket);
    done_.emplace(item.ticket, std::move(out));
    done_cv_.notify_all();
  }
}

void FileBatchQueue::close() noexcept {
  if (::getpid() != owner_pid_) {
    // The worker exists only in the parent: joining it here would wait
    // forever (or fail), so its handle is left as it is, never destroyed.
    new (&worker_) std::thread();  // the copied handle forgotten, not joined
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    closing_ = true;
  }
  work_cv_.notify_all();
  if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) worker_.join();
}

}  // namespace hf2q::device
