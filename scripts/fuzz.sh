#!/usr/bin/env bash
# Runs the libFuzzer targets (docs/fuzzing.md) one after another, one process at a time.
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]      (default: 60 seconds, every target)
# Builds build-fuzz (clang, BATON_FUZZ=ON, -O1 as libFuzzer's documentation builds: it compiles
# faster than -O2 on 2 cores) if needed. Seeds are read from fuzz/corpus/<target>
# (never written); new inputs go to build-fuzz/corpus/<target>, crashes to
# build-fuzz/findings/<target>/, logs to build-fuzz/logs/<target>.log. Prints one line per target
# with its executions and exits non-zero if any target found a crash, leak, timeout or OOM.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FUZZ_DIR="${BATON_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
SECONDS_PER_TARGET="${1:-60}"
shift || true
TARGETS=("$@")
((${#TARGETS[@]})) || TARGETS=(fuzz_duration fuzz_curriculum fuzz_set fuzz_idx fuzz_csv fuzz_checkpoint fuzz_artifact fuzz_shards)

if [ "${BATON_FUZZ_NO_BUILD:-0}" != 1 ]; then
  export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S "$ROOT" -B "$FUZZ_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -DNDEBUG" \
        -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_UNITY_BUILD="${BATON_UNITY_BUILD:-ON}" \
        -DBATON_FUZZ=ON -DBATON_BUILD_TESTS=OFF -DBATON_BUILD_EXAMPLES=OFF -DBATON_BUILD_BENCHMARKS=OFF \
        "${launcher[@]}" >/dev/null
  cmake --build "$FUZZ_DIR" -j "${BATON_JOBS:-2}" --target "${TARGETS[@]}"
fi

# Leaks are checked (libFuzzer's default); UBSan stops at the first report with a stack.
export ASAN_OPTIONS="${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
status=0
for t in "${TARGETS[@]}"; do
  mkdir -p "$FUZZ_DIR/corpus/$t" "$FUZZ_DIR/findings/$t" "$FUZZ_DIR/logs"
  log="$FUZZ_DIR/logs/$t.log"
  # First every kept finding (fuzz/regressions/<target>/): each must run clean.
  shopt -s nullglob
  regressions=("$ROOT/fuzz/regressions/$t"/*)
  shopt -u nullglob
  if ((${#regressions[@]})) && ! "$FUZZ_DIR/fuzz/$t" "${regressions[@]}" >"$FUZZ_DIR/logs/$t.regressions.log" 2>&1; then
    status=1
    echo "$t: FAILED on a kept regression input; see $FUZZ_DIR/logs/$t.regressions.log"
    continue
  fi
  rc=0
  "$FUZZ_DIR/fuzz/$t" -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -print_final_stats=1 \
      -artifact_prefix="$FUZZ_DIR/findings/$t/" "$FUZZ_DIR/corpus/$t" "$ROOT/fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  execs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')"
  if ((rc == 0)); then
    echo "$t: ok, $execs executions in ${SECONDS_PER_TARGET}s, ${#regressions[@]} regression inputs clean"
  else
    status=1
    echo "$t: FAILED (exit $rc) after $execs executions; see $log and $FUZZ_DIR/findings/$t/"
    grep -m3 -E 'ERROR|runtime error|SUMMARY|invariant' "$log" || true
  fi
done
exit "$status"
