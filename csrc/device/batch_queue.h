// Prepared file batches read one after another on a thread of the queue's
// own (docs/CUDA.md, "The batch queue"). A GPU load prepares batch N+1
// while batch N is read; submitted here, N+1 starts the moment N's pipeline
// ends, with no Python between them (a Python thread per batch waited for
// the GIL on the way in and out of each native call while the loading
// thread held it, a few milliseconds a batch). The worker never touches
// Python: it may run while the interpreter finalizes. Each queued batch owns
// the buffers it writes until its read ended, so no caller's failure path
// can free memory under a read. A child forked meanwhile has no worker:
// every call there is refused, and letting the queue go there leaks its
// state rather than waiting for threads that exist only in the parent.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include <sys/types.h>

#include "device.h"

namespace hf2q::device {

class FileBatchQueue {
 public:
  // The worker starts here (std::system_error where no thread can start).
  // `device` must outlive the queue (the binding keeps it alive).
  explicit FileBatchQueue(Device& device);
  ~FileBatchQueue();
  FileBatchQueue(const FileBatchQueue&) = delete;
  FileBatchQueue& operator=(const FileBatchQueue&) = delete;

  // Plans `jobs` (every check of Device::read_file_batch, on the calling
  // thread: a bad job is refused here) and queues them; returns a ticket.
  // `keep`: the buffers the jobs write and read (their scales), held until
  // the read ended. `after`: a ticket of this queue whose batch must have
  // succeeded for this one to run (0: none); else this one fails unread.
  // The files the jobs name must stay open until the ticket ended (close()
  // waits for every ticket).
  // `transposes`: unit transposes of the jobs' buffers run once the read
  // succeeded (their failure is the ticket's), as the batch thread ran them
  // before: not on the caller's thread, where they would wait for the next
  // batch's copies in flight.
  std::uint64_t submit(const std::vector<Device::BatchJob>& jobs, std::vector<std::shared_ptr<BufferImpl>> keep,
                       std::uint64_t after, std::vector<Device::UnitTransposeSpec> transposes = {});

  // The ticket's outcome once it ran: its results and the seconds since it
  // ended, or its error rethrown; the ticket is spent either way. nullopt if
  // it has not ended within `timeout_s` (the caller waits again).
  std::optional<std::pair<std::vector<UploadResult>, double>> wait(std::uint64_t ticket, double timeout_s);

  // The batches not started yet end unread (their tickets fail); the one
  // being read goes on. For a caller that is failing: less to wait for.
  void cancel();

  // Batches still queued are read, then the worker is joined. Idempotent;
  // no-op in a forked child.
  void close() noexcept;

 private:
  struct Item {
    std::uint64_t ticket;
    std::uint64_t after;
    std::vector<FileBatchItem> items;
    std::vector<std::shared_ptr<BufferImpl>> keep;
    std::vector<Device::UnitTransposeSpec> transposes;
  };
  struct Outcome {
    std::vector<UploadResult> results;
    std::exception_ptr error;
    std::chrono::steady_clock::time_point ended;
  };
  // Everything a forked child must never destroy (a condition variable the
  // parent's threads waited on, the worker's handle): on the heap, leaked there.
  struct State {
    std::mutex mu;
    std::condition_variable work_cv, done_cv;
    std::deque<Item> pending;
    std::map<std::uint64_t, Outcome> done;
    std::set<std::uint64_t> failed;  // tickets that failed or were not run (what `after` looks at)
    std::uint64_t next_ticket = 1;
    std::uint64_t running = 0;  // the ticket being read (0: none)
    bool closing = false;
    std::thread worker;
  };

  void run() noexcept;
  void check_owner() const;

  Device& device_;
  pid_t owner_pid_;
  State* st_;
};

}  // namespace hf2q::device
