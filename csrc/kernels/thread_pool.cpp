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

// "This thread is running pool work" (a worker, or a caller inside a body),
// so a nested parallel_for runs inline. A pthread key, not thread_local: in a
// dlopen'ed module thread_local storage is allocated lazily on first use in
// each thread, and glibc aborts the process ("cannot allocate memory for
// thread-local data") when that allocation fails under an address-space
// limit. The first pthread keys live inside the thread descriptor itself.
pthread_key_t g_in_pool_work_key;
const bool g_key_ready = pthread_key_create(&g_in_pool_work_key, nullptr) == 0;

bool in_pool_work() { return g_key_ready && pthread_getspecific(g_in_pool_work_key) != nullptr; }
void set_in_pool_work(bool v) {
  if (g_key_ready) (void)pthread_setspecific(g_in_pool_work_key, v ? reinterpret_cast<void*>(1) : nullptr);
}

class Pool {
 public:
  Pool() : num_threads_(default_num_threads()) {}
  explicit Pool(int n) : num_threads_(n) {}
  ~Pool() { stop_workers(); }

  int num_threads() const { return num_threads_.load(); }

  void set_num_threads(int n) {
    std::lock_guard<std::mutex> run_lock(run_mutex_);
    stop_workers();
    attempted_ = kNotAttempted;
    num_threads_.store(n);
  }

  void run(std::size_t nchunks, const std::function<void(std::size_t)>& chunk_fn, WhenBusy when_busy) {
    // Nested calls (from a worker or from a body on the calling thread) run
    // inline before touching run_mutex_, which this thread may already own.
    if (in_pool_work() || num_threads_.load() <= 1 || nchunks < 2) {
      run_inline(nchunks, chunk_fn);
      return;
    }
    std::unique_lock<std::mutex> run_lock(run_mutex_, std::defer_lock);
    if (when_busy == WhenBusy::kWait) {
      run_lock.lock();  // the loop holding the pool ends (thread_pool.h: what a waiting caller may hold)
    } else {
      (void)run_lock.try_lock();
    }
    // The count as of now, under the lock: set_num_threads() may have
    // changed it while this caller waited.
    const int threads = num_threads_.load();
    if (!run_lock.owns_lock() || threads <= 1) {
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

 private:
  static void run_inline(std::size_t nchunks, const std::function<void(std::size_t)>& chunk_fn) {
    for (std::size_t c = 0; c < nchunks; ++c) chunk_fn(c);
  }

  void work_loop() {
    const bool was_in = in_pool_work();
    set_in_pool_work(true);
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
    set_in_pool_work(was_in);
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

  // Starts up to n workers once per thread count. When the system refuses
  // threads (EAGAIN, an address-space limit) the pool keeps those it got and
  // does not try again until set_num_threads() asks for another count: no
  // tear-down and re-creation on every parallel loop.
  void ensure_workers(std::size_t n) {
    if (workers_.size() == n || attempted_ == n) return;
    stop_workers();
    attempted_ = n;
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

  static constexpr std::size_t kNotAttempted = static_cast<std::size_t>(-1);
  std::size_t attempted_ = kNotAttempted;  // worker count last asked of the system
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
std::atomic<Pool*> g_pool{nullptr};

// After fork() only the forking thread exists in the child. Its pool may have
// been in any state in the parent (a job half done, workers being started, a
// mutex held by a thread that is gone), so the child gets a fresh pool with
// the same thread count; the old one is leaked on purpose (its workers cannot
// be joined, its mutexes may be locked). The parent's pool is not touched.
void replace_pool_in_child() {
  Pool* old = g_pool.load();
  if (old != nullptr) g_pool.store(new Pool(old->num_threads()));
}

// Lock-free creation: no once-flag or mutex a fork could leave held.
Pool& pool() {
  Pool* p = g_pool.load(std::memory_order_acquire);
  if (p != nullptr) return *p;
  auto* fresh = new Pool();
  Pool* expected = nullptr;
  if (g_pool.compare_exchange_strong(expected, fresh, std::memory_order_acq_rel)) {
#if defined(__unix__) || defined(__APPLE__)
    pthread_atfork(nullptr, nullptr, replace_pool_in_child);
#endif
    return *fresh;
  }
  delete fresh;  // another thread won; it registers the fork handler
  return *expected;
}

}  // namespace

int get_num_threads() { return pool().num_threads(); }

void set_num_threads(int n) { pool().set_num_threads(std::min(kMaxThreads, std::max(1, n))); }

void parallel_for(std::size_t n, std::size_t grain,
                  const std::function<void(std::size_t, std::size_t)>& body, WhenBusy when_busy) {
  if (n == 0) return;
  grain = std::max<std::size_t>(grain, 1);
  const std::size_t nchunks = n / grain + (n % grain != 0 ? 1 : 0);
  if (nchunks < 2) {
    body(0, n);
    return;
  }
  pool().run(
      nchunks,
      [&](std::size_t c) {
        const std::size_t begin = c * grain;
        body(begin, std::min(n, begin + grain));
      },
      when_busy);
}

}  // namespace hf2q
