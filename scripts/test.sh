#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, and runs every test with CTest; then a
# short run of every fuzz target under ASan + UBSan (build-fuzz, after its kept findings), then
# the whole suite built with ASan + UBSan (build-asan; BATON_ASAN_SUITE=0 leaves it out).
# BATON_SKIP_SANITIZERS=1 skips both. Figures and options: docs/sanitizers.md.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# Each phase's wall time, printed as it ends (CI has a 90-minute limit: docs/sanitizers.md).
phase_start=$SECONDS
phase() { echo "baton: [time] $1: $((SECONDS - phase_start)) s"; phase_start=$SECONDS; }
ensure_packages
phase "packages"
build
phase "build"
(cd "$BUILD_DIR" && ctest --output-on-failure --timeout 600 -j "$(nproc 2>/dev/null || echo 2)" "$@")
phase "test suite"

if [ "${BATON_SKIP_SANITIZERS:-0}" != 1 ]; then
  echo "baton: every fuzz target on its kept findings, then for ${BATON_FUZZ_SMOKE_SECONDS:-10} s (build-fuzz)"
  BATON_JOBS="$(nproc 2>/dev/null || echo 2)" bash "$ROOT/scripts/fuzz.sh" "${BATON_FUZZ_SMOKE_SECONDS:-10}"
  phase "fuzz build and runs"

  if [ "${BATON_ASAN_SUITE:-1}" = 1 ]; then
    echo "baton: the test suite under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan)"
    # -O1: compiles much faster than Release's -O3 on 2 cores, and the suite's time
    # is LibTorch's (not instrumented), not baton's code.
    BUILD_DIR="$ROOT/build-asan" build -DBATON_SANITIZE=ON -DBATON_BUILD_EXAMPLES=OFF -DBATON_BUILD_BENCHMARKS=OFF \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -DNDEBUG"
    phase "ASan build"
    # No ASan option or suppression is needed (docs/sanitizers.md); leaks are checked.
    export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
    # Left out (docs/sanitizers.md says why each): the install check (it builds another project
    # against the instrumented library), the tests that stop processes at many random moments or
    # kill one in the middle of a write (repetitions: their code paths run under ASan in the single
    # Ctrl-C, kill-one-rank and resume tests, and a SIGKILLed process is not checked by ASan at
    # all), the shipped curriculum's report in
    # Chromium (three stages of LibTorch training; its report code runs under ASan in the other
    # browser test), the resident-memory bound of training from shards (ASan's shadow memory
    # is not the program's; the shard code runs under ASan in the other [data_scale] tests),
    # tests/data/bad's 29 malformed curricula (the same parsing and validation run under ASan in
    # the catalog's 74 config cases; each is a baton process, ~4 s under ASan), and retraining the
    # shipped six-language tokenizer (18 s; the same training code runs under ASan in the other
    # tokenizer tests).
    # A test that hangs is stopped at 15 minutes (the longest here takes about 4).
    (cd "$ROOT/build-asan" && ctest --output-on-failure --timeout 900 -LE install \
         -E "SIGINT at 20 random moments|SIGKILL at random moments|SIGKILL in the middle of a checkpoint write|killed \\(kill -9\\) at random moments|killed \\(SIGKILL\\) at random moments|the shipped curriculum's report|keeps resident memory below|every malformed curriculum in tests/data/bad|the shipped examples/fortunes-4096.model" \
         -j "$(nproc 2>/dev/null || echo 2)" "$@")
    phase "ASan suite"
  fi
fi
