#!/usr/bin/env bash
# Coverage-guided fuzzing of hf2q with atheris (libFuzzer), against a native
# core built with ASan + UBSan + libFuzzer coverage (clang), in its own venv.
#
#   scripts/run_fuzz.sh [TARGET...]      targets: safetensors checkpoint ops device hub (default: all)
#
# Environment:
#   FUZZ_SECONDS     time budget per target (default 60; a longer run: FUZZ_SECONDS=3600)
#   HF2Q_FUZZ_VENV   venv (default build/fuzz-venv; git-ignored)
#   HF2Q_FUZZ_BUILD  CMake build directory (default build/fuzz-build)
#   HF2Q_FUZZ_WORK   corpora, crash artifacts, logs, stats (default build/fuzz-work)
#   HF2Q_SKIP_BUILD  1: reuse the venv's installed build
#   FUZZ_ARGS        extra libFuzzer flags (e.g. "-jobs=2 -workers=2", "-seed=1")
#   PYTHON           interpreter that creates the venv (default python3)
#
# Each target starts from the seed corpus fuzz/make_corpus.py writes (valid
# tiny checkpoints and hand-made files) plus its working corpus from earlier
# runs (HF2Q_FUZZ_WORK/corpus/TARGET). A crash, a sanitizer report, a Python
# exception the oracle does not allow or a timeout fails the target: the
# reproducer is HF2Q_FUZZ_WORK/artifacts/TARGET-crash-*; replay it with
#   scripts/run_fuzz.sh --replay TARGET FILE
# Executions per target go to HF2Q_FUZZ_WORK/stats.tsv and the summary.
#
# Without clang (and outside CI, where clang is installed with apt-get), the
# core is built without sanitizers and only Python code is coverage-guided;
# the summary says so.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

VENV=${HF2Q_FUZZ_VENV:-build/fuzz-venv}
BUILD_DIR=${HF2Q_FUZZ_BUILD:-build/fuzz-build}
WORK=${HF2Q_FUZZ_WORK:-build/fuzz-work}
SECONDS_PER_TARGET=${FUZZ_SECONDS:-60}
PY=${PYTHON:-python3}
ALL_TARGETS=(safetensors checkpoint ops device hub)

replay=""
if [ "${1:-}" = "--replay" ]; then
  [ $# -eq 3 ] || { echo "usage: $0 --replay TARGET FILE" >&2; exit 2; }
  replay="$3"
  set -- "$2"
fi
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${ALL_TARGETS[@]}")
for t in "${targets[@]}"; do
  [ -f "fuzz/fuzz_$t.py" ] || { echo "fuzz: unknown target '$t' (known: ${ALL_TARGETS[*]})" >&2; exit 2; }
done

t0=$(date +%s)
mode=asan
if ! command -v clang++ >/dev/null 2>&1; then
  if [ "${CI:-}" = "true" ] && command -v apt-get >/dev/null 2>&1; then
    echo "fuzz: installing clang (CI)"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang >/dev/null) || true
  fi
  command -v clang++ >/dev/null 2>&1 || mode=plain
fi

case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
VPY="$VENV/bin/python"
if [ "${HF2Q_SKIP_BUILD:-0}" != "1" ]; then
  "$VPY" -m pip install --quiet --disable-pip-version-check atheris
  # The package and its runtime dependencies only: no fuzz target imports the test extra
  # (torch, transformers, gguf), which would only lengthen the install.
  if [ "$mode" = asan ]; then
    echo "fuzz: building hf2q with clang, -DHF2Q_SANITIZE=ON -DHF2Q_FUZZ=ON into $VENV"
    CC=clang CXX=clang++ "$VPY" -m pip install --quiet --disable-pip-version-check \
      -C cmake.define.HF2Q_SANITIZE=ON -C cmake.define.HF2Q_FUZZ=ON \
      -C cmake.build-type=RelWithDebInfo -C "build-dir=$BUILD_DIR/{wheel_tag}" .
  else
    echo "fuzz: clang not found: building hf2q WITHOUT sanitizers (Python-level coverage only)"
    "$VPY" -m pip install --quiet --disable-pip-version-check \
      -C "build-dir=$BUILD_DIR-plain/{wheel_tag}" .
  fi
fi
t_built=$(date +%s)

SITE=$("$VPY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
CORE=$(ls "$SITE"/hf2q/_core*.so | head -n 1)
if nm -D "$CORE" | grep -c "__asan_report" >/dev/null; then
  mode=asan
  # atheris's ASan runtime with libFuzzer linked in (clang's, matching
  # -fsanitize=fuzzer-no-link); libstdc++ first, for ASan's __cxa_throw hook.
  CXX_LIB=$(ldd "$CORE" | awk '/libstdc\+\+\.so/ {print $3; exit}')
  # Only the Python processes get the runtime (awk, ldd, ... stay uninstrumented).
  PY_ENV=(env "LD_PRELOAD=$SITE/asan_with_fuzzer.so${CXX_LIB:+:$CXX_LIB}"
          "ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1:halt_on_error=1:detect_stack_use_after_return=1:handle_abort=1"
          "UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1"
          PYTHONMALLOC=malloc HF2Q_UNDER_SANITIZER=1)
else
  mode=plain
  PY_ENV=(env)
fi
echo "fuzz: mode $mode ($CORE)"

mkdir -p "$WORK/seeds" "$WORK/artifacts" "$WORK/logs"
if [ -n "$replay" ]; then
  exec "${PY_ENV[@]}" "$VPY" "fuzz/fuzz_${targets[0]}.py" -runs=1 "$replay"
fi
"${PY_ENV[@]}" "$VPY" fuzz/make_corpus.py "$WORK/seeds"

max_len() {
  case "$1" in
    safetensors) echo 131072 ;;
    checkpoint) echo 65536 ;;
    *) echo 8192 ;;
  esac
}

STATS="$WORK/stats.tsv"
[ -f "$STATS" ] || printf "date\ttarget\tmode\tseconds\texecs\texecs_per_s\tcorpus\tcov\tresult\n" > "$STATS"
summary=()
failed=0
for t in "${targets[@]}"; do
  mkdir -p "$WORK/corpus/$t"
  log="$WORK/logs/$t.log"
  dict=()
  case "$t" in safetensors|checkpoint) dict=(-dict=fuzz/safetensors.dict) ;; esac
  echo "fuzz: $t for ${SECONDS_PER_TARGET}s"
  set +e
  # shellcheck disable=SC2086
  "${PY_ENV[@]}" "$VPY" "fuzz/fuzz_$t.py" -max_total_time="$SECONDS_PER_TARGET" -timeout=60 -rss_limit_mb=8192 \
    -max_len="$(max_len "$t")" -print_final_stats=1 -artifact_prefix="$WORK/artifacts/$t-" "${dict[@]}" \
    ${FUZZ_ARGS:-} "$WORK/corpus/$t" "$WORK/seeds/$t" >"$log" 2>&1
  rc=$?
  set -e
  execs=$(awk '/stat::number_of_executed_units/ {v=$NF} END {print v+0}' "$log")
  rate=$(awk '/stat::average_exec_per_sec/ {v=$NF} END {print v+0}' "$log")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | awk '{print $2}' || true)
  corpus=$(find "$WORK/corpus/$t" -type f | wc -l)
  result=ok
  if [ "$rc" -ne 0 ] || grep -q "ERROR: AddressSanitizer\|runtime error:\|ERROR: libFuzzer\|Uncaught Python exception" "$log"; then
    result="FAIL(rc=$rc)"
    failed=1
    echo "fuzz: $t FAILED; last lines of $log:" >&2
    tail -n 60 "$log" >&2
  fi
  printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$t" "$mode" \
    "$SECONDS_PER_TARGET" "$execs" "$rate" "$corpus" "${cov:-?}" "$result" >> "$STATS"
  summary+=("$(printf "%-12s %10s execs %8s/s  corpus %5s  cov %6s  %s" "$t" "$execs" "$rate" "$corpus" "${cov:-?}" "$result")")
done
t_end=$(date +%s)
echo "fuzz: summary (mode $mode, ${SECONDS_PER_TARGET}s per target; build $((t_built - t0)) s, total $((t_end - t0)) s)"
for line in "${summary[@]}"; do echo "  $line"; done
exit "$failed"
