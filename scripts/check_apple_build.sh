#!/usr/bin/env bash
# The Apple build, checked on Linux: every translation unit that an Apple
# (macOS arm64) build of hf2q compiles, compiled to Mach-O arm64 objects with
# clang against Apple's headers, warnings as errors.
#
# How to run it by hand (from anywhere in the checkout):
#
#     HF2Q_APPLE_SDK=/path/to/apple-sdk scripts/check_apple_build.sh
#     scripts/check_apple_build.sh --install     # apt-get installs clang/cmake if missing (root or sudo)
#
# HF2Q_APPLE_SDK is a folder holding a macOS SDK sysroot (MacOSX*.sdk) and
# Apple's metal-cpp (metal-cpp/); default: ../shared/apple-sdk beside the
# checkout, when it exists. Needs clang with the AArch64 target (any clang
# from Debian: apt-get install clang-19), cmake >= 3.18 with make or ninja,
# and python3. With CI=true (or --install) missing tools are installed with
# apt-get; the nanobind headers (for the bindings) come from the Python in
# PYTHON (default python3) or, when installing, from PyPI into build/apple-pydeps/.
#
# What it does:
#  1. CMake configures this project for Darwin arm64 (CMAKE_SYSTEM_NAME=Darwin,
#     the SDK as CMAKE_OSX_SYSROOT, the deployment target CMakeLists.txt sets)
#     and writes compile_commands.json: the translation units and the exact
#     flags of the real Apple build, taken from CMakeLists.txt itself, so
#     nothing here can drift from it. Only compiling, never linking: the SDK
#     has no libSystem.
#  2. Every command is run as CMake wrote it, plus -Werror for csrc/ (nanobind's
#     own sources keep their flags), in three configurations:
#       macos14-sdk14  arm64-apple-macos14 against the SDK as it is (14.2: the
#                      residency-set code compiles out)
#       macos14-sdk15  arm64-apple-macos14 against the SDK seen as macOS 15: the
#                      version macros of tests/apple/sdk15/sdk15_prefix.h and the
#                      residency-set declarations generated from metal-cpp
#                      (tests/apple/sdk15/Metal/, checked against metal-cpp
#                      first) spliced into a scratch copy of Metal's headers.
#                      This is how a release wheel is built (new SDK, older
#                      deployment target): every macOS 15 call must sit under
#                      @available (-Werror=unguarded-availability-new)
#       macos15-sdk15  arm64-apple-macos15, same headers
#     (an SDK that already has MTLResidencySet.h is used as it is for the
#     last two).
#  3. Each object must be a Mach-O arm64 MH_OBJECT for macOS with the expected
#     minimum OS version, and metal_backend.mm's object must reference the
#     residency-set selectors exactly in the sdk15 configurations.
# It proves the Apple sources type-check and compile against Apple's
# declarations; not that they link, that the .metal shaders compile, or that
# anything runs (see the README's Apple section).
#
# Options: --install / --no-install (default: install only when CI=true);
# --config NAME (repeatable; default all three); --only SRC (compile only
# sources whose path ends with SRC; repeatable); --replace SRC=FILE (compile
# FILE in place of SRC, for tests/test_apple_build.py); --no-configure (reuse
# the build dirs of an earlier run).
# Environment: HF2Q_APPLE_SDK, HF2Q_APPLE_CXX (clang++), HF2Q_CMAKE, PYTHON,
# HF2Q_APPLE_BUILD_DIR (default build/apple).
# Exit status: 0 passed; 1 a translation unit failed (or the overlay is out of
# date); 2 usage or configure error; 77 skipped ("skipped: <reason>": no SDK,
# or no clang/cmake and not installing).
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${HF2Q_APPLE_BUILD_DIR:-$ROOT/build/apple}
PYDEPS=$ROOT/build/apple-pydeps  # nanobind from PyPI when installing (kept apart from BUILD)
INSTALL=0
[ "${CI:-}" = true ] && INSTALL=1
CONFIGS=()
PASS_ARGS=()
CONFIGURE=1

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --install) INSTALL=1 ;;
    --no-configure) CONFIGURE=0 ;;
    --no-install) INSTALL=0 ;;
    --config) [ $# -ge 2 ] || { echo "error: --config needs a name" >&2; exit 2; }; CONFIGS+=("$2"); shift ;;
    --only) [ $# -ge 2 ] || { echo "error: --only needs a source" >&2; exit 2; }; PASS_ARGS+=(--only "$2"); shift ;;
    --replace) [ $# -ge 2 ] || { echo "error: --replace needs SRC=FILE" >&2; exit 2; }; PASS_ARGS+=(--replace "$2"); shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ ${#CONFIGS[@]} -gt 0 ] || CONFIGS=(macos14-sdk14 macos14-sdk15 macos15-sdk15)
for c in "${CONFIGS[@]}"; do
  case "$c" in macos14-sdk14|macos14-sdk15|macos15-sdk15) ;; *) echo "error: unknown configuration '$c'" >&2; exit 2 ;; esac
done

skip() { echo "skipped: $*"; exit 77; }
die() { echo "error: $*" >&2; exit 2; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
T_START=$(now)

# ---- the SDK
SDK=${HF2Q_APPLE_SDK:-}
if [ -z "$SDK" ] && [ -d "$ROOT/../shared/apple-sdk" ]; then SDK="$ROOT/../shared/apple-sdk"; fi
[ -n "$SDK" ] || skip "no Apple SDK (set HF2Q_APPLE_SDK to a folder with MacOSX*.sdk and metal-cpp; ../shared/apple-sdk beside the checkout does not exist)"
[ -d "$SDK" ] || skip "HF2Q_APPLE_SDK=$SDK is not a directory"
SDK=$(cd "$SDK" && pwd)
if [ -d "$SDK/System/Library/Frameworks" ]; then
  SYSROOT=$SDK
else
  SYSROOT=$(ls -d "$SDK"/MacOSX*.sdk 2>/dev/null | sort -V | tail -1)
fi
METAL_H="${SYSROOT:-/nonexistent}/System/Library/Frameworks/Metal.framework/Headers"
[ -n "$SYSROOT" ] && [ -f "$METAL_H/Metal.h" ] || skip "no macOS SDK with Metal.framework in $SDK"
METAL_CPP=$SDK/metal-cpp
SDK_HAS_SETS=0
[ -f "$METAL_H/MTLResidencySet.h" ] && SDK_HAS_SETS=1
if [ "$SDK_HAS_SETS" = 0 ] && [ ! -f "$METAL_CPP/Metal/MTLResidencySet.hpp" ]; then
  skip "$SYSROOT predates macOS 15 and $METAL_CPP/Metal/MTLResidencySet.hpp is missing (the residency-set path cannot be checked)"
fi

# ---- tools
PY=${PYTHON:-python3}
command -v "$PY" >/dev/null 2>&1 || skip "no $PY"
apple_clang_ok() {  # a clang that targets arm64-apple-macos
  echo 'int hf2q_probe;' | "$1" --target=arm64-apple-macos14 -x c++ -c - -o /dev/null >/dev/null 2>&1
}
find_tools() {
  CXX=${HF2Q_APPLE_CXX:-}
  if [ -z "$CXX" ]; then
    for c in clang++-21 clang++-20 clang++-19 clang++-18 clang++-17 clang++-16 clang++-15 clang++-14 clang++; do
      p=$(command -v "$c" 2>/dev/null) || continue
      if apple_clang_ok "$p"; then CXX=$p; break; fi
    done
  else
    CXX=$(command -v "$CXX" 2>/dev/null || echo "$CXX")
    apple_clang_ok "$CXX" || CXX=""
  fi
  CMAKE=${HF2Q_CMAKE:-$(command -v cmake 2>/dev/null || true)}
  if [ -n "$CMAKE" ]; then
    v=$("$CMAKE" --version 2>/dev/null | head -1 | awk '{print $3}')
    [ -n "$v" ] && [ "$(printf '%s\n' 3.18 "$v" | sort -V | head -1)" = 3.18 ] || CMAKE=""
  fi
  GEN=""
  if command -v ninja >/dev/null 2>&1; then GEN=Ninja; elif command -v make >/dev/null 2>&1; then GEN="Unix Makefiles"; fi
}
find_tools
if [ -z "$CXX" ] || [ -z "$CMAKE" ] || [ -z "$GEN" ]; then
  pkgs=()
  if [ -z "$CXX" ]; then
    ver=""
    if command -v apt-cache >/dev/null 2>&1; then
      for v in 21 20 19 18 17 16 15 14; do
        if apt-cache policy "clang-$v" 2>/dev/null | grep -q 'Candidate: [0-9]'; then ver=$v; break; fi
      done
    fi
    pkgs+=("clang${ver:+-$ver}")
  fi
  [ -n "$CMAKE" ] || pkgs+=(cmake)
  [ -n "$GEN" ] || pkgs+=(make)
  what="${pkgs[*]}"
  if [ -z "$CXX" ] && [ -n "${HF2Q_APPLE_CXX:-}" ]; then
    skip "HF2Q_APPLE_CXX=$HF2Q_APPLE_CXX cannot compile for arm64-apple-macos14 (not a clang with the AArch64 target?)"
  fi
  [ "$INSTALL" = 1 ] || skip "not installed: $what (apt-get install $what, or run with --install)"
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
  apt_log=$(mktemp)
  if ! "${SUDO[@]}" apt-get install -y --no-install-recommends "${pkgs[@]}" >"$apt_log" 2>&1; then
    if ! { "${SUDO[@]}" apt-get update && "${SUDO[@]}" apt-get install -y --no-install-recommends "${pkgs[@]}"; } >>"$apt_log" 2>&1; then
      tail -5 "$apt_log"; rm -f "$apt_log"; skip "apt-get install $what failed"
    fi
  fi
  rm -f "$apt_log"
  find_tools
  [ -n "$CXX" ] && [ -n "$CMAKE" ] && [ -n "$GEN" ] || skip "installed $what, but still no clang with the AArch64 target / cmake / make"
  echo "install: $(since "$T_INSTALL") s"
fi
echo "compiler: $CXX ($("$CXX" --version | head -1)); cmake: $("$CMAKE" --version | head -1); SDK: $SYSROOT"
mkdir -p "$BUILD" || die "cannot create $BUILD"

# ---- the bindings need Python's headers and nanobind's (CMake's find_package)
BINDINGS=ON
WHY_NO_BINDINGS=""
PY_INC=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)
NB_DIR=$("$PY" -c 'import nanobind; print(nanobind.cmake_dir())' 2>/dev/null)
if [ ! -f "$PY_INC/Python.h" ]; then
  BINDINGS=OFF; WHY_NO_BINDINGS="no Python.h in '$PY_INC' (install python3-dev)"
elif [ -z "$NB_DIR" ]; then
  NB_SPEC=$(grep -o '"nanobind[^"]*"' "$ROOT/pyproject.toml" | head -1 | tr -d '"')
  NB_SPEC=${NB_SPEC:-nanobind}
  if [ -d "$PYDEPS/nanobind" ] || { [ "$INSTALL" = 1 ] &&
       "$PY" -m pip install --quiet --disable-pip-version-check --target "$PYDEPS" "$NB_SPEC" >/dev/null 2>&1; }; then
    NB_DIR=$(PYTHONPATH="$PYDEPS" "$PY" -c 'import nanobind; print(nanobind.cmake_dir())' 2>/dev/null)
  fi
  [ -n "$NB_DIR" ] || { BINDINGS=OFF; WHY_NO_BINDINGS="nanobind is not importable by $PY (pip install '$NB_SPEC', or --install)"; }
fi
if [ "$BINDINGS" = OFF ]; then
  [ "${CI:-}" = true ] && { echo "error: CI=true but the bindings cannot be checked: $WHY_NO_BINDINGS" >&2; exit 2; }
  echo "note: csrc/bindings not checked: $WHY_NO_BINDINGS"
fi

# ---- the macOS 15 view of the SDK
SDK15_FLAGS=""
if [ "$SDK_HAS_SETS" = 0 ]; then
  "$PY" "$ROOT/tests/apple/gen_sdk15_overlay.py" check "$METAL_CPP" "$ROOT/tests/apple/sdk15/Metal" || exit 1
  "$PY" "$ROOT/tests/apple/gen_sdk15_overlay.py" apply "$SYSROOT" "$ROOT/tests/apple/sdk15/Metal" "$BUILD/sdk15-frameworks" ||
    die "splicing the overlay into a copy of $METAL_H failed"
  SDK15_FLAGS="-F$BUILD/sdk15-frameworks -include $ROOT/tests/apple/sdk15/sdk15_prefix.h"
fi

# ---- configure (in parallel), then compile each configuration
# name -> target triple, deployment target (empty: CMakeLists.txt's), macOS 15 SDK view
triple() { case "$1" in macos15-*) echo arm64-apple-macos15 ;; *) echo arm64-apple-macos14 ;; esac; }
deploy() { case "$1" in macos15-*) echo 15.0 ;; *) echo "" ;; esac; }
minos() { case "$1" in macos15-*) echo 15.0 ;; *) echo 14.0 ;; esac; }
sdk15() { case "$1" in *-sdk15) echo 1 ;; *) echo 0 ;; esac; }

configure() {
  # Apple's toolchain links libc++ only; say so, so that a Debian clang whose
  # Darwin driver would pick libstdc++ (clang 14 does) checks the same headers.
  local name=$1 dir="$BUILD/$1" t d flags="-stdlib=libc++"
  t=$(triple "$name"); d=$(deploy "$name")
  [ "$(sdk15 "$name")" = 1 ] && flags="$flags $SDK15_FLAGS"
  rm -rf "$dir"
  local args=(-S "$ROOT" -B "$dir" -G "$GEN"
    -DCMAKE_SYSTEM_NAME=Darwin -DCMAKE_SYSTEM_PROCESSOR=arm64
    -DCMAKE_OSX_SYSROOT="$SYSROOT" -DCMAKE_OSX_ARCHITECTURES=arm64
    -DCMAKE_CXX_COMPILER="$CXX" -DCMAKE_OBJCXX_COMPILER="$CXX"
    -DCMAKE_CXX_COMPILER_TARGET="$t" -DCMAKE_OBJCXX_COMPILER_TARGET="$t"
    -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_OBJCXX_FLAGS="$flags"
    -DCMAKE_TRY_COMPILE_TARGET_TYPE=STATIC_LIBRARY -DCMAKE_INSTALL_NAME_TOOL=/bin/true
    -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DHF2Q_BUILD_PYTHON="$BINDINGS")
  [ -n "$d" ] && args+=(-DCMAKE_OSX_DEPLOYMENT_TARGET="$d")
  [ "$BINDINGS" = ON ] && args+=(-DPython_EXECUTABLE="$(command -v "$PY")" -Dnanobind_DIR="$NB_DIR")
  env -u MACOSX_DEPLOYMENT_TARGET "$CMAKE" "${args[@]}" >"$BUILD/$name.configure.log" 2>&1
}

T_CONF=$(now)
pids=()
for c in "${CONFIGS[@]}"; do
  if [ "$CONFIGURE" = 0 ] && [ -f "$BUILD/$c/compile_commands.json" ]; then continue; fi
  configure "$c" & pids+=($!)
done
conf_ok=1
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    echo "error: CMake could not configure ${CONFIGS[$i]} (log: $BUILD/${CONFIGS[$i]}.configure.log):" >&2
    tail -20 "$BUILD/${CONFIGS[$i]}.configure.log" >&2
    conf_ok=0
  fi
done
[ "$conf_ok" = 1 ] || exit 2
echo "configure: $(since "$T_CONF") s"

JOBS=$(nproc 2>/dev/null || echo 2)
rc=0
for c in "${CONFIGS[@]}"; do
  res=no
  if [ "$(sdk15 "$c")" = 1 ] || [ "$SDK_HAS_SETS" = 1 ]; then res=yes; fi
  extra=()
  # nanobind's own sources see no Metal header: once per deployment target is enough.
  [ "$c" = macos14-sdk15 ] && [[ " ${CONFIGS[*]} " == *" macos14-sdk14 "* ]] && extra=(--skip-third-party)
  "$PY" "$ROOT/tests/apple/compile_apple_objects.py" "$BUILD/$c" --root "$ROOT" --minos "$(minos "$c")" \
    --residency "$res" --label "$c" --jobs "$JOBS" ${extra[@]+"${extra[@]}"} ${PASS_ARGS[@]+"${PASS_ARGS[@]}"} || rc=1
done
if [ "$rc" = 0 ]; then
  echo "Apple build check passed (${CONFIGS[*]}; bindings ${BINDINGS}); total: $(since "$T_START") s"
else
  echo "Apple build check FAILED; total: $(since "$T_START") s" >&2
fi
exit "$rc"
