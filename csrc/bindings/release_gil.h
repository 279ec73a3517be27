// The GIL-release guard every binding uses instead of nb::gil_scoped_release.
//
// A daemon thread still inside a native call when the interpreter finalizes
// cannot take the GIL back: before Python 3.14, PyEval_RestoreThread() ends
// the thread with pthread_exit(), which on glibc unwinds the stack with a
// forced-unwind exception. Raised inside nb::gil_scoped_release's destructor
// (implicitly noexcept) it calls std::terminate: the process aborts with
// status 134 and "terminate called without an active exception". Here the
// forced unwind is caught where it starts and the thread parks for good, as
// Python 3.14 does itself: the process exits with the status it would have
// had without us, and nothing is printed. The thread holds no hf2q lock at
// that point (every native call has returned).
#pragma once

#include <nanobind/nanobind.h>

#if defined(__GLIBCXX__)
#include <cxxabi.h>
#endif
#include <unistd.h>

namespace hf2q::bindings {

[[noreturn]] inline void park_thread_forever() noexcept {
  for (;;) ::pause();
}

inline void restore_thread(PyThreadState* state) noexcept {
#if defined(__GLIBCXX__)
  try {
    PyEval_RestoreThread(state);
  } catch (abi::__forced_unwind&) {
    park_thread_forever();
  }
#else
  PyEval_RestoreThread(state);
#endif
}

class ReleaseGil {
 public:
  ReleaseGil() noexcept : state_(PyEval_SaveThread()) {}
  ~ReleaseGil() { restore_thread(state_); }
  ReleaseGil(const ReleaseGil&) = delete;
  ReleaseGil& operator=(const ReleaseGil&) = delete;

 private:
  PyThreadState* state_;
};

}  // namespace hf2q::bindings
