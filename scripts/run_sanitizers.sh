#!/usr/bin/env bash
# The whole test suite against a native core built with AddressSanitizer +
# UndefinedBehaviorSanitizer (CMake option HF2Q_SANITIZE), in its own venv.
#
#   scripts/run_sanitizers.sh [extra pytest args]
#
# Environment:
#   HF2Q_ASAN_VENV   venv to build into (default build/asan-venv; git-ignored)
#   HF2Q_ASAN_BUILD  CMake build directory (default build/asan-build; kept for incremental builds)
#   PYTHON           interpreter that creates the venv (default python3)
#   HF2Q_SKIP_BUILD  1: reuse the already installed sanitized build
#
# Exits non-zero when a test fails, when pytest collects nothing, or when any
# sanitizer report was written, by this process or by any subprocess the tests
# start (reports go to build/sanitizer-logs/, which is checked at the end).
#
# The interpreter is not instrumented, so the compiler's ASan runtime is
# LD_PRELOADed. PYTHONMALLOC=malloc routes Python's own allocations (bytes,
# bytearray, numpy data) through ASan's allocator, so an overrun of a buffer
# handed to native code is caught too. LeakSanitizer is off (detect_leaks=0):
# CPython deliberately leaves interned strings, static types and module state
# allocated at exit, and every one of those reports has interpreter frames on
# its stack, so LSan cannot tell them from a leak in _core. Leaks of device
# memory are covered instead by tests/test_fault_injection.py (residency
# counts and RSS return to their prior state).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

VENV=${HF2Q_ASAN_VENV:-build/asan-venv}
BUILD_DIR=${HF2Q_ASAN_BUILD:-build/asan-build}
PY=${PYTHON:-python3}
LOGDIR="$ROOT/build/sanitizer-logs"
t_start=$(date +%s)

case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
if [ ! -x "$VENV/bin/python" ]; then
  echo "sanitizers: creating $VENV"
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"

if [ "${HF2Q_SKIP_BUILD:-0}" != "1" ]; then
  echo "sanitizers: building hf2q with -DHF2Q_SANITIZE=ON into $VENV"
  # Own build dir: never touches the regular (editable) build under build/<wheel_tag>.
  "$VPY" -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
    -C cmake.define.HF2Q_SANITIZE=ON \
    -C cmake.build-type=RelWithDebInfo \
    -C "build-dir=$BUILD_DIR/{wheel_tag}" \
    ".[test]"
fi
t_built=$(date +%s)

# The module that will be imported must be the sanitized one from the venv
# (found without importing it: an ASan module refuses to load before the
# runtime is preloaded).
CORE=$(ls "$VENV"/lib/python*/site-packages/hf2q/_core*.so 2>/dev/null | head -n 1 || true)
if [ -z "$CORE" ]; then
  echo "sanitizers: no hf2q/_core*.so in $VENV" >&2
  exit 1
fi
ASAN_LIB=$(ldd "$CORE" | awk '/libasan\.so/ {print $3; exit}')
if [ -z "$ASAN_LIB" ]; then
  # A clang build (CXX=clang++) does not link its runtime into a shared module.
  cand=$("${CXX:-clang++}" -print-file-name="libclang_rt.asan-$(uname -m).so" 2>/dev/null || true)
  [ -f "$cand" ] && ASAN_LIB=$cand
fi
# libstdc++ is preloaded too: the interpreter does not link it, and ASan's
# __cxa_throw interceptor must find the real one when the runtime starts
# (otherwise the first C++ exception dies in "CHECK failed ... real___cxa_throw").
CXX_LIB=$(ldd "$CORE" | awk '/libstdc\+\+\.so/ {print $3; exit}')
SAN_SYMS=$(nm -D "$CORE" | grep -c "__asan_report\|__ubsan_handle" || true)
if [ -z "$ASAN_LIB" ] || [ "${SAN_SYMS:-0}" -eq 0 ]; then
  echo "sanitizers: $CORE is not built with ASan/UBSan" >&2
  exit 1
fi
echo "sanitizers: module $CORE"
echo "sanitizers: LD_PRELOAD $ASAN_LIB ${CXX_LIB:-}"

rm -rf "$LOGDIR"
mkdir -p "$LOGDIR"

# Only the Python processes get the runtime (find, ldd, ... stay uninstrumented);
# the tests' Python subprocesses inherit it.
PY_ENV=(env
  "LD_PRELOAD=$ASAN_LIB${CXX_LIB:+:$CXX_LIB}${LD_PRELOAD:+:$LD_PRELOAD}"
  "ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:exitcode=86:allocator_may_return_null=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1:log_path=$LOGDIR/report"
  "UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:exitcode=86:log_path=$LOGDIR/report"
  PYTHONMALLOC=malloc PYTHONFAULTHANDLER=1 HF2Q_UNDER_SANITIZER=1)

IMPORTED=$(cd / && "${PY_ENV[@]}" "$VPY" -c "import hf2q._core as c; print(c.__file__)")
if [ "$IMPORTED" != "$CORE" ]; then
  echo "sanitizers: hf2q._core imports from '$IMPORTED', not from '$CORE'" >&2
  exit 1
fi

# The harness itself: a deliberate heap overflow (through ASan's memmove
# interceptor) must produce a report and a failing exit, or the run proves nothing.
set +e
"${PY_ENV[@]}" "$VPY" -c "import ctypes; b = ctypes.create_string_buffer(16); ctypes.memmove(b, b'x' * 64, 64)" 2>/dev/null
canary=$?
set -e
if [ "$canary" -ne 86 ] || [ -z "$(find "$LOGDIR" -type f -size +0)" ]; then
  echo "sanitizers: the ASan canary was not caught (exit $canary): reports would go unseen" >&2
  exit 1
fi
rm -f "$LOGDIR"/*

# tests/test_arm64.py cross-compiles its own driver and runs it under qemu:
# none of the sanitized module is involved, and the x86 runtime in LD_PRELOAD
# would be handed to the emulated aarch64 binary. Tests marked host_tools
# (mypy, a wheel build, cross compilers, nvcc, the shader and CUDA emulators)
# run no code of the sanitized module either; under ASan they took minutes of
# CI's 2 cores (mypy alone runs ~4x slower with PYTHONMALLOC=malloc). The main
# suite runs them all.
set +e
"${PY_ENV[@]}" "$VPY" -m pytest -q -p no:cacheprovider --ignore=tests/test_arm64.py -m "not host_tools" "$@"
rc=$?
set -e
t_end=$(date +%s)

reports=$(find "$LOGDIR" -type f -size +0 | sort)
if [ -n "$reports" ]; then
  echo "sanitizers: SANITIZER REPORTS:" >&2
  for f in $reports; do
    echo "==== $f" >&2
    head -n 80 "$f" >&2
  done
  [ "$rc" -eq 0 ] && rc=1
fi
if [ "$rc" -eq 5 ]; then
  echo "sanitizers: pytest collected no tests" >&2
  rc=1
fi
echo "sanitizers: build $((t_built - t_start)) s, tests $((t_end - t_built)) s, exit $rc"
exit "$rc"
