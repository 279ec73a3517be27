#include "thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif
#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#endif

namespace hf2q {
namespace {

int default_num_threads() {
  if (const char* env = std::getenv("HF2Q_NUM_THREADS")) {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && v >= 1 && v <= 1024) return static_cast<int>(v);
  }
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
#endif
  const unsigned hc = std::thread::hardware_concurrency();
  return hc > 0 ? static_cast<int>(hc) : 1;
}

thread_local bool t_in_pool_work = false;

class Pool {
 public:
  Pool() : num_threads_(default_num_threads()) {}
  ~Pool() { stop_workers(); }

  int num_threads() const { return num_threads_.load(); }

  void set_num_threads(int n) {
    std::lock_guard<std::mutex> run_lock(run_mutex_);
    stop_workers();
    num_threads_.store(n);
  }

  void run(std::size_t nchunks, const std::function<void(std::size_t)>& chunk_fn) {
    const int threads = num_threads_.load();
    // Nested calls (from a worker or from a body on the calling thread) run
    // inline before touching run_mutex_, which this thread may already own.
    if (t_in_pool_work || threads <= 1 || nchunks < 2) {
      run_inline(nchunks, chunk_fn);
      return;
    }
    std::unique_lock<std::mutex> run_lock(run_mutex_, std::try_to_lock);
    if (!run_lock.owns_lock()) {
      run_inline(nchunks, chunk_fn);
      return;
    }
    ensure_workers(static_cast<std::size_t>(threads - 1));
    if (workers_.empty()) {
      run_inline(nchunks, chunk_fn);
      return;
    }
    {
      std::lock_guard<std::mutex> lk(mutex_);
      job_ = &chunk_fn;
      job_chunks_ = nchunks;
      next_chunk_.store(0);
      error_ = nullptr;
      busy_workers_ = workers_.size();
      ++generation_;
    }
    cv_work_.notify_all();
    work_loop();
    std::unique_lock<std::mutex> lk(mutex_);
    cv_done_.wait(lk, [this] { return busy_workers_ == 0; });
    job_ = nullptr;
    std::exception_ptr err = error_;
    error_ = nullptr;
    lk.unlock();
    if (err) std::rethrow_exception(err);
  }

  // After fork() only the forking thread exists in the child; forget the
  // (non-existent) workers without joining them.
  void forget_workers_after_fork() {
    for (auto* t : workers_) (void)t;  // leaked on purpose: cannot be joined
    workers_.clear();
    new (&mutex_) std::mutex();
    new (&run_mutex_) std::mutex();
    new (&cv_work_) std::condition_variable();
    new (&cv_done_) std::condition_variable();
    job_ = nullptr;
    stopping_ = false;
    busy_workers_ = 0;
  }

 private:
  static void run_inline(std::size_t nchunks, const std::function<void(std::size_t)>& chunk_fn) {
    for (std::size_t c = 0; c < nchunks; ++c) chunk_fn(c);
  }

  void work_loop() {
    const bool was_in = t_in_pool_work;
    t_in_pool_work = true;
    for (;;) {
      const std::size_t c = next_chunk_.fetch_add(1);
      if (c >= job_chunks_) break;
      try {
        (*job_)(c);
      } catch (...) {
        std::lock_guard<std::mutex> lk(mutex_);
        if (!error_) error_ = std::current_exception();
      }
    }
    t_in_pool_work = was_in;
  }

  // `seen` starts at the generation current when the worker was created: a
  // worker (re)started after earlier jobs must not take a finished job's
  // generation for a new one (it would run a stale round and decrement
  // busy_workers_ twice).
  void worker_main(std::uint64_t seen) {
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(mutex_);
        cv_work_.wait(lk, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) return;
        seen = generation_;
      }
      work_loop();
      {
        std::lock_guard<std::mutex> lk(mutex_);
        if (--busy_workers_ == 0) cv_done_.notify_one();
      }
    }
  }

  void ensure_workers(std::size_t n) {
    if (workers_.size() == n) return;
    stop_workers();
    std::uint64_t gen;
    {
      std::lock_guard<std::mutex> lk(mutex_);
      gen = generation_;
    }
    // If the system refuses threads, run with those it gave (possibly none).
    try {
      workers_.reserve(n);
      for (std::size_t i = 0; i < n; ++i) workers_.push_back(new std::thread([this, gen] { worker_main(gen); }));
    } catch (const std::exception&) {
    }
  }

  void stop_workers() {
    {
      std::lock_guard<std::mutex> lk(mutex_);
      stopping_ = true;
    }
    cv_work_.notify_all();
    for (auto* t : workers_) {
      t->join();
      delete t;
    }
    workers_.clear();
    std::lock_guard<std::mutex> lk(mutex_);
    stopping_ = false;
  }

  std::atomic<int> num_threads_;
  std::mutex run_mutex_;  // one parallel job at a time
  std::mutex mutex_;
  std::condition_variable cv_work_;
  std::condition_variable cv_done_;
  std::vector<std::thread*> workers_;
  const std::function<void(std::size_t)>* job_ = nullptr;
  std::size_t job_chunks_ = 0;
  std::atomic<std::size_t> next_chunk_{0};
  std::size_t busy_workers_ = 0;
  std::uint64_t generation_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
};

// Never destroyed: worker threads must not outlive their pool during
// interpreter shutdown, and a detached static avoids destructor-order races.
Pool* g_pool = nullptr;
std::once_flag g_pool_once;

Pool& pool() {
  std::call_once(g_pool_once, [] {
    g_pool = new Pool();
#if defined(__unix__) || defined(__APPLE__)
    pthread_atfork(nullptr, nullptr, [] { g_pool->forget_workers_after_fork(); });
#endif
  });
  return *g_pool;
}

}  // namespace

int get_num_threads() { return pool().num_threads(); }

void set_num_threads(int n) { pool().set_num_threads(std::min(kMaxThreads, std::max(1, n))); }

void parallel_for(std::size_t n, std::size_t grain,
                  const std::function<void(std::size_t, std::size_t)>& body) {
  if (n == 0) return;
  grain = std::max<std::size_t>(grain, 1);
  const std::size_t nchunks = n / grain + (n % grain != 0 ? 1 : 0);
  if (nchunks < 2) {
    body(0, n);
    return;
  }
  pool().run(nchunks, [&](std::size_t c) {
    const std::size_t begin = c * grain;
    body(begin, std::min(n, begin + grain));
  });
}

}  // namespace hf2q
