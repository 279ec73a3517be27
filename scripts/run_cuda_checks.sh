#!/usr/bin/env bash
# The CUDA checks, on a machine with an NVIDIA GPU: build and install hf2q
# from this tree, run the CUDA tests (pytest -m cuda) and the whole suite,
# then benchmarks/bench_cuda.py and benchmarks/bench_fullscale.py at a small
# size (--layers $FULLSCALE_LAYERS, default 4: ~7 GB per Qwen case in
# /dev/shm; FULLSCALE_ARGS adds options, e.g. FULLSCALE_LAYERS= for the
# full-size models). Logs and results go to $OUT (default
# /tmp/hf2q-cuda). Wheels in .whl/ (packages the machine lacks, e.g.
# fastsafetensors, gguf) are installed into a private target first.
#
#   bash scripts/run_cuda_checks.sh [tests|bench|all]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/hf2q-cuda}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
what=${1:-all}
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/hf2q-site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/hf2q-site${PYTHONPATH:+:$PYTHONPATH}
fi
t0=$(date +%s)
$PY -m pip install -q --no-build-isolation --no-deps --no-index --target /tmp/hf2q-install . >"$OUT/build.log" 2>&1 \
  || { tail -50 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/hf2q-install:$PYTHONPATH
echo "build+install: $(( $(date +%s) - t0 )) s"
rc=0
if [ "$what" != bench ]; then
  $PY -m pytest -q -p no:cacheprovider -m cuda -rs tests/ 2>&1 | tee "$OUT/cuda_tests.log" | tail -25
  rc=${PIPESTATUS[0]}
  $PY -m pytest -q -p no:cacheprovider -n 8 >"$OUT/full_tests.log" 2>&1
  tail -3 "$OUT/full_tests.log"
fi
if [ "$what" != tests ]; then
  $PY benchmarks/bench_cuda.py ${BENCH_ARGS:-} --dir /tmp/hf2q-bench --json "$OUT/bench.json" --markdown "$OUT/bench.md" 2>&1 | tee "$OUT/bench.log" | tail -30
  layers=${FULLSCALE_LAYERS-4}
  $PY benchmarks/bench_fullscale.py ${layers:+--layers $layers} ${FULLSCALE_ARGS:-} --dir /dev/shm/hf2q-fullscale \
    --json "$OUT/fullscale.json" --markdown "$OUT/fullscale.md" 2>&1 | tee "$OUT/fullscale.log" | tail -30
fi
exit $rc
