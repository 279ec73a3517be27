#!/usr/bin/env bash
# arm64 kernels verified under emulation.
#
# How to run it by hand (x86_64 Debian/Ubuntu, from anywhere in the checkout,
# with hf2q installed in the Python on PATH, e.g. `pip install -e .`):
#
#     scripts/run_arm64_tests.sh                  # installs the tools if missing (root or sudo)
#     scripts/run_arm64_tests.sh --no-install     # never installs; exits 77 if tools are missing
#     scripts/run_arm64_tests.sh --vectors F.bin  # use an existing vector file
#
# It needs `g++-aarch64-linux-gnu` and `qemu-user-static` (or `qemu-user`):
#     sudo apt-get install g++-aarch64-linux-gnu qemu-user-static
# then (1) writes test vectors with hf2q.reference on this x86 host
# (tests/native/gen_arm64_vectors.py -> build/arm64/vectors.bin), (2) cross-
# compiles the portable kernels (csrc/kernels/*.cpp: {scalar,dispatch,thread_pool,format_kernels,
# checked_ops,arm_neon}.cpp; the NEON path is selected by __aarch64__, no
# AVX2 file) and tests/native/arm64_driver.cpp for aarch64 Linux, statically
# linked, with the warning flags and -ffp-contract=off of CMakeLists.txt, and
# (3) runs the driver under qemu-aarch64. It ends with a line
# "arm64 driver: N passed, 0 failed". About 10-20 s once the tools are there.
# On an aarch64 Linux host it builds with the native g++ and runs without qemu.
# tests/test_arm64.py runs this script (installing the tools only when CI=true).
#
# Environment: PYTHON (default python3, then python), HF2Q_ARM64_CXX (the
# compiler), HF2Q_ARM64_QEMU (the emulator), HF2Q_ARM64_DRIVER_TIMEOUT (the
# driver's watchdog, seconds).
# Exit status: 0 passed; 1 the driver reported a mismatch (or timed out);
# 2 usage, build or vector-generation error; 77 skipped (tools missing and not
# installable; the reason is printed as "skipped: <reason>").
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD="$ROOT/build/arm64"
INSTALL=1
VECTORS=""

usage() { sed -n '2,29p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --no-install) INSTALL=0 ;;
    --vectors) [ $# -ge 2 ] || { echo "error: --vectors needs a file" >&2; exit 2; }; VECTORS=$2; shift ;;
    --vectors=*) VECTORS=${1#--vectors=} ;;
    -h|--help) usage; exit 0 ;;
    *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

skip() { echo "skipped: $*"; exit 77; }
die() { echo "error: $*" >&2; exit 2; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

T_START=$(now)
[ "$(uname -s)" = Linux ] || skip "needs Linux (Debian's aarch64 cross toolchain and qemu-user); this is $(uname -s)"
HOST_ARCH=$(uname -m)

# ---- tools
find_tools() {
  CXX=${HF2Q_ARM64_CXX:-}
  RUNNER=${HF2Q_ARM64_QEMU:-}
  if [ "$HOST_ARCH" = aarch64 ] || [ "$HOST_ARCH" = arm64 ]; then
    [ -n "$CXX" ] || CXX=$(command -v g++ || command -v c++ || true)
    RUNNER=${RUNNER:-native}
  else
    [ -n "$CXX" ] || CXX=$(command -v aarch64-linux-gnu-g++ || true)
    [ -n "$RUNNER" ] || RUNNER=$(command -v qemu-aarch64-static || command -v qemu-aarch64 || true)
  fi
}
find_tools

if [ -z "$CXX" ] || [ -z "$RUNNER" ]; then
  pkgs=()
  [ -n "$CXX" ] || pkgs+=(g++-aarch64-linux-gnu)
  [ -n "$RUNNER" ] || pkgs+=(qemu-user-static)
  what="${pkgs[*]}"
  [ "$INSTALL" = 1 ] || skip "not installed: $what (apt-get install $what; --no-install was given)"
  command -v apt-get >/dev/null 2>&1 || skip "not installed: $what, and there is no apt-get to install them"
  if [ "$(id -u)" = 0 ]; then
    SUDO=()
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
  else
    skip "not installed: $what, and installing needs root (or passwordless sudo)"
  fi
  T_INSTALL=$(now)
  echo "installing $what with apt-get ..."
  export DEBIAN_FRONTEND=noninteractive
  apt_log="$(mktemp)"
  if ! "${SUDO[@]}" apt-get update >"$apt_log" 2>&1; then
    tail -5 "$apt_log"; rm -f "$apt_log"; skip "apt-get update failed (no network or no package mirror?)"
  fi
  if ! "${SUDO[@]}" apt-get install -y --no-install-recommends "${pkgs[@]}" >>"$apt_log" 2>&1; then
    # Some releases ship qemu-aarch64 only in qemu-user.
    alt=("${pkgs[@]/qemu-user-static/qemu-user}")
    if [ "${alt[*]}" = "${pkgs[*]}" ] || ! "${SUDO[@]}" apt-get install -y --no-install-recommends "${alt[@]}" >>"$apt_log" 2>&1; then
      tail -5 "$apt_log"; rm -f "$apt_log"; skip "apt-get install $what failed"
    fi
  fi
  rm -f "$apt_log"
  find_tools
  [ -n "$CXX" ] && [ -n "$RUNNER" ] || skip "installed $what, but still no aarch64-linux-gnu-g++ / qemu-aarch64 on PATH"
  echo "install: $(since "$T_INSTALL") s"
fi
echo "compiler: $CXX ($("$CXX" -dumpfullversion -dumpversion 2>/dev/null | head -1)); runner: $RUNNER"

mkdir -p "$BUILD/obj" || die "cannot create $BUILD"

# ---- vectors (hf2q.reference on this host)
if [ -z "$VECTORS" ]; then
  T_VEC=$(now)
  VECTORS="$BUILD/vectors.bin"
  PY=""
  for cand in ${PYTHON:-} python3 python; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import hf2q.reference" >/dev/null 2>&1; then PY=$cand; break; fi
  done
  [ -n "$PY" ] || die "no Python that can import hf2q.reference (install hf2q, e.g. pip install -e '.[test]', or set PYTHON)"
  "$PY" "$ROOT/tests/native/gen_arm64_vectors.py" "$VECTORS" || die "generating the vectors failed"
  echo "vectors: $(since "$T_VEC") s"
fi
[ -f "$VECTORS" ] || die "vector file not found: $VECTORS"

# ---- cross-compile (flags as CMakeLists.txt: Release -O3 -DNDEBUG, warnings, no FMA contraction)
T_BUILD=$(now)
CXXFLAGS=(-std=c++17 -O3 -DNDEBUG -Wall -Wextra -Wshadow -ffp-contract=off -fno-math-errno -pthread -I"$ROOT/csrc")
# Every portable kernel file, as CMakeLists.txt globs them (the AVX2 file is x86 only).
SOURCES=()
for f in "$ROOT"/csrc/kernels/*.cpp; do
  case "$(basename "$f")" in *_avx2.cpp) ;; *) SOURCES+=("csrc/kernels/$(basename "$f")") ;; esac
done
SOURCES+=(tests/native/arm64_driver.cpp)
pids=()
objs=()
for src in "${SOURCES[@]}"; do
  obj="$BUILD/obj/$(basename "${src%.cpp}").o"
  objs+=("$obj")
  "$CXX" "${CXXFLAGS[@]}" -c "$ROOT/$src" -o "$obj" &
  pids+=($!)
done
build_ok=1
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { echo "error: compiling ${SOURCES[$i]} failed" >&2; build_ok=0; }
done
[ "$build_ok" = 1 ] || exit 2
"$CXX" -static -pthread "${objs[@]}" -o "$BUILD/arm64_driver" || die "linking the static aarch64 driver failed"
echo "build: $(since "$T_BUILD") s ($BUILD/arm64_driver)"

# ---- run
T_RUN=$(now)
if [ "$RUNNER" = native ]; then
  run=("$BUILD/arm64_driver")
else
  run=("$RUNNER" "$BUILD/arm64_driver")
fi
command -v timeout >/dev/null 2>&1 && run=(timeout 300 "${run[@]}")
"${run[@]}" "$VECTORS"
rc=$?
echo "run: $(since "$T_RUN") s; total: $(since "$T_START") s"
if [ "$rc" != 0 ]; then
  echo "arm64 tests FAILED (driver exit status $rc)" >&2
  exit 1
fi
echo "arm64 tests passed"
