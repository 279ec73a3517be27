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

#include <unistd.h>

namespace hf2q::bindings {

[[noreturn]] inline void park_thread_forever() noexcept {
  for (;;) ::pause();
}

// PyEval_RestoreThread is C and throws nothing else: whatever unwinds out of
// it is the forced unwind of pthread_exit (abi::__forced_unwind on glibc,
// caught with "..." because it has no C++ object to bind a reference to).
// A forced unwind may be caught as long as the handler does not return.
inline void restore_thread(PyThreadState* state) noexcept {
  try {
    PyEval_RestoreThread(state);
  } catch (...) {
    park_thread_forever();
  }
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
