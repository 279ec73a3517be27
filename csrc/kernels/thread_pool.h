// A small persistent thread pool for data-parallel loops.
//
// The calling thread takes part in the work. A parallel_for issued from a
// pool worker, or while another thread is using the pool, runs inline on the
// calling thread: concurrent callers (several Python threads with the GIL
// released) each make progress instead of queueing behind one another
// (unless the caller asks to wait for the pool: WhenBusy::kWait).
#pragma once

#include <cstddef>
#include <functional>

namespace hf2q {

// Threads used by parallel loops, the caller included. Default: the CPUs this
// process may run on, or HF2Q_NUM_THREADS when it is a positive integer.
int get_num_threads();
constexpr int kMaxThreads = 1024;
// 1 <= n <= kMaxThreads. Workers are (re)started lazily on the next parallel loop.
void set_num_threads(int n);

// What a parallel_for does when another thread's loop holds the pool:
// runs inline on the calling thread (the default: a short loop goes on at
// once), or waits for the pool (a loop that would take long on one thread,
// such as a GPU batch upload started while the loading thread fills a small
// tensor). A loop inside pool work always runs inline. A caller that waits
// must hold nothing that a body of another thread's loop may wait for (a
// lock, a slot, a status cell): the loop holding the pool could not end.
enum class WhenBusy { kInline, kWait };

// Calls body(begin, end) over [0, n) in chunks of `grain` items (the last one
// may be shorter), on up to get_num_threads() threads. Ranges with fewer than
// two chunks run inline. The first exception thrown by a body is rethrown
// here after all chunks have finished.
void parallel_for(std::size_t n, std::size_t grain,
                  const std::function<void(std::size_t, std::size_t)>& body,
                  WhenBusy when_busy = WhenBusy::kInline);

}  // namespace hf2q
